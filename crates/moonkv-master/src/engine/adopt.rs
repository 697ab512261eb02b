//! Re-adoption: a master that does not know a node's segments (it restarted, or took over as
//! leader) rebuilds the objects the node still holds from the node's catalog of committed
//! replicas, and feeds that catalog while it runs (`catalog`). The rules, argued in
//! `docs/operations.md` ("Restart and re-adoption"):
//!
//! - only replicas whose PutEnd/UpsertEnd was acknowledged are in a catalog (a commit notice is
//!   queued when the replica turns COMPLETE), and a catalog entry dies the moment anything
//!   writes into its range on the node, so an entry always describes intact bytes;
//! - an announced entry lands exactly where the node holds it (the range is reserved, so a
//!   range taken meanwhile rejects it), keeps its replica id, and the id issuer moves past it;
//! - per key the newest version wins: `(epoch, write)` orders writes across master lives, a
//!   value written here beats every announced one, and a write in flight here beats them too;
//!   equal versions are replicas of one value and merge.

use super::alloc::aligned_len;
use super::catalog::CatalogFence;
use super::object::{ObjectMeta, Placement, Replica};
use super::replica_list::ReplicaList;
use super::segments::{MemBuffer, SegmentSlot};
use super::shard::{After, Shard};
use super::sink::Medium;
use super::validate::{check_key, invalid, read_tenant};
use super::Engine;
use moonkv_proto::msg::{
    AdoptReplicasRequest, AdoptReplicasResponse, CatalogEntry, CatalogNotice, SyncCatalogRequest,
    SyncCatalogResponse,
};
use moonkv_proto::{Error, ErrorCode, ReplicaStatus, Result, TenantId};
use std::sync::Arc;

/// What became of one announced entry.
enum Verdict {
    Adopted,
    /// This master already holds it.
    Known,
    Rejected,
}

impl Engine {
    /// This master's epoch (see [`super::EngineConfig::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.catalog.epoch()
    }

    /// Called whenever a notice is queued for some node (the server wakes its long polls),
    /// with whether that node's notices must now leave without lingering
    /// ([`Engine::catalog_urgent`]).
    pub fn set_catalog_waker(&self, waker: super::catalog::CatalogWaker) {
        self.catalog.set_waker(waker);
    }

    /// SyncCatalog without waiting: forgets what the node acknowledged and answers what is
    /// pending (the server holds an empty answer up to the request's `wait_ms`).
    pub fn sync_catalog(&self, req: &SyncCatalogRequest) -> Result<SyncCatalogResponse> {
        Ok(self
            .catalog
            .sync(req.client_id, req.epoch, req.acked, self.now()))
    }

    /// SyncCatalog's acknowledgement alone: forgets what the node acknowledged, and says what
    /// [`Engine::sync_catalog`] would answer (without copying it), and whether it may wait.
    pub fn catalog_acknowledge(&self, req: &SyncCatalogRequest) -> super::PendingNotices {
        self.catalog
            .acknowledge(req.client_id, req.epoch, req.acked, self.now())
    }

    /// Whether the notices pending for `node` must be answered without lingering (tests; a
    /// poll learns it from [`Engine::catalog_acknowledge`]).
    #[cfg(test)]
    pub(crate) fn catalog_urgent(&self, node: moonkv_proto::ClientId) -> bool {
        self.catalog.urgent(node)
    }

    /// Whether the drop notices of `fence` were acknowledged (or cannot be: the node is gone
    /// or has not polled for `stale_ms`).
    pub fn catalog_fence_passed(&self, fence: &CatalogFence, stale_ms: u64) -> bool {
        self.catalog.fence_passed(fence, self.now(), stale_ms)
    }

    /// Notices queued for nodes and not yet acknowledged (metrics).
    pub fn catalog_pending_notices(&self) -> u64 {
        self.catalog.pending_total()
    }

    /// AdoptReplicas: rebuilds objects from one chunk of a node's catalog for one of its
    /// segments; answers the entries not adopted. `done` ends the segment's freeze.
    pub fn adopt_replicas(&self, req: &AdoptReplicasRequest) -> Result<AdoptReplicasResponse> {
        let slot = {
            let registry = self.registry.read();
            match registry.by_id.get(&req.segment_id) {
                None => {
                    return Err(Error::new(
                        ErrorCode::SEGMENT_NOT_FOUND,
                        "segment not mounted; mount it before announcing its replicas",
                    ))
                }
                Some(slot) if slot.owner != req.client_id => {
                    return Err(Error::new(
                        ErrorCode::ILLEGAL_CLIENT,
                        "segment is owned by another client",
                    ))
                }
                Some(slot) => slot.clone(),
            }
        };
        let mut rejected = Vec::new();
        let mut adopted = 0u64;
        for entry in &req.entries {
            match self.adopt_entry(&slot, entry) {
                Verdict::Adopted => adopted += 1,
                Verdict::Known => {}
                Verdict::Rejected => rejected.push(entry.address),
            }
        }
        if req.done && slot.thaw() {
            tracing::info!(segment = %slot.info.name, "segment re-adopted; taking writes");
        }
        if adopted > 0 {
            self.recompute_quotas();
        }
        Ok(AdoptReplicasResponse { rejected, adopted })
    }

    /// Segments whose node never finished announcing take writes again.
    pub(crate) fn thaw_overdue_adoptions(&self) {
        let now = self.now();
        let registry = self.registry.read();
        for slot in registry.by_id.values() {
            let deadline = slot.adopt_deadline_ms();
            if deadline != 0 && deadline <= now && slot.thaw() {
                tracing::warn!(segment = %slot.info.name, "re-adoption not finished in time; the segment takes writes");
            }
        }
    }

    /// Queues a commit notice for every memory replica of `obj` that just turned COMPLETE
    /// (`fresh` picks them) and marks their buffers as cataloged.
    pub(crate) fn catalog_commit(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        fresh: impl Fn(&Replica) -> bool,
    ) {
        obj.set_adopted_version(None);
        let (epoch, write) = obj.version(self.catalog.epoch());
        let (size, checksum) = (obj.size, obj.checksum());
        for r in obj.replicas.iter_mut() {
            if !fresh(r) {
                continue;
            }
            let id = r.id;
            if let Placement::Memory(buf) = &mut r.placement {
                buf.segment.notify_owner(|| {
                    CatalogNotice::Commit(CatalogEntry {
                        segment_id: buf.segment.info.id,
                        address: buf.address,
                        len: buf.len(),
                        replica_id: id,
                        epoch,
                        write,
                        tenant: tenant.0.clone(),
                        key: key.to_string(),
                        size,
                        checksum,
                    })
                });
                buf.set_cataloged();
            }
        }
    }

    fn adopt_entry(&self, slot: &Arc<SegmentSlot>, e: &CatalogEntry) -> Verdict {
        if entry_problem(slot, e).is_some() {
            return Verdict::Rejected;
        }
        let Ok(tenant) = read_tenant(&e.tenant) else {
            return Verdict::Rejected;
        };
        let own = self.catalog.epoch();
        let announced = (e.epoch, e.write);
        let merge_only = self.catalog.is_merge_only(slot.owner);
        let mut shard = self.lock_shard(self.shard_index(tenant, &e.key));
        enum Found {
            Known,
            Merged,
            Older,
            Newer,
        }
        let found = self.with_object(&mut shard, tenant, &e.key, |tid, obj| {
            if obj.in_flight {
                return (Found::Newer, After::Keep);
            }
            let current = obj.version(own);
            if announced < current {
                return (Found::Newer, After::Keep);
            }
            if announced > current {
                // From a node this master knew, a newer value than the one held here cannot be
                // trusted to be current: keep ours.
                if merge_only {
                    return (Found::Newer, After::Keep);
                }
                return (Found::Older, After::Erase);
            }
            if let Some(known) = obj.replicas.iter().find(|r| r.id == e.replica_id) {
                // Announced again to a master that has it (a remount it did not need).
                let same_place = matches!(&known.placement, Placement::Memory(b)
                    if Arc::ptr_eq(&b.segment, slot) && b.address == e.address);
                let found = if same_place {
                    Found::Known
                } else {
                    Found::Newer
                };
                return (found, After::Keep);
            }
            if obj.size != e.size {
                return (Found::Newer, After::Keep);
            }
            let Some(replica) = self.adopted_replica(slot, e) else {
                return (Found::Newer, After::Keep);
            };
            let before = obj.media();
            obj.replicas.push(replica);
            self.placement_changed(tid, &e.key, obj, before);
            (Found::Merged, After::Keep)
        });
        match found {
            Some(Found::Merged) => Verdict::Adopted,
            Some(Found::Known) => Verdict::Known,
            Some(Found::Newer) => Verdict::Rejected,
            // A node this master knew: an object missing here was removed, evicted or replaced
            // by this master, which must not come back.
            Some(Found::Older) | None if merge_only => Verdict::Rejected,
            // The object here is an older value (its replicas went with it) or there is none.
            Some(Found::Older) | None => self.adopt_new_object(&mut shard, tenant, slot, e),
        }
    }

    fn adopt_new_object(
        &self,
        shard: &mut Shard,
        tenant: &str,
        slot: &Arc<SegmentSlot>,
        e: &CatalogEntry,
    ) -> Verdict {
        let Some(replica) = self.adopted_replica(slot, e) else {
            return Verdict::Rejected;
        };
        let mut obj = ObjectMeta::new(
            e.size,
            slot.owner,
            self.now(),
            ReplicaList::One(replica),
            false,
        );
        obj.set_adopted_version(Some((e.epoch, e.write)));
        obj.set_checksum(e.checksum);
        let tid = TenantId(tenant.to_string());
        self.settle_charge(tenant, &mut obj);
        self.sink.stored(&tid, &e.key, None, Medium::Cpu);
        self.insert_object(shard, tenant, &e.key, obj);
        Verdict::Adopted
    }

    /// Reserves the entry's range and builds its replica (cataloged: the node holds it).
    fn adopted_replica(&self, slot: &Arc<SegmentSlot>, e: &CatalogEntry) -> Option<Replica> {
        if !slot.reserve(e.address, e.len) {
            return None;
        }
        self.replica_ids.move_past(e.replica_id);
        let mut buffer = MemBuffer::new(slot.clone(), e.address, e.len);
        buffer.set_cataloged();
        Some(Replica {
            id: e.replica_id,
            status: ReplicaStatus::Complete,
            placement: Placement::Memory(buffer),
        })
    }
}

/// Why an announced entry cannot be adopted, if it cannot.
fn entry_problem(slot: &SegmentSlot, e: &CatalogEntry) -> Option<Error> {
    if e.segment_id != slot.info.id {
        return Some(invalid("entry names another segment"));
    }
    if check_key(&e.key).is_err() {
        return Some(invalid("invalid key"));
    }
    if e.size == 0 || aligned_len(e.size) != Some(e.len) {
        return Some(invalid("size and buffer length disagree"));
    }
    if e.replica_id.0 == 0 || e.epoch == 0 || e.write == 0 {
        return Some(invalid("replica id, epoch and write must be non-zero"));
    }
    None
}
