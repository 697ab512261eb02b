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

use super::node_call::{laid_end_to_end, left_to_caller, Whole};
use super::{Store, WriteKind};
use moonkv_dataplane::header::LocalPlan;
use moonkv_dataplane::same_host::{LONG_CALL_BYTES, SPLIT_COPY_BYTES};
use moonkv_proto::{ReplicateConfig, Result};

/// A [`BatchPutStartRequest`] as it is encoded (the same fields, names and order), borrowing
/// the caller's keys instead of copying each into a `String`.
#[derive(serde::Serialize)]
struct StartBody<'a> {
    client_id: moonkv_proto::ClientId,
    tenant: &'a str,
    keys: &'a [&'a str],
    sizes: &'a [u64],
    config: &'a ReplicateConfig,
}

/// One answer per key: `None` for a key the node left to the usual path.
pub(crate) type NodeAnswers = Vec<Option<Result<()>>>;

/// Whether a put of objects of `sizes` goes through the node. A long call of smaller objects
/// goes the usual way: its copy requests spread over the node's threads, where the node copies
/// one request's small objects on one thread, and its round trips cost it little. Objects of
/// `SPLIT_COPY_BYTES` or more the node copies on two threads itself.
pub(crate) fn node_takes(sizes: &[u64]) -> bool {
    let total: u64 = sizes.iter().sum();
    let long = total as usize >= LONG_CALL_BYTES;
    !(sizes.contains(&0) || (long && sizes.iter().any(|s| (*s as usize) < SPLIT_COPY_BYTES)))
}

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
        let endpoint = self.config.put_local_node.clone()?;
        self.put_through_node_at(&endpoint, kind, keys, objects, config)
            .await
    }

    /// The body of a put the node takes whole (PUT_LOCAL, PUT_WHOLE): the batch start it sends
    /// the master in this store's name, encoded from the caller's keys as they are.
    pub(crate) fn whole_put_body(
        &self,
        kind: WriteKind,
        keys: &[&str],
        sizes: Vec<u64>,
        config: &ReplicateConfig,
    ) -> Option<Vec<u8>> {
        let request = StartBody {
            client_id: self.master.client_id(),
            tenant: &self.tenant,
            keys,
            sizes: &sizes,
            config,
        };
        rmp_serde::to_vec_named(&(kind == WriteKind::Upsert, &request)).ok()
    }

    /// [`Store::put_through_node`] through the node at `endpoint`.
    pub(crate) async fn put_through_node_at(
        &self,
        endpoint: &str,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> Option<NodeAnswers> {
        let (ranges, sizes) = laid_end_to_end(
            objects
                .iter()
                .map(|parts| parts.iter().map(|p| (p.as_ptr() as u64, p.len() as u64))),
        );
        let total: u64 = sizes.iter().sum();
        if !node_takes(&sizes) {
            return None;
        }
        let long = total as usize >= LONG_CALL_BYTES;
        let body = self.whole_put_body(kind, keys, sizes, config)?;
        let flags = if long { LocalPlan::LONG_CALL } else { 0 };
        let items = self
            .call_node::<()>(
                endpoint,
                Whole::Put,
                ranges,
                flags,
                total,
                &body,
                keys.len(),
            )
            .await?;
        self.transfer.advance(total as usize);
        Some(
            items
                .into_iter()
                .map(|item| (!left_to_caller(&item)).then_some(item))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_proto::msg::BatchPutStartRequest;

    #[test]
    fn a_borrowed_start_body_decodes_as_the_batch_start_it_stands_for() {
        let config = ReplicateConfig {
            group_ids: Some(vec!["g1".into(), "g2".into()]),
            preferred_segments: vec!["node-a".into()],
            ..ReplicateConfig::default()
        };
        let keys = ["k\u{e9}y-1", ""];
        let sizes = [4096u64, 1 << 20];
        let body = StartBody {
            client_id: moonkv_proto::ClientId::new(0x1234, 0x5678_9abc),
            tenant: "tenant-7",
            keys: &keys,
            sizes: &sizes,
            config: &config,
        };
        let encoded = rmp_serde::to_vec_named(&(true, &body)).unwrap();
        let (upsert, decoded): (bool, BatchPutStartRequest) =
            rmp_serde::from_slice(&encoded).unwrap();
        assert!(upsert);
        assert_eq!(
            decoded,
            BatchPutStartRequest {
                client_id: moonkv_proto::ClientId::new(0x1234, 0x5678_9abc),
                tenant: "tenant-7".into(),
                keys: keys.iter().map(|k| k.to_string()).collect(),
                sizes: sizes.to_vec(),
                config,
            }
        );
        // Byte for byte what the owned request encodes to.
        let owned = rmp_serde::to_vec_named(&(true, &decoded)).unwrap();
        assert_eq!(encoded, owned);
    }
}
