//! Gets through the node (`docs/data-plane.md`, *Gets through the node*): a standalone store
//! whose node takes whole gets (its STATS say `get_local`), or a store that hands its puts to
//! a node on this machine (`put_whole.rs`), hands it the keys and its buffers in one GET_LOCAL
//! request. The node asks the master for the replicas in this store's tenant
//! and copies each object it holds straight into this process: one request crossing
//! processes instead of a replica list and a copy request.
//!
//! Anything the node does not take comes back for the usual path: the whole call when the node
//! refuses the request (an older node, a connection that is not attached), and each key it
//! could not read itself (answered `NOT_SUPPORTED`, nothing written), which the usual path
//! reads or answers with its own errors.

use super::get_whole::{Sink, Took};
use super::node_call::{laid_end_to_end, left_to_caller, Whole};
use super::Store;
use moonkv_proto::{Error, ErrorCode, Result};

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
        if keys.len() != targets.len() {
            return None;
        }
        let endpoint = &self.local_get_node().await?;
        let (ranges, capacities) = laid_end_to_end(
            targets
                .iter()
                .map(|parts| parts.iter().map(|p| (p.as_ptr() as u64, p.len() as u64))),
        );
        let total: u64 = capacities.iter().sum();
        if capacities.contains(&0) {
            return None;
        }
        let body = rmp_serde::to_vec(&(&self.tenant, keys, &capacities)).ok()?;
        let items = self
            .call_node::<u64>(endpoint, Whole::Get, ranges, 0, total, &body, keys.len())
            .await?;
        let mut moved = 0usize;
        let answers = items
            .into_iter()
            .zip(&capacities)
            .map(|(item, capacity)| match item {
                item if left_to_caller(&item) => None,
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
        Some(answers)
    }

    /// The node this store's gets go through as GET_LOCAL: a standalone store's node, or the
    /// node on this machine a store hands its puts to, once this store's pool has attached a
    /// connection there.
    async fn local_get_node(&self) -> Option<String> {
        if let Some(node) = &self.config.get_local_node {
            return Some(node.clone());
        }
        let (endpoint, local, gets) = self.whole_route().await?;
        (local && gets && self.attached_to(&endpoint).await).then_some(endpoint)
    }

    /// Reads each key into the leading buffers of its target: through the node first, when
    /// this store has one that takes gets, then the keys it left (or all of them) the usual
    /// way: one replica list for them, then the bytes.
    pub(crate) async fn read_keys_into(
        &self,
        keys: &[&str],
        targets: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<usize>> {
        let through_node = if keys.iter().all(|k| crate::util::check_key(k).is_ok()) {
            self.get_through_node(keys, &targets).await
        } else {
            None
        };
        let Some(answers) = through_node else {
            return self.read_keys_whole(keys, targets).await;
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
        super::every_key(results)
    }

    /// Reads each key into its target through GET_WHOLE when this store hands gets to a node
    /// over the socket (`get_whole.rs`), the keys it leaves with the lists it sent back; else
    /// the usual way.
    async fn read_keys_whole(
        &self,
        keys: &[&str],
        targets: Vec<Vec<&mut [u8]>>,
    ) -> Vec<Result<usize>> {
        if !keys.iter().all(|k| crate::util::check_key(k).is_ok()) {
            return self.read_keys_usual(keys, targets).await;
        }
        let mut sinks: Vec<Sink<'_>> = targets.into_iter().map(Sink::Parts).collect();
        let Some((started, took)) = self.get_whole(keys, &mut sinks).await else {
            let targets = sinks.into_iter().map(Sink::into_parts).collect();
            return self.read_keys_usual(keys, targets).await;
        };
        let mut results: Vec<Option<Result<usize>>> = Vec::with_capacity(keys.len());
        let (mut rest_keys, mut rest_lists, mut rest_targets, mut rest_at) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, (took, sink)) in took.into_iter().zip(sinks).enumerate() {
            results.push(match took {
                Took::Read(size) => Some(Ok(size)),
                Took::Failed(e) => Some(Err(e)),
                Took::Listed(list) => {
                    rest_keys.push(keys[i]);
                    rest_lists.push(Ok(list));
                    rest_targets.push(Some(sink.into_parts()));
                    rest_at.push(i);
                    None
                }
            });
        }
        if !rest_keys.is_empty() {
            let rest = self
                .read_batch(&rest_keys, rest_lists, started, rest_targets)
                .await;
            for (i, result) in rest_at.into_iter().zip(rest) {
                results[i] = Some(result);
            }
        }
        super::every_key(results)
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
