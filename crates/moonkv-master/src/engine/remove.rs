//! Remove, BatchRemove, RemoveByRegex, RemoveAll. A read lease blocks removal unless `force`;
//! an incomplete object (a write in flight) blocks it always.

use super::object::ObjectMeta;
use super::read::{compile_regex, matching_keys};
use super::shard::{After, Shard};
use super::validate::{check_key, read_tenant};
use super::Engine;
use moonkv_proto::msg::{
    BatchRemoveRequest, RemoveAllRequest, RemoveByRegexRequest, RemoveRequest,
};
use moonkv_proto::{Error, ErrorCode, ItemResult, Result, TenantId};
use std::collections::BTreeSet;

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
