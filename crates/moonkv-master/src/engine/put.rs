//! PutStart / UpsertStart and their batch forms: admission, preemption of abandoned writes,
//! in-place and replacing upserts, and replica placement.

use super::alloc::aligned_len;
use super::config::AllocationStrategy;
use super::grants::Use;
use super::object::{ObjectMeta, PinIntent, Placement, Replica};
use super::replica_list::ReplicaList;
use super::segments::{MemBuffer, NameGroup};
use super::shard::{After, Shard};
use super::sink::{emit_diff, MediaSet};
use super::validate::{batch_group, check_object, invalid, single_group, tenant_name};
use super::Engine;
use moonkv_proto::msg::{BatchPutStartRequest, PutStartRequest};
use moonkv_proto::{
    ClientId, Error, ErrorCode, ItemResult, ReplicaDescriptor, ReplicaStatus, ReplicateConfig,
    Result,
};
use rand::Rng;
use std::sync::atomic::Ordering;

/// One key of a Start, validated.
struct WriteSpec<'a> {
    client: ClientId,
    tenant: &'a str,
    key: &'a str,
    size: u64,
    config: &'a ReplicateConfig,
    group: Option<&'a str>,
    pin: PinIntent,
    /// Tenant-quota bytes charged at admission; handed to the new object or refunded.
    precharge: u64,
}

/// What an UpsertStart found.
enum UpsertPath {
    /// Allocate a new record, carrying these properties over from a replaced one.
    Fresh {
        soft_pin_deadline_ms: u64,
        hard_pinned: bool,
        group: Option<Box<str>>,
    },
    /// Same-size rewrite of the existing buffers.
    InPlace(Vec<ReplicaDescriptor>),
}

impl Engine {
    /// PutStart: allocates PROCESSING replicas for a new object.
    pub fn put_start(&self, req: &PutStartRequest) -> Result<Vec<ReplicaDescriptor>> {
        let mut descriptors = self.start_one(req, false)?;
        self.grant(&mut descriptors, tenant_name(&req.tenant), Use::Write);
        Ok(descriptors)
    }

    /// UpsertStart: like PutStart, but replaces an existing object (in place when the size is
    /// unchanged) and preempts any write in flight on the key.
    pub fn upsert_start(&self, req: &PutStartRequest) -> Result<Vec<ReplicaDescriptor>> {
        let mut descriptors = self.start_one(req, true)?;
        self.grant(&mut descriptors, tenant_name(&req.tenant), Use::Write);
        Ok(descriptors)
    }

    /// BatchPutStart: PutStart per key; tenant, length and config errors fail every item.
    pub fn batch_put_start(
        &self,
        req: &BatchPutStartRequest,
    ) -> Result<Vec<ItemResult<Vec<ReplicaDescriptor>>>> {
        let mut items = self.start_batch(req, false);
        self.grant_items(&mut items, tenant_name(&req.tenant), Use::Write);
        Ok(items)
    }

    /// BatchUpsertStart: UpsertStart per key, validated like BatchPutStart.
    pub fn batch_upsert_start(
        &self,
        req: &BatchPutStartRequest,
    ) -> Result<Vec<ItemResult<Vec<ReplicaDescriptor>>>> {
        let mut items = self.start_batch(req, true);
        self.grant_items(&mut items, tenant_name(&req.tenant), Use::Write);
        Ok(items)
    }

    fn start_one(&self, req: &PutStartRequest, upsert: bool) -> Result<Vec<ReplicaDescriptor>> {
        let tenant = self.write_tenant(&req.tenant)?;
        check_object(&req.key, req.size)?;
        let pin = self.check_write_config(&req.config)?;
        let group = single_group(&req.config)?;
        let precharge = self.admit(
            tenant,
            req.size.saturating_mul(req.config.replica_num as u64),
        )?;
        let spec = WriteSpec {
            client: req.client_id,
            tenant,
            key: &req.key,
            size: req.size,
            config: &req.config,
            group,
            pin,
            precharge,
        };
        let mut shard = self.lock_shard(self.shard_index(tenant, &req.key));
        self.start_locked(&mut shard, &spec, upsert, self.now())
    }

    fn start_batch(
        &self,
        req: &BatchPutStartRequest,
        upsert: bool,
    ) -> Vec<ItemResult<Vec<ReplicaDescriptor>>> {
        let n = req.keys.len();
        let fail_all = |e: Error| (0..n).map(|_| ItemResult(Err(e.clone()))).collect();
        let tenant = match self.write_tenant(&req.tenant) {
            Ok(t) => t,
            Err(e) => return fail_all(e),
        };
        if req.sizes.len() != n || req.config.group_ids.as_ref().is_some_and(|g| g.len() != n) {
            return fail_all(invalid("sizes and group_ids must have one entry per key"));
        }
        let pin = match self.check_write_config(&req.config) {
            Ok(p) => p,
            Err(e) => return fail_all(e),
        };
        let mut results: Vec<ItemResult<Vec<ReplicaDescriptor>>> = (0..n)
            .map(|_| ItemResult(Err(Error::from(ErrorCode::INTERNAL_ERROR))))
            .collect();
        let per_key_bytes = req.config.replica_num as u64;
        // One reading of the clock for the whole batch (milliseconds; a batch takes microseconds).
        let now = self.now();
        let charges: Vec<Option<u64>> = (0..n)
            .map(|i| {
                let admitted = check_object(&req.keys[i], req.sizes[i])
                    .and_then(|()| self.admit(tenant, req.sizes[i].saturating_mul(per_key_bytes)));
                match admitted {
                    Ok(c) => Some(c),
                    Err(e) => {
                        results[i] = ItemResult(Err(e));
                        None
                    }
                }
            })
            .collect();
        self.for_each_by_shard(
            tenant,
            (0..n).filter(|i| charges[*i].is_some()),
            |i| req.keys[i].as_str(),
            |shard, i| {
                let spec = WriteSpec {
                    client: req.client_id,
                    tenant,
                    key: &req.keys[i],
                    size: req.sizes[i],
                    config: &req.config,
                    group: batch_group(&req.config, i),
                    pin,
                    precharge: charges[i].unwrap_or(0),
                };
                results[i] = ItemResult(self.start_locked(shard, &spec, upsert, now));
            },
        );
        results
    }

    /// Runs a Start under its shard lock; refunds the admission charge when it fails.
    fn start_locked(
        &self,
        shard: &mut Shard,
        spec: &WriteSpec<'_>,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDescriptor>> {
        let mark = super::catalog::drops_mark();
        let result = if upsert {
            self.upsert_locked(shard, spec, now)
        } else {
            self.put_locked(shard, spec, now)
        };
        match &result {
            // What an UpsertStart replaced must be gone from the nodes' catalogs before its End
            // is acknowledged (the End waits, not the Start). PutStart's drops (a stalled write
            // it preempts) were never waited for, and PutEnd is not fenced.
            Ok(descriptors) if upsert => {
                let replaced = super::catalog::drops_since(mark);
                if !replaced.is_empty() {
                    let ids: Vec<moonkv_proto::ReplicaId> =
                        descriptors.iter().map(|d| d.id).collect();
                    self.catalog.hold_replaced(&ids, replaced, now);
                }
            }
            Ok(_) => {}
            Err(_) => self.refund_admission(spec.tenant, spec.precharge),
        }
        result
    }

    fn put_locked(
        &self,
        shard: &mut Shard,
        spec: &WriteSpec<'_>,
        now: u64,
    ) -> Result<Vec<ReplicaDescriptor>> {
        let discard = self.config.put_start_discard_timeout_ms;
        let release = self.config.put_start_release_timeout_ms;
        let existing = self.with_object(shard, spec.tenant, spec.key, |_, obj| {
            if obj.has_available() || now <= obj.put_start_ms.saturating_add(discard) {
                return (
                    Err(Error::new(
                        ErrorCode::OBJECT_ALREADY_EXISTS,
                        "object already exists",
                    )),
                    After::Keep,
                );
            }
            // An abandoned write older than the discard timeout: take the key over, but keep its
            // buffers parked until the old writer can no longer be writing into them.
            let release_at = obj.put_start_ms.saturating_add(release);
            self.park_processing(obj, release_at);
            self.counters
                .put_start_discard_cnt
                .fetch_add(1, Ordering::Relaxed);
            let carried = if obj.soft_pinned(now) {
                obj.soft_pin_deadline_ms()
            } else {
                0
            };
            (Ok(carried), After::Erase)
        });
        let soft_pin = existing.transpose()?.unwrap_or(0);
        self.create_object(
            shard,
            spec,
            now,
            soft_pin,
            spec.config.with_hard_pin,
            spec.group,
        )
    }

    fn upsert_locked(
        &self,
        shard: &mut Shard,
        spec: &WriteSpec<'_>,
        now: u64,
    ) -> Result<Vec<ReplicaDescriptor>> {
        let release_at = now.saturating_add(self.config.put_start_release_timeout_ms);
        let existing = self.with_object(shard, spec.tenant, spec.key, |tenant, obj| {
            if let Some(g) = spec.group {
                if obj.group() != Some(g) {
                    return (
                        Err(invalid("the group id of an existing object cannot change")),
                        After::Keep,
                    );
                }
            }
            let carried_pin = if obj.soft_pinned(now) {
                obj.soft_pin_deadline_ms()
            } else {
                0
            };
            if obj.in_flight {
                // Upsert preempts any write in flight immediately.
                self.park_processing(obj, release_at);
                obj.set_pin_intent(PinIntent::Preserve);
                self.counters
                    .put_start_discard_cnt
                    .fetch_add(1, Ordering::Relaxed);
                if !obj.has_complete() {
                    let group = obj.take_group();
                    let fresh = UpsertPath::Fresh {
                        soft_pin_deadline_ms: carried_pin,
                        hard_pinned: spec.config.with_hard_pin,
                        group,
                    };
                    return (Ok(fresh), After::Erase);
                }
            }
            let before = obj.media();
            // Disk files are written once: an object with a disk copy (or one wanted) is
            // replaced, never rewritten in place. Nor is one under a read lease: a reader may
            // be copying those bytes right now and, its lease still live, would not revalidate.
            let in_place = obj.size == spec.size
                && !obj.has_disk()
                && !spec.config.with_disk_replica
                && !obj.lease_active(now);
            if in_place {
                // In place: same buffers and addresses. The replicas get NEW ids on purpose
                // (upstream keeps them): a reader revalidating ids it got before this rewrite
                // must be told INVALID_REPLICA, since the bytes behind them are being replaced.
                obj.writer = spec.client;
                obj.put_start_ms = now;
                for r in obj.replicas.iter_mut().filter(|r| r.is_complete()) {
                    r.status = ReplicaStatus::Processing;
                    r.id = self.replica_ids.next_id();
                    // The committed value is being overwritten: its node forgets it first.
                    if let Placement::Memory(buf) = &mut r.placement {
                        buf.uncatalog();
                    }
                }
                obj.set_pin_intent(spec.pin);
                obj.in_flight = true;
                self.media_changed(tenant, spec.key, obj, before);
                let descriptors = obj
                    .replicas
                    .iter()
                    .map(|r| r.descriptor(obj.size))
                    .collect();
                return (Ok(UpsertPath::InPlace(descriptors)), After::Keep);
            }
            // Replaced: the old value goes away now. Its committed buffers have no writer left,
            // only readers, so they stay parked until the last read lease ends (writes in flight
            // were parked above for the full release timeout).
            let group = obj.take_group();
            emit_diff(
                self.sink.as_ref(),
                tenant,
                spec.key,
                group.as_deref(),
                before,
                MediaSet::EMPTY,
            );
            self.park_all(obj, obj.lease_deadline_ms.max(now));
            let fresh = UpsertPath::Fresh {
                soft_pin_deadline_ms: carried_pin,
                hard_pinned: obj.hard_pinned || spec.config.with_hard_pin,
                group,
            };
            (Ok(fresh), After::Erase)
        });
        match existing.transpose()? {
            Some(UpsertPath::InPlace(descriptors)) => {
                shard.note_in_flight(now);
                self.refund_admission(spec.tenant, spec.precharge);
                Ok(descriptors)
            }
            Some(UpsertPath::Fresh {
                soft_pin_deadline_ms,
                hard_pinned,
                group,
            }) => {
                let group = spec.group.or(group.as_deref());
                self.create_object(shard, spec, now, soft_pin_deadline_ms, hard_pinned, group)
            }
            None => self.create_object(shard, spec, now, 0, spec.config.with_hard_pin, spec.group),
        }
    }

    /// Allocates replicas and inserts a new in-flight record (the key is known to be free).
    fn create_object(
        &self,
        shard: &mut Shard,
        spec: &WriteSpec<'_>,
        now: u64,
        soft_pin_deadline_ms: u64,
        hard_pinned: bool,
        group: Option<&str>,
    ) -> Result<Vec<ReplicaDescriptor>> {
        let mut replicas = self.place(
            spec.size,
            spec.config.replica_num,
            &spec.config.preferred_segments,
        )?;
        if spec.config.with_disk_replica {
            let disk = self.place_disk(spec.size, &replicas)?;
            replicas.push(disk);
        }
        let mut obj = ObjectMeta::new(spec.size, spec.client, now, replicas, true);
        obj.charged_bytes = spec.precharge;
        obj.hard_pinned = hard_pinned;
        obj.set_soft_pin_deadline_ms(soft_pin_deadline_ms);
        obj.set_group(group.map(Box::from));
        obj.set_pin_intent(spec.pin);
        self.settle_charge(spec.tenant, &mut obj);
        let descriptors = obj
            .replicas
            .iter()
            .map(|r| r.descriptor(obj.size))
            .collect();
        self.insert_object(shard, spec.tenant, spec.key, obj);
        Ok(descriptors)
    }

    /// Picks up to `replica_num` segments with distinct names: preferred names first, then by
    /// strategy, on distinct hosts (`host_id`) while hosts with room remain, then on any host.
    /// Fewer than asked is a partial success; none is `NO_AVAILABLE_HANDLE`.
    fn place(&self, size: u64, replica_num: u32, preferred: &[String]) -> Result<ReplicaList> {
        let no_handle = || Error::new(ErrorCode::NO_AVAILABLE_HANDLE, super::pressure::NO_MEMORY);
        let len = aligned_len(size).ok_or_else(no_handle)?;
        let registry = self.registry.read();
        let groups = &registry.groups;
        let names = groups.len();
        let want = (replica_num as usize).min(names);
        // One replica (the usual case) stays inline: no allocation for the list.
        let mut out = ReplicaList::default();
        let mut rng = rand::rng();
        for name in preferred {
            if out.len() >= want {
                break;
            }
            if let Some(&gi) = registry.group_index.get(name.as_str()) {
                self.try_group(&groups[gi], len, &mut out, &mut rng, false);
            }
        }
        if self.config.allocation_strategy == AllocationStrategy::FreeRatioFirst && out.len() < want
        {
            let sample = (6 * (want - out.len())).min(names);
            let start = rng.random_range(0..names);
            let mut picks: Vec<(f64, usize)> = (0..sample)
                .map(|i| {
                    let gi = (start + i) % names;
                    (groups[gi].free_ratio(), gi)
                })
                .collect();
            picks.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
            for (_, gi) in picks {
                if out.len() >= want {
                    break;
                }
                self.try_group(&groups[gi], len, &mut out, &mut rng, true);
            }
        }
        // Every name once more: first only hosts that hold no replica of this object yet, then
        // any host.
        for spread in [true, false] {
            if out.len() >= want {
                break;
            }
            let start = rng.random_range(0..names);
            for i in 0..names {
                if out.len() >= want {
                    break;
                }
                self.try_group(
                    &groups[(start + i) % names],
                    len,
                    &mut out,
                    &mut rng,
                    spread,
                );
            }
        }
        // Names with a segment that takes new replicas at all (not frozen for re-adoption, not
        // reported unreachable): only a lack of room there is something eviction can fix.
        let placeable = out.is_empty().then(|| {
            groups
                .iter()
                .filter(|g| g.slots.iter().any(|slot| slot.is_placeable()))
                .count()
        });
        drop(registry);
        if let Some(placeable) = placeable {
            self.counters
                .put_start_alloc_failures
                .fetch_add(1, Ordering::Relaxed);
            if placeable == 0 && names > 0 {
                return Err(Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    "no segment takes new replicas now: every one is being re-adopted or its node was reported unreachable",
                ));
            }
            if placeable >= replica_num as usize {
                self.need_eviction.store(true, Ordering::Release);
            }
            return Err(no_handle());
        }
        if out.len() < replica_num as usize {
            self.counters
                .put_start_partial_allocations
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Allocates one replica in `group` unless the object already has one under that name
    /// (or, with `spread`, on that group's host).
    fn try_group(
        &self,
        group: &NameGroup,
        len: u64,
        out: &mut ReplicaList,
        rng: &mut impl Rng,
        spread: bool,
    ) {
        let taken = out.iter().any(|r| match &r.placement {
            Placement::Memory(buf) => {
                *buf.segment.info.name == *group.name
                    || (spread
                        && group
                            .slots
                            .iter()
                            .any(|slot| slot.info.host_id == buf.segment.info.host_id))
            }
            Placement::Disk(_) => false,
        });
        if taken || group.slots.is_empty() {
            return;
        }
        let start = rng.random_range(0..group.slots.len());
        if let Some((segment, address)) = group.allocate(len, start) {
            out.push(Replica {
                id: self.replica_ids.next_id(),
                status: ReplicaStatus::Processing,
                placement: Placement::Memory(MemBuffer::new(segment, address, len)),
            });
        }
    }
}
