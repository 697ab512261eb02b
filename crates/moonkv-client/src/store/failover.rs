//! Writes that fail over: a put, upsert or batch put whose target node cannot be reached
//! (connection refused, or no answer within the connect timeout) is revoked, the master is told
//! which endpoints did not answer (`ReportUnreachable`, so it stops placing replicas there until
//! those nodes heartbeat again), and the write is placed again, within the same call.
//!
//! Only a failure to *connect* is retried: the node then provably received no byte of this
//! write, and the revoke that frees the key went out before the retry. A write that timed out
//! mid-transfer keeps its revoke deferred (the node may still apply its bytes), so it is never
//! placed again under the same key.

use super::Store;
use moonkv_proto::msg::{ReportUnreachableRequest, Request, MAX_REPORTED_ENDPOINTS};
use moonkv_proto::types::ReplicaDescriptor;
use moonkv_proto::{Error, ErrorCode};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Placements one write tries at most (the first and two more).
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// A failed attempt, and the unreachable endpoints that make it worth placing again.
pub(crate) struct Failed {
    pub error: Error,
    /// `Some`: the write was revoked and these endpoints did not answer.
    pub retry: Option<Vec<String>>,
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Failed { error, retry: None }
    }
}

/// How long and how often one call may place its write again: [`MAX_ATTEMPTS`] placements, and
/// none started after the call's transfer deadline.
pub(crate) struct Window {
    started: Instant,
    deadline: Duration,
    attempts: u32,
}

impl Window {
    pub(crate) fn start(store: &Store) -> Window {
        Window {
            started: Instant::now(),
            deadline: store.config.transfer_timeout,
            attempts: 1,
        }
    }

    /// Whether another placement may start now; counts it.
    pub(crate) fn allows_another(&mut self) -> bool {
        if self.attempts >= MAX_ATTEMPTS || self.started.elapsed() >= self.deadline {
            return false;
        }
        self.attempts += 1;
        true
    }
}

/// A second placement that found no room elsewhere (`NO_AVAILABLE_HANDLE`: every other segment
/// is full, or the unreachable node was the only one) reports why the write really failed: the
/// unreachable node of the attempt before.
pub(crate) fn keep_first_cause(failed: Failed, before: Option<Error>) -> Failed {
    match before {
        Some(cause) if failed.error.code == ErrorCode::NO_AVAILABLE_HANDLE => Failed {
            error: Error::new(
                cause.code,
                format!(
                    "{} (and no other segment could take the write: {})",
                    cause.message, failed.error.message
                ),
            ),
            retry: None,
        },
        _ => failed,
    }
}

impl Store {
    /// Endpoints among `replicas` that do not answer: those this store could not connect to on
    /// its last try, and, after a write that failed on the data plane (`TRANSFER_FAIL`: a
    /// connection reset or closed mid-transfer), those a fresh connection attempt cannot reach
    /// now. `probed` remembers answers within one attempt, so a batch dials each node once.
    pub(crate) async fn unreachable_endpoints(
        &self,
        replicas: &[ReplicaDescriptor],
        error: &Error,
        probed: &mut HashMap<String, bool>,
    ) -> Vec<String> {
        let pool = self.transfer.pool();
        let mut down = Vec::new();
        for replica in replicas.iter().filter(|r| !self.transfer.is_local(r)) {
            let endpoint: &str = &replica.endpoint;
            let gone = match probed.get(endpoint) {
                Some(gone) => *gone,
                None => {
                    let gone = pool.unreachable(endpoint)
                        || (error.code == ErrorCode::TRANSFER_FAIL && !pool.probe(endpoint).await);
                    probed.insert(endpoint.to_string(), gone);
                    gone
                }
            };
            if gone && !down.iter().any(|d| d == endpoint) {
                down.push(endpoint.to_string());
            }
        }
        down.sort();
        down
    }

    /// Tells the master these endpoints did not answer. Best effort: a master that does not
    /// know the request (older) or does not answer still gets the retry, which may then land on
    /// the same node and fail the same way.
    pub(crate) async fn report_unreachable(&self, mut endpoints: Vec<String>) {
        endpoints.truncate(MAX_REPORTED_ENDPOINTS);
        let request = ReportUnreachableRequest {
            client_id: self.master.client_id(),
            endpoints,
        };
        match self
            .master
            .call::<u32>(Request::ReportUnreachable(request))
            .await
        {
            Ok(marked) => tracing::debug!(marked, "reported unreachable nodes to the master"),
            Err(e) => {
                tracing::warn!(error = %e, "could not report unreachable nodes to the master")
            }
        }
    }
}
