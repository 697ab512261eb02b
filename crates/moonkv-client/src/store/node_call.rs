//! What puts and gets through the node share (`put_local`, `get_local`): the caller's memory
//! laid end to end in one plan, and the one request with its answer per key.

use super::lanes::QUIET_BYTES;
use super::{Store, MAX_KEYS_THROUGH_NODE};
use moonkv_dataplane::header::{LocalPlan, MAX_LOCAL_RANGES};
use moonkv_dataplane::same_host::monotonic_now_ns;
use moonkv_proto::{Error, ErrorCode, ItemResult, Result};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Which request the node serves whole.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whole {
    Put,
    Get,
}

impl Whole {
    fn what(self) -> &'static str {
        match self {
            Whole::Put => "put",
            Whole::Get => "get",
        }
    }
}

/// The caller's memory of `objects` (each the concatenation of its `(address, length)` parts)
/// laid end to end: the ranges, neighbouring parts merged, and each object's bytes.
pub(crate) fn laid_end_to_end<O, P>(objects: O) -> (Vec<(u64, u64)>, Vec<u64>)
where
    O: IntoIterator<Item = P>,
    P: IntoIterator<Item = (u64, u64)>,
{
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut sizes = Vec::new();
    for parts in objects {
        let mut size = 0u64;
        for (address, len) in parts.into_iter().filter(|p| p.1 > 0) {
            match ranges.last_mut() {
                Some((a, l)) if *a + *l == address => *l += len,
                _ => ranges.push((address, len)),
            }
            size += len;
        }
        sizes.push(size);
    }
    (ranges, sizes)
}

impl Store {
    /// Sends the node at `endpoint` one request it serves whole (`body` for `keys` keys; the
    /// caller's memory in `ranges`, `total` bytes, with the plan's `flags`) and reads its
    /// answer: one result per key, the call's error for every key when it failed as a whole.
    /// `None`: nothing was done, the usual path does it all (a call the node cannot take: no
    /// key, too many keys or ranges, a node not on this machine; or one it refused, or no
    /// connection to be had). A get's buffers stay lent until the node answers, or, when this
    /// future is dropped or the wait runs out, until it provably let go of them (see
    /// `DataConnection::get_local`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call_node<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        whole: Whole,
        ranges: Vec<(u64, u64)>,
        flags: u32,
        total: u64,
        body: &[u8],
        keys: usize,
    ) -> Option<Vec<Result<T>>> {
        if keys == 0
            || keys > MAX_KEYS_THROUGH_NODE
            || ranges.len() > MAX_LOCAL_RANGES
            || !self.transfer.pool().same_host(endpoint)
        {
            return None;
        }
        let failed = |e: Error| Some((0..keys).map(|_| Err(e.clone())).collect());
        // The node copies nothing after this (its first question to the master, then the
        // copy); the caller waits longer, for the node's last question after the copy (a put's
        // end, a get's revalidation).
        let copy_time = self.config.rpc_timeout + self.transfer.step_timeout();
        let plan = &LocalPlan {
            deadline_ns: monotonic_now_ns().saturating_add(copy_time.as_nanos() as u64),
            ranges,
            flags,
        };
        let wait = copy_time + self.config.rpc_timeout + Duration::from_secs(1);
        let _quiet = (total as usize >= QUIET_BYTES).then(|| self.transfer.quiet_wait());
        let (mut conn, mut reused) = match self.transfer.pool().checkout(endpoint).await {
            Ok(checked_out) => checked_out,
            Err(_) => return None,
        };
        let what = whole.what();
        let answer = loop {
            let call = async {
                match whole {
                    Whole::Put => conn.put_local(plan, total, body).await,
                    Whole::Get => conn.get_local(plan, total, body).await,
                }
            };
            match tokio::time::timeout(wait, call).await {
                Err(_) => {
                    return failed(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!(
                            "node {endpoint} did not answer a same-host {what} within {wait:?}"
                        ),
                    ))
                }
                // An idle connection the node had already closed: it saw nothing of the
                // request, so it goes again on a fresh one.
                Ok(Err(_)) if reused => {
                    reused = false;
                    if self.transfer.pool().redial(&mut conn).await.is_err() {
                        return None;
                    }
                }
                Ok(Err(e)) => return failed(e),
                // Refused before anything was done: the usual path does it all.
                Ok(Ok(Err(_status))) => {
                    self.transfer.pool().checkin(conn);
                    return None;
                }
                Ok(Ok(Ok(answer))) => break answer,
            }
        };
        self.transfer.pool().checkin(conn);
        let items: Vec<ItemResult<T>> = match rmp_serde::from_slice(&answer) {
            Ok(items) => items,
            Err(e) => {
                return failed(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("node {endpoint} answered a same-host {what} with {e}"),
                ))
            }
        };
        if items.len() != keys {
            return failed(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!(
                    "node {endpoint} answered {} items for {keys} keys",
                    items.len()
                ),
            ));
        }
        Some(items.into_iter().map(|item| item.0).collect())
    }
}

/// `NOT_SUPPORTED` from the node: the key is left to the usual path.
pub(crate) fn left_to_caller<T>(item: &Result<T>) -> bool {
    matches!(item, Err(e) if e.code == ErrorCode::NOT_SUPPORTED)
}
