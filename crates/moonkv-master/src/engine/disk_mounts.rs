//! Disks: mount (with re-admission of the files a restarted node found), unmount and client
//! expiry (both detach: replicas stay known but unreadable for `disk_detach_grace_ms`), and the
//! end of the grace period. The master stays the authority: a file is re-admitted only if it is
//! the object's own disk replica, or if the object is unknown and the file id was never removed.

use super::disk::{disk_charge, DiskHandle, DiskSlot, DiskState};
use super::object::{ObjectMeta, Placement, Replica};
use super::replica_list::ReplicaList;
use super::shard::After;
use super::sink::Medium;
use super::validate::{check_key, invalid, read_tenant};
use super::Engine;
use moonkv_proto::msg::{MountDiskSegmentRequest, UnmountDiskSegmentRequest};
use moonkv_proto::{
    ClientId, DiskFile, DiskSegment, Error, ErrorCode, MountDiskSegmentResponse, ReplicaStatus,
    Result, SegmentId, TenantId,
};
use std::sync::Arc;

fn check_disk(disk: &DiskSegment) -> Result<()> {
    if disk.capacity_bytes == 0 {
        return Err(invalid("disk capacity must be non-zero"));
    }
    if disk.endpoint.is_empty() {
        return Err(invalid("disk endpoint must be non-empty"));
    }
    Ok(())
}

impl Engine {
    /// MountDiskSegment: mounts the caller's disk and re-admits the files it listed. A disk id
    /// known from an earlier mount (the node restarted on the same directory) takes over that
    /// mount: its replicas are revived from the listed files, the rest are dropped. Answers the
    /// files to delete.
    pub fn mount_disk_segment(
        &self,
        req: &MountDiskSegmentRequest,
    ) -> Result<MountDiskSegmentResponse> {
        check_disk(&req.disk)?;
        let (slot, previous) = self.register_disk(&req.disk, req.client_id)?;
        if let Some(prev) = previous.as_ref().filter(|p| p.is_mounted()) {
            // The old owner never unmounted (it restarted before expiring): its copies go away
            // before the new mount brings back the ones still on disk.
            prev.set_state(DiskState::Detached);
            self.detach_sweep(prev);
        }
        self.mark_client_alive(req.client_id);
        let rejected = req
            .existing
            .iter()
            .filter(|f| !self.admit_file(&slot, f))
            .map(|f| f.replica_id)
            .collect();
        if let Some(prev) = previous {
            prev.set_state(DiskState::Gone);
            self.sweep_dead_replicas();
        }
        tracing::info!(disk = %req.disk.name, client = %req.client_id, files = req.existing.len(), "disk mounted");
        Ok(MountDiskSegmentResponse { rejected })
    }

    /// UnmountDiskSegment: only the owner may unmount; an unknown disk is already unmounted.
    /// The disk's replicas are detached, as on client expiry.
    pub fn unmount_disk_segment(&self, req: &UnmountDiskSegmentRequest) -> Result<()> {
        let slot = {
            let registry = self.disks.read();
            match registry.by_id.get(&req.disk_id) {
                Some(slot) if slot.owner != req.client_id => {
                    return Err(Error::new(
                        ErrorCode::ILLEGAL_CLIENT,
                        "disk is owned by another client",
                    ))
                }
                Some(slot) if slot.is_mounted() => slot.clone(),
                _ => return Ok(()),
            }
        };
        self.detach_disk(&slot);
        Ok(())
    }

    /// Detaches the disks of expired clients.
    pub(crate) fn detach_disks_of(&self, clients: &[ClientId]) {
        let slots: Vec<Arc<DiskSlot>> = {
            let registry = self.disks.read();
            clients
                .iter()
                .filter_map(|c| registry.of_client(*c).cloned())
                .collect()
        };
        for slot in &slots {
            self.detach_disk(slot);
        }
        {
            let mut mailboxes = self.offload_mailboxes.lock();
            for c in clients {
                mailboxes.remove(c);
            }
        }
        self.counters.tier.promotions.forget_clients(clients);
    }

    /// Drops the replicas of detached disks whose grace period ended. Returns the disks ended.
    pub fn expire_detached_disks(&self) -> usize {
        let now = self.now();
        let due: Vec<Arc<DiskSlot>> = {
            let mut registry = self.disks.write();
            let ids: Vec<SegmentId> = registry
                .by_id
                .iter()
                .filter(|(_, s)| {
                    s.state() == DiskState::Detached
                        && s.detach_deadline_ms
                            .load(std::sync::atomic::Ordering::Acquire)
                            <= now
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| registry.by_id.remove(id))
                .collect()
        };
        if due.is_empty() {
            return 0;
        }
        for slot in &due {
            tracing::info!(disk = %slot.info.name, "detached disk not remounted in time; dropping its replicas");
            slot.set_state(DiskState::Gone);
        }
        self.sweep_dead_replicas();
        due.len()
    }

    /// Records the mount; returns the new slot and the previous mount of the same disk id.
    fn register_disk(
        &self,
        disk: &DiskSegment,
        client: ClientId,
    ) -> Result<(Arc<DiskSlot>, Option<Arc<DiskSlot>>)> {
        let mut registry = self.disks.write();
        if registry
            .by_client
            .get(&client)
            .is_some_and(|id| *id != disk.id)
        {
            return Err(invalid("a client mounts at most one disk"));
        }
        if let Some(slot) = registry.by_id.get(&disk.id) {
            if slot.owner == client && slot.is_mounted() && slot.info == *disk {
                return Ok((slot.clone(), None));
            }
        }
        let memory = registry.memory_of(disk.id);
        let slot = Arc::new(DiskSlot::new(disk.clone(), client, memory));
        let previous = registry.by_id.insert(disk.id, slot.clone());
        if let Some(prev) = &previous {
            if registry.by_client.get(&prev.owner) == Some(&disk.id) {
                registry.by_client.remove(&prev.owner);
            }
        }
        registry.by_client.insert(client, disk.id);
        Ok((slot, previous))
    }

    /// Detaches a mounted disk: unreadable now, dropped after the grace period unless remounted.
    fn detach_disk(&self, slot: &Arc<DiskSlot>) {
        {
            let mut registry = self.disks.write();
            if registry.by_client.get(&slot.owner) == Some(&slot.info.id) {
                registry.by_client.remove(&slot.owner);
            }
        }
        let deadline = self.now().saturating_add(self.config.disk_detach_grace_ms);
        slot.detach_deadline_ms
            .store(deadline, std::sync::atomic::Ordering::Release);
        slot.set_state(DiskState::Detached);
        tracing::info!(disk = %slot.info.name, "disk detached");
        self.detach_sweep(slot);
    }

    /// Marks every replica on `slot` detached (with `removed disk` where the object loses the
    /// medium) and cancels offloads writing to it.
    fn detach_sweep(&self, slot: &Arc<DiskSlot>) {
        let on_slot = |r: &Replica| r.disk().is_some_and(|f| Arc::ptr_eq(&f.slot, slot));
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            for t in shard.tenants.values_mut() {
                for (key, obj) in t.objects.iter_mut() {
                    if obj.offload().is_some_and(|p| on_slot(p.replica())) {
                        obj.take_offload();
                    }
                    if !obj.replicas.iter().any(on_slot) {
                        continue;
                    }
                    let before = obj.media();
                    for r in obj.replicas.iter_mut() {
                        if let Placement::Disk(file) = &mut r.placement {
                            if Arc::ptr_eq(&file.slot, slot) {
                                file.attached = false;
                            }
                        }
                    }
                    self.media_changed(&t.tenant, key, obj, before);
                }
            }
        }
    }

    /// Re-admits one listed file on a new mount. Returns false when the node must delete it.
    fn admit_file(&self, slot: &Arc<DiskSlot>, file: &DiskFile) -> bool {
        let Ok(tenant) = read_tenant(&file.tenant) else {
            return false;
        };
        if check_key(&file.key).is_err() || file.size == 0 || file.replica_id.0 == 0 {
            return false;
        }
        let mut shard = self.lock_shard(self.shard_index(tenant, &file.key));
        let revived = self.with_object(&mut shard, tenant, &file.key, |tid, obj| {
            (
                self.revive_replica(tid, &file.key, obj, slot, file),
                After::Keep,
            )
        });
        if let Some(accepted) = revived {
            return accepted;
        }
        if slot.memory.is_tombstoned(file.replica_id.0) {
            return false;
        }
        // Unknown object and a file id never removed: the master restarted; the file is the
        // object's only copy.
        let handle = DiskHandle::adopted(slot.clone(), file.replica_id.0, disk_charge(file.size));
        let replica = Replica {
            id: file.replica_id,
            status: ReplicaStatus::Complete,
            placement: Placement::Disk(Box::new(handle)),
        };
        let obj = ObjectMeta::new(
            file.size,
            slot.owner,
            self.now(),
            ReplicaList::One(replica),
            false,
        );
        self.sink
            .stored(&TenantId(tenant.to_string()), &file.key, None, Medium::Disk);
        self.insert_object(&mut shard, tenant, &file.key, obj);
        true
    }

    /// Re-attaches the object's disk replica that `file` is, if it is one.
    fn revive_replica(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        slot: &Arc<DiskSlot>,
        file: &DiskFile,
    ) -> bool {
        if obj.size != file.size {
            return false;
        }
        let before = obj.media();
        let Some(handle) = obj
            .replicas
            .iter_mut()
            .find_map(|r| match &mut r.placement {
                Placement::Disk(h) if r.id == file.replica_id && h.slot.info.id == slot.info.id => {
                    Some(h)
                }
                _ => None,
            })
        else {
            return false;
        };
        handle.reattach(slot);
        self.media_changed(tenant, key, obj, before);
        true
    }
}
