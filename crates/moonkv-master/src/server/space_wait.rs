//! Answers the disk tier holds back (`engine/pressure.rs`):
//!
//! - a PutStart or UpsertStart that found no memory while a disk tier can free some leaves its
//!   connection's inline path and is retried until it fits or the engine's `put_space_wait_ms`
//!   has passed, so writers faster than offload are slowed, not failed;
//! - a write or removal that dropped disk replicas is answered once their nodes have deleted
//!   the files (or after `disk_removal_ack_wait_ms`), so a removal the caller was told about
//!   cannot come back from a file after a master restart.
//!
//! Everything else answers at once.

use super::rpc::{dispatch, respond, RpcShared};
use crate::engine::{fence_scope, CatalogFence, Engine};
use moonkv_proto::msg::{Op, Request};
use moonkv_proto::{ErrorCode, ReplicaDescriptor, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between two checks of a held answer.
const RETRY_EVERY: Duration = Duration::from_millis(2);

/// What to do with one request.
pub(crate) enum Answer {
    /// Answered (succeeded or not): the encoded frame.
    Done(Vec<u8>),
    /// A Start held for space; it has not changed anything yet, so without a slot to run it
    /// in it may be retried later from the start. Yields the frame and the fence of the drops
    /// its retries caused.
    HeldStart(Pin<Box<dyn Future<Output = (Vec<u8>, CatalogFence)> + Send>>),
    /// Executed; its answer waits for file deletions.
    HeldDeletion(Pin<Box<dyn Future<Output = Vec<u8>> + Send>>),
}

/// Whether `op` may drop disk replicas (and so delete files): the writes and removals.
pub(crate) fn may_delete_files(op: Op) -> bool {
    let code = op as u16;
    (20..=31).contains(&code) || (40..=43).contains(&code)
}

fn start(engine: &Engine, request: &Request) -> Option<Result<Vec<ReplicaDescriptor>>> {
    match request {
        Request::PutStart(r) => Some(engine.put_start(r)),
        Request::UpsertStart(r) => Some(engine.upsert_start(r)),
        _ => None,
    }
}

/// Runs a write or removal (see [`may_delete_files`]), holding its answer when the disk tier
/// needs it to wait; counts it in the metrics.
pub(crate) fn answer(
    shared: &Arc<RpcShared>,
    engine: &Arc<Engine>,
    request_id: u64,
    request: &Request,
) -> Answer {
    let started = Instant::now();
    let before = engine.deletion_seq();
    let mut out = Vec::new();
    match start(engine, request) {
        Some(result) => match engine.space_wait_deadline(&result) {
            Some(deadline) => {
                let (shared, engine, request) = (shared.clone(), engine.clone(), request.clone());
                return Answer::HeldStart(Box::pin(async move {
                    let (result, fence) = retry(&engine, &request, deadline).await;
                    let mut out = Vec::new();
                    let encoded = respond(&mut out, request_id, &result);
                    shared
                        .metrics
                        .record_reply(&request, &result, encoded, started.elapsed());
                    wait_for_deletions(&engine, before).await;
                    (out, fence)
                }));
            }
            None => {
                let encoded = respond(&mut out, request_id, &result);
                shared
                    .metrics
                    .record_reply(request, &result, encoded, started.elapsed());
            }
        },
        None => dispatch(shared, engine, request_id, request, &mut out),
    }
    let after = engine.deletion_seq();
    if after > before && !engine.deletions_done_through(after) {
        let engine = engine.clone();
        return Answer::HeldDeletion(Box::pin(async move {
            wait_for_deletions(&engine, after).await;
            out
        }));
    }
    Answer::Done(out)
}

/// Retries a held Start until it fits, fails for another reason, or `deadline` passes.
async fn retry(
    engine: &Engine,
    request: &Request,
    deadline: u64,
) -> (Result<Vec<ReplicaDescriptor>>, CatalogFence) {
    let mut fence = CatalogFence::default();
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        let (result, drops) = fence_scope(|| {
            start(engine, request).unwrap_or_else(|| {
                Err(moonkv_proto::Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "only PutStart and UpsertStart are held for space",
                ))
            })
        });
        fence.extend(drops);
        if !crate::engine::found_no_memory(&result) || engine.space_wait_over(deadline) {
            return (result, fence);
        }
    }
}

/// Waits until the deletions numbered up to `seq` are done, or the engine's bound passes.
pub(super) async fn wait_for_deletions(engine: &Engine, seq: u64) {
    if engine.deletion_seq() <= seq && engine.deletions_done_through(seq) {
        return;
    }
    let seq = seq.max(engine.deletion_seq());
    let deadline = engine.deletion_wait_deadline();
    while !engine.deletions_done_through(seq) && !engine.past(deadline) {
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// The blocking-pool form of [`wait_for_deletions`], for scans (RemoveByRegex, RemoveAll).
pub(crate) fn wait_for_deletions_blocking(engine: &Engine, before: u64) {
    let after = engine.deletion_seq();
    if after <= before {
        return;
    }
    let deadline = engine.deletion_wait_deadline();
    while !engine.deletions_done_through(after) && !engine.past(deadline) {
        std::thread::sleep(RETRY_EVERY);
    }
}
