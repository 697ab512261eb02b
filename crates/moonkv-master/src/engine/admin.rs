//! Observability and admin views: segment list, stats, placement snapshot, and the report and
//! snapshot types the admin HTTP server serializes.

use super::sink::Medium;
use super::Engine;
use moonkv_proto::{ClientId, DiskSegment, Segment, SegmentStatus};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// One mounted segment as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentInfo {
    /// The segment as mounted.
    pub segment: Segment,
    /// Owner.
    pub client_id: ClientId,
    /// Current status.
    pub status: SegmentStatus,
    /// Bytes allocated in it.
    pub used_bytes: u64,
    /// Its size.
    pub capacity_bytes: u64,
    /// A client reported its node unreachable since the node's last heartbeat: no new
    /// replicas are placed here.
    pub suspect: bool,
}

/// One known disk as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiskInfo {
    /// The disk as mounted.
    pub disk: DiskSegment,
    /// Owner.
    pub client_id: ClientId,
    /// `OK` (mounted) or `DETACHED` (owner gone; replicas unreadable until remounted).
    pub status: &'static str,
    /// Bytes charged by its replicas (object sizes plus a per-file overhead).
    pub used_bytes: u64,
    /// Its capacity.
    pub capacity_bytes: u64,
}

/// Engine-wide gauges and counters (exported as metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// Sum of mounted segment sizes.
    pub capacity_bytes: u64,
    /// Bytes allocated in mounted segments (including in-flight and parked buffers).
    pub allocated_bytes: u64,
    /// Objects in the map (any state).
    pub key_count: u64,
    /// Objects with an active soft pin.
    pub soft_pin_key_count: u64,
    /// Clients with a live heartbeat.
    pub active_clients: u64,
    /// Eviction rounds that freed something.
    pub evictions_total: u64,
    /// Objects evicted.
    pub evicted_key_count: u64,
    /// Replica bytes evicted.
    pub evicted_size_bytes: u64,
    /// Eviction rounds triggered.
    pub attempted_evictions: u64,
    /// Abandoned or replaced writes whose buffers were parked.
    pub put_start_discard_cnt: u64,
    /// Parked buffers released.
    pub put_start_release_cnt: u64,
    /// Bytes currently parked.
    pub discarded_staging_bytes: u64,
    /// Writes reclaimed by the stalled-write sweep.
    pub stalled_writes_reclaimed: u64,
    /// PutStarts that found no space.
    pub put_start_alloc_failures: u64,
    /// PutStarts granted fewer replicas than asked.
    pub put_start_partial_allocations: u64,
    /// Objects per tenant.
    pub tenant_key_counts: BTreeMap<String, u64>,
    /// Sum of mounted disk capacities.
    pub disk_capacity_bytes: u64,
    /// Bytes charged on mounted disks.
    pub disk_allocated_bytes: u64,
    /// Offloads in flight.
    pub offloads_pending: u64,
    /// Offloads started by eviction.
    pub offloads_started: u64,
    /// Offloads that landed (the object moved to disk).
    pub offloads_completed: u64,
    /// Offloads that failed, were refused or expired.
    pub offloads_failed: u64,
    /// Objects with a readable memory replica (upstream's `mem_cache_nums_`).
    pub mem_cache_objects: u64,
    /// Objects with a readable disk replica (upstream's `file_cache_nums_`).
    pub disk_cache_objects: u64,
}

/// Result of one eviction round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EvictionReport {
    /// Whether the round ran (over the watermark or after a failed allocation).
    pub triggered: bool,
    /// Objects that lost their memory replicas.
    pub evicted_keys: u64,
    /// Replica bytes freed.
    pub evicted_bytes: u64,
    /// Parked buffers released during the round.
    pub released_buffers: u64,
    /// Of `evicted_keys`, objects whose offload to disk started (memory freed when it lands).
    pub offloads_started: u64,
}

/// Quota state of one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TenantQuotaSnapshot {
    /// Tenant name.
    pub tenant_id: String,
    /// Quota asked for by the policy.
    pub requested_quota_bytes: u64,
    /// Quota in force after sharing mounted memory.
    pub effective_quota_bytes: u64,
    /// Bytes charged by the tenant's objects and writes.
    pub charged_bytes: u64,
    /// New writes refused (policy being deleted).
    pub admission_closed: bool,
    /// Charged bytes exceed the effective quota.
    pub over_quota: bool,
    /// The tenant has a registered policy.
    pub has_explicit_policy: bool,
}

/// One object's placement: the media it is available in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacedObject {
    /// Tenant.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// Group id, if any.
    pub group_id: Option<String>,
    /// Media holding a readable replica, in event order.
    pub media: Vec<Medium>,
}

/// Current placement plus the id of the last event it reflects: applying this snapshot and then
/// every event with a larger id yields the exact current placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacementSnapshot {
    /// Highest event id already reflected in `objects`.
    pub watermark_event_id: u64,
    /// Available objects, sorted by tenant then key.
    pub objects: Vec<PlacedObject>,
}

impl Engine {
    /// Every mounted segment, sorted by name then id.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let registry = self.registry.read();
        let mut out: Vec<SegmentInfo> = registry
            .by_id
            .values()
            .map(|slot| SegmentInfo {
                segment: slot.info.clone(),
                client_id: slot.owner,
                status: slot.status(),
                used_bytes: slot.used_bytes(),
                capacity_bytes: slot.info.size,
                suspect: slot.is_suspect(),
            })
            .collect();
        out.sort_by(|a, b| (&a.segment.name, a.segment.id).cmp(&(&b.segment.name, b.segment.id)));
        out
    }

    /// Every known disk (mounted or detached), sorted by name then id.
    pub fn disk_segments(&self) -> Vec<DiskInfo> {
        let registry = self.disks.read();
        let mut out: Vec<DiskInfo> = registry
            .by_id
            .values()
            .map(|slot| DiskInfo {
                disk: slot.info.clone(),
                client_id: slot.owner,
                status: if slot.is_mounted() { "OK" } else { "DETACHED" },
                used_bytes: slot.used_bytes(),
                capacity_bytes: slot.info.capacity_bytes,
            })
            .collect();
        out.sort_by(|a, b| (&a.disk.name, a.disk.id).cmp(&(&b.disk.name, b.disk.id)));
        out
    }

    /// Gauges and counters.
    pub fn stats(&self) -> EngineStats {
        let now = self.now();
        let mut stats = EngineStats {
            capacity_bytes: self.usage.capacity.load(Ordering::Acquire),
            allocated_bytes: self.usage.allocated.load(Ordering::Acquire),
            active_clients: self.clients.lock().len() as u64,
            ..Default::default()
        };
        for i in 0..self.shards.len() {
            let shard = self.lock_shard(i);
            for (name, t) in shard.tenants.iter().filter(|(_, t)| !t.objects.is_empty()) {
                let n = t.objects.len() as u64;
                stats.key_count += n;
                *stats.tenant_key_counts.entry(name.clone()).or_default() += n;
                for o in t.objects.values() {
                    stats.soft_pin_key_count += o.soft_pinned(now) as u64;
                    let media = o.media();
                    stats.mem_cache_objects += media.contains(Medium::Cpu) as u64;
                    stats.disk_cache_objects += media.contains(Medium::Disk) as u64;
                }
            }
        }
        let c = &self.counters;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        stats.evictions_total = load(&c.evictions_total);
        stats.evicted_key_count = load(&c.evicted_key_count);
        stats.evicted_size_bytes = load(&c.evicted_size_bytes);
        stats.attempted_evictions = load(&c.attempted_evictions);
        stats.put_start_discard_cnt = load(&c.put_start_discard_cnt);
        stats.put_start_release_cnt = load(&c.put_start_release_cnt);
        stats.discarded_staging_bytes = load(&c.discarded_staging_bytes);
        stats.stalled_writes_reclaimed = load(&c.stalled_writes_reclaimed);
        stats.put_start_alloc_failures = load(&c.put_start_alloc_failures);
        stats.put_start_partial_allocations = load(&c.put_start_partial_allocations);
        stats.offloads_started = load(&c.offloads_started);
        stats.offloads_completed = load(&c.offloads_completed);
        stats.offloads_failed = load(&c.offloads_failed);
        stats.offloads_pending = self.pending_offloads.count();
        for disk in self.disk_segments().iter().filter(|d| d.status == "OK") {
            stats.disk_capacity_bytes += disk.capacity_bytes;
            stats.disk_allocated_bytes += disk.used_bytes;
        }
        stats
    }

    /// Placement of one tenant's objects (`None`: every tenant) with the event watermark, read
    /// while every shard is locked so no event can slip between the two.
    pub fn placement_snapshot(&self, tenant: Option<&str>) -> PlacementSnapshot {
        let tenant = tenant.map(super::validate::tenant_name);
        let shards = self.lock_all_shards();
        let watermark_event_id = self.sink.last_event_id();
        let mut objects = Vec::new();
        for shard in shards.iter() {
            for (name, t) in shard.tenants.iter() {
                if tenant.is_some_and(|only| only != name) {
                    continue;
                }
                for (key, obj) in t.objects.iter() {
                    let media = obj.media();
                    if media.is_empty() {
                        continue;
                    }
                    objects.push(PlacedObject {
                        tenant: name.clone(),
                        key: key.to_string(),
                        group_id: obj.group().map(str::to_string),
                        media: media.iter().collect(),
                    });
                }
            }
        }
        drop(shards);
        objects.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
        PlacementSnapshot {
            watermark_event_id,
            objects,
        }
    }
}
