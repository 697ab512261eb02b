//! Prometheus metrics of the indexer, served at `/metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// Every metric the indexer exports.
pub struct Metrics {
    registry: Registry,
    /// Registered sources by type.
    pub sources: Family<Labels, Gauge>,
    /// Events applied, by kind (`stored`, `removed`, `cleared`) and source type.
    pub events: Family<Labels, Counter>,
    /// Events or messages refused, by reason.
    pub rejected: Family<Labels, Counter>,
    /// Sequence gaps seen, by source type.
    pub gaps: Family<Labels, Counter>,
    /// Publisher restarts seen, by source type.
    pub restarts: Family<Labels, Counter>,
    /// Replay attempts by result (`repaired`, `history_lost`, `timeout`, `failed`).
    pub replays: Family<Labels, Counter>,
    /// A source's blocks dropped from the index because its history could not be repaired.
    pub source_resets: Family<Labels, Counter>,
    /// moonkv object keys that fit no connector grammar, or name another model.
    pub unrecognized_keys: Family<Labels, Counter>,
    /// Blocks in the index (set when scraped).
    pub blocks: Gauge,
    /// Estimated heap bytes of the index (set when scraped).
    pub index_bytes: Gauge,
    /// Query latency in seconds, including hashing.
    pub query_seconds: Histogram,
    /// Queries by body format (`json`, `msgpack`).
    pub queries: Family<Labels, Counter>,
    /// Blocks held by the chain cache (set when scraped).
    pub chain_cache_blocks: Gauge,
    /// Estimated heap bytes of the chain cache (set when scraped).
    pub chain_cache_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every metric under the `moonkv_indexer` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("moonkv_indexer");
        let m = Metrics {
            registry: Registry::default(),
            sources: Family::default(),
            events: Family::default(),
            rejected: Family::default(),
            gaps: Family::default(),
            restarts: Family::default(),
            replays: Family::default(),
            source_resets: Family::default(),
            unrecognized_keys: Family::default(),
            blocks: Gauge::default(),
            index_bytes: Gauge::default(),
            query_seconds: Histogram::new(exponential_buckets(5e-6, 2.0, 18)),
            queries: Family::default(),
            chain_cache_blocks: Gauge::default(),
            chain_cache_bytes: Gauge::default(),
        };
        registry.register("sources", "Registered sources", m.sources.clone());
        registry.register("events", "Events applied", m.events.clone());
        registry.register("rejected", "Events or messages refused", m.rejected.clone());
        registry.register("gaps", "Sequence gaps seen", m.gaps.clone());
        registry.register("restarts", "Publisher restarts seen", m.restarts.clone());
        registry.register("replays", "Replay attempts by result", m.replays.clone());
        registry.register(
            "source_resets",
            "Times a source's blocks were dropped after lost history",
            m.source_resets.clone(),
        );
        registry.register(
            "unrecognized_keys",
            "Object keys that fit no connector grammar",
            m.unrecognized_keys.clone(),
        );
        registry.register("blocks", "Blocks in the index", m.blocks.clone());
        registry.register(
            "index_bytes",
            "Estimated heap bytes of the index",
            m.index_bytes.clone(),
        );
        registry.register(
            "query_seconds",
            "Query latency including hashing",
            m.query_seconds.clone(),
        );
        registry.register("queries", "Queries by body format", m.queries.clone());
        registry.register(
            "chain_cache_blocks",
            "Blocks whose digest the chain cache holds",
            m.chain_cache_blocks.clone(),
        );
        registry.register(
            "chain_cache_bytes",
            "Estimated heap bytes of the chain cache",
            m.chain_cache_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Exports the chain cache's counters: `chain_cache_hits` and `chain_cache_misses` (query
    /// blocks whose digest was found, or hashed) and `trusted_hash_mismatches`.
    pub fn register_chain_stats(&mut self, stats: &crate::index::chains::ChainStats) {
        self.registry.register(
            "chain_cache_hits",
            "Query blocks whose digest came from the chain cache",
            stats.hits.clone(),
        );
        self.registry.register(
            "chain_cache_misses",
            "Query blocks hashed with SHA-256",
            stats.misses.clone(),
        );
        self.registry.register(
            "trusted_hash_mismatches",
            "Blocks of trust-mode sources whose hash differs from the one recomputed from their tokens",
            stats.trusted_mismatches.clone(),
        );
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Counts one refused event or message.
    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }

    /// Counts `n` applied events of `kind` from a source of `source_type`.
    pub fn applied(&self, source_type: &str, kind: &str, n: u64) {
        self.events
            .get_or_create(&vec![
                ("source_type", source_type.to_owned()),
                ("kind", kind.to_owned()),
            ])
            .inc_by(n);
    }

    /// Increments a family that is labelled by source type only.
    pub fn by_type(family: &Family<Labels, Counter>, source_type: &str) {
        family
            .get_or_create(&vec![("source_type", source_type.to_owned())])
            .inc();
    }
}
