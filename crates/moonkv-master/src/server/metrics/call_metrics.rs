//! What the metrics learn from an answered request beyond its success: how the items of a batch
//! went, which tier a read is served from, the sizes of new objects and the grants handed out.
//!
//! Names, types and counting rules are upstream's master's, so its Grafana dashboard works
//! unchanged: a batch counts its keys as items and counts as a failure only when every item
//! failed (a partial success otherwise); a read counts once in `total_get_nums_`, once more in
//! `valid_get_nums_` when it answers replicas, and as a memory or file hit by the tier of the
//! first replica it answers, with the object's size in the hit bytes.

use moonkv_proto::msg::Request;
use moonkv_proto::{
    Error, GetReplicaListResponse, ItemResult, MountDiskSegmentResponse, OffloadHeartbeatResponse,
    PingResponse, ReplicaDescriptor, ReplicaKind, SegmentStatus,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::fmt::Write;

/// Upstream's object-size buckets (4 KiB .. 64 MiB), the ones its value-size panel reads.
const VALUE_SIZE_BUCKETS: [f64; 7] = [
    4096.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];

/// An answer as the metrics see it; every response type of the op table implements it.
pub(crate) trait Reply {
    /// A batch answer's items in request order, `Some` for each item that succeeded.
    fn items(&self) -> Option<Vec<Option<&dyn Reply>>> {
        None
    }
    /// The replicas the answer hands out (a read's replica list, a write's allocation).
    fn replicas(&self) -> &[ReplicaDescriptor] {
        &[]
    }
    /// How many of a batch's keys succeeded, for an answer that lists only those (a
    /// BatchReplicaClear's cleared keys); every other key of the batch counts as failed.
    fn succeeded(&self) -> Option<usize> {
        None
    }
}

impl Reply for Vec<String> {
    fn succeeded(&self) -> Option<usize> {
        Some(self.len())
    }
}

impl<T: Reply> Reply for Vec<ItemResult<T>> {
    fn items(&self) -> Option<Vec<Option<&dyn Reply>>> {
        Some(
            self.iter()
                .map(|i| i.0.as_ref().ok().map(|r| r as &dyn Reply))
                .collect(),
        )
    }
}

impl Reply for GetReplicaListResponse {
    fn replicas(&self) -> &[ReplicaDescriptor] {
        &self.replicas
    }
}

impl Reply for Vec<ReplicaDescriptor> {
    fn replicas(&self) -> &[ReplicaDescriptor] {
        self
    }
}

macro_rules! plain_replies {
    ($($t:ty),* $(,)?) => { $(impl Reply for $t {})* };
}
plain_replies!(
    (),
    bool,
    i64,
    u32,
    String,
    PingResponse,
    SegmentStatus,
    MountDiskSegmentResponse,
    OffloadHeartbeatResponse,
    Vec<(String, Vec<ReplicaDescriptor>)>,
    moonkv_proto::msg::SyncCatalogResponse,
    moonkv_proto::msg::AdoptReplicasResponse,
);

/// Keys named by a batch request, `None` for a single-key request.
pub(crate) fn batch_len(request: &Request) -> Option<usize> {
    Some(match request {
        Request::BatchExistKey(r) | Request::BatchGetReplicaList(r) => r.keys.len(),
        Request::BatchPutStart(r) | Request::BatchUpsertStart(r) => r.keys.len(),
        Request::BatchPutEnd(r) | Request::BatchUpsertEnd(r) => r.items.len(),
        Request::BatchPutRevoke(r) | Request::BatchUpsertRevoke(r) => r.items.len(),
        Request::BatchRemove(r) => r.keys.len(),
        Request::BatchReplicaClear(r) => r.keys.len(),
        _ => return None,
    })
}

/// Items, failures and partial successes of one batch operation.
#[derive(Default)]
pub(crate) struct BatchMetrics {
    items: Counter,
    failed_items: Counter,
    partial_successes: Counter,
}

impl BatchMetrics {
    /// Registers `master_<name>_{items,failed_items,partial_successes}_total`.
    pub(crate) fn register(registry: &mut Registry, name: &str) -> Self {
        let m = Self::default();
        registry.register(
            format!("master_{name}_items"),
            format!("keys named by {name} requests"),
            m.items.clone(),
        );
        registry.register(
            format!("master_{name}_failed_items"),
            format!("keys of {name} requests that failed"),
            m.failed_items.clone(),
        );
        registry.register(
            format!("master_{name}_partial_successes"),
            format!("{name} requests in which some but not all keys failed"),
            m.partial_successes.clone(),
        );
        m
    }

    /// Counts one batch of `len` keys, `failed` of them failed; returns whether the whole
    /// request counts as a failure (every key failed).
    pub(crate) fn count(&self, len: usize, failed: usize) -> bool {
        self.items.inc_by(len as u64);
        self.failed_items.inc_by(failed as u64);
        if failed > 0 && failed < len {
            self.partial_successes.inc();
        }
        len > 0 && failed == len
    }
}

/// Read hits, object sizes and grants, counted from answers.
pub(crate) struct ReplyMetrics {
    value_size: Histogram,
    mem_hit_bytes: Counter,
    file_hit_bytes: Counter,
    read_grants: Counter,
    write_grants: Counter,
    refused_handshakes: Counter,
    refused_connections: Counter,
    // Upstream names these counters without `_total`; they are written by `encode_literal`.
    total_gets: Counter,
    valid_gets: Counter,
    mem_hits: Counter,
    file_hits: Counter,
}

impl ReplyMetrics {
    /// Registers the metrics that carry a `_total` suffix or are histograms.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            value_size: Histogram::new(VALUE_SIZE_BUCKETS),
            mem_hit_bytes: Counter::default(),
            file_hit_bytes: Counter::default(),
            read_grants: Counter::default(),
            write_grants: Counter::default(),
            refused_handshakes: Counter::default(),
            refused_connections: Counter::default(),
            total_gets: Counter::default(),
            valid_gets: Counter::default(),
            mem_hits: Counter::default(),
            file_hits: Counter::default(),
        };
        registry.register(
            "master_value_size_bytes",
            "sizes of the objects writes started",
            m.value_size.clone(),
        );
        registry.register(
            "mem_cache_hit_bytes",
            "object bytes of reads answered from memory",
            m.mem_hit_bytes.clone(),
        );
        registry.register(
            "file_cache_hit_bytes",
            "object bytes of reads answered from disk",
            m.file_hit_bytes.clone(),
        );
        registry.register(
            "master_read_grants_issued",
            "data-plane read grants signed",
            m.read_grants.clone(),
        );
        registry.register(
            "master_write_grants_issued",
            "data-plane write grants signed",
            m.write_grants.clone(),
        );
        registry.register(
            "master_refused_handshakes",
            "connections refused at the hello (bad magic, version or credential)",
            m.refused_handshakes.clone(),
        );
        registry.register(
            "master_refused_connections",
            "connections closed at accept because max_connections were open",
            m.refused_connections.clone(),
        );
        m
    }

    /// Counts a handshake that was refused.
    pub(crate) fn refused_handshake(&self) {
        self.refused_handshakes.inc();
    }

    /// Counts a connection closed at accept.
    pub(crate) fn refused_connection(&self) {
        self.refused_connections.inc();
    }

    /// Counts what `reply` (the answer to `request`) shows; returns the failed items of a batch.
    pub(crate) fn observe<T: Reply>(&self, request: &Request, reply: &Result<T, Error>) -> usize {
        let items = reply.as_ref().ok().and_then(|r| r.items());
        let len = batch_len(request);
        let succeeded = reply.as_ref().ok().and_then(|r| r.succeeded());
        let failed = match (&items, len, succeeded) {
            (Some(items), _, _) => items.iter().filter(|i| i.is_none()).count(),
            (None, Some(len), Some(succeeded)) => len.saturating_sub(succeeded),
            (None, Some(len), None) if reply.is_err() => len,
            _ => 0,
        };
        match request {
            Request::GetReplicaList(_) => {
                self.read(reply.as_ref().ok().map(|r| r as &dyn Reply));
            }
            Request::BatchGetReplicaList(_) => match &items {
                Some(items) => items.iter().for_each(|i| self.read(*i)),
                None => {
                    self.total_gets.inc_by(len.unwrap_or(0) as u64);
                }
            },
            Request::PutStart(r) | Request::UpsertStart(r) if reply.is_ok() => {
                self.value_size.observe(r.size as f64);
            }
            Request::BatchPutStart(r) | Request::BatchUpsertStart(r) => {
                for (size, item) in r.sizes.iter().zip(items.iter().flatten()) {
                    if item.is_some() {
                        self.value_size.observe(*size as f64);
                    }
                }
            }
            _ => {}
        }
        if let Ok(reply) = reply {
            self.grants(request, reply, &items);
        }
        failed
    }

    fn read(&self, answer: Option<&dyn Reply>) {
        self.total_gets.inc();
        let Some(first) = answer.and_then(|a| a.replicas().first()) else {
            return;
        };
        self.valid_gets.inc();
        match first.kind {
            ReplicaKind::Memory => {
                self.mem_hits.inc();
                self.mem_hit_bytes.inc_by(first.size);
            }
            ReplicaKind::LocalDisk => {
                self.file_hits.inc();
                self.file_hit_bytes.inc_by(first.size);
            }
        }
    }

    fn grants(
        &self,
        request: &Request,
        reply: &dyn Reply,
        items: &Option<Vec<Option<&dyn Reply>>>,
    ) {
        let granted = |r: &dyn Reply| r.replicas().iter().filter(|d| d.grant.is_some()).count();
        let n = match items {
            Some(items) => items.iter().flatten().map(|r| granted(*r)).sum(),
            None => granted(reply),
        } as u64;
        if n == 0 {
            return;
        }
        match request {
            Request::GetReplicaList(_) | Request::BatchGetReplicaList(_) => {
                self.read_grants.inc_by(n)
            }
            _ => self.write_grants.inc_by(n),
        };
    }

    /// Upstream's read counters, whose names carry no `_total`.
    pub(crate) fn literal_counters(&self) -> [(&'static str, &'static str, u64); 4] {
        [
            (
                "total_get_nums_",
                "replica-list reads",
                self.total_gets.get(),
            ),
            (
                "valid_get_nums_",
                "replica-list reads that answered replicas",
                self.valid_gets.get(),
            ),
            (
                "mem_cache_hit_nums_",
                "reads answered from memory",
                self.mem_hits.get(),
            ),
            (
                "file_cache_hit_nums_",
                "reads answered from disk",
                self.file_hits.get(),
            ),
        ]
    }
}

/// Appends counters under their literal names (prometheus-client would add `_total`) before
/// the closing `# EOF` of `text`.
pub(crate) fn encode_literal(text: &mut String, counters: &[(&str, &str, u64)]) {
    let eof = text.ends_with("# EOF\n");
    if eof {
        text.truncate(text.len() - "# EOF\n".len());
    }
    for (name, help, value) in counters {
        let _ = write!(
            text,
            "# HELP {name} {help}.\n# TYPE {name} counter\n{name} {value}\n"
        );
    }
    if eof {
        text.push_str("# EOF\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_fails_only_when_every_key_failed() {
        let m = BatchMetrics::default();
        assert!(!m.count(3, 0));
        assert!(!m.count(3, 1));
        assert!(m.count(3, 3));
        assert!(!m.count(0, 0), "an empty batch is no failure");
        assert_eq!(m.items.get(), 9);
        assert_eq!(m.failed_items.get(), 4);
        assert_eq!(m.partial_successes.get(), 1);
    }

    #[test]
    fn a_replica_clear_counts_the_keys_it_left_as_failed_items() {
        let r = ReplyMetrics::register(&mut Registry::default());
        let request = Request::BatchReplicaClear(moonkv_proto::msg::BatchReplicaClearRequest {
            client_id: moonkv_proto::ClientId::new(1, 1),
            tenant: String::new(),
            keys: vec!["a".into(), "b".into(), "c".into()],
            segment_name: String::new(),
        });
        assert_eq!(batch_len(&request), Some(3));
        assert_eq!(r.observe(&request, &Ok(vec!["b".to_string()])), 2);
        assert_eq!(r.observe(&request, &Ok(Vec::<String>::new())), 3);
        let refused: Result<Vec<String>, Error> =
            Err(moonkv_proto::ErrorCode::INVALID_PARAMS.into());
        assert_eq!(r.observe(&request, &refused), 3);
    }

    #[test]
    fn literal_counters_keep_their_names_and_the_eof_stays_last() {
        let mut text = String::from("# HELP a x.\n# TYPE a gauge\na 1\n# EOF\n");
        encode_literal(&mut text, &[("mem_cache_hit_nums_", "reads", 7)]);
        assert!(text.contains("# TYPE mem_cache_hit_nums_ counter\nmem_cache_hit_nums_ 7\n"));
        assert!(text.ends_with("mem_cache_hit_nums_ 7\n# EOF\n"), "{text}");
    }
}
