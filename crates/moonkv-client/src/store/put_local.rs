//! Puts through the node (`docs/data-plane.md`, *Puts through the node*): a standalone store
//! whose node takes whole puts (its STATS say `put_local`) hands it the keys, sizes and the
//! memory of the values in one PUT_LOCAL request. The node starts the write at the master in
//! this store's name, copies the bytes from this process, and ends it: one request crossing
//! processes instead of a start, a copy request and an end.
//!
//! Anything the node does not take comes back for the usual path: the whole call when the
//! node refuses the request before placing anything (an older node, a connection that is not
//! attached), and each key whose replicas the master placed elsewhere (answered
//! `NOT_SUPPORTED`, already revoked).

use super::lanes::QUIET_BYTES;
use super::{Store, WriteKind, MAX_KEYS_THROUGH_NODE};
use moonkv_dataplane::header::{LocalPlan, MAX_LOCAL_RANGES};
use moonkv_dataplane::same_host::{monotonic_now_ns, LONG_CALL_BYTES, SPLIT_COPY_BYTES};
use moonkv_proto::msg::BatchPutStartRequest;
use moonkv_proto::{Error, ErrorCode, ItemResult, ReplicateConfig, Result};
use std::time::Duration;

/// One answer per key: `None` for a key the node left to the usual path.
pub(crate) type NodeAnswers = Vec<Option<Result<()>>>;

impl Store {
    /// Writes `objects` (object i is the concatenation of `objects[i]`) under `keys` through
    /// the node, when this store has such a node and the call fits one request. `None`: the
    /// node took nothing, write every key the usual way. Keys and sizes must be valid
    /// (checked by the caller).
    pub(crate) async fn put_through_node(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> Option<NodeAnswers> {
        let endpoint = self.config.put_local_node.as_deref()?;
        if keys.is_empty()
            || keys.len() > MAX_KEYS_THROUGH_NODE
            || !self.transfer.pool().same_host(endpoint)
        {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut sizes = Vec::with_capacity(keys.len());
        for parts in objects {
            let mut size = 0u64;
            for part in parts.iter().filter(|p| !p.is_empty()) {
                let (address, len) = (part.as_ptr() as u64, part.len() as u64);
                match ranges.last_mut() {
                    Some((a, l)) if *a + *l == address => *l += len,
                    _ => ranges.push((address, len)),
                }
                size += len;
            }
            sizes.push(size);
        }
        let total: u64 = sizes.iter().sum();
        // A long call of smaller objects goes the usual way: its copy requests spread over
        // the node's threads, where the node copies one request's small objects on one thread,
        // and its round trips cost it little. Objects of `SPLIT_COPY_BYTES` or more the node
        // copies on two threads itself.
        let long = total as usize >= LONG_CALL_BYTES;
        if ranges.len() > MAX_LOCAL_RANGES
            || sizes.contains(&0)
            || (long && sizes.iter().any(|s| (*s as usize) < SPLIT_COPY_BYTES))
        {
            return None;
        }
        let request = BatchPutStartRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            sizes,
            config: config.clone(),
        };
        let body = rmp_serde::to_vec_named(&(kind == WriteKind::Upsert, &request)).ok()?;
        // The node copies nothing after this (its start at the master, then the copy); the
        // caller waits longer, for the node's end at the master after the copy.
        let copy_time = self.config.rpc_timeout + self.transfer.step_timeout();
        let plan = LocalPlan {
            deadline_ns: monotonic_now_ns().saturating_add(copy_time.as_nanos() as u64),
            ranges,
            flags: if long { LocalPlan::LONG_CALL } else { 0 },
        };
        let wait = copy_time + self.config.rpc_timeout + Duration::from_secs(1);
        let _quiet = (total as usize >= QUIET_BYTES).then(|| self.transfer.quiet_wait());
        let (mut conn, mut reused) = match self.transfer.pool().checkout(endpoint).await {
            Ok(checked_out) => checked_out,
            Err(_) => return None,
        };
        let failed = |e: Error| Some(keys.iter().map(|_| Some(Err(e.clone()))).collect());
        loop {
            let answer = match tokio::time::timeout(wait, conn.put_local(&plan, total, &body)).await
            {
                Err(_) => {
                    return failed(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!("node {endpoint} did not answer a same-host put within {wait:?}"),
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
                // Refused before anything was placed: the usual path does it all.
                Ok(Ok(Err(_status))) => {
                    self.transfer.pool().checkin(conn);
                    return None;
                }
                Ok(Ok(Ok(answer))) => answer,
            };
            self.transfer.pool().checkin(conn);
            self.transfer.advance(total as usize);
            let items: Vec<ItemResult<()>> = match rmp_serde::from_slice(&answer) {
                Ok(items) => items,
                Err(e) => {
                    return failed(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("node {endpoint} answered a same-host put with {e}"),
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
            return Some(
                items
                    .into_iter()
                    .map(|item| match item.0 {
                        Err(e) if e.code == ErrorCode::NOT_SUPPORTED => None,
                        other => Some(other),
                    })
                    .collect(),
            );
        }
    }
}
