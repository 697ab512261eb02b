//! vLLM and SGLang sources: a ZMQ SUB on the engine's publisher, sequence tracking per
//! connection, replay of a gap from the engine's ROUTER when one is registered, and the blocks
//! the engine reported.
//!
//! A gap that replay cannot close (no replay endpoint, the ring no longer has the batches, no
//! answer in time) and a publisher restart both drop every block of the source: its cache is
//! then unknown (or, after a restart, empty), and a stale block would send requests to an
//! instance that no longer has it. New events rebuild it.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::{SourceCtx, POLL};
use crate::api::{EngineHashes, SourceSpec};
use crate::error::IndexerError;
use crate::hash::{Digest32, Extra, HashProfile};
use crate::ids::{BlockHash, PartitionKey, SourceSlot, Tier, TierMask};
use crate::index::chains::Generations;
use crate::index::{Partition, PassThroughHasher, PrefixIndex};
use crate::state::{partition_of, tenant_or_default};
use crate::wire::{decode_batch, EngineEvent, StoredBlocks};

/// How long a replay may take before the gap is treated as unrecoverable.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(3);

/// The sequence frame of a replay's end marker.
const REPLAY_END: [u8; 8] = [0xff; 8];

/// How many blocks ahead of the one it stores a batch asks for (prefetches) the index slot of.
const STORE_AHEAD: usize = 8;

/// Trust-mode blocks remembered as parents for the chain cache, per generation (two
/// generations of 49,152, each filling a 2^16-slot table to 3/4: about 3.5 MiB each).
pub const TRUSTED_PARENTS_PER_GENERATION: usize = 3 << 14;

#[derive(Debug, Clone, Copy)]
struct EngineBlock {
    index: BlockHash,
    digest: Digest32,
    /// The block's fast key in the chain cache (0 when the cache is off).
    fast: u64,
    part: u16,
    tiers: TierMask,
}

/// A trusted block's place in its chain, for the blocks stored after it.
#[derive(Debug, Clone, Copy, Default)]
struct TrustedParent {
    part: u16,
    fast: u64,
    digest: Digest32,
}

/// The blocks one engine source reported, and how its hashes map to index hashes.
pub struct EngineBlocks {
    slot: SourceSlot,
    spec: SourceSpec,
    tenant: String,
    profile: HashProfile,
    parts: Vec<(PartitionKey, Arc<RwLock<Partition>>)>,
    /// Recompute mode: engine hash → the block in the index.
    blocks: HashMap<u64, EngineBlock, BuildHasherDefault<PassThroughHasher>>,
    /// Trust mode: recent blocks whose digest was recomputed (and agreed), so that the chains
    /// stored after them can be recorded in the chain cache too.
    trusted: Generations<TrustedParent>,
    scratch: Vec<u8>,
    extra: Vec<u8>,
    computed: Vec<(u64, Digest32)>,
}

impl EngineBlocks {
    /// State for a source in `slot`.
    pub fn new(slot: SourceSlot, spec: SourceSpec, profile: HashProfile) -> EngineBlocks {
        EngineBlocks {
            slot,
            tenant: tenant_or_default(&spec.tenant_id).to_owned(),
            spec,
            profile,
            parts: Vec::new(),
            blocks: HashMap::default(),
            trusted: Generations::new(TRUSTED_PARENTS_PER_GENERATION),
            scratch: Vec::new(),
            extra: Vec::new(),
            computed: Vec::new(),
        }
    }

    fn part(&mut self, index: &PrefixIndex, lora: Option<&str>) -> Result<u16, &'static str> {
        let key = partition_of(&self.spec, &self.tenant, lora);
        if let Some(i) = self.parts.iter().position(|(k, _)| *k == key) {
            return Ok(i as u16);
        }
        if self.parts.len() >= usize::from(u16::MAX) {
            return Err("too_many_partitions");
        }
        let p = index
            .partition_or_create(&key, &self.profile)
            .map_err(|_| "profile_mismatch")?;
        self.parts.push((key, p));
        Ok((self.parts.len() - 1) as u16)
    }

    /// Applies one event; returns how many blocks it touched, or why it was refused.
    pub fn apply(&mut self, index: &PrefixIndex, ev: &EngineEvent) -> Result<usize, &'static str> {
        match ev {
            EngineEvent::Stored(st) => self.store(index, st),
            EngineEvent::Removed {
                block_hashes,
                medium,
            } => {
                let tier = tier_of(medium.as_deref())?;
                Ok(self.remove(block_hashes, tier))
            }
            EngineEvent::Cleared => Ok(self.reset(index)),
        }
    }

    fn store(&mut self, index: &PrefixIndex, st: &StoredBlocks) -> Result<usize, &'static str> {
        let tier = tier_of(st.medium.as_deref())?;
        let bs = self.spec.block_size;
        if st.block_size.is_some_and(|b| b != bs) {
            return Err("block_size_mismatch");
        }
        let lora: Option<String> = st
            .lora_name
            .clone()
            .or_else(|| self.spec.lora_name.clone())
            .filter(|l| !l.is_empty());
        let lora = lora.as_deref();
        let part = self.part(index, lora)?;
        let partition = Arc::clone(&self.parts[usize::from(part)].1);
        let mut partition = partition.write();
        let chains = index.chains();
        if self.spec.engine_hashes == EngineHashes::Trust {
            for (i, h) in st.block_hashes.iter().enumerate() {
                if let Some(ahead) = st.block_hashes.get(i + STORE_AHEAD) {
                    partition.prefetch(*ahead);
                }
                partition.store(*h, self.slot, tier);
            }
            if chains.enabled() {
                self.remember_trusted(index, &partition, part, lora, st);
            }
            return Ok(st.block_hashes.len());
        }
        let n = st.block_hashes.len();
        if st.token_ids.len() != n * bs as usize {
            return Err("token_count_mismatch");
        }
        let (mut parent, mut parent_fast) = match st.parent {
            None => (None, partition.chain_root()),
            Some(p) => match self.blocks.get(&p.0) {
                Some(b) if b.part == part => (Some(b.digest), b.fast),
                _ => return Err("unknown_parent"),
            },
        };
        let extras = st.extra_keys.as_ref().filter(|e| e.len() == n);
        let lora_key = lora.filter(|_| self.profile.hashes_extras());
        self.computed.clear();
        for (i, engine_hash) in st.block_hashes.iter().enumerate() {
            let tokens = &st.token_ids[i * bs as usize..(i + 1) * bs as usize];
            let extra = match extras {
                Some(e) => Extra::Reported(e[i].as_deref()),
                None => Extra::Request {
                    lora_name: lora_key,
                    cache_salt: None,
                },
            };
            let digest = self
                .profile
                .block_with(&mut self.scratch, parent.as_ref(), tokens, extra);
            let fast = if chains.enabled() {
                self.extra.clear();
                extra.encode_for(&self.profile, &mut self.extra);
                let fast = chains.fast_key(parent_fast, tokens, &self.extra);
                self.computed.push((fast, digest));
                fast
            } else {
                0
            };
            let hash = BlockHash::from_digest(&digest);
            self.keep_stored(
                &mut partition,
                (*engine_hash, hash, digest, fast),
                part,
                tier,
            );
            parent = Some(digest);
            parent_fast = fast;
        }
        chains.record(&self.computed);
        Ok(n)
    }

    /// Indexes one recomputed block (`(engine hash, index hash, digest, fast key)`) for this
    /// source in `tier`, and maps the engine's hash to it. An engine hash that named other
    /// content before drops the old block first.
    fn keep_stored(
        &mut self,
        partition: &mut Partition,
        (engine_hash, hash, digest, fast): (BlockHash, BlockHash, Digest32, u64),
        part: u16,
        tier: Tier,
    ) {
        partition.store(hash, self.slot, tier);
        let entry = self.blocks.entry(engine_hash.0).or_insert(EngineBlock {
            index: hash,
            digest,
            fast,
            part,
            tiers: TierMask::EMPTY,
        });
        if entry.index != hash {
            // the engine reused a hash for other content: the old block is gone
            let old = *entry;
            if let Some((_, p)) = self.parts.get(usize::from(old.part)) {
                if old.part == part {
                    partition.remove_all_tiers(old.index, self.slot);
                    partition.store(hash, self.slot, tier);
                } else {
                    p.write().remove_all_tiers(old.index, self.slot);
                }
            }
            *entry = EngineBlock {
                index: hash,
                digest,
                fast,
                part,
                tiers: TierMask::EMPTY,
            };
        }
        entry.tiers = entry.tiers.with(tier);
    }

    /// Trust mode: recomputes the digests of stored blocks that came with their tokens, after
    /// a parent this source stored recently (or from the root), and records them in the chain
    /// cache while they agree with the engine's hashes. A disagreement (the engine does not run
    /// the partition's profile) is counted and ends the chain there; the index keeps the
    /// engine's hashes either way.
    fn remember_trusted(
        &mut self,
        index: &PrefixIndex,
        partition: &Partition,
        part: u16,
        lora: Option<&str>,
        st: &StoredBlocks,
    ) {
        let bs = self.spec.block_size as usize;
        let n = st.block_hashes.len();
        if n == 0 || st.token_ids.len() != n * bs {
            return;
        }
        let (mut parent, mut parent_fast) = match st.parent {
            None => (None, partition.chain_root()),
            Some(p) => match self.trusted.get(p.0) {
                Some((t, _)) if t.part == part => (Some(t.digest), t.fast),
                _ => return,
            },
        };
        let chains = index.chains();
        let extras = st.extra_keys.as_ref().filter(|e| e.len() == n);
        let lora_key = lora.filter(|_| self.profile.hashes_extras());
        self.computed.clear();
        for (i, engine_hash) in st.block_hashes.iter().enumerate() {
            let tokens = &st.token_ids[i * bs..(i + 1) * bs];
            let extra = match extras {
                Some(e) => Extra::Reported(e[i].as_deref()),
                None => Extra::Request {
                    lora_name: lora_key,
                    cache_salt: None,
                },
            };
            let digest = self
                .profile
                .block_with(&mut self.scratch, parent.as_ref(), tokens, extra);
            if BlockHash::from_digest(&digest) != *engine_hash {
                chains.stats().trusted_mismatches.inc();
                break;
            }
            self.extra.clear();
            extra.encode_for(&self.profile, &mut self.extra);
            let fast = chains.fast_key(parent_fast, tokens, &self.extra);
            self.computed.push((fast, digest));
            self.trusted
                .insert(engine_hash.0, TrustedParent { part, fast, digest });
            parent = Some(digest);
            parent_fast = fast;
        }
        chains.record(&self.computed);
    }

    fn remove(&mut self, hashes: &[BlockHash], tier: Tier) -> usize {
        let mut touched = 0;
        if self.spec.engine_hashes == EngineHashes::Trust {
            for (_, p) in &self.parts {
                let mut p = p.write();
                for h in hashes {
                    touched += usize::from(p.remove(*h, self.slot, tier));
                }
            }
            return touched;
        }
        for h in hashes {
            let Some(b) = self.blocks.get_mut(&h.0) else {
                continue;
            };
            b.tiers = b.tiers.without(tier);
            let (index, part, empty) = (b.index, b.part, b.tiers.is_empty());
            if empty {
                self.blocks.remove(&h.0);
            }
            if let Some((_, p)) = self.parts.get(usize::from(part)) {
                touched += usize::from(p.write().remove(index, self.slot, tier));
            }
        }
        touched
    }

    /// Drops every block of the source; returns how many it held.
    pub fn reset(&mut self, index: &PrefixIndex) -> usize {
        self.blocks = HashMap::default();
        self.trusted.clear();
        index.remove_source(self.slot)
    }

    /// Engine blocks tracked for hash mapping (recompute mode).
    pub fn tracked(&self) -> usize {
        self.blocks.len()
    }
}

fn tier_of(medium: Option<&str>) -> Result<Tier, &'static str> {
    match medium {
        None => Ok(Tier::Gpu),
        Some(m) => Tier::from_medium(m).ok_or("unknown_medium"),
    }
}

/// The SUB socket of an engine source.
pub struct EngineSubscriber {
    // The socket must close before its context terminates.
    sub: zmq::Socket,
    zmq: zmq::Context,
}

fn socket_err(op: &'static str, endpoint: &str) -> impl FnOnce(zmq::Error) -> IndexerError {
    let endpoint = endpoint.to_owned();
    move |source| IndexerError::Socket {
        op,
        endpoint,
        source,
    }
}

impl EngineSubscriber {
    /// Connects a SUB socket, subscribed to every topic.
    pub fn connect(spec: &SourceSpec) -> Result<EngineSubscriber, IndexerError> {
        let ep = spec.endpoint.as_str();
        let zmq = zmq::Context::new();
        let sub = zmq.socket(zmq::SUB).map_err(socket_err("socket", ep))?;
        sub.set_rcvtimeo(POLL.as_millis() as i32)
            .map_err(socket_err("set RCVTIMEO", ep))?;
        sub.set_rcvhwm(100_000)
            .map_err(socket_err("set RCVHWM", ep))?;
        sub.set_maxmsgsize(64 << 20)
            .map_err(socket_err("set MAXMSGSIZE", ep))?;
        sub.set_linger(0).map_err(socket_err("set LINGER", ep))?;
        sub.set_reconnect_ivl(100)
            .map_err(socket_err("set RECONNECT_IVL", ep))?;
        sub.set_reconnect_ivl_max(5_000)
            .map_err(socket_err("set RECONNECT_IVL_MAX", ep))?;
        sub.set_subscribe(b"")
            .map_err(socket_err("subscribe", ep))?;
        sub.connect(ep).map_err(socket_err("connect", ep))?;
        Ok(EngineSubscriber { sub, zmq })
    }

    /// Receives and applies messages until the source is unregistered.
    pub fn run(self, ctx: SourceCtx) {
        let mut state = EngineStream {
            blocks: EngineBlocks::new(ctx.slot, ctx.spec.clone(), ctx.profile.clone()),
            last: None,
            replayed: None,
        };
        ctx.status.lock().live = true;
        while !ctx.stopping() {
            match self.sub.recv_multipart(0) {
                Ok(frames) => state.on_message(&ctx, &self.zmq, frames),
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {}
                Err(e) => {
                    tracing::warn!(endpoint = %ctx.spec.endpoint, error = %e, "engine stream receive failed");
                    std::thread::sleep(POLL);
                }
            }
        }
    }
}

struct EngineStream {
    blocks: EngineBlocks,
    last: Option<u64>,
    /// Sequence numbers that arrived by replay: live copies of them are duplicates.
    replayed: Option<(u64, u64)>,
}

fn sequence(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

impl EngineStream {
    fn on_message(&mut self, ctx: &SourceCtx, zmq: &zmq::Context, frames: Vec<Vec<u8>>) {
        ctx.status.lock().messages += 1;
        let seq = match (frames.len(), frames.get(1).and_then(|f| sequence(f))) {
            (3, Some(seq)) => seq,
            _ => {
                ctx.indexer.metrics().reject("envelope");
                ctx.status.lock().malformed_messages += 1;
                return;
            }
        };
        if self
            .replayed
            .is_some_and(|(from, to)| (from..=to).contains(&seq))
        {
            return; // already applied from the replay
        }
        self.replayed = None;
        let kind = ctx.spec.source_type.as_str();
        match self.last {
            None => {}
            Some(last) if seq == last.wrapping_add(1) => {}
            Some(last) if seq > last => {
                ctx.status.lock().gaps += 1;
                crate::metrics::Metrics::by_type(&ctx.indexer.metrics().gaps, kind);
                tracing::info!(endpoint = %ctx.spec.endpoint, last, seq, "engine stream gap");
                self.repair(ctx, zmq, last + 1);
                if self.last.is_some_and(|l| seq <= l) {
                    return; // the replay covered this message too
                }
            }
            Some(last) => {
                ctx.status.lock().restarts += 1;
                crate::metrics::Metrics::by_type(&ctx.indexer.metrics().restarts, kind);
                tracing::info!(endpoint = %ctx.spec.endpoint, last, seq, "engine publisher restarted");
                self.reset(ctx);
            }
        }
        self.apply(ctx, seq, &frames[2]);
    }

    /// Replays from `from`; anything short of a complete repair drops the source's blocks.
    fn repair(&mut self, ctx: &SourceCtx, zmq: &zmq::Context, from: u64) {
        let metrics = ctx.indexer.metrics();
        let result = |r: &str| {
            metrics
                .replays
                .get_or_create(&vec![("result", r.to_owned())])
                .inc();
        };
        let Some(endpoint) = ctx.spec.replay_endpoint.as_deref() else {
            self.reset(ctx);
            return;
        };
        match replay(zmq, endpoint, from) {
            Ok(batches) if batches.first().is_some_and(|(s, _)| *s == from) => {
                result("repaired");
                ctx.status.lock().repaired_gaps += 1;
                for (seq, payload) in batches {
                    if self.last.is_none_or(|l| seq > l) {
                        self.apply(ctx, seq, &payload);
                    }
                }
                self.replayed = self.last.map(|l| (from, l));
            }
            Ok(batches) => {
                result("history_lost");
                self.reset(ctx);
                let first = batches.first().map(|(s, _)| *s);
                for (seq, payload) in batches {
                    self.apply(ctx, seq, &payload);
                }
                self.replayed = first.zip(self.last);
            }
            Err(e) => {
                result(if e == "timeout" { "timeout" } else { "failed" });
                tracing::warn!(
                    endpoint,
                    error = e,
                    "replay failed; dropping the source's blocks"
                );
                self.reset(ctx);
            }
        }
    }

    fn reset(&mut self, ctx: &SourceCtx) {
        self.blocks.reset(ctx.indexer.index());
        ctx.status.lock().resets += 1;
        crate::metrics::Metrics::by_type(
            &ctx.indexer.metrics().source_resets,
            ctx.spec.source_type.as_str(),
        );
    }

    fn apply(&mut self, ctx: &SourceCtx, seq: u64, payload: &[u8]) {
        self.last = Some(seq);
        let metrics = ctx.indexer.metrics();
        let batch = match decode_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(seq, error = %e, "malformed engine message");
                metrics.reject("malformed_message");
                let mut s = ctx.status.lock();
                s.malformed_messages += 1;
                s.last_sequence = Some(seq);
                return;
            }
        };
        if batch
            .dp_rank
            .is_some_and(|r| r != i64::from(ctx.spec.dp_rank))
        {
            metrics.reject("dp_rank_mismatch");
            let mut s = ctx.status.lock();
            s.malformed_messages += 1;
            s.last_sequence = Some(seq);
            return;
        }
        let kind = ctx.spec.source_type.as_str();
        let (mut applied, mut rejected) = (0u64, batch.rejected.len() as u64);
        for e in &batch.rejected {
            tracing::debug!(seq, error = %e, "engine event rejected");
            metrics.reject("malformed_event");
        }
        for ev in &batch.events {
            match self.blocks.apply(ctx.indexer.index(), ev) {
                Ok(_) => {
                    applied += 1;
                    let name = match ev {
                        EngineEvent::Stored(_) => "stored",
                        EngineEvent::Removed { .. } => "removed",
                        EngineEvent::Cleared => "cleared",
                    };
                    metrics.applied(kind, name, 1);
                }
                Err(reason) => {
                    rejected += 1;
                    metrics.reject(reason);
                }
            }
        }
        let mut s = ctx.status.lock();
        s.events += applied;
        s.rejected_events += rejected;
        s.last_sequence = Some(seq);
    }
}

/// Asks the engine's ROUTER for every batch from `from` on. Accepts vLLM's 4-frame replies
/// (`["", topic, seq, payload]`) and the older 3-frame ones (`["", seq, payload]`).
fn replay(
    zmq: &zmq::Context,
    endpoint: &str,
    from: u64,
) -> Result<Vec<(u64, Vec<u8>)>, &'static str> {
    let dealer = zmq.socket(zmq::DEALER).map_err(|_| "socket")?;
    dealer.set_linger(0).map_err(|_| "socket")?;
    dealer
        .set_rcvtimeo(POLL.as_millis() as i32)
        .map_err(|_| "socket")?;
    dealer.connect(endpoint).map_err(|_| "connect")?;
    dealer
        .send_multipart([&b""[..], &from.to_be_bytes()[..]], 0)
        .map_err(|_| "send")?;
    let deadline = Instant::now() + REPLAY_TIMEOUT;
    let mut out = Vec::new();
    loop {
        if Instant::now() > deadline {
            return Err("timeout");
        }
        let frames = match dealer.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => continue,
            Err(_) => return Err("receive"),
        };
        let (seq, payload) = match frames.as_slice() {
            [d, seq, payload] if d.is_empty() => (seq, payload),
            [d, _topic, seq, payload] if d.is_empty() => (seq, payload),
            _ => return Err("reply_shape"),
        };
        if seq.as_slice() == REPLAY_END {
            return Ok(out);
        }
        let seq = sequence(seq).ok_or("reply_sequence")?;
        out.push((seq, payload.clone()));
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
