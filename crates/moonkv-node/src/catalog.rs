//! The node's catalog of its committed memory replicas, kept so that a master that lost its
//! metadata (restart, failover) can rebuild the objects from the node
//! (`docs/operations.md`, "Restart and re-adoption").
//!
//! Each segment keeps its entries (`SegmentMemory::catalog_*`). The master feeds them through
//! a long poll (`SyncCatalog`): `Commit` when a replica's PutEnd was acknowledged, `Drop` when
//! it left its object. A write into a range forgets the entries it overlaps before a byte
//! changes, so an entry always describes intact bytes. When the master asks for a remount,
//! [`Announcer`] sends the entries of every segment (`AdoptReplicas`) if the master is a new
//! one (another epoch), or if it is the one that expired this node and takes a returning
//! node's catalog back (it then only returns replicas to objects it still holds unchanged);
//! otherwise it forgets them.

use crate::server::SegmentTable;
use moonkv_client::master_client::{MasterClient, RemountHook};
use moonkv_proto::msg::{
    AdoptReplicasRequest, AdoptReplicasResponse, CatalogNotice, Request, SyncCatalogRequest,
    SyncCatalogResponse,
};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the master may hold one poll.
const POLL_WAIT_MS: u32 = 1_000;

/// Entries per AdoptReplicas request.
const ADOPT_CHUNK: usize = 4_096;

/// What the poll loop and the announcer share.
#[derive(Debug, Default)]
pub struct CatalogState {
    /// Epoch of the master the catalog's entries were last reconciled with (0: none yet).
    mount_epoch: AtomicU64,
    /// Entries announced and adopted by the last re-adoption, and how long it took (ms).
    pub last_adopted: AtomicU64,
    /// How long the last re-adoption took, in milliseconds.
    pub last_adopt_ms: AtomicU64,
}

/// Polls the master for notices and applies them until the task is aborted.
pub(crate) async fn run_sync(
    route: crate::server::MasterRoute,
    segments: SegmentTable,
    state: Arc<CatalogState>,
) {
    let master = &route.client;
    let mut epoch = 0u64;
    let mut acked = 0u64;
    let mut failures = 0u32;
    loop {
        let request = Request::SyncCatalog(SyncCatalogRequest {
            client_id: master.client_id(),
            epoch,
            acked,
            wait_ms: POLL_WAIT_MS,
        });
        let timeout = Duration::from_millis(u64::from(POLL_WAIT_MS)) + master.config().rpc_timeout;
        // By a call when the master runs in this process (`moonkv up`): a notice then reaches
        // the node, and its acknowledgement the master, without a socket.
        let answered = route
            .call_with_timeout::<SyncCatalogResponse>(request, timeout)
            .await;
        match answered {
            Ok(answer) => {
                failures = 0;
                let _ = state.mount_epoch.compare_exchange(
                    0,
                    answer.epoch,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                epoch = answer.epoch;
                acked = answer.last;
                apply(&segments, answer);
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(50) {
                    tracing::debug!(error = %e, failures, "catalog poll failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn apply(segments: &SegmentTable, answer: SyncCatalogResponse) {
    let table = segments.read();
    if answer.reset {
        tracing::info!("the master dropped this node's replicas; forgetting the catalog");
        for memory in table.values() {
            memory.catalog_clear();
        }
    }
    for notice in answer.notices {
        match notice {
            CatalogNotice::Commit(entry) => {
                if let Some(memory) = table.get(&entry.segment_id) {
                    memory.catalog_commit(entry);
                }
            }
            CatalogNotice::Drop {
                segment_id,
                address,
                len,
            } => {
                if let Some(memory) = table.get(&segment_id) {
                    memory.catalog_forget(address, len);
                }
            }
        }
    }
}

/// Announces the catalog after a remount (see the module documentation).
pub(crate) struct Announcer {
    pub(crate) segments: SegmentTable,
    pub(crate) state: Arc<CatalogState>,
}

impl RemountHook for Announcer {
    fn remounted(
        &self,
        master: MasterClient,
        master_epoch: u64,
        merges_returning: bool,
    ) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let segments = self.segments.clone();
        let state = self.state.clone();
        Box::pin(async move {
            let previous = state.mount_epoch.swap(master_epoch, Ordering::AcqRel);
            let announce = previous != 0 && (previous != master_epoch || merges_returning);
            let started = Instant::now();
            let mut adopted = 0u64;
            let memories: Vec<_> = segments.read().values().cloned().collect();
            for memory in memories {
                let entries = if announce {
                    memory.catalog_entries()
                } else {
                    // The same master expired this node and cannot take them back: it dropped
                    // these replicas.
                    memory.catalog_clear();
                    Vec::new()
                };
                let mut entries = entries.into_iter();
                loop {
                    let chunk: Vec<_> = entries.by_ref().take(ADOPT_CHUNK).collect();
                    let done = entries.len() == 0;
                    let request = AdoptReplicasRequest {
                        client_id: master.client_id(),
                        segment_id: memory.id(),
                        entries: chunk,
                        done,
                    };
                    match master
                        .call::<AdoptReplicasResponse>(Request::AdoptReplicas(request))
                        .await
                    {
                        Ok(answer) => {
                            memory.catalog_forget_at(&answer.rejected);
                            adopted += answer.adopted;
                        }
                        Err(e) => {
                            // The master's freeze ends by itself; the next remount retries.
                            tracing::warn!(segment = %memory.id(), error = %e, "announcing replicas failed");
                            break;
                        }
                    }
                    if done {
                        break;
                    }
                    if crate::failpoints::fires(crate::failpoints::ANNOUNCE_MID_CATALOG) {
                        tracing::warn!("fault point: the announcement stops here");
                        std::future::pending::<()>().await;
                    }
                }
            }
            let took = started.elapsed();
            state.last_adopted.store(adopted, Ordering::Release);
            state
                .last_adopt_ms
                .store(took.as_millis() as u64, Ordering::Release);
            if announce {
                tracing::info!(
                    adopted,
                    took_ms = took.as_millis() as u64,
                    "replicas re-adopted by a new master"
                );
            }
        })
    }
}
