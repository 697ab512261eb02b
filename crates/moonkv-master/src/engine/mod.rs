//! The metadata engine: a synchronous, I/O-free state machine over objects, replicas, leases,
//! segments, clients, eviction and tenants, with an injected [`Clock`].
//!
//! Map of the rooms:
//! - [`clock`], [`sink`], [`config`]: the injected time source, the availability-event hook and
//!   the tunables.
//! - `alloc`, `segments`: per-segment best-fit allocators and the buffer handles replicas hold.
//! - `object`, `replica_list`, `shard`, `keyhash`: object records, replica ids, the sharded
//!   (tenant, key) map and its keyed hash.
//! - `put`, `end`, `read`, `remove`: the RPC operations on objects.
//! - `mounts`: segments and clients (mount, unmount, ping, expiry).
//! - `evict`, `sweep`: watermark eviction, stalled-write reclamation, parked buffers.
//! - `disk`, `disk_mounts`, `offload`: the disk tier — disk accounting and file handles, disk
//!   mount/detach/revive, write-through placement and offload-on-evict (`docs/disk-tier.md`).
//! - `tenants`: tenant registration and quotas; `admin`: stats and snapshots.
//! - `grants`: capability grants attached to descriptors when a grant key is configured.
//!
//! Locking: every object lives in one of `shard_count` shards chosen by hash(tenant, key); a
//! request takes its shard's mutex once (a batch takes each involved shard's mutex once). Lock
//! order is clients → shards (ascending index) → tenant accounts → segment registry → disk
//! registry → one segment allocator → parked buffers → offload mailboxes; a disk's tombstone and
//! deletion lists are leaves. No path takes them in another order. The locks are parking_lot's,
//! which do not poison: a request that panicked must not fail every request after it.

pub mod clock;
pub mod config;
pub mod sink;

mod admin;
mod adopt;
mod alloc;
mod catalog;
mod disk;
mod disk_mounts;
mod end;
mod evict;
mod grants;
mod keyhash;
mod mounts;
mod object;
mod object_map;
mod offload;
mod pressure;
mod promote;
mod put;
mod read;
mod remove;
mod replica_list;
mod segments;
mod shard;
mod sweep;
mod tenants;
mod validate;

#[cfg(test)]
mod tests;

pub use admin::{
    DiskInfo, EngineStats, EvictionReport, PlacedObject, PlacementSnapshot, SegmentInfo,
    TenantQuotaSnapshot,
};
pub use catalog::{fence_scope, CatalogFence, PendingNotices};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{default_shard_count, AllocationStrategy, EngineConfig, EngineConfigError};
pub use pressure::{found_no_memory, TierStats};
pub use promote::PromotionStats;
pub use sink::{AvailabilitySink, Medium, NoopSink};

use moonkv_proto::{ClientId, OffloadTask, ReplicaId};
use object::ReplicaIdGen;
use parking_lot::{Mutex, RwLock};
use segments::{MemBuffer, Registry, SpaceUsage};
use shard::Shard;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// A buffer taken from an abandoned or replaced write, kept out of the allocator until a slow
/// writer can no longer be writing into it.
#[derive(Debug)]
struct ParkedBuffer {
    release_at_ms: u64,
    buffer: MemBuffer,
    /// Set for the replica of a revoked write whose writer may release it early
    /// (`ReleaseParked`) once it knows no node still writes into it.
    revoked: Option<(ClientId, ReplicaId)>,
}

/// Monotonic counters exported as metrics.
#[derive(Debug, Default)]
struct Counters {
    evictions_total: AtomicU64,
    attempted_evictions: AtomicU64,
    evicted_key_count: AtomicU64,
    evicted_size_bytes: AtomicU64,
    put_start_discard_cnt: AtomicU64,
    put_start_release_cnt: AtomicU64,
    discarded_staging_bytes: AtomicU64,
    stalled_writes_reclaimed: AtomicU64,
    put_start_alloc_failures: AtomicU64,
    put_start_partial_allocations: AtomicU64,
    offloads_started: AtomicU64,
    offloads_completed: AtomicU64,
    offloads_failed: AtomicU64,
    /// Disk tier under pressure (`pressure.rs`).
    tier: pressure::TierCounters,
}

/// The master's metadata engine. `Send + Sync`; every method takes `&self`.
pub struct Engine {
    config: EngineConfig,
    clock: Arc<dyn Clock>,
    sink: Arc<dyn AvailabilitySink>,
    /// Chooses the shard of (tenant, key); seeded apart from the maps inside the shards.
    shard_hasher: keyhash::KeyHashState,
    shards: Box<[Mutex<Shard>]>,
    registry: RwLock<Registry>,
    usage: Arc<SpaceUsage>,
    /// Live clients → heartbeat deadline (ms).
    clients: Mutex<HashMap<ClientId, u64>>,
    /// Clients whose life is this master's own, never expired ([`Engine::never_expire`]).
    undying: Mutex<Vec<ClientId>>,
    parked: Mutex<Vec<ParkedBuffer>>,
    replica_ids: ReplicaIdGen,
    /// Set when an allocation failed; the next eviction round runs even below the watermark.
    need_eviction: AtomicBool,
    tenants: tenants::TenantBook,
    counters: Counters,
    disks: RwLock<disk::DiskRegistry>,
    /// Offload tasks not yet fetched, per disk owner.
    offload_mailboxes: Mutex<HashMap<ClientId, Vec<OffloadTask>>>,
    /// Offloads started and not yet landed, failed or cancelled.
    pending_offloads: Arc<disk::OffloadBacklog>,
    /// Set when a put gave up waiting for offloads: the next eviction round drops plainly.
    offload_stalled: AtomicBool,
    /// Commit and drop notices for the nodes' catalogs of committed replicas.
    catalog: Arc<catalog::CatalogBook>,
}

/// Which of the engine's periodic duties are due ([`Engine::run_duties`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Duties {
    /// Eviction only: it runs often (every few milliseconds), because writers wait for space.
    Eviction,
    /// Every duty: deadlines are checked about once a second.
    All,
}

impl Engine {
    /// Builds an empty engine. The configuration is expected to have passed
    /// [`EngineConfig::validate`]; a zero shard count is treated as one.
    pub fn new(
        config: EngineConfig,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn AvailabilitySink>,
    ) -> Engine {
        let shard_count = config.shard_count.max(1);
        let shards = (0..shard_count)
            .map(|_| Mutex::new(Shard::default()))
            .collect();
        Engine {
            clock,
            sink,
            shard_hasher: keyhash::KeyHashState::new_random(),
            shards,
            registry: RwLock::new(Registry::default()),
            usage: Arc::new(SpaceUsage::default()),
            clients: Mutex::new(HashMap::new()),
            undying: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
            replica_ids: ReplicaIdGen::new_random(),
            need_eviction: AtomicBool::new(false),
            tenants: tenants::TenantBook::default(),
            counters: Counters::default(),
            disks: RwLock::new(disk::DiskRegistry::default()),
            offload_mailboxes: Mutex::new(HashMap::new()),
            pending_offloads: Arc::new(disk::OffloadBacklog::default()),
            offload_stalled: AtomicBool::new(false),
            catalog: Arc::new(catalog::CatalogBook::new(config.epoch)),
            config,
        }
    }

    /// The configuration this engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs every periodic duty once ([`Engine::run_duties`] with all of them due).
    pub fn tick(&self) {
        self.run_duties(Duties::All);
    }

    /// The engine's periodic duties, in their one order; the server's maintenance thread and
    /// the tests both run them through here, so no duty can exist in one schedule only.
    /// Deadline duties (`Duties::All`): re-adoptions that overran their deadline take writes
    /// again, silent clients are expired, graceful unmounts end, stalled writes are swept.
    /// Eviction runs every time, last, so it sees the space the others freed.
    pub fn run_duties(&self, due: Duties) {
        if due == Duties::All {
            self.thaw_overdue_adoptions();
            self.expire_clients();
            self.run_graceful_unmounts();
            self.sweep_stalled_writes();
        }
        self.run_eviction();
    }

    /// Runs `work` (the answer to a request); the availability changes it reports leave from
    /// this thread when it is done, instead of waking the event publisher's thread for them
    /// ([`AvailabilitySink::inline`]). A batch's End reports one change per key: their wake-up
    /// of another thread, on a busy host, cost more than encoding them here.
    pub fn reporting_inline<R>(&self, work: impl FnOnce() -> R) -> R {
        through_sink(work, |w| self.sink.inline(w)).0
    }

    /// Like [`Engine::reporting_inline`], but what `work` reported leaves when the second value
    /// is dropped (`None`: nothing to send), so that a caller can answer first.
    pub fn reporting_deferred<R>(&self, work: impl FnOnce() -> R) -> (R, Option<Box<dyn Send>>) {
        through_sink(work, |w| self.sink.inline_deferred(w))
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }
}

/// Runs `work` through `sink_call` (a sink method that takes the work as a `&mut dyn FnMut()`
/// and runs it once): `work`'s result and the sink's.
fn through_sink<R, T>(
    work: impl FnOnce() -> R,
    sink_call: impl FnOnce(&mut dyn FnMut()) -> T,
) -> (R, T) {
    let mut work = Some(work);
    let mut out = None;
    let from_sink = sink_call(&mut || {
        if let Some(work) = work.take() {
            out = Some(work());
        }
    });
    match out {
        Some(out) => (out, from_sink),
        None => unreachable!("the sink runs the work it is given exactly once"),
    }
}
