//! The node's Prometheus metrics, served on `/metrics` by [`serve`]: data-plane requests,
//! payload bytes and service time per operation, connections, refused handshakes, connections
//! and grants, range-lock waits, and segment and disk usage. Counters are plain atomics bumped
//! by the request loop; gauges are read at scrape time.

use crate::server::Served;
use moonkv_dataplane::header::DataOp;
use moonkv_proto::grant::Refusal;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The data-plane operations, with their `op` label.
/// Same-host reads and writes count as reads and writes (`node_data_same_host_requests` tells
/// them apart).
const OPS: [(DataOp, &str); 9] = [
    (DataOp::Read, "read"),
    (DataOp::Write, "write"),
    (DataOp::FileRead, "file_read"),
    (DataOp::FileWrite, "file_write"),
    (DataOp::Stats, "stats"),
    (DataOp::PutLocal, "put_local"),
    (DataOp::GetLocal, "get_local"),
    (DataOp::PutWhole, "put_whole"),
    (DataOp::GetWhole, "get_whole"),
];

/// Why a grant was refused, with its `reason` label.
const REFUSALS: [(Refusal, &str); 8] = [
    (Refusal::Missing, "missing"),
    (Refusal::Malformed, "malformed"),
    (Refusal::BadMac, "bad_mac"),
    (Refusal::Expired, "expired"),
    (Refusal::WrongRight, "wrong_right"),
    (Refusal::OutOfRange, "out_of_range"),
    (Refusal::Superseded, "superseded"),
    (Refusal::Unwritten, "unwritten"),
];

fn op_index(op: u8) -> Option<usize> {
    let op = DataOp::as_socket_op(op);
    OPS.iter().position(|(o, _)| *o as u8 == op)
}

/// Counters the data-plane request loop bumps.
#[derive(Debug)]
pub(crate) struct DataMetrics {
    requests: [AtomicU64; OPS.len()],
    failed: [AtomicU64; OPS.len()],
    bytes: [AtomicU64; OPS.len()],
    latency: [Histogram; OPS.len()],
    refused_grants: [AtomicU64; REFUSALS.len()],
    refused_handshakes: AtomicU64,
    handshake_timeouts: AtomicU64,
    refused_attaches: AtomicU64,
    refused_connections: AtomicU64,
}

impl Default for DataMetrics {
    fn default() -> Self {
        Self {
            requests: Default::default(),
            failed: Default::default(),
            bytes: Default::default(),
            // 10 µs .. ~5 s
            latency: std::array::from_fn(|_| Histogram::new(exponential_buckets(1e-5, 2.0, 20))),
            refused_grants: Default::default(),
            refused_handshakes: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            refused_attaches: AtomicU64::new(0),
            refused_connections: AtomicU64::new(0),
        }
    }
}

impl DataMetrics {
    /// Counts one served request of `op`: `ok` when answered OK, then its payload `bytes`.
    pub(crate) fn served(&self, op: u8, ok: bool, bytes: u64, elapsed: Duration) {
        let Some(i) = op_index(op) else {
            return;
        };
        self.requests[i].fetch_add(1, Ordering::Relaxed);
        if ok {
            self.bytes[i].fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.failed[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency[i].observe(elapsed.as_secs_f64());
    }

    /// Counts a request refused for its grant.
    pub(crate) fn refused_grant(&self, why: Refusal) {
        if let Some(i) = REFUSALS.iter().position(|(r, _)| *r == why) {
            self.refused_grants[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a connection refused at the handshake (TLS, missing or wrong proof).
    pub(crate) fn handshake_timed_out(&self) {
        self.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused_attach(&self) {
        self.refused_attaches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused_handshake(&self) {
        self.refused_handshakes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed at accept (the connection cap was reached).
    pub(crate) fn refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }
}

/// A node's metrics as Prometheus text; cheap to clone.
#[derive(Clone)]
pub struct NodeMetrics {
    registry: Arc<Registry>,
}

impl std::fmt::Debug for NodeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeMetrics")
    }
}

impl NodeMetrics {
    pub(crate) fn new(served: Arc<Served>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(NodeCollector { served }));
        Self {
            registry: Arc::new(registry),
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

struct NodeCollector {
    served: Arc<Served>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let g = ConstGauge::new(v.min(i64::MAX as u64) as i64);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One counter family with an `op` label, read from `values`.
fn per_op(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[AtomicU64; OPS.len()],
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for ((_, label), v) in OPS.iter().zip(values) {
        ConstCounter::new(v.load(Ordering::Relaxed))
            .encode(family.encode_family(&[("op", *label)])?)?;
    }
    Ok(())
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut encoder;
        let m = &self.served.metrics;
        per_op(
            e,
            "node_data_requests",
            "data-plane requests served",
            &m.requests,
        )?;
        per_op(
            e,
            "node_data_request_failures",
            "data-plane requests answered with an error status",
            &m.failed,
        )?;
        per_op(
            e,
            "node_data_bytes",
            "payload bytes of requests answered OK",
            &m.bytes,
        )?;
        let mut family = e.encode_descriptor(
            "node_data_request_seconds",
            "service time of a data-plane request, header to last byte",
            None,
            MetricType::Histogram,
        )?;
        for ((_, label), h) in OPS.iter().zip(&m.latency) {
            h.encode(family.encode_family(&[("op", *label)])?)?;
        }
        let mut family = e.encode_descriptor(
            "node_refused_grants",
            "data-plane requests refused for their grant",
            None,
            MetricType::Counter,
        )?;
        for ((_, label), v) in REFUSALS.iter().zip(&m.refused_grants) {
            ConstCounter::new(v.load(Ordering::Relaxed))
                .encode(family.encode_family(&[("reason", *label)])?)?;
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            e,
            "node_refused_handshakes",
            "data-plane connections refused at the handshake (TLS, missing or wrong proof)",
            load(&m.refused_handshakes),
        )?;
        counter(
            e,
            "node_handshake_timeouts",
            "data-plane connections closed because their first byte, TLS, hello or proof did not come within the handshake deadline",
            load(&m.handshake_timeouts),
        )?;
        counter(
            e,
            "node_refused_attaches",
            "same-host ATTACH requests refused (checks failed, another user, copies off, or a second ATTACH on one connection)",
            load(&m.refused_attaches),
        )?;
        counter(
            e,
            "node_refused_connections",
            "data-plane connections closed at accept: the connection cap was reached",
            load(&m.refused_connections),
        )?;
        let stats = self.served.counters.snapshot();
        counter(
            e,
            "node_data_connections_opened",
            "data-plane connections accepted",
            stats.connections_opened,
        )?;
        counter(
            e,
            "node_data_local_connections_opened",
            "data-plane connections accepted on the node's local socket (callers on this machine)",
            stats.local_connections_opened,
        )?;
        gauge(
            e,
            "node_data_connections_open",
            "data-plane connections open now",
            stats.connections_open,
        )?;
        counter(
            e,
            "node_data_same_host_requests",
            "reads and writes served as same-host copies (straight to or from a caller's memory)",
            stats.same_host_requests,
        )?;
        let segments: Vec<_> = self.served.segments.read().values().cloned().collect();
        let (waits, waited_us) = segments
            .iter()
            .map(|s| s.range_lock_waits())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        counter(
            e,
            "node_range_lock_waits",
            "requests that waited for an overlapping range lock",
            waits,
        )?;
        let c = ConstCounter::new(waited_us as f64 / 1e6);
        c.encode(e.encode_descriptor(
            "node_range_lock_wait_seconds",
            "time requests waited for overlapping range locks",
            None,
            c.metric_type(),
        )?)?;
        gauge(
            e,
            "node_segments",
            "memory segments served",
            segments.len() as u64,
        )?;
        gauge(
            e,
            "node_segment_capacity_bytes",
            "bytes of the memory segments served",
            segments.iter().map(|s| s.size()).sum(),
        )?;
        let (used, capacity) = self
            .served
            .disk
            .as_ref()
            .map_or((0, 0), |d| (d.used(), d.capacity()));
        gauge(e, "node_disk_used_bytes", "bytes the disk tier holds", used)?;
        gauge(
            e,
            "node_disk_capacity_bytes",
            "bytes the disk tier may use",
            capacity,
        )?;
        Ok(())
    }
}

/// Serves `/metrics` and `/health` on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: NodeMetrics,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::header;
    use axum::response::IntoResponse;
    use axum::routing::get;
    let scrape = move || {
        let metrics = metrics.clone();
        async move {
            let text = tokio::task::spawn_blocking(move || metrics.encode())
                .await
                .unwrap_or_default();
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                text,
            )
                .into_response()
        }
    };
    let router = axum::Router::new()
        .route("/metrics", get(scrape))
        .route("/health", get(|| async { "ok" }));
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
}
