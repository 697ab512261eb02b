//! PutStart and UpsertStart that found no memory while a disk tier can free some: the request
//! leaves its connection's inline path and is retried until it fits or the engine's
//! `put_space_wait_ms` has passed (`engine/pressure.rs`), so writers faster than offload are
//! slowed, not failed. Other requests, and these when no disk is mounted, answer at once.

use crate::engine::Engine;
use moonkv_proto::msg::Request;
use moonkv_proto::{ReplicaDescriptor, Result};
use std::time::Duration;

/// Pause between two attempts of a held put.
const RETRY_EVERY: Duration = Duration::from_millis(2);

fn attempt(engine: &Engine, request: &Request) -> Option<Result<Vec<ReplicaDescriptor>>> {
    match request {
        Request::PutStart(r) => Some(engine.put_start(r)),
        Request::UpsertStart(r) => Some(engine.upsert_start(r)),
        _ => None,
    }
}

/// A first attempt at `request`. `Err(deadline)` when it is a Start that must be held (nothing
/// was answered); otherwise the result, to be answered now (`None`: not a Start).
pub(crate) fn first_try(
    engine: &Engine,
    request: &Request,
) -> std::result::Result<Option<Result<Vec<ReplicaDescriptor>>>, u64> {
    let Some(result) = attempt(engine, request) else {
        return Ok(None);
    };
    match engine.space_wait_deadline(&result) {
        Some(deadline) => Err(deadline),
        None => Ok(Some(result)),
    }
}

/// Retries a held Start until it fits, fails for another reason, or `deadline` passes.
pub(crate) async fn retry(
    engine: &Engine,
    request: &Request,
    deadline: u64,
) -> Result<Vec<ReplicaDescriptor>> {
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        let Some(result) = attempt(engine, request) else {
            unreachable_start()?;
            continue;
        };
        let no_room =
            matches!(&result, Err(e) if e.code == moonkv_proto::ErrorCode::NO_AVAILABLE_HANDLE);
        if !no_room || engine.space_wait_over(deadline) {
            return result;
        }
    }
}

fn unreachable_start() -> Result<()> {
    Err(moonkv_proto::Error::new(
        moonkv_proto::ErrorCode::INTERNAL_ERROR,
        "only PutStart and UpsertStart are held for space",
    ))
}
