//! [`Indexer`]: the index, the registered sources and the workers they report for, and the
//! register / unregister / query operations the HTTP API exposes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use serde::Serialize;

use crate::api::{
    HashQueryRequest, InstanceMatch, QueryAnswer, QueryRequest, SourceSpec, SourceType,
    UnregisterRequest,
};
use crate::error::IndexerError;
use crate::hash::HashProfile;
use crate::ids::{BlockHash, PartitionKey, SourceSlot, Worker, DEFAULT_TENANT};
use crate::index::chains::ChainCache;
use crate::index::{walk, CachedChain, PrefixIndex, WorkerRun};
use crate::metrics::Metrics;
use crate::source::{SourceHandle, SourceStatus};

/// Longest prompt accepted, in tokens (beyond any model's context today).
pub const MAX_QUERY_TOKENS: usize = 4 << 20;

/// One registered source.
struct Registered {
    spec: SourceSpec,
    worker: u32,
    handle: Option<SourceHandle>,
}

#[derive(Default)]
struct Registry {
    sources: BTreeMap<SourceSlot, Registered>,
    workers: Vec<Worker>,
    worker_ids: HashMap<Worker, u32>,
    /// `worker_of[slot]`, for queries; rebuilt on every change.
    worker_of: Arc<Vec<Option<u32>>>,
    next_slot: u32,
}

impl Registry {
    fn rebuild(&mut self) {
        let mut v = vec![None; self.next_slot as usize];
        for (slot, r) in &self.sources {
            v[slot.0 as usize] = Some(r.worker);
        }
        self.worker_of = Arc::new(v);
    }
}

/// What `GET /sources` shows of a source.
#[derive(Debug, Clone, Serialize)]
pub struct SourceView {
    /// The slot.
    pub source_id: SourceSlot,
    /// The registration.
    pub spec: SourceSpec,
    /// Live counters.
    pub status: SourceStatus,
}

/// The indexer: shared by the HTTP handlers and the source threads.
pub struct Indexer {
    index: PrefixIndex,
    registry: RwLock<Registry>,
    metrics: Metrics,
}

impl Default for Indexer {
    fn default() -> Self {
        Indexer::new()
    }
}

/// The partition a registration's own tenant, LoRA and salt select.
pub fn partition_of(spec: &SourceSpec, tenant: &str, lora: Option<&str>) -> PartitionKey {
    PartitionKey {
        tenant_id: tenant.to_owned(),
        model: spec.modelname.clone(),
        lora_name: lora.unwrap_or_default().to_owned(),
        block_size: spec.block_size,
        additional_salt: spec.additionalsalt.clone().unwrap_or_default(),
    }
}

/// The tenant a request names, `default` when it names none.
pub fn tenant_or_default(t: &Option<String>) -> &str {
    t.as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_TENANT)
}

impl Indexer {
    /// An indexer with no sources, its chain cache sized by
    /// `MOONKV_INDEXER_CHAIN_CACHE_BLOCKS` (default
    /// [`crate::index::chains::DEFAULT_CHAIN_CACHE_BLOCKS`]; an unreadable value is logged and
    /// the default used).
    pub fn new() -> Indexer {
        let blocks = ChainCache::blocks_from_env().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "using the default chain cache size");
            crate::index::chains::DEFAULT_CHAIN_CACHE_BLOCKS
        });
        Indexer::with_chain_cache(blocks)
    }

    /// An indexer with no sources whose chain cache holds at most `blocks` blocks (`0`: no
    /// cache, every query block is hashed with SHA-256).
    pub fn with_chain_cache(blocks: usize) -> Indexer {
        let index = PrefixIndex::with_chain_cache(blocks);
        let mut metrics = Metrics::new();
        metrics.register_chain_stats(index.chains().stats());
        Indexer {
            index,
            registry: RwLock::new(Registry::default()),
            metrics,
        }
    }

    /// The index.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Validates `spec`, reserves a slot and its partition, and starts its subscriber thread.
    pub fn register(self: &Arc<Self>, spec: SourceSpec) -> Result<SourceSlot, IndexerError> {
        let profile = validate(&spec)?;
        let slot = self.add(spec.clone(), &profile)?;
        match crate::source::spawn(Arc::clone(self), slot, spec.clone(), profile) {
            Ok(handle) => {
                if let Some(r) = self.registry.write().sources.get_mut(&slot) {
                    r.handle = Some(handle);
                }
                Ok(slot)
            }
            Err(e) => {
                self.remove_slots(&[slot]);
                Err(e)
            }
        }
    }

    /// Adds a source without a subscriber (sources fed in-process, benchmarks and tests).
    pub fn add(&self, spec: SourceSpec, profile: &HashProfile) -> Result<SourceSlot, IndexerError> {
        let tenant = tenant_or_default(&spec.tenant_id).to_owned();
        let key = partition_of(&spec, &tenant, spec.lora_name.as_deref());
        self.index.partition_or_create(&key, profile).map_err(|m| {
            IndexerError::Conflict(format!(
                "partition {key:?} hashes with {:?}, not {:?}",
                m.existing.spec(),
                profile.spec()
            ))
        })?;
        let mut reg = self.registry.write();
        let duplicate = reg.sources.values().any(|r| {
            r.spec.endpoint == spec.endpoint
                && r.spec.instance_id == spec.instance_id
                && tenant_or_default(&r.spec.tenant_id) == tenant
                && r.spec.dp_rank == spec.dp_rank
        });
        if duplicate {
            return Err(IndexerError::Conflict(format!(
                "{} is already registered for instance {:?} rank {} in tenant {tenant:?}",
                spec.endpoint, spec.instance_id, spec.dp_rank
            )));
        }
        let worker = Worker {
            instance_id: spec.instance_id.clone(),
            dp_rank: spec.dp_rank,
        };
        let next_worker = reg.workers.len() as u32;
        let w = *reg.worker_ids.entry(worker.clone()).or_insert(next_worker);
        if w == next_worker {
            reg.workers.push(worker);
        }
        let slot = SourceSlot(reg.next_slot);
        reg.next_slot += 1;
        self.metrics
            .sources
            .get_or_create(&vec![("source_type", spec.source_type.as_str().to_owned())])
            .inc();
        reg.sources.insert(
            slot,
            Registered {
                spec,
                worker: w,
                handle: None,
            },
        );
        reg.rebuild();
        Ok(slot)
    }

    /// Removes the matching sources, stops their threads and drops their blocks. Returns the
    /// removed `instance|tenant|rank` names.
    pub fn unregister(&self, req: &UnregisterRequest) -> Result<Vec<String>, IndexerError> {
        let tenant = tenant_or_default(&req.tenant_id);
        let slots: Vec<SourceSlot> = self
            .registry
            .read()
            .sources
            .iter()
            .filter(|(_, r)| {
                r.spec.instance_id == req.instance_id
                    && tenant_or_default(&r.spec.tenant_id) == tenant
                    && req.dp_rank.is_none_or(|d| d == r.spec.dp_rank)
                    && req.source_type.is_none_or(|t| t == r.spec.source_type)
                    && req.endpoint.as_ref().is_none_or(|e| *e == r.spec.endpoint)
            })
            .map(|(s, _)| *s)
            .collect();
        if slots.is_empty() {
            return Err(IndexerError::NotFound(format!(
                "no source of instance {:?} in tenant {tenant:?} matches",
                req.instance_id
            )));
        }
        Ok(self.remove_slots(&slots))
    }

    fn remove_slots(&self, slots: &[SourceSlot]) -> Vec<String> {
        let mut removed = Vec::new();
        let mut handles = Vec::new();
        {
            let mut reg = self.registry.write();
            for slot in slots {
                if let Some(r) = reg.sources.remove(slot) {
                    let name = format!(
                        "{}|{}|{}",
                        r.spec.instance_id,
                        tenant_or_default(&r.spec.tenant_id),
                        r.spec.dp_rank
                    );
                    if !removed.contains(&name) {
                        removed.push(name);
                    }
                    self.metrics
                        .sources
                        .get_or_create(&vec![(
                            "source_type",
                            r.spec.source_type.as_str().to_owned(),
                        )])
                        .dec();
                    handles.extend(r.handle);
                }
            }
            // queries stop seeing the slots before their blocks go
            reg.rebuild();
        }
        for h in handles {
            h.stop();
        }
        // the threads have stopped, so nothing re-adds a removed slot's blocks
        for slot in slots {
            self.index.remove_source(*slot);
        }
        removed
    }

    /// Whether `slot` is still registered (source threads stop when it is not).
    pub fn is_registered(&self, slot: SourceSlot) -> bool {
        self.registry.read().sources.contains_key(&slot)
    }

    /// Every registered source with its status.
    pub fn sources(&self) -> Vec<SourceView> {
        self.registry
            .read()
            .sources
            .iter()
            .map(|(slot, r)| SourceView {
                source_id: *slot,
                spec: r.spec.clone(),
                status: r.handle.as_ref().map(|h| h.status()).unwrap_or_default(),
            })
            .collect()
    }

    /// Source counts by type.
    pub fn source_count(&self) -> usize {
        self.registry.read().sources.len()
    }

    /// Answers `POST /query`.
    pub fn query(&self, req: &QueryRequest) -> Result<QueryAnswer, IndexerError> {
        check_block_size(req.block_size)?;
        if req.token_ids.0.len() > MAX_QUERY_TOKENS {
            return Err(IndexerError::BadRequest(format!(
                "{} token ids (limit {MAX_QUERY_TOKENS})",
                req.token_ids.0.len()
            )));
        }
        let started = Instant::now();
        let tenant = tenant_or_default(&req.tenant_id);
        let key = PartitionKey {
            tenant_id: tenant.to_owned(),
            model: req.model.clone(),
            lora_name: req.lora_name.clone().unwrap_or_default(),
            block_size: req.block_size,
            additional_salt: req.additional_salt.clone().unwrap_or_default(),
        };
        let chains = self.index.chains();
        let answer = self.answer(&key, req.instance_id.as_deref(), |profile, out, part, w| {
            let lora = req.lora_name.as_deref().filter(|_| profile.hashes_extras());
            let salt = req
                .cache_salt
                .as_deref()
                .filter(|_| profile.hashes_extras());
            let mut chain = CachedChain::new(
                chains,
                part.chain_root(),
                profile,
                &req.token_ids.0,
                req.block_size as usize,
                lora,
                salt,
            );
            walk(part, &mut chain, w, out);
            chain.finish();
        });
        self.metrics
            .query_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(answer)
    }

    /// Answers `POST /query_by_hash`.
    pub fn query_by_hash(&self, req: &HashQueryRequest) -> Result<QueryAnswer, IndexerError> {
        check_block_size(req.block_size)?;
        let started = Instant::now();
        let key = PartitionKey {
            tenant_id: tenant_or_default(&req.tenant_id).to_owned(),
            model: req.model.clone(),
            lora_name: req.lora_name.clone().unwrap_or_default(),
            block_size: req.block_size,
            additional_salt: req.additional_salt.clone().unwrap_or_default(),
        };
        let answer = self.answer(&key, req.instance_id.as_deref(), |_, out, part, w| {
            walk(part, req.seq_hashes.iter().map(|&h| BlockHash(h)), w, out);
        });
        self.metrics
            .query_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(answer)
    }

    fn answer(
        &self,
        key: &PartitionKey,
        instance: Option<&str>,
        run: impl FnOnce(
            &HashProfile,
            &mut Vec<(u32, WorkerRun)>,
            &crate::index::Partition,
            &[Option<u32>],
        ),
    ) -> QueryAnswer {
        let mut answer = QueryAnswer::new();
        let tenant_answer = answer.entry(key.tenant_id.clone()).or_default();
        let Some(partition) = self.index.partition(key) else {
            return answer;
        };
        let (worker_of, workers) = {
            let reg = self.registry.read();
            let worker_of = match instance {
                None => Arc::clone(&reg.worker_of),
                Some(i) => Arc::new(
                    reg.worker_of
                        .iter()
                        .map(|w| w.filter(|&w| reg.workers[w as usize].instance_id == i))
                        .collect(),
                ),
            };
            (worker_of, reg.workers.clone())
        };
        let mut runs = Vec::new();
        {
            let part = partition.read();
            run(part.profile(), &mut runs, &part, &worker_of);
        }
        let bs = u64::from(key.block_size);
        for (w, r) in runs {
            let Some(worker) = workers.get(w as usize) else {
                continue;
            };
            let m: &mut InstanceMatch =
                tenant_answer.entry(worker.instance_id.clone()).or_default();
            m.gpu = m.gpu.max(u64::from(r.gpu) * bs);
            m.cpu = m.cpu.max(u64::from(r.cpu) * bs);
            m.disk = m.disk.max(u64::from(r.disk) * bs);
            m.longest_matched = m.disk;
            m.dp.insert(worker.dp_rank.to_string(), u64::from(r.disk) * bs);
        }
        answer
    }
}

fn check_block_size(bs: u32) -> Result<(), IndexerError> {
    if bs == 0 {
        return Err(IndexerError::BadRequest(
            "block_size must be positive".into(),
        ));
    }
    Ok(())
}

/// Checks a registration before anything is reserved; returns its profile.
pub fn validate(spec: &SourceSpec) -> Result<HashProfile, IndexerError> {
    let bad = |m: String| Err(IndexerError::BadRequest(m));
    if spec.modelname.is_empty() {
        return bad("modelname must not be empty".into());
    }
    if spec.instance_id.is_empty() {
        return bad("instance_id must not be empty".into());
    }
    if spec.block_size == 0 {
        return bad("block_size must be positive".into());
    }
    if !spec.endpoint.contains("://") {
        return bad(format!(
            "endpoint {:?} is not a ZMQ address (tcp://host:port, ipc://path)",
            spec.endpoint
        ));
    }
    if spec.replay_endpoint.is_some() && !spec.source_type.is_engine() {
        return bad("replay_endpoint is only for vLLM and SGLang sources".into());
    }
    if spec.admin.is_some() && spec.source_type != SourceType::Moonkv {
        return bad("admin is only for moonkv sources".into());
    }
    HashProfile::from_spec(&spec.hash_profile.clone().unwrap_or_default())
}
