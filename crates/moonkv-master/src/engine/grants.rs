//! Capability grants on handed-out descriptors (`moonkv_proto::grant`). Without a grant key
//! this is a no-op and costs nothing; with one, each descriptor costs one HMAC, computed after
//! the shard lock is released.

use super::Engine;
use moonkv_proto::grant::{Grant, FILE, READ, WRITE};
use moonkv_proto::{GetReplicaListResponse, ItemResult, ReplicaDescriptor, ReplicaKind};

/// What a batch of descriptors may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Reads (GetReplicaList and its forms).
    Read,
    /// Writes of a put or upsert in flight (reads too, to verify).
    Write,
}

impl Engine {
    /// Attaches a grant for `tenant` to every descriptor, when a grant key is configured.
    pub(crate) fn grant(&self, descriptors: &mut [ReplicaDescriptor], tenant: &str, usage: Use) {
        let Some(key) = &self.config.grant_key else {
            return;
        };
        let (rights, ttl) = match usage {
            Use::Read => (
                READ,
                self.config.read_grant_ttl_ms.unwrap_or(
                    self.config
                        .default_kv_lease_ttl_ms
                        .saturating_add(super::config::READ_GRANT_MARGIN_MS),
                ),
            ),
            Use::Write => (READ | WRITE, self.config.put_start_release_timeout_ms),
        };
        let now = self.now();
        let expires_ms = now.saturating_add(ttl);
        for d in descriptors {
            let file = if d.kind == ReplicaKind::LocalDisk {
                FILE
            } else {
                0
            };
            let grant = Grant::new(rights | file, expires_ms, d.address, d.size, tenant)
                .for_replica(d.id.0, now);
            d.grant = Some(grant.seal(key, d.segment_id));
        }
    }

    /// [`Engine::grant`] over per-key results.
    pub(crate) fn grant_items(
        &self,
        items: &mut [ItemResult<Vec<ReplicaDescriptor>>],
        tenant: &str,
        usage: Use,
    ) {
        if self.config.grant_key.is_none() {
            return;
        }
        for descriptors in items.iter_mut().filter_map(|i| i.0.as_mut().ok()) {
            self.grant(descriptors, tenant, usage);
        }
    }

    /// [`Engine::grant`] over per-key read answers.
    pub(crate) fn grant_reads(
        &self,
        items: &mut [ItemResult<GetReplicaListResponse>],
        tenant: &str,
    ) {
        if self.config.grant_key.is_none() {
            return;
        }
        for response in items.iter_mut().filter_map(|i| i.0.as_mut().ok()) {
            self.grant(&mut response.replicas, tenant, Use::Read);
        }
    }
}
