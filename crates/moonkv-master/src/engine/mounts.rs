//! Segments and clients: mount, remount, unmount (plain and graceful), status queries, ping and
//! client expiry. Unmounting kills the segment's slot (its replicas turn invalid at once), then
//! sweeps every shard so each object that lost a medium reports `removed` right away.

use super::segments::SegmentSlot;
use super::validate::invalid;
use super::Engine;
use moonkv_proto::msg::{
    GracefulUnmountSegmentRequest, MountSegmentRequest, PingRequest, QuerySegmentStatusByIdRequest,
    QuerySegmentStatusRequest, ReMountSegmentRequest, ReportUnreachableRequest,
    UnmountSegmentRequest, MAX_REPORTED_ENDPOINTS,
};
use moonkv_proto::{
    ClientId, ClientStatus, Error, ErrorCode, PingResponse, Result, Segment, SegmentId,
    SegmentStatus,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn check_segment(segment: &Segment) -> Result<()> {
    if segment.base == 0 || segment.size == 0 {
        return Err(invalid("segment base and size must be non-zero"));
    }
    if segment.base.checked_add(segment.size).is_none() {
        return Err(invalid("segment base + size overflows"));
    }
    Ok(())
}

fn segment_not_found() -> Error {
    Error::new(ErrorCode::SEGMENT_NOT_FOUND, "segment not found")
}

impl Engine {
    /// Ping: `OK` for a client the master knows (heartbeat refreshed), `NEED_REMOUNT` otherwise.
    pub fn ping(&self, req: &PingRequest) -> Result<PingResponse> {
        let deadline = self.now().saturating_add(self.config.client_live_ttl_ms);
        // Segments of this client that someone else unmounted: its next remount restores them.
        let missing = req.mounted_segments > 0 && {
            let registry = self.registry.read();
            let held = registry
                .by_id
                .values()
                .filter(|slot| slot.owner == req.client_id)
                .count();
            held < req.mounted_segments as usize
        };
        let client_status = match self.clients.lock().get_mut(&req.client_id) {
            Some(d) => {
                *d = deadline;
                if missing {
                    ClientStatus::NeedRemount
                } else {
                    ClientStatus::Ok
                }
            }
            None => ClientStatus::NeedRemount,
        };
        if client_status == ClientStatus::Ok {
            self.clear_suspects_of(req.client_id);
        }
        Ok(PingResponse {
            view_version: 0,
            client_status,
            master_epoch: self.catalog.epoch(),
            merges_returning: true,
        })
    }

    /// ReportUnreachable: a client could not reach these endpoints, so their segments leave
    /// placement at once (not at the heartbeat deadline, which still unmounts them if their node
    /// is gone). The node's next heartbeat puts them back. Returns how many segments this report
    /// took out of placement.
    pub fn report_unreachable(&self, req: &ReportUnreachableRequest) -> Result<u32> {
        if req.endpoints.len() > MAX_REPORTED_ENDPOINTS {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "a report names at most {MAX_REPORTED_ENDPOINTS} endpoints, not {}",
                    req.endpoints.len()
                ),
            ));
        }
        let registry = self.registry.read();
        let mut marked = 0;
        for slot in registry.by_id.values() {
            if req.endpoints.iter().any(|e| **e == *slot.info.endpoint) && slot.mark_suspect() {
                marked += 1;
                tracing::warn!(segment = %slot.info.name, endpoint = %slot.info.endpoint, reporter = %req.client_id, "a client cannot reach this segment's node; no new replicas go there until it answers");
            }
        }
        Ok(marked)
    }

    /// The owner answered: its segments take new replicas again.
    fn clear_suspects_of(&self, owner: ClientId) {
        if self.usage.suspects.load(Ordering::Acquire) == 0 {
            return;
        }
        let registry = self.registry.read();
        let Some(ids) = registry.by_client.get(&owner) else {
            return;
        };
        for slot in ids.iter().filter_map(|id| registry.by_id.get(id)) {
            if slot.clear_suspect() {
                tracing::info!(segment = %slot.info.name, "the segment's node answers again; it takes new replicas");
            }
        }
    }

    /// MountSegment. Marks the client alive and OK, so its next Ping answers `OK`.
    pub fn mount_segment(&self, req: &MountSegmentRequest) -> Result<()> {
        check_segment(&req.segment)?;
        {
            let mut registry = self.registry.write();
            if let Some(slot) = registry.by_id.get(&req.segment.id) {
                if slot.status() != SegmentStatus::Ok {
                    return Err(Error::new(
                        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                        "segment is being unmounted",
                    ));
                }
            } else {
                let _ = self.add_slot(&mut registry, req.segment.clone(), req.client_id);
            }
        }
        if req.keeps_catalog {
            self.catalog.open(req.client_id);
        }
        self.mark_client_alive(req.client_id);
        self.recompute_quotas();
        Ok(())
    }

    /// ReMountSegment: re-registers a client's segments after `NEED_REMOUNT`. Segments already
    /// mounted must be identical and owned by the caller; new ones are mounted (invalid ones
    /// skipped); the client becomes OK.
    pub fn remount_segment(&self, req: &ReMountSegmentRequest) -> Result<()> {
        {
            let mut registry = self.registry.write();
            for segment in &req.segments {
                if let Some(slot) = registry.by_id.get(&segment.id) {
                    if slot.owner != req.client_id || slot.info != *segment {
                        return Err(invalid(
                            "segment already mounted with different parameters or owner",
                        ));
                    }
                    if slot.status() != SegmentStatus::Ok {
                        return Err(Error::new(
                            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                            "segment is being unmounted",
                        ));
                    }
                }
            }
            let freeze_until = self
                .now()
                .saturating_add(self.config.adopt_timeout_ms)
                .max(1);
            for segment in &req.segments {
                if check_segment(segment).is_ok() && !registry.by_id.contains_key(&segment.id) {
                    let slot = self.add_slot(&mut registry, segment.clone(), req.client_id);
                    if req.adopt {
                        // Its node holds replicas this master does not know: nothing new lands
                        // here until they are announced (AdoptReplicas) or the freeze ends.
                        slot.freeze_for_adoption(freeze_until);
                    }
                }
            }
        }
        if req.adopt {
            // An owner that announces its catalog keeps one.
            self.catalog.open(req.client_id);
        }
        self.mark_client_alive(req.client_id);
        self.recompute_quotas();
        Ok(())
    }

    /// UnmountSegment: only the owner may unmount; an unknown id is already unmounted (OK).
    pub fn unmount_segment(&self, req: &UnmountSegmentRequest) -> Result<()> {
        {
            let registry = self.registry.read();
            match registry.by_id.get(&req.segment_id) {
                None => return Ok(()),
                Some(slot) if slot.owner != req.client_id => {
                    return Err(Error::new(
                        ErrorCode::ILLEGAL_CLIENT,
                        "segment is owned by another client",
                    ));
                }
                Some(_) => {}
            }
        }
        self.unmount_many(&[req.segment_id]);
        Ok(())
    }

    /// GracefulUnmountSegment: stops allocating in the segment now, keeps it readable, and
    /// unmounts it when the grace period ends (see [`Engine::run_graceful_unmounts`]).
    pub fn graceful_unmount_segment(&self, req: &GracefulUnmountSegmentRequest) -> Result<()> {
        let deadline = self.now().saturating_add(req.grace_period_ms);
        let mut registry = self.registry.write();
        let owned = registry
            .by_client
            .get(&req.client_id)
            .ok_or_else(segment_not_found)?;
        if !owned.contains(&req.segment_id) {
            return Err(invalid("the caller does not own this segment"));
        }
        let slot = registry
            .by_id
            .get(&req.segment_id)
            .cloned()
            .ok_or_else(segment_not_found)?;
        match slot.status() {
            SegmentStatus::Ok => {
                slot.set_status(SegmentStatus::GracefullyUnmounting);
                registry.graceful.insert(req.segment_id, deadline);
                registry.rebuild_groups();
                Ok(())
            }
            SegmentStatus::GracefullyUnmounting => Ok(()),
            SegmentStatus::Unmounting => Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "segment is being unmounted",
            )),
        }
    }

    /// QuerySegmentStatus by name (the most recently mounted segment of that name).
    pub fn query_segment_status(&self, req: &QuerySegmentStatusRequest) -> Result<SegmentStatus> {
        let registry = self.registry.read();
        let id = registry
            .last_by_name
            .get(&req.segment_name)
            .ok_or_else(segment_not_found)?;
        registry
            .by_id
            .get(id)
            .map(|s| s.status())
            .ok_or_else(segment_not_found)
    }

    /// QuerySegmentStatusById.
    pub fn query_segment_status_by_id(
        &self,
        req: &QuerySegmentStatusByIdRequest,
    ) -> Result<SegmentStatus> {
        let registry = self.registry.read();
        registry
            .by_id
            .get(&req.segment_id)
            .map(|s| s.status())
            .ok_or_else(segment_not_found)
    }

    /// Never expires `client`, whatever its heartbeats: a client that lives exactly as long as
    /// this master does (the node `moonkv up` runs in the master's process). A pause of the whole
    /// process (a stopped process, a suspended VM) then cannot cost that node its replicas when
    /// the sweep runs before its next heartbeat, so such a node needs no catalog to regain them.
    pub fn never_expire(&self, client: ClientId) {
        let mut undying = self.undying.lock();
        if !undying.contains(&client) {
            undying.push(client);
        }
    }

    /// Expires clients whose heartbeat deadline passed (but those of [`Engine::never_expire`]):
    /// their segments are unmounted and objects that only lived there disappear (with `removed`
    /// events); their disks are detached. Also ends detached disks whose grace period passed.
    /// Returns the number of clients expired.
    pub fn expire_clients(&self) -> usize {
        self.expire_detached_disks();
        let now = self.now();
        let expired: Vec<ClientId> = {
            let undying = self.undying.lock();
            let mut clients = self.clients.lock();
            let ids: Vec<ClientId> = clients
                .iter()
                .filter(|(c, d)| **d < now && !undying.contains(c))
                .map(|(c, _)| *c)
                .collect();
            for id in &ids {
                clients.remove(id);
            }
            ids
        };
        if expired.is_empty() {
            return 0;
        }
        let segments: Vec<SegmentId> = {
            let registry = self.registry.read();
            expired
                .iter()
                .filter_map(|c| registry.by_client.get(c))
                .flatten()
                .copied()
                .collect()
        };
        for client in &expired {
            tracing::info!(client = %client, "client heartbeat expired; unmounting its segments");
        }
        self.unmount_many(&segments);
        self.detach_disks_of(&expired);
        // Their replicas were dropped without notices. Their mailboxes stay: should they come
        // back, they remount and announce their catalogs, and get back the replicas of objects
        // still held here at the same version (merge only); everything else they forget.
        self.catalog.expired(&expired);
        expired.len()
    }

    /// Finishes graceful unmounts whose grace period ended. Returns the number unmounted.
    pub fn run_graceful_unmounts(&self) -> usize {
        let now = self.now();
        let due: Vec<SegmentId> = {
            let registry = self.registry.read();
            registry
                .graceful
                .iter()
                .filter(|(_, d)| **d <= now)
                .map(|(id, _)| *id)
                .collect()
        };
        if due.is_empty() {
            return 0;
        }
        self.unmount_many(&due)
    }

    fn add_slot(
        &self,
        registry: &mut super::segments::Registry,
        segment: Segment,
        owner: ClientId,
    ) -> Arc<SegmentSlot> {
        self.usage
            .capacity
            .fetch_add(segment.size, Ordering::AcqRel);
        let slot = Arc::new(SegmentSlot::new(
            segment,
            owner,
            self.usage.clone(),
            self.catalog.clone(),
        ));
        registry.insert(slot.clone());
        slot
    }

    pub(crate) fn mark_client_alive(&self, client: ClientId) {
        let deadline = self.now().saturating_add(self.config.client_live_ttl_ms);
        self.clients.lock().insert(client, deadline);
    }

    /// Unmounts the given segments, then sweeps their replicas out of every object.
    fn unmount_many(&self, ids: &[SegmentId]) -> usize {
        let killed: Vec<Arc<SegmentSlot>> = {
            let mut registry = self.registry.write();
            ids.iter().filter_map(|id| registry.remove(*id)).collect()
        };
        let count = killed.iter().filter(|slot| slot.kill()).count();
        if count > 0 {
            self.sweep_dead_replicas();
            self.recompute_quotas();
        }
        count
    }

    /// Drops replicas on dead segments from every object (and objects left with none).
    pub(crate) fn sweep_dead_replicas(&self) {
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            for t in shard.tenants.values_mut() {
                let tid = &t.tenant;
                t.objects.retain(|key, obj| {
                    if !obj.has_dead_replica() || !self.drop_dead_replicas(tid, key, obj) {
                        return true;
                    }
                    self.erase_in_place(tid, key, obj);
                    false
                });
            }
        }
    }
}
