//! Writes between their Start and their End, so that a store being closed (or a process
//! exiting) revokes them at once instead of leaving their keys to the master's discard
//! timeout.

use super::{Store, WriteKind};
use moonkv_proto::ReplicaId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One started write: what its revoke needs.
struct Started {
    tenant: String,
    kind: WriteKind,
    key: String,
    ids: Vec<ReplicaId>,
}

/// The started writes of one store, its clones and its siblings, by token.
#[derive(Default)]
pub(crate) struct InFlight {
    next: AtomicU64,
    writes: Mutex<HashMap<u64, Started>>,
}

impl InFlight {
    /// Number of writes between their Start and their End now.
    pub(crate) fn len(&self) -> usize {
        self.writes.lock().len()
    }
}

/// Revokes a write whose call was dropped between its Start and its End (unsettled, see
/// [`Store::revoke`]), from a background task of the runtime it was dropped in. While it lives
/// its writes are listed in the store's [`InFlight`], so [`Store::abandon_writes`] can revoke
/// them first.
pub(crate) struct RevokeIfCancelled {
    store: Store,
    kind: WriteKind,
    /// Each started write's token in the store's [`InFlight`].
    tokens: Vec<u64>,
    /// Cleared once the call handles its own outcome.
    armed: bool,
}

impl RevokeIfCancelled {
    /// Lists `writes` (key and replica ids of each) as in flight until the guard drops.
    pub(crate) fn new(
        store: &Store,
        kind: WriteKind,
        writes: impl IntoIterator<Item = (String, Vec<ReplicaId>)>,
    ) -> Self {
        let table = &store.transfer.in_flight;
        let mut listed = table.writes.lock();
        let tokens = writes
            .into_iter()
            .map(|(key, ids)| {
                let token = table.next.fetch_add(1, Ordering::Relaxed);
                let started = Started {
                    tenant: store.tenant.clone(),
                    kind,
                    key,
                    ids,
                };
                listed.insert(token, started);
                token
            })
            .collect();
        drop(listed);
        RevokeIfCancelled {
            store: store.clone(),
            kind,
            tokens,
            armed: true,
        }
    }

    /// The call handles its outcome (End, or its own revoke) from here.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for RevokeIfCancelled {
    fn drop(&mut self) {
        // Writes [`Store::abandon_writes`] took are revoked already.
        let writes: Vec<Started> = {
            let mut listed = self.store.transfer.in_flight.writes.lock();
            self.tokens
                .iter()
                .filter_map(|t| listed.remove(t))
                .collect()
        };
        if !self.armed || writes.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (store, kind) = (self.store.clone(), self.kind);
        self.store.transfer.spawn_background(async move {
            for w in writes {
                store.revoke_marked(kind, &w.key, w.ids, true).await;
            }
        });
    }
}

impl Store {
    /// Revokes every write of this store (and its clones) that has started and not ended, as
    /// a closing store must: their calls may still be running or may never run again (their
    /// threads end with the process). Each revoke is marked unsettled, so the master parks the
    /// space a transfer may still reach while the key is free at once; a call whose End comes
    /// later gets it refused and reports the write failed. Returns how many were revoked.
    pub async fn abandon_writes(&self) -> usize {
        let writes: Vec<Started> = self
            .transfer
            .in_flight
            .writes
            .lock()
            .drain()
            .map(|(_, w)| w)
            .collect();
        let revokes = writes.into_iter().map(|w| async move {
            let Ok(store) = self.with_tenant(&w.tenant) else {
                return false;
            };
            store.revoke_marked(w.kind, &w.key, w.ids, true).await
        });
        futures_util::future::join_all(revokes)
            .await
            .into_iter()
            .filter(|&revoked| revoked)
            .count()
    }

    /// Writes between their Start and their End now (this store and its clones).
    pub fn writes_in_flight(&self) -> usize {
        self.transfer.in_flight.len()
    }
}
