//! The sharded (tenant, key) → object map and the helpers every operation goes through: lookup
//! with lazy cleanup of replicas whose segment died, erase with its events and quota refund,
//! insertion, and grouping of batch items by shard.

use super::keyhash::KeyHashState;
use super::object::{ObjectMeta, Replica};
use super::sink::emit_diff;
use super::sink::MediaSet;
use super::validate::read_tenant;
use super::{Engine, ParkedBuffer};
use moonkv_proto::{ClientId, ErrorCode, ItemResult, Result, TenantId};
use parking_lot::MutexGuard;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;

/// Objects of one tenant inside one shard.
#[derive(Debug)]
pub(crate) struct TenantObjects {
    /// Owned once per shard so events can name the tenant without allocating.
    pub(crate) tenant: TenantId,
    /// One record per object, holding its key; a slot is a pointer and a hash (see `ObjectMap`).
    pub(crate) objects: super::object_map::ObjectMap,
}

/// One shard of the object map.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) tenants: HashMap<String, TenantObjects, KeyHashState>,
    /// Lower bound of `put_start_ms` over in-flight objects (u64::MAX: none); lets the stalled
    /// write sweep skip shards that cannot hold an expired write.
    pub(crate) oldest_in_flight_ms: u64,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            tenants: HashMap::default(),
            oldest_in_flight_ms: u64::MAX,
        }
    }
}

impl Shard {
    pub(crate) fn note_in_flight(&mut self, put_start_ms: u64) {
        self.oldest_in_flight_ms = self.oldest_in_flight_ms.min(put_start_ms);
    }
}

/// What to do with an object after an operation looked at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    Keep,
    Erase,
}

impl Engine {
    pub(crate) fn shard_index(&self, tenant: &str, key: &str) -> usize {
        (self.shard_hasher.hash_one((tenant, key)) % self.shards.len() as u64) as usize
    }

    pub(crate) fn lock_shard(&self, index: usize) -> MutexGuard<'_, super::Shard> {
        self.shards[index].lock()
    }

    /// Every shard, locked in index order (RemoveAll, snapshots).
    pub(crate) fn lock_all_shards(&self) -> Vec<MutexGuard<'_, super::Shard>> {
        self.shards.iter().map(|shard| shard.lock()).collect()
    }

    /// Runs `f` on the live object (tenant, key), if any. Replicas whose segment died are dropped
    /// first (with their `removed` events); an object left with no replica is erased and treated
    /// as missing. If `f` answers [`After::Erase`], the object is erased afterwards, emitting
    /// `removed` for every medium it is still available in and refunding its quota charge.
    pub(crate) fn with_object<R>(
        &self,
        shard: &mut Shard,
        tenant: &str,
        key: &str,
        f: impl FnOnce(&TenantId, &mut ObjectMeta) -> (R, After),
    ) -> Option<R> {
        let t = shard.tenants.get_mut(tenant)?;
        let obj = t.objects.get_mut(key)?;
        let (result, after) =
            if obj.has_dead_replica() && self.drop_dead_replicas(&t.tenant, key, obj) {
                (None, After::Erase)
            } else {
                let (r, a) = f(&t.tenant, obj);
                (Some(r), a)
            };
        if after == After::Erase {
            if let Some(obj) = t.objects.remove(key) {
                self.finish_erase(&t.tenant, key, obj);
            }
        }
        result
    }

    /// Drops replicas whose storage is gone. Returns true if nothing is left.
    pub(crate) fn drop_dead_replicas(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
    ) -> bool {
        let before = obj.media();
        let own = self.catalog.epoch();
        let version = obj.version(own);
        obj.replicas.retain(Replica::handle_valid);
        if !obj.replicas.is_empty() && obj.version(own) != version {
            // The value is the same: keep its version, which a written value takes from its
            // smallest replica id, so a returning node's entries for it still match.
            obj.set_adopted_version(Some(version));
        }
        obj.in_flight = obj.replicas.iter().any(Replica::is_processing);
        if obj.offload().is_some_and(|p| {
            !p.replica().handle_valid() || !obj.replicas.iter().any(|r| r.id == p.source)
        }) {
            // The pinned source (or the target disk) is gone: the offload cannot land.
            obj.take_offload();
        }
        self.placement_changed(tenant, key, obj, before);
        obj.replicas.is_empty()
    }

    /// Last rites of an object removed from its map: `removed` per medium it was still
    /// available in, quota refund; its buffers return to their segments when it drops.
    pub(crate) fn finish_erase(&self, tenant: &TenantId, key: &str, mut obj: ObjectMeta) {
        self.erase_in_place(tenant, key, &mut obj);
    }

    /// Inserts a new object (the caller checked that none exists).
    pub(crate) fn insert_object(
        &self,
        shard: &mut Shard,
        tenant: &str,
        key: &str,
        obj: ObjectMeta,
    ) {
        if obj.in_flight {
            shard.note_in_flight(obj.put_start_ms);
        }
        let t = match shard.tenants.get_mut(tenant) {
            Some(t) => t,
            None => shard
                .tenants
                .entry(tenant.to_string())
                .or_insert_with(|| TenantObjects {
                    tenant: TenantId(tenant.to_string()),
                    objects: Default::default(),
                }),
        };
        t.objects.insert(key, obj);
    }

    /// After a change of `obj`'s replicas (under its shard lock): the availability events of
    /// the media it gained or lost since `before`, and its quota charge brought in line.
    pub(crate) fn placement_changed(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &mut ObjectMeta,
        before: MediaSet,
    ) {
        self.media_changed(tenant, key, obj, before);
        self.settle_charge(tenant.as_str(), obj);
    }

    /// The availability events of the media `obj` gained or lost since `before` (a change that
    /// leaves its memory, hence its quota charge, as it was).
    pub(crate) fn media_changed(
        &self,
        tenant: &TenantId,
        key: &str,
        obj: &ObjectMeta,
        before: MediaSet,
    ) {
        emit_diff(
            self.sink.as_ref(),
            tenant,
            key,
            obj.group(),
            before,
            obj.media(),
        );
    }

    /// Brings the object's quota charge in line with the memory it holds (multi-tenant mode).
    pub(crate) fn settle_charge(&self, tenant: &str, obj: &mut ObjectMeta) {
        if !self.config.enable_multi_tenants {
            return;
        }
        let target = obj.memory_bytes();
        if target > obj.charged_bytes {
            self.tenants
                .force_charge(tenant, target - obj.charged_bytes);
        } else if target < obj.charged_bytes {
            self.tenants.refund(tenant, obj.charged_bytes - target);
        }
        obj.charged_bytes = target;
    }

    /// Moves the object's PROCESSING replicas to the parked list until `release_at_ms`, so a
    /// slow writer still writing into them cannot corrupt a reallocated range.
    pub(crate) fn park_processing(&self, obj: &mut ObjectMeta, release_at_ms: u64) {
        self.park_where(obj, release_at_ms, None, Replica::is_processing);
        obj.in_flight = false;
    }

    /// Moves every replica of the object to the parked list (disk replicas are dropped) and
    /// cancels its offload.
    pub(crate) fn park_all(&self, obj: &mut ObjectMeta, release_at_ms: u64) {
        self.park_where(obj, release_at_ms, None, |_| true);
        obj.in_flight = false;
        obj.take_offload();
    }

    /// Parks the replicas `pick` chooses of a write `writer` revoked without knowing whether a
    /// node still writes into them; the writer may release them early (`ReleaseParked`).
    pub(crate) fn park_revoked(
        &self,
        obj: &mut ObjectMeta,
        release_at_ms: u64,
        writer: ClientId,
        pick: impl Fn(&Replica) -> bool,
    ) {
        self.park_where(obj, release_at_ms, Some(writer), pick);
    }

    fn park_where(
        &self,
        obj: &mut ObjectMeta,
        release_at_ms: u64,
        revoked_by: Option<ClientId>,
        pick: impl Fn(&Replica) -> bool,
    ) {
        if !obj.replicas.iter().any(&pick) {
            return;
        }
        let all = std::mem::take(&mut obj.replicas);
        let mut parked = self.parked.lock();
        for replica in all {
            if !pick(&replica) {
                obj.replicas.push(replica);
                continue;
            }
            match replica.placement {
                super::object::Placement::Memory(mut buffer) => {
                    // Its owner forgets it now, not when the parking ends: the replica is gone.
                    buffer.uncatalog();
                    self.counters
                        .discarded_staging_bytes
                        .fetch_add(buffer.len(), Ordering::Relaxed);
                    parked.push(ParkedBuffer {
                        release_at_ms,
                        buffer,
                        revoked: revoked_by.map(|writer| (writer, replica.id)),
                    });
                }
                // File ids are never reused, so a late writer cannot hurt anyone: the file is
                // deleted now (and again by the node if the writer finishes later).
                super::object::Placement::Disk(_) => {}
            }
        }
    }

    /// Groups `indices` of a batch by shard and calls `f(shard, index)` for each, locking every
    /// involved shard exactly once.
    pub(crate) fn for_each_by_shard<'k>(
        &self,
        tenant: &str,
        indices: impl Iterator<Item = usize>,
        key_of: impl Fn(usize) -> &'k str,
        mut f: impl FnMut(&mut Shard, usize),
    ) {
        let mut order: Vec<(usize, usize)> = indices
            .map(|i| (self.shard_index(tenant, key_of(i)), i))
            .collect();
        order.sort_unstable();
        let mut pos = 0;
        while pos < order.len() {
            let shard_idx = order[pos].0;
            let mut shard = self.lock_shard(shard_idx);
            while pos < order.len() && order[pos].0 == shard_idx {
                f(&mut shard, order[pos].1);
                pos += 1;
            }
        }
    }

    /// Shared driver of per-key batches: an invalid tenant fails every item, `check` fails
    /// single items, and `op` runs for the rest with each shard locked once per batch.
    pub(crate) fn batch_items<'k, T>(
        &self,
        raw_tenant: &str,
        n: usize,
        key_of: impl Fn(usize) -> &'k str,
        check: impl Fn(usize) -> Result<()>,
        mut op: impl FnMut(&mut Shard, &str, usize) -> Result<T>,
    ) -> Vec<ItemResult<T>> {
        let tenant = match read_tenant(raw_tenant) {
            Ok(t) => t,
            Err(e) => return (0..n).map(|_| ItemResult(Err(e.clone()))).collect(),
        };
        let mut results: Vec<Option<Result<T>>> = (0..n).map(|i| check(i).err().map(Err)).collect();
        let pending: Vec<usize> = (0..n).filter(|i| results[*i].is_none()).collect();
        self.for_each_by_shard(tenant, pending.into_iter(), key_of, |shard, i| {
            results[i] = Some(op(shard, tenant, i));
        });
        results
            .into_iter()
            .map(|r| ItemResult(r.unwrap_or_else(|| Err(ErrorCode::INTERNAL_ERROR.into()))))
            .collect()
    }
}
