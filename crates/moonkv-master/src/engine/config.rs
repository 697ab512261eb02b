//! Engine configuration, with upstream defaults and upstream key names in validation messages.

/// How PutStart picks segments after the caller's preferred ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocationStrategy {
    /// Walk segment names from a random start.
    #[default]
    Random,
    /// Sample a few segment names from a random start and use the emptiest first.
    FreeRatioFirst,
}

/// Tunables of the metadata engine. Durations are milliseconds.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Read lease granted by reads (`default_kv_lease_ttl`).
    pub default_kv_lease_ttl_ms: u64,
    /// Soft pin TTL when a write enables soft pin without a TTL (`default_kv_soft_pin_ttl`).
    pub default_kv_soft_pin_ttl_ms: u64,
    /// Largest soft pin TTL a write may ask for (`max_kv_soft_pin_ttl`).
    pub max_kv_soft_pin_ttl_ms: u64,
    /// Whether eviction may fall back to soft-pinned objects (`allow_evict_soft_pinned_objects`).
    pub allow_evict_soft_pinned_objects: bool,
    /// Fraction of evictable objects one eviction round aims at (`eviction_ratio`).
    pub eviction_ratio: f64,
    /// Used/capacity ratio above which eviction runs (`eviction_high_watermark_ratio`).
    pub eviction_high_watermark_ratio: f64,
    /// A client silent for this long is dead (`client_live_ttl_sec`).
    pub client_live_ttl_ms: u64,
    /// Age after which an unfinished put may be preempted (`put_start_discard_timeout_sec`).
    pub put_start_discard_timeout_ms: u64,
    /// Age after which an unfinished put is reclaimed and parked buffers are released
    /// (`put_start_release_timeout_sec`).
    pub put_start_release_timeout_ms: u64,
    /// Placement strategy (`allocation_strategy`).
    pub allocation_strategy: AllocationStrategy,
    /// Tenant registration and quotas (`enable_multi_tenants`). Tenants isolate in every mode.
    pub enable_multi_tenants: bool,
    /// Number of metadata shards (`shard_count`); unrelated keys rarely share one. Default:
    /// [`default_shard_count`].
    pub shard_count: usize,
    /// How long the disk replicas of a node that expired or unmounted its disk stay known
    /// (unreadable), so a node restarting on the same directory gets them back.
    pub disk_detach_grace_ms: u64,
    /// How long a segment re-mounted for re-adoption stays frozen (no new allocations) while
    /// its node announces the replicas it holds; past it the segment takes writes anyway.
    pub adopt_timeout_ms: u64,
    /// Epoch of this master's metadata: orders the values it commits after every value an
    /// earlier master committed (re-adoption keeps the newest). Unix time in milliseconds at
    /// start by default; an HA leader uses its term.
    pub epoch: u64,
    /// Key of the capability grants attached to every replica descriptor handed out (the
    /// master's shared secret); `None` = no grants (nodes without a secret need none).
    pub grant_key: Option<moonkv_proto::auth::Secret>,
    /// Lifetime of read grants (`data_grant_read_ttl`); `None` = the read lease plus
    /// [`READ_GRANT_MARGIN_MS`]. Write grants live `put_start_release_timeout_ms`.
    pub read_grant_ttl_ms: Option<u64>,
    /// With a disk mounted: memory use above which objects are offloaded to disk ahead of
    /// demand (`offload_high_watermark_ratio`).
    pub offload_high_watermark_ratio: f64,
    /// Offloading ahead of demand continues until memory use, less the offloads in flight, is
    /// at most this (`offload_low_watermark_ratio`).
    pub offload_low_watermark_ratio: f64,
    /// How long a PutStart that found no memory waits for offloads to free some before it
    /// fails (`put_space_wait`); 0 = fail at once. Keep it, plus `disk_removal_ack_wait_ms`,
    /// below the clients' RPC timeout (5 s by default).
    pub put_space_wait_ms: u64,
    /// Disk use above which a disk evicts its least recently used replicas
    /// (`disk_eviction_high_watermark_ratio`).
    pub disk_eviction_high_watermark_ratio: f64,
    /// Disk eviction stops at this use (`disk_eviction_low_watermark_ratio`).
    pub disk_eviction_low_watermark_ratio: f64,
    /// How long the answer to a request that removed disk replicas waits for their nodes to
    /// delete the files (`disk_removal_ack_wait`); 0 = answer at once.
    pub disk_removal_ack_wait_ms: u64,
    /// Bring objects read from disk back into memory (`promotion_on_hit`).
    pub promotion_on_hit: bool,
    /// Reads of a disk-only object before it is promoted (`promotion_admission_threshold`).
    pub promotion_admission_threshold: u32,
    /// Most promotions in flight at once (`promotion_queue_limit`).
    pub promotion_queue_limit: u64,
}

/// How much longer than the read lease a read grant lives by default, so a transfer that
/// started just before the lease ended can finish.
pub const READ_GRANT_MARGIN_MS: u64 = 2_000;

/// The default number of metadata shards: 32 per CPU, at least 64 and at most 1024.
///
/// Shards keep concurrent requests off each other's locks, which only threads running at the
/// same time can contend for. Each shard a request touches costs it cold cache lines (the
/// shard's lock, its tenant map, its table), and a batch's keys fall into about as many shards
/// as it has keys. On a 2-CPU machine, right after a 4 MiB copy, a 32-key batch start took
/// 68 µs with 64 shards against 91 with 1024, its end 45 against 58, and a 32-key replica list
/// 45 against 59 (docs/benchmarks.md, *Fewer metadata shards on fewer CPUs*). Fewer shards make
/// each shard's table larger, and a table grows under its shard's lock: at 8 M objects, the
/// slowest single put waited 17 ms with 64 shards against 3 ms with 1024. Set `shard_count`
/// higher for a master that holds many millions of objects and must not stall.
pub fn default_shard_count() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 32).next_power_of_two().clamp(64, 1024)
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 1_800_000,
            max_kv_soft_pin_ttl_ms: 86_400_000,
            allow_evict_soft_pinned_objects: true,
            eviction_ratio: 0.05,
            eviction_high_watermark_ratio: 0.90,
            client_live_ttl_ms: 10_000,
            put_start_discard_timeout_ms: 30_000,
            put_start_release_timeout_ms: 600_000,
            allocation_strategy: AllocationStrategy::Random,
            enable_multi_tenants: false,
            shard_count: default_shard_count(),
            disk_detach_grace_ms: 300_000,
            adopt_timeout_ms: 30_000,
            epoch: moonkv_proto::grant::unix_now_ms().max(1),
            grant_key: None,
            read_grant_ttl_ms: None,
            offload_high_watermark_ratio: 0.80,
            offload_low_watermark_ratio: 0.60,
            put_space_wait_ms: 3_000,
            disk_eviction_high_watermark_ratio: 0.95,
            disk_eviction_low_watermark_ratio: 0.85,
            disk_removal_ack_wait_ms: 1_000,
            promotion_on_hit: true,
            promotion_admission_threshold: 2,
            promotion_queue_limit: 50_000,
        }
    }
}

/// A tunable out of range, or two that contradict each other. The message names the upstream
/// config key, which [`EngineConfigError::key`] gives alone.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EngineConfigError {
    /// `eviction_ratio` or `eviction_high_watermark_ratio` outside [0, 1].
    #[error("{key} must be in [0, 1], got {value}")]
    RatioOutOfRange {
        /// The config key.
        key: &'static str,
        /// The value given.
        value: f64,
    },
    /// An unfinished put would be reclaimed before it may be replaced.
    #[error("put_start_release_timeout_sec must exceed put_start_discard_timeout_sec")]
    ReleaseNotAfterDiscard,
    /// The default soft pin is longer than any write may ask for.
    #[error("default_kv_soft_pin_ttl must not exceed max_kv_soft_pin_ttl")]
    DefaultSoftPinAboveMax,
    /// Every client would be dead at once.
    #[error("client_live_ttl_sec must be positive")]
    ZeroClientTtl,
    /// No shard to put an object in.
    #[error("shard_count must be positive")]
    ZeroShards,
    /// A low watermark above its high watermark.
    #[error("{low} ({low_value}) must not exceed {high} ({high_value})")]
    LowAboveHigh {
        /// The low watermark key.
        low: &'static str,
        /// Its value.
        low_value: f64,
        /// The high watermark key.
        high: &'static str,
        /// Its value.
        high_value: f64,
    },
}

impl EngineConfigError {
    /// The config key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            Self::RatioOutOfRange { key, .. } => key,
            Self::ReleaseNotAfterDiscard => "put_start_release_timeout_sec",
            Self::DefaultSoftPinAboveMax => "default_kv_soft_pin_ttl",
            Self::ZeroClientTtl => "client_live_ttl_sec",
            Self::ZeroShards => "shard_count",
            Self::LowAboveHigh { low, .. } => low,
        }
    }
}

impl EngineConfig {
    /// Checks ranges and cross-field rules.
    pub fn validate(&self) -> Result<(), EngineConfigError> {
        let ratios = [
            ("eviction_ratio", self.eviction_ratio),
            (
                "eviction_high_watermark_ratio",
                self.eviction_high_watermark_ratio,
            ),
            (
                "offload_high_watermark_ratio",
                self.offload_high_watermark_ratio,
            ),
            (
                "offload_low_watermark_ratio",
                self.offload_low_watermark_ratio,
            ),
            (
                "disk_eviction_high_watermark_ratio",
                self.disk_eviction_high_watermark_ratio,
            ),
            (
                "disk_eviction_low_watermark_ratio",
                self.disk_eviction_low_watermark_ratio,
            ),
        ];
        for (key, value) in ratios {
            if !(0.0..=1.0).contains(&value) {
                return Err(EngineConfigError::RatioOutOfRange { key, value });
            }
        }
        let pairs = [
            (
                "offload_low_watermark_ratio",
                self.offload_low_watermark_ratio,
                "offload_high_watermark_ratio",
                self.offload_high_watermark_ratio,
            ),
            (
                "disk_eviction_low_watermark_ratio",
                self.disk_eviction_low_watermark_ratio,
                "disk_eviction_high_watermark_ratio",
                self.disk_eviction_high_watermark_ratio,
            ),
        ];
        for (low, low_value, high, high_value) in pairs {
            if low_value > high_value {
                return Err(EngineConfigError::LowAboveHigh {
                    low,
                    low_value,
                    high,
                    high_value,
                });
            }
        }
        if self.put_start_release_timeout_ms <= self.put_start_discard_timeout_ms {
            return Err(EngineConfigError::ReleaseNotAfterDiscard);
        }
        if self.default_kv_soft_pin_ttl_ms > self.max_kv_soft_pin_ttl_ms {
            return Err(EngineConfigError::DefaultSoftPinAboveMax);
        }
        if self.client_live_ttl_ms == 0 {
            return Err(EngineConfigError::ZeroClientTtl);
        }
        if self.shard_count == 0 {
            return Err(EngineConfigError::ZeroShards);
        }
        Ok(())
    }
}
