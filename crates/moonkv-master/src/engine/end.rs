//! PutEnd / PutRevoke / UpsertEnd / UpsertRevoke and their batch forms.
//!
//! Both carry the replica ids the writer got from its own Start and are accepted only if those
//! are exactly the object's in-flight (PROCESSING) replicas of the named type, so an End or
//! Revoke left over from a preempted write can never complete or delete a newer write's
//! replicas. Every rejection leaves the object untouched.

use super::object::{same_ids, ObjectMeta, PinIntent, Replica};
use super::shard::{After, Shard};
use super::validate::{check_key, read_tenant};
use super::Engine;
use moonkv_proto::msg::{BatchEndRequest, BatchRevokeRequest, EndRequest, RevokeRequest};
use moonkv_proto::{
    ClientId, Error, ErrorCode, ItemResult, ReplicaId, ReplicaStatus, ReplicaType, Result,
};

fn not_found() -> Error {
    Error::new(ErrorCode::OBJECT_NOT_FOUND, "object not found")
}

fn illegal_client() -> Error {
    Error::new(
        ErrorCode::ILLEGAL_CLIENT,
        "the object is being written by another client",
    )
}

fn invalid_write(message: &'static str) -> Error {
    Error::new(ErrorCode::INVALID_WRITE, message)
}

/// The arguments of one End.
struct EndArgs<'a> {
    client: ClientId,
    key: &'a str,
    rtype: ReplicaType,
    ids: &'a [ReplicaId],
    checksum: Option<u64>,
}

/// What a revoke names: the writer, the key, which replicas, and whether the writer knows no
/// node still writes into them.
struct RevokeArgs<'a> {
    client: ClientId,
    key: &'a str,
    rtype: ReplicaType,
    ids: &'a [ReplicaId],
    unsettled: bool,
}

impl Engine {
    /// PutEnd: marks the writer's PROCESSING replicas COMPLETE (idempotent once complete).
    pub fn put_end(&self, req: &EndRequest) -> Result<()> {
        let tenant = read_tenant(&req.tenant)?;
        check_key(&req.key)?;
        let args = EndArgs {
            client: req.client_id,
            key: &req.key,
            rtype: req.replica_type,
            ids: &req.replica_ids,
            checksum: req.checksum,
        };
        let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
        self.end_locked(&mut shard, tenant, &args, self.now())
    }

    /// UpsertEnd: same as PutEnd.
    pub fn upsert_end(&self, req: &EndRequest) -> Result<()> {
        self.put_end(req)
    }

    /// PutRevoke: abandons the writer's PROCESSING replicas; nothing is published.
    pub fn put_revoke(&self, req: &RevokeRequest) -> Result<()> {
        let tenant = read_tenant(&req.tenant)?;
        check_key(&req.key)?;
        let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
        let args = RevokeArgs {
            client: req.client_id,
            key: &req.key,
            rtype: req.replica_type,
            ids: &req.replica_ids,
            unsettled: req.unsettled,
        };
        self.revoke_locked(&mut shard, tenant, &args)
    }

    /// UpsertRevoke: same as PutRevoke.
    pub fn upsert_revoke(&self, req: &RevokeRequest) -> Result<()> {
        self.put_revoke(req)
    }

    /// BatchPutEnd: PutEnd per item.
    pub fn batch_put_end(&self, req: &BatchEndRequest) -> Result<Vec<ItemResult<()>>> {
        let items = &req.items;
        // One reading of the clock for the whole batch.
        let now = self.now();
        Ok(self.batch_items(
            &req.tenant,
            items.len(),
            |i| items[i].key.as_str(),
            |i| check_key(&items[i].key),
            |shard, tenant, i| {
                let item = &items[i];
                let args = EndArgs {
                    client: req.client_id,
                    key: &item.key,
                    rtype: req.replica_type,
                    ids: &item.replica_ids,
                    checksum: item.checksum,
                };
                self.end_locked(shard, tenant, &args, now)
            },
        ))
    }

    /// BatchUpsertEnd: same as BatchPutEnd.
    pub fn batch_upsert_end(&self, req: &BatchEndRequest) -> Result<Vec<ItemResult<()>>> {
        self.batch_put_end(req)
    }

    /// BatchPutRevoke: PutRevoke per item.
    pub fn batch_put_revoke(&self, req: &BatchRevokeRequest) -> Result<Vec<ItemResult<()>>> {
        let items = &req.items;
        Ok(self.batch_items(
            &req.tenant,
            items.len(),
            |i| items[i].key.as_str(),
            |i| check_key(&items[i].key),
            |shard, tenant, i| {
                let item = &items[i];
                let args = RevokeArgs {
                    client: req.client_id,
                    key: &item.key,
                    rtype: req.replica_type,
                    ids: &item.replica_ids,
                    unsettled: item.unsettled,
                };
                self.revoke_locked(shard, tenant, &args)
            },
        ))
    }

    /// BatchUpsertRevoke: same as BatchPutRevoke.
    pub fn batch_upsert_revoke(&self, req: &BatchRevokeRequest) -> Result<Vec<ItemResult<()>>> {
        self.batch_put_revoke(req)
    }

    fn end_locked(
        &self,
        shard: &mut Shard,
        tenant: &str,
        args: &EndArgs<'_>,
        now: u64,
    ) -> Result<()> {
        let mut started = false;
        let result = self.with_object(shard, tenant, args.key, |tenant_id, obj| {
            if obj.writer != args.client {
                return (Err(illegal_client()), After::Keep);
            }
            let rtype = args.rtype;
            let in_flight_ids = || processing_targets(obj, rtype).map(|r| r.id);
            if !obj.in_flight || in_flight_ids().next().is_none() {
                // A retry of an End that already succeeded is fine, as long as it names the
                // same (now COMPLETE) replicas.
                let targets = || {
                    obj.replicas
                        .iter()
                        .filter(move |r| r.matches(rtype) && r.handle_valid())
                };
                let done = targets().next().is_some() && targets().all(Replica::is_complete);
                let same = same_ids(args.ids, targets().map(|r| r.id));
                let result = if done && same {
                    Ok(())
                } else {
                    Err(invalid_write("no write in progress for these replicas"))
                };
                return (result, After::Keep);
            }
            if !same_ids(args.ids, in_flight_ids()) {
                return (
                    Err(invalid_write(
                        "replica ids do not match the write in progress",
                    )),
                    After::Keep,
                );
            }
            let before = obj.media();
            let had_complete = obj.has_complete();
            let mut committed: smallvec::SmallVec<[ReplicaId; 4]> = smallvec::SmallVec::new();
            for r in obj
                .replicas
                .iter_mut()
                .filter(|r| r.matches(rtype) && r.handle_valid() && r.is_processing())
            {
                r.status = ReplicaStatus::Complete;
                committed.push(r.id);
            }
            if !had_complete {
                commit_soft_pin(obj, now);
            }
            if args.checksum.is_some() || matches!(rtype, ReplicaType::All | ReplicaType::Memory) {
                obj.set_checksum(args.checksum);
            }
            // The nodes holding the new memory replicas learn they are committed.
            self.catalog_commit(tenant_id, args.key, obj, |r| committed.contains(&r.id));
            obj.in_flight = obj.replicas.iter().any(Replica::is_processing);
            started = obj.in_flight;
            // A zero lease: a freshly written object is immediately removable and evictable.
            obj.grant_lease(now, 0);
            self.media_changed(tenant_id, args.key, obj, before);
            (Ok(()), After::Keep)
        });
        if started {
            shard.note_in_flight(now);
        }
        // The value this write replaced leaves the nodes' catalogs before the End is answered.
        let replaced = self.catalog.take_replaced(args.ids);
        if matches!(result, Some(Ok(()))) {
            super::catalog::add_to_scope(&replaced);
        }
        result.unwrap_or_else(|| Err(not_found()))
    }

    fn revoke_locked(&self, shard: &mut Shard, tenant: &str, args: &RevokeArgs<'_>) -> Result<()> {
        let RevokeArgs {
            client,
            key,
            rtype,
            ids,
            unsettled,
        } = *args;
        // A revoked write is never acknowledged: nothing of it waits for the value it replaced.
        drop(self.catalog.take_replaced(ids));
        let result = self.with_object(shard, tenant, key, |tenant_id, obj| {
            if obj.writer != client {
                return (Err(illegal_client()), After::Keep);
            }
            if !obj.in_flight {
                return (Err(invalid_write("no write in progress")), After::Keep);
            }
            if obj
                .replicas
                .iter()
                .any(|r| r.matches(rtype) && !r.is_processing())
            {
                return (
                    Err(invalid_write(
                        "cannot revoke replicas that are already complete",
                    )),
                    After::Keep,
                );
            }
            if !same_ids(ids, processing_targets(obj, rtype).map(|r| r.id)) {
                return (
                    Err(invalid_write(
                        "replica ids do not match the write in progress",
                    )),
                    After::Keep,
                );
            }
            let before = obj.media();
            if unsettled {
                // The writer cannot tell whether a node still writes into them: the key is free
                // now, the space only at the release timeout or the writer's ReleaseParked.
                let release_at = self
                    .now()
                    .saturating_add(self.config.put_start_release_timeout_ms);
                self.park_revoked(obj, release_at, client, |r| {
                    r.matches(rtype) && r.is_processing()
                });
            } else {
                // Freed at once: the writer itself says it stopped writing.
                obj.replicas
                    .retain(|r| !(r.matches(rtype) && r.is_processing()));
            }
            obj.set_pin_intent(PinIntent::Preserve);
            obj.in_flight = obj.replicas.iter().any(Replica::is_processing);
            self.placement_changed(tenant_id, key, obj, before);
            let after = if obj.replicas.is_empty() {
                After::Erase
            } else {
                After::Keep
            };
            (Ok(()), after)
        });
        result.unwrap_or_else(|| Err(not_found()))
    }
}

/// PROCESSING replicas an End/Revoke of `rtype` addresses.
fn processing_targets(
    obj: &ObjectMeta,
    rtype: ReplicaType,
) -> impl Iterator<Item = &Replica> + Clone {
    obj.replicas
        .iter()
        .filter(move |r| r.matches(rtype) && r.handle_valid() && r.is_processing())
}

/// Applies the write's soft-pin request when it first makes the object readable; later Ends,
/// repeated Ends and reads never move the deadline.
fn commit_soft_pin(obj: &mut ObjectMeta, now: u64) {
    match obj.pin_intent() {
        PinIntent::Preserve => {}
        PinIntent::Enable(ttl) => obj.set_soft_pin_deadline_ms(now.saturating_add(ttl)),
        PinIntent::Clear => obj.set_soft_pin_deadline_ms(0),
    }
    obj.set_pin_intent(PinIntent::Preserve);
}
