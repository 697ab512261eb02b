//! Write-through disk placement and offload-on-evict.
//!
//! Offload: when eviction would drop the last memory copy of an object and the node owning that
//! memory has a mounted disk with room, a PROCESSING disk replica is reserved instead and an
//! [`OffloadTask`] is queued for that node. The object keeps its memory copy, pinned (eviction
//! skips it; an upsert replaces it rather than rewriting it in place) until the node reports:
//! success makes the disk replica COMPLETE (`stored disk`) and then drops the memory copy
//! (`removed cpu`); failure drops the disk replica and evicts the memory copy as usual. Offloads
//! not reported within `put_start_release_timeout` are cancelled.

use super::disk::{disk_charge, DiskHandle, PendingOffload};
use super::object::{ObjectMeta, Placement, Replica};
use super::shard::After;
use super::validate::read_tenant;
use super::Engine;
use moonkv_proto::msg::{NotifyOffloadRequest, OffloadHeartbeatRequest};
use moonkv_proto::{
    ClientId, Error, ErrorCode, ItemResult, OffloadHeartbeatResponse, OffloadResult, OffloadTask,
    ReplicaKind, ReplicaStatus, Result, TenantId,
};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// What [`Engine::try_start_offload`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OffloadStart {
    /// An offload is in flight for the object.
    Started,
    /// The disk of the object's node lacks this many bytes; disk eviction may free them.
    NeedsRoom(moonkv_proto::SegmentId, u64),
    /// No disk can take the object: evict it plainly.
    Impossible,
}

fn no_disk() -> Error {
    Error::new(
        ErrorCode::SEGMENT_NOT_FOUND,
        "this client has no mounted disk (mount it with MountDiskSegment)",
    )
}

impl Engine {
    /// A PROCESSING disk replica for a write-through Start: on the disk of the node holding the
    /// first memory replica if it has room, else on the emptiest mounted disk.
    pub(crate) fn place_disk(&self, size: u64, memory: &[Replica]) -> Result<Replica> {
        let charge = disk_charge(size);
        let registry = self.disks.read();
        let near = memory.iter().find_map(|r| match &r.placement {
            Placement::Memory(buf) => registry.of_client(buf.segment.owner).cloned(),
            Placement::Disk(_) => None,
        });
        let disks = registry.mounted_by_free_space();
        let Some(slot) = near
            .iter()
            .chain(disks.iter())
            .find(|slot| slot.try_reserve(charge))
            .cloned()
        else {
            // Disk eviction may make room: on the near disk, else on the largest one.
            let target =
                near.or_else(|| disks.iter().max_by_key(|s| s.info.capacity_bytes).cloned());
            let room = target.filter(|s| s.info.capacity_bytes >= charge && !s.is_full());
            if let Some(slot) = &room {
                slot.wanted.fetch_max(charge, Ordering::AcqRel);
            }
            let message = if room.is_some() {
                super::pressure::NO_DISK_YET
            } else {
                "no mounted disk has room for the disk replica"
            };
            return Err(Error::new(ErrorCode::NO_AVAILABLE_HANDLE, message));
        };
        let id = self.replica_ids.next_id();
        Ok(Replica {
            id,
            status: ReplicaStatus::Processing,
            placement: Placement::Disk(Box::new(DiskHandle::reserved(slot, id.0, charge))),
        })
    }

    /// Starts an offload of `obj` (under its shard lock) instead of dropping its last memory
    /// copy. [`OffloadStart::Impossible`] when plain eviction applies: the object already has
    /// a disk replica, or the node of its memory copy has no mounted disk, or its disk is full
    /// and disk eviction cannot make room; [`OffloadStart::NeedsRoom`] when its disk is short
    /// of room that disk eviction may free.
    pub(crate) fn try_start_offload(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        now: u64,
    ) -> OffloadStart {
        if obj.has_offload() {
            return OffloadStart::Started;
        }
        if obj
            .replicas
            .iter()
            .any(|r| r.kind() == ReplicaKind::LocalDisk)
        {
            return OffloadStart::Impossible;
        }
        let Some((source, owner)) = obj.replicas.iter().find_map(|r| match &r.placement {
            Placement::Memory(buf) if r.is_readable() => Some((r, buf.segment.owner)),
            _ => None,
        }) else {
            return OffloadStart::Impossible;
        };
        let slot = {
            let registry = self.disks.read();
            registry.of_client(owner).cloned()
        };
        let charge = disk_charge(obj.size);
        let Some(slot) = slot else {
            return OffloadStart::Impossible;
        };
        if !slot.try_reserve(charge) {
            return if slot.is_full() || charge > slot.info.capacity_bytes {
                OffloadStart::Impossible
            } else {
                OffloadStart::NeedsRoom(slot.info.id, charge)
            };
        }
        let id = self.replica_ids.next_id();
        let task = OffloadTask {
            tenant: tenant.0.clone(),
            key: key.to_string(),
            source: source.descriptor(obj.size),
            disk_replica_id: id,
        };
        let replica = Replica {
            id,
            status: ReplicaStatus::Processing,
            placement: Placement::Disk(Box::new(DiskHandle::reserved(slot, id.0, charge))),
        };
        let deadline = now.saturating_add(self.config.put_start_release_timeout_ms);
        let pending = PendingOffload::new(
            replica,
            source.id,
            deadline,
            self.pending_offloads.clone(),
            obj.size,
        );
        obj.set_offload(Box::new(pending));
        self.offload_mailboxes
            .lock()
            .entry(owner)
            .or_default()
            .push(task);
        self.counters
            .offloads_started
            .fetch_add(1, Ordering::Relaxed);
        OffloadStart::Started
    }

    /// Drops the object's readable memory replicas, reporting the media it lost. Returns the
    /// bytes freed.
    pub(crate) fn drop_memory_copies(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
    ) -> u64 {
        let before = obj.media();
        let count = obj.replicas.len();
        obj.replicas
            .retain(|r| !(r.kind() == ReplicaKind::Memory && r.is_readable()));
        let dropped = (count - obj.replicas.len()) as u64;
        if dropped > 0 {
            self.count_dropped(obj);
        }
        if obj
            .offload()
            .is_some_and(|p| !obj.replicas.iter().any(|r| r.id == p.source))
        {
            obj.take_offload();
        }
        self.placement_changed(tenant, key, obj, before);
        obj.size.saturating_mul(dropped)
    }

    /// OffloadHeartbeat: hands the caller its queued offload tasks and the files to delete.
    pub fn offload_heartbeat(
        &self,
        req: &OffloadHeartbeatRequest,
    ) -> Result<OffloadHeartbeatResponse> {
        let slot = {
            let registry = self.disks.read();
            registry.of_client(req.client_id).cloned()
        }
        .ok_or_else(no_disk)?;
        slot.memory.ack_deletions(&req.deleted);
        let tasks = self
            .offload_mailboxes
            .lock()
            .remove(&req.client_id)
            .unwrap_or_default();
        Ok(OffloadHeartbeatResponse {
            tasks,
            deletions: slot.memory.take_deletions(),
            promotions: self.counters.tier.promotions.take_tasks(req.client_id),
        })
    }

    /// NotifyOffload: applies each result. An error item means the master no longer wants that
    /// file (the object changed meanwhile); the node deletes it.
    pub fn notify_offload(&self, req: &NotifyOffloadRequest) -> Result<Vec<ItemResult<()>>> {
        let mounted = {
            let registry = self.disks.read();
            registry.of_client(req.client_id).is_some()
        };
        if !mounted {
            return Ok(req
                .results
                .iter()
                .map(|_| ItemResult(Err(no_disk())))
                .collect());
        }
        let now = self.now();
        Ok(req
            .results
            .iter()
            .map(|r| ItemResult(self.apply_offload_result(req.client_id, r, now)))
            .collect())
    }

    fn apply_offload_result(
        &self,
        client: ClientId,
        result: &OffloadResult,
        now: u64,
    ) -> Result<()> {
        let tenant = read_tenant(&result.tenant)?;
        let mut shard = self.lock_shard(self.shard_index(tenant, &result.key));
        self.with_object(&mut shard, tenant, &result.key, |tid, obj| {
            let outcome = self.land_offload(client, tid, &result.key, obj, result, now);
            let after = if obj.replicas.is_empty() {
                After::Erase
            } else {
                After::Keep
            };
            (outcome, after)
        })
        .unwrap_or_else(|| Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "object not found")))
    }

    fn land_offload(
        &self,
        client: ClientId,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        result: &OffloadResult,
        now: u64,
    ) -> Result<()> {
        let ours = obj.offload().is_some_and(|p| {
            let r = p.replica();
            r.id == result.disk_replica_id
                && match &r.placement {
                    Placement::Disk(f) => f.slot.owner == client,
                    Placement::Memory(buf) => p.is_promotion() && buf.segment.owner == client,
                }
        });
        if !ours {
            return Err(Error::new(
                ErrorCode::INVALID_WRITE,
                "no such offload in progress (the object changed or the task expired)",
            ));
        }
        let Some(pending) = obj.take_offload() else {
            return Err(Error::from(ErrorCode::INTERNAL_ERROR));
        };
        if pending.is_promotion() {
            return self.land_promotion(tenant, key, obj, *pending, result.ok);
        }
        let evictable = !obj.lease_active(now) && !obj.hard_pinned;
        let source_ok = obj
            .replicas
            .iter()
            .any(|r| r.id == pending.source && r.is_readable());
        if !result.ok || !source_ok || !pending.replica().disk().is_some_and(|f| f.readable()) {
            self.counters
                .offloads_failed
                .fetch_add(1, Ordering::Relaxed);
            drop(pending);
            if !result.ok && evictable {
                self.count_evicted(self.drop_memory_copies(tenant, key, obj));
            }
            return if result.ok {
                Err(Error::new(
                    ErrorCode::INVALID_REPLICA,
                    "the source replica or the disk changed during the offload",
                ))
            } else {
                Ok(())
            };
        }
        let before = obj.media();
        let (mut replica, still_pending) = (*pending).into_replica();
        replica.status = ReplicaStatus::Complete;
        obj.replicas.push(replica);
        self.media_changed(tenant, key, obj, before);
        self.counters
            .offloads_completed
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .tier
            .offloaded_bytes
            .fetch_add(obj.size, Ordering::Relaxed);
        // A reader that got the memory replica meanwhile keeps it until a later eviction round.
        if evictable {
            self.count_evicted(self.drop_memory_copies(tenant, key, obj));
        }
        drop(still_pending);
        Ok(())
    }

    fn count_evicted(&self, bytes: u64) {
        if bytes > 0 {
            self.counters
                .evicted_key_count
                .fetch_add(1, Ordering::Relaxed);
            self.counters
                .evicted_size_bytes
                .fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Cancels offloads not reported by their deadline. Returns how many.
    pub(crate) fn expire_offloads(&self, now: u64) -> usize {
        let promotions = self.counters.tier.promotions.clone();
        promotions.release_buried(now);
        if self.pending_offloads.count() == 0 && promotions.in_flight() == 0 {
            return 0;
        }
        let mut cancelled: HashSet<u64> = HashSet::new();
        let mut expired_promotions = 0u64;
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            for t in shard.tenants.values_mut() {
                for obj in t.objects.values_mut() {
                    if obj.offload().is_some_and(|p| p.deadline_ms <= now) {
                        if let Some(p) = obj.take_offload() {
                            if p.is_promotion() {
                                // Past its deadline the node can no longer be writing.
                                expired_promotions += 1;
                                p.discard();
                            } else {
                                cancelled.insert(p.replica().id.0);
                            }
                        }
                    }
                }
            }
        }
        promotions.count_expired(expired_promotions);
        if cancelled.is_empty() {
            return expired_promotions as usize;
        }
        for tasks in self.offload_mailboxes.lock().values_mut() {
            tasks.retain(|t| !cancelled.contains(&t.disk_replica_id.0));
        }
        self.counters
            .offloads_failed
            .fetch_add(cancelled.len() as u64, Ordering::Relaxed);
        tracing::info!(
            cancelled = cancelled.len(),
            "offloads not reported in time were cancelled"
        );
        cancelled.len()
    }
}
