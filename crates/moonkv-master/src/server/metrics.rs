//! Prometheus metrics: per-operation counters and latency histograms, plus gauges and counters
//! read from the engine and the event publisher at scrape time.

mod call_metrics;

use super::events::EventHook;
use super::ha::Gate;
use crate::engine::EngineStats;
pub(crate) use call_metrics::Reply;
use call_metrics::{encode_literal, BatchMetrics, ReplyMetrics};
use moonkv_proto::msg::{Op, Request};
use moonkv_proto::Error;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Counters of one RPC.
struct OpMetrics {
    requests: Counter,
    failures: Counter,
    latency: Histogram,
    /// Item counters of a batch operation.
    batch: Option<BatchMetrics>,
}

/// Request metrics of the RPC server and the registry that exposes everything.
pub struct Metrics {
    ops: Vec<OpMetrics>,
    malformed: Counter,
    replies: ReplyMetrics,
    /// The engine stats of the scrape in progress, taken once by [`EngineCollector`].
    last_stats: Arc<Mutex<EngineStats>>,
    connections: super::pending::ConnectionMetrics,
    registry: Registry,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).unwrap_or(0)
}

impl Metrics {
    /// Registers every metric; engine and publisher values are read at each scrape.
    pub fn new(engine: Arc<Gate>, events: Arc<EventHook>) -> Self {
        let mut registry = Registry::default();
        let mut ops = Vec::with_capacity(Op::ALL.len());
        for op in Op::ALL {
            let name = op.metric_name();
            let m = OpMetrics {
                requests: Counter::default(),
                failures: Counter::default(),
                // 5 µs .. ~2.6 s
                latency: Histogram::new(exponential_buckets(5e-6, 2.0, 20)),
                batch: name
                    .starts_with("batch_")
                    .then(|| BatchMetrics::register(&mut registry, name)),
            };
            registry.register(
                format!("master_{name}_requests"),
                format!("{name} requests received"),
                m.requests.clone(),
            );
            registry.register(
                format!("master_{name}_failures"),
                format!("{name} requests that failed (a batch: every key failed)"),
                m.failures.clone(),
            );
            registry.register(
                format!("master_{name}_latency_seconds"),
                format!("{name} service time"),
                m.latency.clone(),
            );
            ops.push(m);
        }
        let malformed = Counter::default();
        registry.register(
            "master_malformed_requests",
            "requests whose body could not be decoded",
            malformed.clone(),
        );
        let replies = ReplyMetrics::register(&mut registry);
        let connections = super::pending::ConnectionMetrics::register(&mut registry);
        let last_stats = Arc::new(Mutex::new(EngineStats::default()));
        registry.register_collector(Box::new(EngineCollector {
            engine,
            last_stats: last_stats.clone(),
        }));
        registry.register_collector(Box::new(EventsCollector { events }));
        Self {
            ops,
            malformed,
            replies,
            last_stats,
            connections,
            registry,
        }
    }

    /// The RPC port's connection gauges and handshake counters.
    pub(crate) fn connection_metrics(&self) -> super::pending::ConnectionMetrics {
        self.connections.clone()
    }

    /// Counts one request refused before it ran (`ok` false) or answered without an engine
    /// result.
    pub fn record(&self, op: Op, ok: bool, elapsed: Duration) {
        let m = &self.ops[op_index(op)];
        m.requests.inc();
        if !ok {
            m.failures.inc();
        }
        m.latency.observe(elapsed.as_secs_f64());
    }

    /// Counts one answered request: its op counters, the items of a batch, and what the answer
    /// shows (read hits, object sizes, grants). `encoded` is false when the answer could not be
    /// encoded and an error went out instead.
    pub(crate) fn record_reply<T: Reply>(
        &self,
        request: &Request,
        reply: &Result<T, Error>,
        encoded: bool,
        elapsed: Duration,
    ) {
        let failed_items = self.replies.observe(request, reply);
        let m = &self.ops[op_index(request.op())];
        let all_failed = match (&m.batch, call_metrics::batch_len(request)) {
            (Some(batch), Some(len)) => batch.count(len, failed_items),
            _ => false,
        };
        self.record(
            request.op(),
            encoded && reply.is_ok() && !all_failed,
            elapsed,
        );
    }

    /// Counts a connection refused at the hello.
    pub(crate) fn record_refused_handshake(&self) {
        self.replies.refused_handshake();
    }

    /// Counts a connection closed at accept (too many open).
    pub(crate) fn record_refused_connection(&self) {
        self.replies.refused_connection();
    }

    /// Counts a request whose body did not decode.
    pub fn record_malformed(&self) {
        self.malformed.inc();
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(64 * 1024);
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
            return text;
        }
        let s = self.last_stats.lock().clone();
        let mut literal = self.replies.literal_counters().to_vec();
        // Every eviction here is a memory eviction, so upstream's `_mem` forms equal the totals.
        literal.extend([
            (
                "master_evicted_key_count",
                "objects evicted",
                s.evicted_key_count,
            ),
            (
                "master_evicted_key_count_mem",
                "objects evicted from memory",
                s.evicted_key_count,
            ),
            (
                "master_evicted_size_bytes",
                "bytes evicted",
                s.evicted_size_bytes,
            ),
            (
                "master_evicted_size_bytes_mem",
                "bytes evicted from memory",
                s.evicted_size_bytes,
            ),
            (
                "master_successful_evictions_mem",
                "memory eviction rounds that freed space",
                s.evictions_total,
            ),
            (
                "master_attempted_evictions_mem",
                "memory eviction rounds started",
                s.attempted_evictions,
            ),
            (
                "master_put_start_discard_cnt",
                "stalled writes preempted",
                s.put_start_discard_cnt,
            ),
            (
                "master_put_start_release_cnt",
                "parked buffers released",
                s.put_start_release_cnt,
            ),
        ]);
        encode_literal(&mut text, &literal);
        text
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value.min(i64::MAX as u64) as i64);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

struct EngineCollector {
    /// Read at each scrape: the engine of the current term.
    engine: Arc<Gate>,
    last_stats: Arc<Mutex<EngineStats>>,
}

impl std::fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCollector")
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let engine = self.engine.engine();
        let s = engine.stats();
        *self.last_stats.lock() = s.clone();
        let e = &mut encoder;
        gauge(
            e,
            "master_total_capacity_bytes",
            "mounted memory capacity",
            s.capacity_bytes,
        )?;
        gauge(
            e,
            "master_allocated_bytes",
            "allocated memory",
            s.allocated_bytes,
        )?;
        gauge(e, "master_key_count", "objects held", s.key_count)?;
        gauge(
            e,
            "master_soft_pin_key_count",
            "objects with an active soft pin",
            s.soft_pin_key_count,
        )?;
        gauge(
            e,
            "master_active_clients",
            "clients with mounted segments",
            s.active_clients,
        )?;
        gauge(
            e,
            "mem_cache_nums_",
            "objects with a readable memory replica",
            s.mem_cache_objects,
        )?;
        gauge(
            e,
            "file_cache_nums_",
            "objects with a readable disk replica",
            s.disk_cache_objects,
        )?;
        gauge(
            e,
            "master_put_start_discarded_staging_size",
            "bytes parked from preempted writes",
            s.discarded_staging_bytes,
        )?;
        counter(
            e,
            "master_successful_evictions",
            "eviction rounds that freed space",
            s.evictions_total,
        )?;
        counter(
            e,
            "master_attempted_evictions",
            "eviction rounds started",
            s.attempted_evictions,
        )?;
        counter(
            e,
            "master_stalled_writes_reclaimed",
            "stalled writes reclaimed by the sweep",
            s.stalled_writes_reclaimed,
        )?;
        counter(
            e,
            "master_put_start_alloc_failures",
            "PutStart allocation failures",
            s.put_start_alloc_failures,
        )?;
        counter(
            e,
            "master_put_start_partial_allocations",
            "PutStart with fewer replicas than asked",
            s.put_start_partial_allocations,
        )?;
        gauge(
            e,
            "master_total_file_capacity_bytes",
            "mounted disk capacity",
            s.disk_capacity_bytes,
        )?;
        gauge(
            e,
            "master_allocated_file_size_bytes",
            "bytes charged on mounted disks",
            s.disk_allocated_bytes,
        )?;
        gauge(
            e,
            "master_offloads_pending",
            "offloads to disk in flight",
            s.offloads_pending,
        )?;
        counter(
            e,
            "master_offloads_started",
            "offloads to disk started by eviction",
            s.offloads_started,
        )?;
        counter(
            e,
            "master_offloads_completed",
            "offloads to disk that landed",
            s.offloads_completed,
        )?;
        counter(
            e,
            "master_offloads_failed",
            "offloads to disk that failed or expired",
            s.offloads_failed,
        )?;
        encode_disk_tier(e, &engine.tier_stats())?;
        encode_promotion(e, &engine.promotion_stats())?;
        let segments = engine.segments();
        let mut used = e.encode_descriptor(
            "segment_allocated_bytes",
            "allocated bytes per segment",
            None,
            MetricType::Gauge,
        )?;
        for seg in &segments {
            let labels = [("segment", &*seg.segment.name)];
            ConstGauge::new(seg.used_bytes as i64).encode(used.encode_family(&labels)?)?;
        }
        let mut cap = e.encode_descriptor(
            "segment_total_capacity_bytes",
            "capacity per segment",
            None,
            MetricType::Gauge,
        )?;
        for seg in &segments {
            let labels = [("segment", &*seg.segment.name)];
            ConstGauge::new(seg.capacity_bytes as i64).encode(cap.encode_family(&labels)?)?;
        }
        let disks = engine.disk_segments();
        let mut used = e.encode_descriptor(
            "disk_segment_allocated_bytes",
            "bytes charged per disk",
            None,
            MetricType::Gauge,
        )?;
        for disk in &disks {
            let labels = [("segment", disk.disk.name.as_str())];
            ConstGauge::new(disk.used_bytes as i64).encode(used.encode_family(&labels)?)?;
        }
        let mut cap = e.encode_descriptor(
            "disk_segment_total_capacity_bytes",
            "capacity per disk",
            None,
            MetricType::Gauge,
        )?;
        for disk in &disks {
            let labels = [("segment", disk.disk.name.as_str())];
            ConstGauge::new(disk.capacity_bytes as i64).encode(cap.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct EventsCollector {
    events: Arc<EventHook>,
}

impl Collector for EventsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.events.status();
        let e = &mut encoder;
        gauge(
            e,
            "kv_events_enabled",
            "1 when the event publisher is live",
            s.enabled as u64,
        )?;
        counter(
            e,
            "kv_events_published_batches",
            "event messages sent",
            s.published_batches,
        )?;
        counter(
            e,
            "kv_events_published_events",
            "events sent",
            s.published_events,
        )?;
        counter(
            e,
            "kv_events_dropped_events",
            "events dropped (each leaves a sequence gap)",
            s.dropped_events,
        )?;
        gauge(
            e,
            "kv_events_queue_len",
            "events accepted but not sent yet",
            s.queue_len,
        )?;
        counter(
            e,
            "kv_events_skipped_keyless_events",
            "per-object events suppressed",
            s.skipped_keyless_events,
        )?;
        Ok(())
    }
}

/// The disk tier under pressure: where memory went (offloaded or dropped), the offload backlog,
/// disk eviction and puts held for space.
fn encode_disk_tier(
    e: &mut DescriptorEncoder,
    t: &crate::engine::TierStats,
) -> Result<(), std::fmt::Error> {
    counter(
        e,
        "master_offloaded_bytes",
        "object bytes moved from memory to disk by offload",
        t.offloaded_bytes,
    )?;
    gauge(
        e,
        "master_offload_backlog_bytes",
        "object bytes of the offloads in flight",
        t.offload_backlog_bytes,
    )?;
    counter(
        e,
        "master_dropped_objects",
        "objects evicted with no copy left in memory or on disk",
        t.dropped_objects,
    )?;
    counter(
        e,
        "master_dropped_bytes",
        "bytes of the objects dropped by eviction",
        t.dropped_bytes,
    )?;
    counter(
        e,
        "master_disk_evicted_objects",
        "disk replicas removed by disk eviction",
        t.disk_evicted_objects,
    )?;
    counter(
        e,
        "master_disk_evicted_bytes",
        "object bytes of the disk replicas removed by disk eviction",
        t.disk_evicted_bytes,
    )?;
    counter(
        e,
        "master_put_space_waits",
        "PutStarts held until offloads freed memory",
        t.put_space_waits,
    )?;
    counter(
        e,
        "master_put_space_wait_timeouts",
        "held PutStarts that gave up waiting for memory",
        t.put_space_wait_timeouts,
    )
}

/// Promotion on hit, under upstream's `master_promotion_*` names (counters gain `_total`).
fn encode_promotion(
    e: &mut DescriptorEncoder,
    p: &crate::engine::PromotionStats,
) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "master_promotion_in_flight",
        "promotions from disk to memory in flight",
        p.in_flight,
    )?;
    let counters = [
        (
            "master_promotion_admitted",
            "promotions admitted past every gate",
            p.admitted,
        ),
        (
            "master_promotion_completed",
            "promotions that landed in memory",
            p.completed,
        ),
        (
            "master_promotion_completed_bytes",
            "object bytes promoted from disk to memory",
            p.completed_bytes,
        ),
        (
            "master_promotion_failed",
            "promotions the node reported failed",
            p.failed,
        ),
        (
            "master_promotion_cancelled",
            "promotions whose object or segment went away meanwhile",
            p.cancelled,
        ),
        (
            "master_promotion_expired",
            "promotions not reported within put_start_release_timeout",
            p.expired,
        ),
        (
            "master_promotion_rejected_frequency",
            "disk hits below promotion_admission_threshold",
            p.rejected_frequency,
        ),
        (
            "master_promotion_rejected_watermark",
            "disk hits while memory was at or above the watermark",
            p.rejected_watermark,
        ),
        (
            "master_promotion_rejected_cap",
            "disk hits while promotion_queue_limit promotions were in flight",
            p.rejected_cap,
        ),
    ];
    for (name, help, value) in counters {
        counter(e, name, help, value)?;
    }
    Ok(())
}
