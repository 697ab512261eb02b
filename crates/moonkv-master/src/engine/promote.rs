//! Promotion on hit: a read served from disk brings the object back into memory.
//!
//! A GetReplicaList of an object readable only on disk counts a hit; once an object has been
//! read `promotion_admission_threshold` times (2 by default: read more than once) and memory
//! use is below the offload watermark (the eviction watermark without one), the engine
//! allocates a PROCESSING memory replica on a segment of the node holding the file and queues a
//! [`PromotionTask`] for that node, at most `promotion_queue_limit` at a time. The replica is
//! kept beside the object (not readable, not seen by writes: readers keep getting the disk
//! replica, so no read is ever torn) until the node reports it filled; then it becomes COMPLETE
//! — **`stored cpu`**. The counters follow upstream's `master_promotion_*` family: rejected by
//! frequency, watermark or cap; admitted; completed (and bytes); failed (the node reported a
//! failure); cancelled (the object or its segment went away meanwhile); expired (not reported
//! within `put_start_release_timeout`).

use super::disk::{OffloadBacklog, PendingOffload};
use super::object::{ObjectMeta, Placement, Replica};
use super::segments::MemBuffer;
use super::Engine;
use moonkv_proto::{ClientId, PromotionTask, ReplicaKind, ReplicaStatus, Result, TenantId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Distinct objects whose hits are counted at once; the counts restart beyond this.
const MAX_TRACKED_HITS: usize = 1 << 20;

/// Promotion state shared by the engine and every pending promotion.
#[derive(Debug, Default)]
pub(crate) struct Promotions {
    backlog: Arc<OffloadBacklog>,
    hits: Mutex<HashMap<(String, Box<str>), u32>>,
    mailboxes: Mutex<HashMap<ClientId, Vec<PromotionTask>>>,
    /// Buffers of promotions dropped unresolved, with the deadline after which the node can no
    /// longer be writing into them.
    buried: Mutex<Vec<(u64, Replica)>>,
    admitted: AtomicU64,
    completed: AtomicU64,
    completed_bytes: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    expired: AtomicU64,
    rejected_frequency: AtomicU64,
    rejected_watermark: AtomicU64,
    rejected_cap: AtomicU64,
}

/// Promotion figures, named after upstream's `master_promotion_*` metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PromotionStats {
    /// Promotions admitted and not yet ended.
    pub in_flight: u64,
    /// Promotions admitted past every gate.
    pub admitted: u64,
    /// Promotions that landed (`stored cpu`).
    pub completed: u64,
    /// Object bytes promoted.
    pub completed_bytes: u64,
    /// Promotions the node reported failed.
    pub failed: u64,
    /// Promotions whose object or segment went away meanwhile.
    pub cancelled: u64,
    /// Promotions not reported in time.
    pub expired: u64,
    /// Hits below the admission threshold.
    pub rejected_frequency: u64,
    /// Hits while memory was at or above the watermark.
    pub rejected_watermark: u64,
    /// Hits while `promotion_queue_limit` promotions were in flight.
    pub rejected_cap: u64,
}

impl Promotions {
    pub(crate) fn in_flight(&self) -> u64 {
        self.backlog.count()
    }

    /// Keeps the buffer of a promotion dropped unresolved until `deadline_ms`.
    pub(crate) fn bury(&self, replica: Replica, deadline_ms: u64) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        self.buried.lock().push((deadline_ms, replica));
    }

    /// Frees the buried buffers whose deadline passed.
    pub(crate) fn release_buried(&self, now: u64) {
        let due: Vec<(u64, Replica)> = {
            let mut buried = self.buried.lock();
            if !buried.iter().any(|(d, _)| *d <= now) {
                return;
            }
            let (due, keep) = std::mem::take(&mut *buried)
                .into_iter()
                .partition(|(d, _)| *d <= now);
            *buried = keep;
            due
        };
        drop(due);
    }

    pub(crate) fn count_expired(&self, n: u64) {
        self.expired.fetch_add(n, Ordering::Relaxed);
    }

    /// The promotion tasks queued for `client`.
    pub(crate) fn take_tasks(&self, client: ClientId) -> Vec<PromotionTask> {
        self.mailboxes.lock().remove(&client).unwrap_or_default()
    }

    /// Drops the tasks of expired clients.
    pub(crate) fn forget_clients(&self, clients: &[ClientId]) {
        let mut mailboxes = self.mailboxes.lock();
        for c in clients {
            mailboxes.remove(c);
        }
    }

    /// Counts a hit; true once the object reached `threshold` hits (its count restarts).
    fn hit(&self, tenant: &str, key: &str, threshold: u32) -> bool {
        let mut hits = self.hits.lock();
        if hits.len() >= MAX_TRACKED_HITS {
            hits.clear();
        }
        let id = (tenant.to_string(), Box::from(key));
        let n = hits.entry(id.clone()).or_insert(0);
        *n = n.saturating_add(1);
        if *n < threshold {
            return false;
        }
        hits.remove(&id);
        true
    }
}

impl Engine {
    /// The promotion counters.
    pub fn promotion_stats(&self) -> PromotionStats {
        let p = &self.counters.tier.promotions;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PromotionStats {
            in_flight: p.in_flight(),
            admitted: load(&p.admitted),
            completed: load(&p.completed),
            completed_bytes: load(&p.completed_bytes),
            failed: load(&p.failed),
            cancelled: load(&p.cancelled),
            expired: load(&p.expired),
            rejected_frequency: load(&p.rejected_frequency),
            rejected_watermark: load(&p.rejected_watermark),
            rejected_cap: load(&p.rejected_cap),
        }
    }

    /// A read of `obj` (under its shard lock): promotes it if it is readable only on disk and
    /// passes the gates.
    pub(crate) fn consider_promotion(
        &self,
        tenant: &str,
        key: &str,
        obj: &mut ObjectMeta,
        now: u64,
    ) {
        if !self.config.promotion_on_hit || obj.in_flight || obj.has_offload() {
            return;
        }
        let in_memory = obj
            .replicas
            .iter()
            .any(|r| r.kind() == ReplicaKind::Memory && r.is_readable());
        let Some((source, owner)) = obj.replicas.iter().find_map(|r| match &r.placement {
            Placement::Disk(f) if r.is_readable() => Some((r, f.slot.owner)),
            _ => None,
        }) else {
            return;
        };
        if in_memory {
            return;
        }
        let p = self.counters.tier.promotions.clone();
        if !p.hit(tenant, key, self.config.promotion_admission_threshold) {
            p.rejected_frequency.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let capacity = self.usage.capacity.load(Ordering::Acquire);
        let allocated = self.usage.allocated.load(Ordering::Acquire);
        let watermark = self
            .config
            .eviction_high_watermark_ratio
            .min(self.config.offload_high_watermark_ratio);
        let after = allocated.saturating_add(obj.size) as f64;
        if capacity == 0 || after >= capacity as f64 * watermark {
            p.rejected_watermark.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if p.in_flight() >= self.config.promotion_queue_limit {
            p.rejected_cap.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(buffer) = self.allocate_on_client(owner, obj.size) else {
            p.rejected_watermark.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let target = Replica {
            id: self.replica_ids.next_id(),
            status: ReplicaStatus::Processing,
            placement: Placement::Memory(buffer),
        };
        let task = PromotionTask {
            tenant: tenant.to_string(),
            key: key.to_string(),
            source: source.descriptor(obj.size),
            target: target.descriptor(obj.size),
        };
        let deadline = now.saturating_add(self.config.put_start_release_timeout_ms);
        let pending = PendingOffload::new(target, source.id, deadline, p.backlog.clone(), obj.size)
            .promotion(p.clone());
        obj.set_offload(Box::new(pending));
        p.mailboxes.lock().entry(owner).or_default().push(task);
        p.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// A buffer of `size` bytes on a live segment of `client`.
    fn allocate_on_client(&self, client: ClientId, size: u64) -> Option<MemBuffer> {
        let len = super::alloc::aligned_len(size)?;
        let registry = self.registry.read();
        registry
            .groups
            .iter()
            .flat_map(|g| g.slots.iter())
            .filter(|slot| slot.owner == client)
            .find_map(|slot| {
                slot.allocate(len)
                    .map(|address| MemBuffer::new(slot.clone(), address, len))
            })
    }

    /// NotifyOffload for a promotion: the filled memory replica joins the object (`stored
    /// cpu`), or a failure ends it.
    pub(crate) fn land_promotion(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        pending: PendingOffload,
        ok: bool,
    ) -> Result<()> {
        let p = &self.counters.tier.promotions;
        if !ok {
            p.failed.fetch_add(1, Ordering::Relaxed);
            pending.discard();
            return Ok(());
        }
        if !pending.replica().handle_valid() {
            p.cancelled.fetch_add(1, Ordering::Relaxed);
            pending.discard();
            return Err(moonkv_proto::Error::new(
                moonkv_proto::ErrorCode::INVALID_REPLICA,
                "the promotion's segment went away",
            ));
        }
        let before = obj.media();
        let (mut replica, count) = pending.into_replica();
        replica.status = ReplicaStatus::Complete;
        obj.replicas.push(replica);
        self.placement_changed(tenant, key, obj, before);
        drop(count);
        p.completed.fetch_add(1, Ordering::Relaxed);
        p.completed_bytes.fetch_add(obj.size, Ordering::Relaxed);
        Ok(())
    }
}
