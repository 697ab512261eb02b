//! Remove, BatchRemove, RemoveByRegex, RemoveAll, BatchReplicaClear. A read lease blocks removal
//! unless `force`; an incomplete object (a write in flight) blocks it always.

use super::object::{ObjectMeta, Placement, Replica};
use super::read::{compile_regex, matching_keys};
use super::shard::{After, Shard};
use super::validate::{check_key, read_tenant};
use super::Engine;
use moonkv_proto::msg::{
    BatchRemoveRequest, BatchReplicaClearRequest, RemoveAllRequest, RemoveByRegexRequest,
    RemoveRequest,
};
use moonkv_proto::{Error, ErrorCode, ItemResult, Result, TenantId};
use std::collections::BTreeSet;

/// Whether `replica` lies on the memory or disk segment named `name`.
fn held_by(replica: &Replica, name: &str) -> bool {
    match &replica.placement {
        Placement::Memory(buf) => *buf.segment.info.name == *name,
        Placement::Disk(handle) => *handle.slot.info.name == *name,
    }
}

/// Why an object may not be removed right now, if it may not.
fn removal_blocker(obj: &ObjectMeta, force: bool, now: u64) -> Option<Error> {
    if !force && obj.lease_active(now) {
        return Some(Error::new(
            ErrorCode::OBJECT_HAS_LEASE,
            "object has an active read lease",
        ));
    }
    if !obj.all_complete() {
        return Some(Error::new(
            ErrorCode::REPLICA_IS_NOT_READY,
            "object has a write in progress",
        ));
    }
    None
}

impl Engine {
    /// Remove one object.
    pub fn remove(&self, req: &RemoveRequest) -> Result<()> {
        let tenant = read_tenant(&req.tenant)?;
        check_key(&req.key)?;
        let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
        self.remove_locked(&mut shard, tenant, &req.key, req.force, self.now())
    }

    /// BatchRemove: Remove per key, in input order.
    pub fn batch_remove(&self, req: &BatchRemoveRequest) -> Result<Vec<ItemResult<()>>> {
        let now = self.now();
        let keys = &req.keys;
        Ok(self.batch_items(
            &req.tenant,
            keys.len(),
            |i| keys[i].as_str(),
            |i| check_key(&keys[i]),
            |shard, tenant, i| self.remove_locked(shard, tenant, &keys[i], req.force, now),
        ))
    }

    /// RemoveByRegex: removes every removable object of the tenant whose key the regex matches
    /// anywhere in; leased (unless `force`) and incomplete objects are skipped. Returns the count.
    pub fn remove_by_regex(&self, req: &RemoveByRegexRequest) -> Result<i64> {
        let tenant = read_tenant(&req.tenant)?;
        let re = compile_regex(&req.regex)?;
        let now = self.now();
        let mut removed = 0i64;
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            let keys = matching_keys(&shard, tenant, &re);
            for key in keys {
                let erased = self.with_object(&mut shard, tenant, &key, |_, obj| {
                    match removal_blocker(obj, req.force, now) {
                        Some(_) => (false, After::Keep),
                        None => (true, After::Erase),
                    }
                });
                removed += i64::from(erased == Some(true));
            }
        }
        Ok(removed)
    }

    /// RemoveAll of one tenant (an invalid tenant is `INVALID_PARAMS`). Emits `removed` per
    /// object, then `cleared` if the tenant is now empty and nothing was skipped.
    pub fn remove_all(&self, req: &RemoveAllRequest) -> Result<i64> {
        let tenant = read_tenant(&req.tenant)?;
        let mut shards = self.lock_all_shards();
        Ok(self.remove_all_locked(&mut shards, tenant, req.force))
    }

    /// Admin RemoveAll without a tenant: every tenant, each with its own `cleared` decision.
    pub fn remove_all_tenants(&self, force: bool) -> i64 {
        let mut shards = self.lock_all_shards();
        let tenants: BTreeSet<String> = shards
            .iter()
            .flat_map(|s| {
                s.tenants
                    .iter()
                    .filter(|(_, t)| !t.objects.is_empty())
                    .map(|(name, _)| name.clone())
            })
            .collect();
        tenants
            .iter()
            .map(|t| self.remove_all_locked(&mut shards, t, force))
            .sum()
    }

    /// BatchReplicaClear: for each key the caller wrote last whose read lease has run out and
    /// whose replicas are all complete, drops every replica (the object goes, as a remove would)
    /// when `segment_name` is empty, else the replicas held by the memory or disk segment of
    /// that name (the object goes with its last one). Returns the keys cleared, in request
    /// order. Every other key (empty or too long, absent, written last by another client,
    /// leased, being written, or with nothing on that segment) is left untouched and is not in
    /// the answer; only an invalid tenant fails the call.
    pub fn batch_replica_clear(&self, req: &BatchReplicaClearRequest) -> Result<Vec<String>> {
        let tenant = read_tenant(&req.tenant)?;
        let keys = &req.keys;
        let segment = (!req.segment_name.is_empty()).then_some(req.segment_name.as_str());
        let now = self.now();
        let mut cleared = vec![false; keys.len()];
        self.for_each_by_shard(
            tenant,
            (0..keys.len()).filter(|&i| check_key(&keys[i]).is_ok()),
            |i| keys[i].as_str(),
            |shard, i| {
                cleared[i] = self
                    .with_object(shard, tenant, &keys[i], |tenant_id, obj| {
                        if obj.writer != req.client_id || removal_blocker(obj, false, now).is_some()
                        {
                            return (false, After::Keep);
                        }
                        let Some(segment) = segment else {
                            return (true, After::Erase);
                        };
                        let on_segment = |r: &Replica| r.is_complete() && held_by(r, segment);
                        if !obj.replicas.iter().any(on_segment) {
                            return (false, After::Keep);
                        }
                        if obj.replicas.iter().all(on_segment) {
                            return (true, After::Erase);
                        }
                        let before = obj.media();
                        obj.replicas.retain(|r| !on_segment(r));
                        if obj
                            .offload()
                            .is_some_and(|p| !obj.replicas.iter().any(|r| r.id == p.source))
                        {
                            obj.take_offload();
                        }
                        self.placement_changed(tenant_id, &keys[i], obj, before);
                        (true, After::Keep)
                    })
                    .unwrap_or(false);
            },
        );
        Ok(keys
            .iter()
            .zip(cleared)
            .filter(|(_, c)| *c)
            .map(|(k, _)| k.clone())
            .collect())
    }

    fn remove_locked(
        &self,
        shard: &mut Shard,
        tenant: &str,
        key: &str,
        force: bool,
        now: u64,
    ) -> Result<()> {
        self.with_object(shard, tenant, key, |_, obj| {
            match removal_blocker(obj, force, now) {
                Some(e) => (Err(e), After::Keep),
                None => (Ok(()), After::Erase),
            }
        })
        .unwrap_or_else(|| Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "object not found")))
    }

    /// RemoveAll under all shard locks, so "the tenant is now empty" is exact when `cleared`
    /// is decided.
    fn remove_all_locked(
        &self,
        shards: &mut [parking_lot::MutexGuard<'_, Shard>],
        tenant: &str,
        force: bool,
    ) -> i64 {
        let now = self.now();
        let mut removed = 0i64;
        let mut skipped = false;
        let mut tenant_id: Option<TenantId> = None;
        for shard in shards.iter_mut() {
            let Some(t) = shard.tenants.get_mut(tenant) else {
                continue;
            };
            if t.objects.is_empty() {
                continue;
            }
            let tid = &t.tenant;
            tenant_id.get_or_insert_with(|| tid.clone());
            t.objects.retain(|key, obj| {
                if obj.has_dead_replica() && self.drop_dead_replicas(tid, key, obj) {
                    self.erase_in_place(tid, key, obj);
                    return false;
                }
                if removal_blocker(obj, force, now).is_some() {
                    skipped = true;
                    return true;
                }
                self.erase_in_place(tid, key, obj);
                removed += 1;
                false
            });
        }
        let Some(tenant_id) = tenant_id else { return 0 };
        let empty = !shards
            .iter()
            .any(|s| s.tenants.get(tenant).is_some_and(|t| !t.objects.is_empty()));
        if empty && !skipped {
            self.sink.cleared(&tenant_id);
        }
        removed
    }

    /// Events and refund of an object about to be dropped by a `retain` over its map.
    pub(crate) fn erase_in_place(&self, tenant: &TenantId, key: &str, obj: &mut ObjectMeta) {
        super::sink::emit_diff(
            self.sink.as_ref(),
            tenant,
            key,
            obj.group(),
            obj.media(),
            super::sink::MediaSet::EMPTY,
        );
        if obj.charged_bytes > 0 {
            self.tenants.refund(tenant.as_str(), obj.charged_bytes);
            obj.charged_bytes = 0;
        }
    }
}
