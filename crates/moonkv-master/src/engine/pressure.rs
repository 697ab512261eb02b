//! The disk tier under pressure: puts that wait for offloads instead of failing at once, disk
//! eviction (least recently used disk replicas, leases and pins respected), and the counters
//! that show where memory went (offloaded, dropped, backlog).
//!
//! A request that removed disk replicas (Remove, an upsert replacing a value, ...) is answered
//! only once the nodes have deleted the files, or after `disk_removal_ack_wait_ms`: a removal
//! the caller was told about cannot come back from a file after a master restart.
//!
//! A PutStart that finds no memory while a disk is mounted is held by the RPC layer and retried
//! until it fits or `put_space_wait_ms` (engine clock) has passed; [`Engine::space_wait_deadline`]
//! says whether to hold it, [`Engine::space_wait_over`] when to give up. A put that gives up
//! marks the tier stalled: the next eviction round drops memory copies plainly, so a disk that
//! cannot keep up never blocks writers for longer than the bound.

use super::disk::DiskSlot;
use super::object::{ObjectMeta, Placement};
use super::shard::After;
use super::Engine;
use moonkv_proto::{ErrorCode, Result, SegmentId, TenantId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The message of a Start that found no memory (the only failure a held put waits out).
pub(crate) const NO_MEMORY: &str = "no segment has room for the object";

/// The message of a write-through that found no disk room yet, where disk eviction can make
/// some (held like a put that found no memory).
pub(crate) const NO_DISK_YET: &str =
    "no mounted disk has room for the disk replica yet (disk eviction is making room)";

/// Whether a Start failed for want of room the tier can make: memory (offload) or disk (disk
/// eviction). A disk that cannot make room fails the Start for good.
pub fn found_no_memory<T>(result: &Result<T>) -> bool {
    matches!(result, Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE
        && (e.message == NO_MEMORY || e.message == NO_DISK_YET))
}

/// Counters of the disk tier under pressure.
#[derive(Debug, Default)]
pub(crate) struct TierCounters {
    /// Object bytes whose offload landed.
    pub(crate) offloaded_bytes: AtomicU64,
    /// Objects whose last readable copy was dropped by eviction (memory or disk).
    pub(crate) dropped_objects: AtomicU64,
    /// Their bytes.
    pub(crate) dropped_bytes: AtomicU64,
    /// Disk replicas removed by disk eviction.
    pub(crate) disk_evicted_objects: AtomicU64,
    /// Their object bytes.
    pub(crate) disk_evicted_bytes: AtomicU64,
    /// PutStarts held because memory was full and an offload could free it.
    pub(crate) put_space_waits: AtomicU64,
    /// Held PutStarts that gave up after `put_space_wait_ms`.
    pub(crate) put_space_wait_timeouts: AtomicU64,
    /// Promotion on hit (`promote.rs`).
    pub(crate) promotions: Arc<super::promote::Promotions>,
}

/// The tier's figures, for stats and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    /// Object bytes whose offload landed.
    pub offloaded_bytes: u64,
    /// Offloads in flight.
    pub offload_backlog: u64,
    /// Object bytes of the offloads in flight.
    pub offload_backlog_bytes: u64,
    /// Objects lost to eviction (no copy left anywhere).
    pub dropped_objects: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
    /// Disk replicas removed by disk eviction.
    pub disk_evicted_objects: u64,
    /// Their object bytes.
    pub disk_evicted_bytes: u64,
    /// PutStarts held for offloads.
    pub put_space_waits: u64,
    /// Held PutStarts that gave up.
    pub put_space_wait_timeouts: u64,
}

/// One disk replica disk eviction may remove.
struct DiskCandidate {
    last_use: u64,
    soft_pinned: bool,
    shard: usize,
    tenant: String,
    key: Box<str>,
}

impl Engine {
    /// The tier's counters.
    pub fn tier_stats(&self) -> TierStats {
        let c = &self.counters.tier;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TierStats {
            offloaded_bytes: load(&c.offloaded_bytes),
            offload_backlog: self.pending_offloads.count(),
            offload_backlog_bytes: self.pending_offloads.bytes(),
            dropped_objects: load(&c.dropped_objects),
            dropped_bytes: load(&c.dropped_bytes),
            disk_evicted_objects: load(&c.disk_evicted_objects),
            disk_evicted_bytes: load(&c.disk_evicted_bytes),
            put_space_waits: load(&c.put_space_waits),
            put_space_wait_timeouts: load(&c.put_space_wait_timeouts),
        }
    }

    /// Whether a PutStart that failed with `result` should be held and retried: it found no
    /// memory, a disk is mounted, and waiting is allowed. Returns the engine-clock deadline.
    pub fn space_wait_deadline<T>(&self, result: &Result<T>) -> Option<u64> {
        if !found_no_memory(result)
            || self.config.put_space_wait_ms == 0
            || !self.any_disk_mounted()
        {
            return None;
        }
        self.counters
            .tier
            .put_space_waits
            .fetch_add(1, Ordering::Relaxed);
        Some(self.now().saturating_add(self.config.put_space_wait_ms))
    }

    /// Whether a held PutStart must give up now (its deadline passed, or no disk is mounted any
    /// more). Giving up marks the tier stalled: the next eviction round drops plainly.
    pub fn space_wait_over(&self, deadline_ms: u64) -> bool {
        if self.now() < deadline_ms && self.any_disk_mounted() {
            return false;
        }
        self.counters
            .tier
            .put_space_wait_timeouts
            .fetch_add(1, Ordering::Relaxed);
        self.offload_stalled.store(true, Ordering::Release);
        self.need_eviction.store(true, Ordering::Release);
        true
    }

    /// The number of the latest disk-file deletion queued: compare before and after a request
    /// to see whether it removed disk replicas.
    pub fn deletion_seq(&self) -> u64 {
        super::disk::deletion_seq()
    }

    /// Whether every deletion numbered up to `seq` on a mounted disk has been carried out by
    /// its node (file unlinked, directory synced). Detached disks are not waited for: their
    /// tombstones keep the files out while this master lives.
    pub fn deletions_done_through(&self, seq: u64) -> bool {
        let registry = self.disks.read();
        !registry
            .by_client
            .values()
            .filter_map(|id| registry.by_id.get(id))
            .any(|slot| slot.is_mounted() && slot.memory.unacked_through(seq))
    }

    /// The engine-clock deadline for holding an answer until its deletions are done.
    pub fn deletion_wait_deadline(&self) -> u64 {
        self.now()
            .saturating_add(self.config.disk_removal_ack_wait_ms)
    }

    /// Whether `deadline_ms` (from [`Engine::deletion_wait_deadline`]) has passed.
    pub fn past(&self, deadline_ms: u64) -> bool {
        self.now() >= deadline_ms
    }

    pub(crate) fn any_disk_mounted(&self) -> bool {
        !self.disks.read().by_client.is_empty()
    }

    /// Counts an object whose last readable copy went away.
    pub(crate) fn count_dropped(&self, obj: &ObjectMeta) {
        if !obj.has_readable() {
            let c = &self.counters.tier;
            c.dropped_objects.fetch_add(1, Ordering::Relaxed);
            c.dropped_bytes.fetch_add(obj.size, Ordering::Relaxed);
        }
    }

    /// Disk eviction: every mounted disk above its high watermark, or short of room for an
    /// offload (`deficits`: bytes wanted per disk), drops its least recently used disk replicas
    /// — unleased, not hard-pinned, soft-pinned last and only if allowed — down to its low
    /// watermark (and the deficit). A disk that cannot free what an offload needs is marked
    /// full, so eviction drops the memory copies bound for it instead of waiting. Returns the
    /// disk replicas removed.
    pub(crate) fn run_disk_eviction(&self, deficits: &HashMap<SegmentId, u64>) -> u64 {
        let (hw, lw) = (
            self.config.disk_eviction_high_watermark_ratio,
            self.config.disk_eviction_low_watermark_ratio,
        );
        let slots: Vec<(Arc<DiskSlot>, u64)> = {
            let registry = self.disks.read();
            registry
                .mounted_by_free_space()
                .into_iter()
                .filter_map(|slot| {
                    let cap = slot.info.capacity_bytes as f64;
                    // Removed files whose deletion is on its way count as freed already.
                    let releasing = slot.releasing_bytes();
                    let used = slot.used_bytes().saturating_sub(releasing);
                    let over = if used as f64 > cap * hw {
                        used.saturating_sub((cap * lw) as u64)
                    } else {
                        0
                    };
                    let wanted = slot.wanted.swap(0, Ordering::AcqRel);
                    let short = deficits
                        .get(&slot.info.id)
                        .map_or(0, |d| *d)
                        .max(wanted)
                        .saturating_sub(slot.free_bytes() + releasing);
                    let want = over.max(short);
                    if want == 0 {
                        slot.set_full(false);
                        None
                    } else {
                        Some((slot, want))
                    }
                })
                .collect()
        };
        let mut removed = 0;
        for (slot, want) in slots {
            let freed = self.evict_disk(&slot, want, &mut removed);
            slot.set_full(freed < want);
        }
        removed
    }

    /// Drops LRU disk replicas of `slot` until `want` bytes are freed; returns the bytes freed.
    fn evict_disk(&self, slot: &Arc<DiskSlot>, want: u64, removed: &mut u64) -> u64 {
        let now = self.now();
        let ttl = self.config.default_kv_lease_ttl_ms;
        let on_slot = |obj: &ObjectMeta| {
            obj.replicas
                .iter()
                .any(|r| r.is_readable() && r.disk().is_some_and(|f| Arc::ptr_eq(&f.slot, slot)))
        };
        let mut candidates = Vec::new();
        for i in 0..self.shards.len() {
            let shard = self.lock_shard(i);
            for (name, t) in shard.tenants.iter() {
                for (key, obj) in t.objects.iter() {
                    if obj.hard_pinned || obj.lease_active(now) || obj.in_flight || !on_slot(obj) {
                        continue;
                    }
                    candidates.push(DiskCandidate {
                        last_use: obj
                            .put_start_ms
                            .max(obj.lease_deadline_ms.saturating_sub(ttl)),
                        soft_pinned: obj.soft_pinned(now),
                        shard: i,
                        tenant: name.clone(),
                        key: Box::from(key),
                    });
                }
            }
        }
        let allow_pinned = self.config.allow_evict_soft_pinned_objects;
        candidates.retain(|c| allow_pinned || !c.soft_pinned);
        candidates.sort_by(|a, b| {
            (a.soft_pinned, a.last_use, &a.tenant, &a.key).cmp(&(
                b.soft_pinned,
                b.last_use,
                &b.tenant,
                &b.key,
            ))
        });
        let mut freed = 0u64;
        for c in candidates {
            if freed >= want {
                break;
            }
            let mut shard = self.lock_shard(c.shard);
            let got = self.with_object(&mut shard, &c.tenant, &c.key, |tenant, obj| {
                if obj.hard_pinned || obj.lease_active(now) || obj.in_flight || !on_slot(obj) {
                    return (0, After::Keep);
                }
                let bytes = self.drop_disk_copies(tenant, &c.key, obj, slot);
                let after = if obj.replicas.is_empty() {
                    After::Erase
                } else {
                    After::Keep
                };
                (bytes, after)
            });
            if let Some(bytes) = got.filter(|b| *b > 0) {
                freed += bytes;
                *removed += 1;
            }
        }
        if freed > 0 {
            tracing::debug!(disk = %slot.info.name, freed, "disk eviction");
        }
        freed
    }

    /// Drops the object's disk replicas on `slot` (emitting `removed disk` when the object
    /// loses the medium); returns the disk bytes freed.
    fn drop_disk_copies(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        slot: &Arc<DiskSlot>,
    ) -> u64 {
        let before = obj.media();
        let mut freed = 0;
        obj.replicas.retain(|r| match &r.placement {
            Placement::Disk(f) if Arc::ptr_eq(&f.slot, slot) => {
                freed += f.charge;
                false
            }
            _ => true,
        });
        if freed == 0 {
            return 0;
        }
        self.placement_changed(tenant, key, obj, before);
        let c = &self.counters.tier;
        c.disk_evicted_objects.fetch_add(1, Ordering::Relaxed);
        c.disk_evicted_bytes.fetch_add(obj.size, Ordering::Relaxed);
        self.count_dropped(obj);
        freed
    }
}
