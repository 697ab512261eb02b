//! moonkv and Mooncake master sources: the pool's CPU and disk tiers.
//!
//! The stream is followed by `moonkv-events`' [`Subscriber`] with an [`IndexSync`]: its
//! placement index (object key → media) is kept exact across gaps, publisher restarts and late
//! joins by a snapshot from the master's admin port (moonkv), or is wiped on any loss when the
//! master has no snapshot (Mooncake). The prefix index is then derived from that placement: a
//! key touched by an event is re-read from it, and any recovery or wipe re-derives the whole
//! source. While a snapshot is awaited the source's blocks are withheld, never stale.
//!
//! Several objects can name one block (SGLang writes `_k` and `_v` per TP rank, vLLM one key
//! per rank); a block is in a tier while at least one of its objects is.

use std::collections::HashMap;
use std::sync::Arc;

use moonkv_events::{
    Delivery, EventKind, HttpSnapshotSource, IndexSync, MediaSet, Medium, PlacementIndex,
    SnapshotSource, Subscriber,
};
use parking_lot::RwLock;

use super::{SourceCtx, POLL};
use crate::api::SourceSpec;
use crate::error::IndexerError;
use crate::hash::HashProfile;
use crate::ids::{BlockHash, SourceSlot, Tier};
use crate::index::{Partition, PrefixIndex};
use crate::keys::recognize;
use crate::metrics::Metrics;
use crate::state::partition_of;

fn tier(m: Medium) -> Tier {
    match m {
        Medium::Cpu => Tier::Cpu,
        Medium::Disk => Tier::Disk,
    }
}

fn slot_of(m: Medium) -> usize {
    match m {
        Medium::Cpu => 0,
        Medium::Disk => 1,
    }
}

/// The blocks a store source contributes, derived from its placement.
pub struct PoolBlocks {
    slot: SourceSlot,
    spec: SourceSpec,
    profile: HashProfile,
    /// (tenant, key) → the block it names and the media applied for it.
    keys: HashMap<(String, String), (BlockHash, MediaSet)>,
    /// (tenant, block) → objects per medium (cpu, disk).
    counts: HashMap<(String, u64), [u32; 2]>,
    parts: HashMap<String, Arc<RwLock<Partition>>>,
}

/// Why a key contributes no block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// No connector grammar fits it.
    Unrecognized,
    /// It names another model than the source's.
    OtherModel,
    /// Its tenant's partition hashes with another profile.
    ProfileMismatch,
}

impl Skipped {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Skipped::Unrecognized => "unrecognized",
            Skipped::OtherModel => "other_model",
            Skipped::ProfileMismatch => "profile_mismatch",
        }
    }
}

impl PoolBlocks {
    /// State for a source in `slot`.
    pub fn new(slot: SourceSlot, spec: SourceSpec, profile: HashProfile) -> PoolBlocks {
        PoolBlocks {
            slot,
            spec,
            profile,
            keys: HashMap::new(),
            counts: HashMap::new(),
            parts: HashMap::new(),
        }
    }

    fn part(
        &mut self,
        index: &PrefixIndex,
        tenant: &str,
    ) -> Result<Arc<RwLock<Partition>>, Skipped> {
        if let Some(p) = self.parts.get(tenant) {
            return Ok(Arc::clone(p));
        }
        let key = partition_of(&self.spec, tenant, self.spec.lora_name.as_deref());
        let p = index
            .partition_or_create(&key, &self.profile)
            .map_err(|_| Skipped::ProfileMismatch)?;
        self.parts.insert(tenant.to_owned(), Arc::clone(&p));
        Ok(p)
    }

    /// Makes `(tenant, key)` contribute exactly `media`. Returns why it contributes nothing,
    /// if it does not (media empty is not a skip).
    pub fn set_key(
        &mut self,
        index: &PrefixIndex,
        tenant: &str,
        key: &str,
        media: MediaSet,
    ) -> Result<(), Skipped> {
        let id = (tenant.to_owned(), key.to_owned());
        let old = self.keys.get(&id).copied();
        let hash = match old {
            Some((h, _)) => h,
            None if media.is_empty() => return Ok(()),
            None => {
                let k = recognize(self.spec.key_format, key).ok_or(Skipped::Unrecognized)?;
                if k.model.is_some_and(|m| m != self.spec.modelname) {
                    return Err(Skipped::OtherModel);
                }
                k.hash
            }
        };
        let old_media = old.map_or(MediaSet::EMPTY, |(_, m)| m);
        if old_media == media {
            return Ok(());
        }
        let part = self.part(index, tenant)?;
        let mut part = part.write();
        let counts = self.counts.entry((tenant.to_owned(), hash.0)).or_default();
        for m in [Medium::Cpu, Medium::Disk] {
            let c = &mut counts[slot_of(m)];
            match (old_media.contains(m), media.contains(m)) {
                (false, true) => {
                    *c += 1;
                    if *c == 1 {
                        part.store(hash, self.slot, tier(m));
                    }
                }
                (true, false) => {
                    *c = c.saturating_sub(1);
                    if *c == 0 {
                        part.remove(hash, self.slot, tier(m));
                    }
                }
                _ => {}
            }
        }
        if *counts == [0, 0] {
            self.counts.remove(&(tenant.to_owned(), hash.0));
        }
        if media.is_empty() {
            self.keys.remove(&id);
        } else {
            self.keys.insert(id, (hash, media));
        }
        Ok(())
    }

    /// Drops everything the source contributes.
    pub fn clear(&mut self, index: &PrefixIndex) {
        self.keys.clear();
        self.counts.clear();
        index.remove_source(self.slot);
    }

    /// Re-derives the source from `placement` (`None`: withhold everything). Returns how many
    /// keys were skipped, by reason.
    pub fn rebuild(
        &mut self,
        index: &PrefixIndex,
        placement: Option<&PlacementIndex>,
    ) -> Vec<Skipped> {
        self.clear(index);
        let mut skipped = Vec::new();
        for e in placement.map(PlacementIndex::entries).unwrap_or_default() {
            if let Err(s) = self.set_key(index, &e.tenant_id, &e.object_key, e.media) {
                skipped.push(s);
            }
        }
        skipped
    }

    /// Objects currently contributing.
    pub fn objects(&self) -> usize {
        self.keys.len()
    }
}

/// The subscriber of a store source.
pub struct PoolSubscriber {
    sub: Subscriber,
}

impl PoolSubscriber {
    /// Connects to the master's stream; with `admin`, recovers through its snapshots.
    pub fn connect(spec: &SourceSpec) -> Result<PoolSubscriber, IndexerError> {
        let snapshots: Option<Box<dyn SnapshotSource + Send>> = match &spec.admin {
            Some(admin) => Some(Box::new(HttpSnapshotSource::new(admin)?)),
            None => None,
        };
        let sync = IndexSync::new(snapshots, None).with_retry_interval(POLL * 5);
        let sub = Subscriber::connect(&spec.endpoint, POLL)?.with_index(sync);
        Ok(PoolSubscriber { sub })
    }

    /// Polls and applies until the source is unregistered.
    pub fn run(mut self, ctx: SourceCtx) {
        let mut blocks = PoolBlocks::new(ctx.slot, ctx.spec.clone(), ctx.profile.clone());
        let index = ctx.indexer.index();
        let metrics = ctx.indexer.metrics();
        let kind = ctx.spec.source_type.as_str();
        let mut seen = self.sub.counters();
        let mut seen_sync = recovery_state(&self.sub);
        while !ctx.stopping() {
            let delivery = match self.sub.poll() {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(endpoint = %ctx.spec.endpoint, error = %e, "store stream receive failed");
                    std::thread::sleep(POLL);
                    continue;
                }
            };
            let c = self.sub.counters();
            for _ in seen.gaps..c.gaps {
                Metrics::by_type(&metrics.gaps, kind);
            }
            for _ in seen.restarts..c.restarts {
                Metrics::by_type(&metrics.restarts, kind);
            }
            let sync_now = recovery_state(&self.sub);
            let placement = self
                .sub
                .sync()
                .filter(|s| s.is_live())
                .map(IndexSync::index);
            if sync_now != seen_sync {
                if placement.is_none() || sync_now.2 > seen_sync.2 {
                    Metrics::by_type(&metrics.source_resets, kind);
                }
                for s in blocks.rebuild(index, placement) {
                    count_skip(&ctx, s);
                }
            } else if let (Delivery::Message { message, .. }, Some(placement)) =
                (&delivery, placement)
            {
                let mut rebuilt = false;
                for ev in &message.events {
                    metrics.applied(kind, ev.kind.as_str(), 1);
                    if rebuilt {
                        continue;
                    }
                    if ev.kind == EventKind::Cleared {
                        rebuilt = true;
                        for s in blocks.rebuild(index, Some(placement)) {
                            count_skip(&ctx, s);
                        }
                        continue;
                    }
                    let (Some(backend), Some(tenant), Some(key)) = (
                        ev.backend_id.as_deref(),
                        ev.tenant_id.as_deref(),
                        ev.object_key.as_deref(),
                    ) else {
                        metrics.reject("unindexable_event");
                        continue;
                    };
                    let media = placement.media(backend, tenant, key);
                    if let Err(s) = blocks.set_key(index, tenant, key, media) {
                        count_skip(&ctx, s);
                    }
                }
            }
            let mut s = ctx.status.lock();
            s.messages = c.messages;
            s.events = c.events;
            s.rejected_events = c.rejected_events;
            s.malformed_messages = c.malformed;
            s.gaps = c.gaps;
            s.restarts = c.restarts;
            s.last_sequence = c.last_sequence;
            s.resets = sync_now.2;
            s.live = sync_now.0;
            seen = c;
            seen_sync = sync_now;
        }
    }
}

/// (live, recoveries, invalidations): a change in any means the placement was replaced.
fn recovery_state(sub: &Subscriber) -> (bool, u64, u64) {
    sub.sync().map_or((false, 0, 0), |s| {
        let c = s.counters();
        (s.is_live(), c.recoveries, c.invalidations)
    })
}

fn count_skip(ctx: &SourceCtx, s: Skipped) {
    ctx.indexer
        .metrics()
        .unrecognized_keys
        .get_or_create(&vec![("reason", s.as_str().to_owned())])
        .inc();
    ctx.status.lock().unrecognized_keys += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SourceType;
    use crate::keys::KeyFormat;

    fn spec() -> SourceSpec {
        SourceSpec {
            endpoint: "tcp://127.0.0.1:1".into(),
            replay_endpoint: None,
            source_type: SourceType::Moonkv,
            modelname: "m".into(),
            lora_name: None,
            tenant_id: None,
            instance_id: "pool".into(),
            block_size: 16,
            dp_rank: 0,
            additionalsalt: None,
            hash_profile: None,
            engine_hashes: Default::default(),
            key_format: KeyFormat::Auto,
            admin: None,
        }
    }

    const D: &str = "00112233445566778899aabbccddeeff00112233445566770000000000000007";

    #[test]
    fn a_block_stays_while_any_of_its_objects_does() {
        let index = PrefixIndex::new();
        let mut pool = PoolBlocks::new(SourceSlot(0), spec(), HashProfile::vllm("0"));
        let cpu = MediaSet::of(&[Medium::Cpu]);
        let both = MediaSet::of(&[Medium::Cpu, Medium::Disk]);
        let (k, v) = (format!("{D}_0_k"), format!("{D}_0_v"));
        pool.set_key(&index, "t", &k, cpu).unwrap();
        pool.set_key(&index, "t", &v, both).unwrap();
        let key = partition_of(&spec(), "t", None);
        let holders = |index: &PrefixIndex| {
            index
                .partition(&key)
                .and_then(|p| p.read().holders(BlockHash(7)).map(|h| h[0].tiers))
        };
        let t = holders(&index).unwrap();
        assert!(t.contains(Tier::Cpu) && t.contains(Tier::Disk));
        pool.set_key(&index, "t", &v, cpu).unwrap();
        assert!(!holders(&index).unwrap().contains(Tier::Disk));
        pool.set_key(&index, "t", &k, MediaSet::EMPTY).unwrap();
        assert!(holders(&index).unwrap().contains(Tier::Cpu));
        pool.set_key(&index, "t", &v, MediaSet::EMPTY).unwrap();
        assert_eq!(holders(&index), None);
        assert_eq!(pool.objects(), 0);
    }

    #[test]
    fn unknown_and_foreign_keys_are_skipped_not_guessed() {
        let index = PrefixIndex::new();
        let mut pool = PoolBlocks::new(SourceSlot(0), spec(), HashProfile::vllm("0"));
        let cpu = MediaSet::of(&[Medium::Cpu]);
        assert_eq!(
            pool.set_key(&index, "t", "user-object", cpu),
            Err(Skipped::Unrecognized)
        );
        let other = format!("other@tp_rank:0@pcp0@dcp0@pp_rank:0@{D}");
        assert_eq!(
            pool.set_key(&index, "t", &other, cpu),
            Err(Skipped::OtherModel)
        );
        // removing a key never seen is not a skip
        assert_eq!(
            pool.set_key(&index, "t", "user-object", MediaSet::EMPTY),
            Ok(())
        );
        assert_eq!(index.blocks(), 0);
    }
}
