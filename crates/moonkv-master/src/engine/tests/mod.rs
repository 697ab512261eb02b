//! Engine behaviour tests, driven by a manual clock and a recording sink (never sleeping).
//!
//! Case numbers refer to the behavioural list of the upstream semantics reference (§9); `fix_*`
//! tests pin the deliberate fixes of SPEC §2, `rfc_*` the replica-id RFC.

mod adopt;
mod bad_input;
mod disk;
mod events;
mod evict;
mod grants;
mod model;
mod pressure;
mod promote;
mod put_get;
mod remove;
mod rfc;
mod segments;
mod tenants;
mod upsert;

use super::*;
use moonkv_proto::msg::*;
use moonkv_proto::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) const BASE: u64 = 0x3_0000_0000;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const LEASE_MS: u64 = 50;
pub(super) const START_MS: u64 = 1_000_000;

/// One availability change as the sink saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ev {
    Stored(String, String, Option<String>, Medium),
    Removed(String, String, Option<String>, Medium),
    Cleared(String),
}

/// Sink that records every call and numbers events like a publisher would.
#[derive(Debug, Default)]
pub(super) struct RecordingSink {
    events: Mutex<Vec<Ev>>,
    last_id: AtomicU64,
}

impl RecordingSink {
    pub(super) fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.events.lock())
    }

    fn push(&self, ev: Ev) {
        self.last_id.fetch_add(1, Ordering::SeqCst);
        self.events.lock().push(ev);
    }
}

impl AvailabilitySink for RecordingSink {
    fn stored(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium) {
        self.push(Ev::Stored(
            tenant.0.clone(),
            key.into(),
            group_id.map(Into::into),
            medium,
        ));
    }
    fn removed(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium) {
        self.push(Ev::Removed(
            tenant.0.clone(),
            key.into(),
            group_id.map(Into::into),
            medium,
        ));
    }
    fn cleared(&self, tenant: &TenantId) {
        self.push(Ev::Cleared(tenant.0.clone()));
    }
    fn last_event_id(&self) -> u64 {
        self.last_id.load(Ordering::SeqCst)
    }
}

pub(super) fn stored(key: &str) -> Ev {
    Ev::Stored("default".into(), key.into(), None, Medium::Cpu)
}

pub(super) fn removed(key: &str) -> Ev {
    Ev::Removed("default".into(), key.into(), None, Medium::Cpu)
}

pub(super) fn code<T: std::fmt::Debug>(r: Result<T>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.code,
    }
}

pub(super) fn ids(descs: &[ReplicaDescriptor]) -> Vec<ReplicaId> {
    descs.iter().map(|d| d.id).collect()
}

/// An engine with a manual clock, a recording sink and (usually) one mounted segment.
pub(super) struct Harness {
    pub(super) engine: Engine,
    pub(super) clock: Arc<ManualClock>,
    pub(super) sink: Arc<RecordingSink>,
    pub(super) client: ClientId,
    next_segment: AtomicU64,
}

impl Harness {
    /// The §9 setup: one 16 MiB segment at 0x300000000, lease 50 ms, single-tenant mode.
    pub(super) fn new() -> Self {
        let h = Self::bare(Self::config());
        h.mount("seg-0", BASE, 16 * MIB);
        h.sink.take();
        h
    }

    pub(super) fn config() -> EngineConfig {
        EngineConfig {
            default_kv_lease_ttl_ms: LEASE_MS,
            shard_count: 16,
            ..Default::default()
        }
    }

    /// No segment mounted.
    pub(super) fn bare(config: EngineConfig) -> Self {
        assert_eq!(config.validate(), Ok(()));
        let clock = Arc::new(ManualClock::new(START_MS));
        let sink = Arc::new(RecordingSink::default());
        let engine = Engine::new(config, clock.clone(), sink.clone());
        Self {
            engine,
            clock,
            sink,
            client: ClientId::new(7, 7),
            next_segment: AtomicU64::new(1),
        }
    }

    /// A master restart: a fresh engine with the same configuration, clock and sink, and no
    /// segment mounted, and a later epoch. Nothing survives in the engine itself: objects come
    /// back only when nodes announce them (`adopt`).
    pub(super) fn restart(&mut self) {
        let mut config = self.engine.config().clone();
        // A new master process has a new, later epoch.
        config.epoch += 1;
        self.engine = Engine::new(config, self.clock.clone(), self.sink.clone());
    }

    pub(super) fn segment(&self, name: &str, base: u64, size: u64) -> Segment {
        let n = self.next_segment.fetch_add(1, Ordering::SeqCst);
        Segment {
            id: SegmentId::new(1, n),
            name: name.into(),
            base,
            size,
            endpoint: name.into(),
            protocol: "tcp".into(),
            host_id: "host".into(),
        }
    }

    pub(super) fn mount(&self, name: &str, base: u64, size: u64) -> SegmentId {
        self.mount_for(self.client, name, base, size)
    }

    pub(super) fn mount_for(
        &self,
        client: ClientId,
        name: &str,
        base: u64,
        size: u64,
    ) -> SegmentId {
        let segment = self.segment(name, base, size);
        let id = segment.id;
        self.engine
            .mount_segment(&MountSegmentRequest {
                segment,
                client_id: client,
                keeps_catalog: true,
            })
            .unwrap();
        id
    }

    pub(super) fn unmount(&self, id: SegmentId) -> Result<()> {
        self.engine.unmount_segment(&UnmountSegmentRequest {
            segment_id: id,
            client_id: self.client,
        })
    }

    pub(super) fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    pub(super) fn start_req(
        &self,
        tenant: &str,
        key: &str,
        size: u64,
        config: ReplicateConfig,
    ) -> PutStartRequest {
        PutStartRequest {
            client_id: self.client,
            tenant: tenant.into(),
            key: key.into(),
            size,
            config,
        }
    }

    pub(super) fn put_start(&self, key: &str, size: u64) -> Result<Vec<ReplicaDescriptor>> {
        self.engine
            .put_start(&self.start_req("", key, size, ReplicateConfig::default()))
    }

    pub(super) fn put_start_with(
        &self,
        key: &str,
        size: u64,
        config: ReplicateConfig,
    ) -> Result<Vec<ReplicaDescriptor>> {
        self.engine
            .put_start(&self.start_req("", key, size, config))
    }

    pub(super) fn end_req(
        &self,
        tenant: &str,
        key: &str,
        replica_ids: Vec<ReplicaId>,
    ) -> EndRequest {
        EndRequest {
            client_id: self.client,
            tenant: tenant.into(),
            key: key.into(),
            replica_type: ReplicaType::All,
            replica_ids,
            checksum: None,
        }
    }

    pub(super) fn revoke_req(
        &self,
        tenant: &str,
        key: &str,
        replica_ids: Vec<ReplicaId>,
    ) -> RevokeRequest {
        RevokeRequest {
            client_id: self.client,
            tenant: tenant.into(),
            key: key.into(),
            replica_type: ReplicaType::All,
            replica_ids,
            unsettled: false,
        }
    }

    pub(super) fn put_end(&self, key: &str, descs: &[ReplicaDescriptor]) -> Result<()> {
        self.engine.put_end(&self.end_req("", key, ids(descs)))
    }

    pub(super) fn put_revoke(&self, key: &str, descs: &[ReplicaDescriptor]) -> Result<()> {
        self.engine
            .put_revoke(&self.revoke_req("", key, ids(descs)))
    }

    /// A complete Put in the default tenant.
    pub(super) fn put(&self, key: &str, size: u64) -> Vec<ReplicaDescriptor> {
        self.put_in("", key, size)
    }

    pub(super) fn put_in(&self, tenant: &str, key: &str, size: u64) -> Vec<ReplicaDescriptor> {
        let descs = self
            .engine
            .put_start(&self.start_req(tenant, key, size, ReplicateConfig::default()))
            .unwrap();
        self.engine
            .put_end(&self.end_req(tenant, key, ids(&descs)))
            .unwrap();
        descs
    }

    pub(super) fn key_req(&self, tenant: &str, key: &str) -> KeyRequest {
        KeyRequest {
            tenant: tenant.into(),
            key: key.into(),
        }
    }

    pub(super) fn get(&self, key: &str) -> Result<GetReplicaListResponse> {
        self.engine.get_replica_list(&self.key_req("", key))
    }

    pub(super) fn exists(&self, key: &str) -> bool {
        self.engine.exist_key(&self.key_req("", key)).unwrap()
    }

    pub(super) fn remove(&self, key: &str, force: bool) -> Result<()> {
        self.engine.remove(&RemoveRequest {
            tenant: String::new(),
            key: key.into(),
            force,
        })
    }

    pub(super) fn remove_all(&self, tenant: &str, force: bool) -> Result<i64> {
        self.engine.remove_all(&RemoveAllRequest {
            tenant: tenant.into(),
            force,
        })
    }

    pub(super) fn revalidate(&self, key: &str, replica_ids: Vec<ReplicaId>) -> Result<()> {
        let req = RevalidateRequest {
            tenant: String::new(),
            items: vec![RevalidateItem {
                key: key.into(),
                replica_ids,
            }],
        };
        self.engine.revalidate_replicas(&req).unwrap().remove(0).0
    }

    pub(super) fn ping(&self, client: ClientId) -> ClientStatus {
        self.engine
            .ping(&PingRequest {
                client_id: client,
                mounted_segments: 0,
            })
            .unwrap()
            .client_status
    }
}
