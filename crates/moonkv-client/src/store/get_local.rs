//! Gets through the node (`docs/data-plane.md`, *Gets through the node*): a standalone store
//! whose node takes whole gets (its STATS say `get_local`) hands it the keys and its buffers
//! in one GET_LOCAL request. The node asks the master for the replicas in this store's tenant
//! and copies each object it holds straight into this process: one request crossing
//! processes instead of a replica list and a copy request.
//!
//! Anything the node does not take comes back for the usual path: the whole call when the node
//! refuses the request (an older node, a connection that is not attached), and each key it
//! could not read itself (answered `NOT_SUPPORTED`, nothing written), which the usual path
//! reads or answers with its own errors.

use super::lanes::QUIET_BYTES;
use super::{Store, MAX_KEYS_THROUGH_NODE};
use moonkv_dataplane::header::{LocalPlan, MAX_LOCAL_RANGES};
use moonkv_dataplane::same_host::{monotonic_now_ns, LONG_CALL_BYTES};
use moonkv_proto::{Error, ErrorCode, ItemResult, Result};
use std::time::Duration;

/// One answer per key: `None` for a key the node left to the usual path.
pub(crate) type NodeReads = Vec<Option<Result<usize>>>;

impl Store {
    /// Reads `keys` through the node into `targets` (key i into the leading buffers of
    /// `targets[i]`), when this store has such a node and the call fits one request. `None`:
    /// the node read nothing, read every key the usual way. Keys must be valid (checked by
    /// the caller).
    pub(crate) async fn get_through_node(
        &self,
        keys: &[&str],
        targets: &[Vec<&mut [u8]>],
    ) -> Option<NodeReads> {
        let endpoint = self.config.get_local_node.as_deref()?;
        if keys.is_empty()
            || keys.len() > MAX_KEYS_THROUGH_NODE
            || keys.len() != targets.len()
            || !self.transfer.pool().same_host(endpoint)
        {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut capacities = Vec::with_capacity(keys.len());
        for parts in targets {
            let mut capacity = 0u64;
            for part in parts.iter().filter(|p| !p.is_empty()) {
                let (address, len) = (part.as_ptr() as u64, part.len() as u64);
                match ranges.last_mut() {
                    Some((a, l)) if *a + *l == address => *l += len,
                    _ => ranges.push((address, len)),
                }
                capacity += len;
            }
            capacities.push(capacity);
        }
        let total: u64 = capacities.iter().sum();
        // A long call goes the usual way: its copy requests spread over the node's threads,
        // and its round trips cost it little. (Copied by the node on two threads, large gets
        // measured slower than their copy requests: docs/benchmarks.md, *Gets through the
        // node*.)
        if ranges.len() > MAX_LOCAL_RANGES
            || capacities.contains(&0)
            || total as usize >= LONG_CALL_BYTES
        {
            return None;
        }
        let body = rmp_serde::to_vec(&(&self.tenant, keys, &capacities)).ok()?;
        // The node copies nothing after this (its question to the master, then the copy); the
        // caller waits longer, for a revalidation after the copy.
        let copy_time = self.config.rpc_timeout + self.transfer.step_timeout();
        let plan = LocalPlan {
            deadline_ns: monotonic_now_ns().saturating_add(copy_time.as_nanos() as u64),
            ranges,
            flags: 0,
        };
        let wait = copy_time + self.config.rpc_timeout + Duration::from_secs(1);
        let _quiet = (total as usize >= QUIET_BYTES).then(|| self.transfer.quiet_wait());
        let (mut conn, mut reused) = match self.transfer.pool().checkout(endpoint).await {
            Ok(checked_out) => checked_out,
            Err(_) => return None,
        };
        let failed = |e: Error| Some(keys.iter().map(|_| Some(Err(e.clone()))).collect());
        loop {
            // Dropping this future (a timeout here, or the caller's) waits, inside, until the
            // node let go of the buffers.
            let answer = match tokio::time::timeout(wait, conn.get_local(&plan, total, &body)).await
            {
                Err(_) => {
                    return failed(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!("node {endpoint} did not answer a same-host get within {wait:?}"),
                    ))
                }
                // An idle connection the node had already closed: it saw nothing of the
                // request, so it goes again on a fresh one.
                Ok(Err(_)) if reused => {
                    reused = false;
                    if self.transfer.pool().redial(&mut conn).await.is_err() {
                        return None;
                    }
                    continue;
                }
                Ok(Err(e)) => return failed(e),
                // Refused before anything was read: the usual path does it all.
                Ok(Ok(Err(_status))) => {
                    self.transfer.pool().checkin(conn);
                    return None;
                }
                Ok(Ok(Ok(answer))) => answer,
            };
            self.transfer.pool().checkin(conn);
            let items: Vec<ItemResult<u64>> = match rmp_serde::from_slice(&answer) {
                Ok(items) => items,
                Err(e) => {
                    return failed(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("node {endpoint} answered a same-host get with {e}"),
                    ))
                }
            };
            if items.len() != keys.len() {
                return failed(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!(
                        "node {endpoint} answered {} items for {} keys",
                        items.len(),
                        keys.len()
                    ),
                ));
            }
            let mut moved = 0usize;
            let answers = items
                .into_iter()
                .zip(&capacities)
                .map(|(item, capacity)| match item.0 {
                    Err(e) if e.code == ErrorCode::NOT_SUPPORTED => None,
                    Ok(size) if size > *capacity => Some(Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("node {endpoint} read {size} bytes into a {capacity}-byte buffer"),
                    ))),
                    Ok(size) => {
                        moved += size as usize;
                        Some(Ok(size as usize))
                    }
                    Err(e) => Some(Err(e)),
                })
                .collect();
            self.transfer.advance(moved);
            return Some(answers);
        }
    }

    /// Reads each key into the leading buffers of its target: through the node first, when
    /// this store has one that takes gets, then the keys it left (or all of them) the usual
    /// way: one replica list for them, then the bytes.
    pub(crate) async fn read_keys_into(
        &self,
        keys: &[&str],
        targets: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<usize>> {
        let through_node = if self.config.get_local_node.is_some()
            && keys.iter().all(|k| crate::util::check_key(k).is_ok())
        {
            self.get_through_node(keys, &targets).await
        } else {
            None
        };
        let Some(answers) = through_node else {
            return self.read_keys_usual(keys, targets).await;
        };
        let mut results: Vec<Option<Result<usize>>> = Vec::with_capacity(keys.len());
        let (mut rest_keys, mut rest_targets, mut rest_at) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (answer, target)) in answers.into_iter().zip(targets).enumerate() {
            if answer.is_none() {
                rest_keys.push(keys[i]);
                rest_targets.push(target);
                rest_at.push(i);
            }
            results.push(answer);
        }
        if !rest_keys.is_empty() {
            let rest = self.read_keys_usual(&rest_keys, rest_targets).await;
            for (i, result) in rest_at.into_iter().zip(rest) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "no result for the key",
                    ))
                })
            })
            .collect()
    }

    async fn read_keys_usual(
        &self,
        keys: &[&str],
        targets: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<usize>> {
        let (started, lists) = self.batch_lists(keys).await;
        let targets = targets.into_iter().map(Some).collect();
        self.read_batch(keys, lists, started, targets).await
    }
}
