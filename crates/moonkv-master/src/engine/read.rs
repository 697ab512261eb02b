//! Reads: ExistKey, GetReplicaList (single, batch, regex), RevalidateReplicas, and the admin
//! key listings. Successful reads grant a read lease.

use super::grants::Use;
use super::object::ObjectMeta;
use super::shard::{After, Shard};
use super::validate::{check_key, invalid, read_tenant, tenant_name};
use super::Engine;
use moonkv_proto::msg::{
    KeyRequest, KeysRequest, RegexRequest, RevalidateItem, RevalidateRequest, ServiceReadyRequest,
};
use moonkv_proto::{
    Error, ErrorCode, GetReplicaListResponse, ItemResult, ReplicaDescriptor, Result,
};
use regex::Regex;

/// Compiles a client regex; a bad one is the caller's error, not ours.
/// The keys of `tenant` in one shard that `re` matches anywhere in (search semantics); copied
/// out so the caller can then touch each object under the same lock.
pub(crate) fn matching_keys(shard: &Shard, tenant: &str, re: &Regex) -> Vec<Box<str>> {
    shard
        .tenants
        .get(tenant)
        .map(|t| {
            t.objects
                .keys()
                .filter(|k| re.is_match(k))
                .map(Box::from)
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn compile_regex(pattern: &str) -> Result<Regex> {
    Regex::new(pattern).map_err(|_| invalid("invalid regular expression"))
}

impl Engine {
    /// ServiceReady: answers the master version (a liveness probe).
    pub fn service_ready(&self, _req: &ServiceReadyRequest) -> Result<String> {
        Ok(env!("CARGO_PKG_VERSION").to_string())
    }

    /// ExistKey: true iff the object has a readable replica (then a read lease is granted);
    /// missing, in-flight or unreadable objects answer false, never an error.
    pub fn exist_key(&self, req: &KeyRequest) -> Result<bool> {
        let tenant = read_tenant(&req.tenant)?;
        check_key(&req.key)?;
        let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
        Ok(self.exist_locked(&mut shard, tenant, &req.key, self.now()))
    }

    /// BatchExistKey: ExistKey per key, in input order.
    pub fn batch_exist_key(&self, req: &KeysRequest) -> Result<Vec<ItemResult<bool>>> {
        let now = self.now();
        Ok(self.batch_keys(req, |shard, tenant, key| {
            Ok(self.exist_locked(shard, tenant, key, now))
        }))
    }

    /// GetReplicaList: the readable replicas and a read lease.
    pub fn get_replica_list(&self, req: &KeyRequest) -> Result<GetReplicaListResponse> {
        let tenant = read_tenant(&req.tenant)?;
        check_key(&req.key)?;
        let mut response = {
            let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
            self.replica_list_locked(&mut shard, tenant, &req.key, Some(self.now()))?
        };
        self.grant(&mut response.replicas, tenant, Use::Read);
        Ok(response)
    }

    /// BatchGetReplicaList: GetReplicaList per key, in input order.
    pub fn batch_get_replica_list(
        &self,
        req: &KeysRequest,
    ) -> Result<Vec<ItemResult<GetReplicaListResponse>>> {
        let now = self.now();
        let mut items = self.batch_keys(req, |shard, tenant, key| {
            self.replica_list_locked(shard, tenant, key, Some(now))
        });
        self.grant_reads(&mut items, tenant_name(&req.tenant));
        Ok(items)
    }

    /// GetReplicaListByRegex: readable replicas of every key of the tenant the regex matches
    /// anywhere in (search semantics), sorted by key; each match gets a read lease.
    pub fn get_replica_list_by_regex(
        &self,
        req: &RegexRequest,
    ) -> Result<Vec<(String, Vec<ReplicaDescriptor>)>> {
        let tenant = read_tenant(&req.tenant)?;
        let re = compile_regex(&req.regex)?;
        let now = self.now();
        let ttl = self.config.default_kv_lease_ttl_ms;
        let mut out = Vec::new();
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            let keys = matching_keys(&shard, tenant, &re);
            for key in keys {
                let found = self.with_object(&mut shard, tenant, &key, |_, obj| {
                    if !obj.has_readable() {
                        return (None, After::Keep);
                    }
                    obj.grant_lease(now, ttl);
                    (Some(readable_descriptors(obj)), After::Keep)
                });
                if let Some(Some(replicas)) = found {
                    out.push((key.into_string(), replicas));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, replicas) in &mut out {
            self.grant(replicas, tenant, Use::Read);
        }
        Ok(out)
    }

    /// RevalidateReplicas: per item, OK iff the object exists and every given id is one of its
    /// current COMPLETE readable replicas; a missing object is `OBJECT_NOT_FOUND`, anything else
    /// (evicted, replaced, rewritten in place) `INVALID_REPLICA`. Grants no lease.
    pub fn revalidate_replicas(&self, req: &RevalidateRequest) -> Result<Vec<ItemResult<()>>> {
        let items = &req.items;
        Ok(self.batch_items(
            &req.tenant,
            items.len(),
            |i| items[i].key.as_str(),
            |i| check_revalidate(&items[i]),
            |shard, tenant, i| {
                let item = &items[i];
                let found = self.with_object(shard, tenant, &item.key, |_, obj| {
                    let all_live = item
                        .replica_ids
                        .iter()
                        .all(|id| obj.replicas.iter().any(|r| r.id == *id && r.is_readable()));
                    (all_live, After::Keep)
                });
                match found {
                    None => Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "object not found")),
                    Some(true) => Ok(()),
                    Some(false) => Err(Error::new(
                        ErrorCode::INVALID_REPLICA,
                        "replicas were replaced or removed",
                    )),
                }
            },
        ))
    }

    /// Admin `/query_key`: the replicas of one object. Unlike upstream it takes no read lease
    /// (a look must not block removal or eviction: `curl` in a loop would pin any key), and the
    /// answer carries no grants: the admin endpoint is for looking, not for reading bytes.
    pub fn query_key(&self, tenant: &str, key: &str) -> Result<GetReplicaListResponse> {
        let tenant = read_tenant(tenant)?;
        check_key(key)?;
        let mut shard = self.lock_shard(self.shard_index(tenant, key));
        self.replica_list_locked(&mut shard, tenant, key, None)
    }

    /// Admin `/get_all_keys`: keys of the tenant's readable objects, sorted.
    pub fn all_keys(&self, tenant: &str) -> Vec<String> {
        let Ok(tenant) = read_tenant(tenant) else {
            return Vec::new();
        };
        let mut keys = Vec::new();
        for i in 0..self.shards.len() {
            let shard = self.lock_shard(i);
            if let Some(t) = shard.tenants.get(tenant) {
                keys.extend(
                    t.objects
                        .iter()
                        .filter(|(_, o)| o.has_readable())
                        .map(|(k, _)| k.to_string()),
                );
            }
        }
        keys.sort();
        keys
    }

    fn exist_locked(&self, shard: &mut Shard, tenant: &str, key: &str, now: u64) -> bool {
        let ttl = self.config.default_kv_lease_ttl_ms;
        self.with_object(shard, tenant, key, |_, obj| {
            let readable = obj.has_readable();
            if readable {
                obj.grant_lease(now, ttl);
            }
            (readable, After::Keep)
        })
        .unwrap_or(false)
    }

    fn replica_list_locked(
        &self,
        shard: &mut Shard,
        tenant: &str,
        key: &str,
        lease_from: Option<u64>,
    ) -> Result<GetReplicaListResponse> {
        let ttl = self.config.default_kv_lease_ttl_ms;
        self.with_object(shard, tenant, key, |_, obj| {
            if !obj.has_readable() {
                let e = if obj.in_flight {
                    Error::new(
                        ErrorCode::REPLICA_IS_NOT_READY,
                        "no replica is complete yet",
                    )
                } else {
                    // Only copies on a detached disk: a miss until its node comes back.
                    Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        "object not found (its only copy is on a disk whose node is away)",
                    )
                };
                return (Err(e), After::Keep);
            }
            if let Some(now) = lease_from {
                obj.grant_lease(now, ttl);
                self.consider_promotion(tenant, key, obj, now);
            }
            let response = GetReplicaListResponse {
                replicas: readable_descriptors(obj),
                lease_ttl_ms: if lease_from.is_some() { ttl } else { 0 },
                object_checksum: obj.checksum(),
            };
            (Ok(response), After::Keep)
        })
        .unwrap_or_else(|| Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "object not found")))
    }

    /// Shared driver of key-list batches: tenant errors fail every item, key errors their item.
    fn batch_keys<T>(
        &self,
        req: &KeysRequest,
        mut op: impl FnMut(&mut Shard, &str, &str) -> Result<T>,
    ) -> Vec<ItemResult<T>> {
        let keys = &req.keys;
        self.batch_items(
            &req.tenant,
            keys.len(),
            |i| keys[i].as_str(),
            |i| check_key(&keys[i]),
            |shard, tenant, i| op(shard, tenant, &keys[i]),
        )
    }
}

fn check_revalidate(item: &RevalidateItem) -> Result<()> {
    check_key(&item.key)?;
    if item.replica_ids.is_empty() {
        return Err(invalid("replica_ids is empty"));
    }
    Ok(())
}

fn readable_descriptors(obj: &ObjectMeta) -> Vec<ReplicaDescriptor> {
    obj.replicas
        .iter()
        .filter(|r| r.is_readable())
        .map(|r| r.descriptor(obj.size))
        .collect()
}
