//! The accepted config keys, declared once: each key's upstream name, value type (with its
//! range), help text and effect on [`MasterConfig`]. From this one table come the typed
//! [`ConfigInput`] serde reads (unknown keys refused by `deny_unknown_fields`), the effect of
//! each key, and [`CONFIG_KEYS`], from which `moonkv master` builds its flags and `--help`.

use super::read::{Entries, ReadError};
use super::values::{present, BadValue, Flag, Int, Ip, Millis, Ratio, Strategy, Text};
use super::{ConfigError, MasterConfig};
use moonkv_proto::auth::Secret;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

/// A config key the master accepts: its upstream name and a one-line description.
pub struct ConfigKey {
    /// Upstream config key (flags use the kebab-case form).
    pub name: &'static str,
    /// What it sets.
    pub help: &'static str,
}

/// Upstream keys recognised but not offered here, so a ported config fails with a useful message.
pub(super) const UPSTREAM_ONLY_KEYS: &[&str] = &[
    "ha_backend_type",
    "ha_backend_connstring",
    "enable_oplog",
    "enable_snapshot",
    "enable_snapshot_restore",
    "root_fs_dir",
    "enable_offload",
    "enable_cxl",
    "memory_allocator",
    "enable_http_metadata_server",
    "nof_eviction_ratio",
];

/// The text of a doc comment: rustdoc keeps the space after each `///`, which also joins the
/// lines of a wrapped one.
const fn doc_text(doc: &'static str) -> &'static str {
    match doc.as_bytes() {
        [b' ', rest @ ..] => match std::str::from_utf8(rest) {
            Ok(text) => text,
            Err(_) => doc,
        },
        _ => doc,
    }
}

macro_rules! config_keys {
    ($(
        $(#[doc = $help:literal])+
        $key:ident $(| $alias:literal)?: $ty:ty => |$c:ident, $v:ident| $effect:expr;
    )*) => {
        /// What a config file or a set of flags holds: every accepted key, typed and checked as
        /// serde reads it. A key not listed is refused.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct ConfigInput {
            $(
                $(#[doc = $help])+
                #[serde(default, deserialize_with = "present" $(, alias = $alias)?)]
                $key: Option<$ty>,
            )*
        }

        /// Every key accepted in a config file or as a flag.
        pub const CONFIG_KEYS: &[ConfigKey] = &[$(
            ConfigKey { name: stringify!($key), help: doc_text(concat!($($help),+)) },
        )*];

        /// What each key's value sets.
        mod effects {
            use super::*;
            $(
                pub(super) fn $key($c: &mut MasterConfig, $v: $ty) -> Result<(), BadValue> {
                    $effect;
                    Ok(())
                }
            )*
        }

        impl ConfigInput {
            /// Applies every key present, in table order.
            pub(super) fn apply_to(self, config: &mut MasterConfig) -> Result<(), ConfigError> {
                $(
                    if let Some(value) = self.$key {
                        effects::$key(config, value)
                            .map_err(|e| ConfigError::new(stringify!($key), e.to_string()))?;
                    }
                )*
                Ok(())
            }
        }
    };
}

config_keys! {
    /// address the RPC server binds (default 127.0.0.1)
    rpc_address: Ip => |c, v| c.rpc_addr.set_ip(v.0);
    /// RPC port (default 50051; 0 picks a free port)
    rpc_port: Int<0, 65535> => |c, v| c.rpc_addr.set_port(v.0 as u16);
    /// also serve RPC on a local socket that callers on this machine reconnect to (default
    /// true; never with TLS)
    rpc_local_socket: Flag => |c, v| c.rpc_local_socket = v.0;
    /// address the admin HTTP server binds (default 127.0.0.1)
    metrics_host: Ip => |c, v| c.admin_addr.set_ip(v.0);
    /// admin HTTP port: /metrics, /health, ... (default 9003; 0 picks a free port)
    metrics_port: Int<0, 65535> => |c, v| c.admin_addr.set_port(v.0 as u16);
    /// certificate chain (PEM) the RPC port presents; with tls_key_file the port only accepts
    /// TLS (default: plaintext)
    tls_cert_file: Text => |c, v| c.tls_cert_file = Some(v.0.into());
    /// private key (PEM) of tls_cert_file
    tls_key_file: Text => |c, v| c.tls_key_file = Some(v.0.into());
    /// CA (PEM) client certificates must chain to; set = clients must present one (mutual TLS)
    tls_client_ca_file: Text => |c, v| c.tls_client_ca_file = Some(v.0.into());
    /// RPC worker threads (0 = one per core)
    rpc_thread_num: Int<0, 1024> => |c, v| c.rpc_threads = v.0 as usize;
    /// largest accepted protocol frame in bytes (default 16 MiB)
    max_frame_bytes: Int<4096, { u32::MAX as u64 }> => |c, v| c.max_frame_bytes = v.0 as u32;
    /// a connection whose frame stays incomplete this long without new bytes is closed, in ms
    /// or with a unit (default 30s)
    rpc_io_timeout: Millis => |c, v| c.rpc_io_timeout_ms = v.0.max(1);
    /// most client and node connections past their handshake open at once; a hello beyond it
    /// is refused with an answer naming the cap (default 10000)
    max_connections: Int<1, 1000000> => |c, v| c.max_connections = v.0 as usize;
    /// a connection's hello (and, with a secret, its proof) must be accepted within this long
    /// of accept, else it is closed; in ms or with a unit (default 10s)
    handshake_timeout: Millis => |c, v| c.handshake_timeout_ms = v.0.max(1);
    /// most connections in their handshake at once; a new one beyond it evicts the oldest, so
    /// silent sockets never lock clients out (default 256)
    max_handshaking_connections: Int<1, 1000000> => |c, v| c.max_handshaking_connections = v.0 as usize;
    /// most connections in their handshake at once from one address; a new one beyond it
    /// evicts that address's oldest (default 64)
    max_handshaking_per_source: Int<1, 1000000> => |c, v| c.max_handshaking_per_source = v.0 as usize;
    /// admin HTTP: a request's headers must arrive within this long of the connection opening
    /// or of the previous answer, else the connection is closed; in ms or with a unit (default
    /// 30s)
    admin_header_timeout: Millis => |c, v| c.admin_header_timeout_ms = v.0.max(1);
    /// admin HTTP: a connection on which no byte moves either way this long is closed (a body
    /// that stops coming, an answer nobody reads); in ms or with a unit (default 60s)
    admin_idle_timeout: Millis => |c, v| c.admin_idle_timeout_ms = v.0.max(1);
    /// most admin HTTP connections open at once; more are closed at once (default 256)
    admin_max_connections: Int<1, 1000000> => |c, v| c.admin_max_connections = v.0 as usize;
    /// file holding the shared secret clients must prove (also MOONKV_AUTH_SECRET[_FILE]);
    /// unset = no authentication
    auth_secret_file: Text => |c, v| c.auth_secret = Some(secret_file(&v.0)?);
    /// file holding the secret that signs data-plane grants, shared with the nodes only (also
    /// MOONKV_GRANT_SECRET[_FILE]); unset = the auth secret
    grant_secret_file: Text => |c, v| c.grant_secret = Some(secret_file(&v.0)?);
    /// read lease in ms, or with a unit: 10s, 500ms (default 10000)
    default_kv_lease_ttl: Millis => |c, v| c.engine.default_kv_lease_ttl_ms = v.0;
    /// with a shared secret: lifetime of the read grants handed to clients, in ms or with a unit
    /// (default: the read lease plus 2s)
    data_grant_read_ttl: Millis => |c, v| c.engine.read_grant_ttl_ms = Some(v.0);
    /// soft pin TTL in ms or with a unit (default 30m)
    default_kv_soft_pin_ttl: Millis => |c, v| c.engine.default_kv_soft_pin_ttl_ms = v.0;
    /// longest soft pin a write may ask for (default 24h)
    max_kv_soft_pin_ttl: Millis => |c, v| c.engine.max_kv_soft_pin_ttl_ms = v.0;
    /// let eviction take soft-pinned objects last (default true)
    allow_evict_soft_pinned_objects: Flag =>
        |c, v| c.engine.allow_evict_soft_pinned_objects = v.0;
    /// fraction of objects evicted per round, in [0, 1] (default 0.05)
    eviction_ratio: Ratio => |c, v| c.engine.eviction_ratio = v.0;
    /// memory use that triggers eviction, in [0, 1] (default 0.90)
    eviction_high_watermark_ratio: Ratio => |c, v| c.engine.eviction_high_watermark_ratio = v.0;
    /// seconds without a ping before a client's segments are unmounted (default 10)
    client_live_ttl_sec | "client_ttl": Int<1, 86_400> =>
        |c, v| c.engine.client_live_ttl_ms = v.0 * 1000;
    /// age after which an unfinished put may be replaced (default 30)
    put_start_discard_timeout_sec: Int<0, { 86_400 * 30 }> =>
        |c, v| c.engine.put_start_discard_timeout_ms = v.0 * 1000;
    /// age after which an unfinished put is reclaimed (default 600)
    put_start_release_timeout_sec: Int<1, { 86_400 * 30 }> =>
        |c, v| c.engine.put_start_release_timeout_ms = v.0 * 1000;
    /// metadata shards: how many locks the object map is split under (default 32 per CPU, at
    /// least 64 and at most 1024)
    shard_count: Int<1, 65536> => |c, v| c.engine.shard_count = v.0 as usize;
    /// replica placement: random | free_ratio_first (default random)
    allocation_strategy: Strategy => |c, v| c.engine.allocation_strategy = v.0;
    /// seconds a gone node's disk replicas stay revivable before they are dropped (default 300)
    disk_detach_grace_sec: Int<0, { 86_400 * 30 }> =>
        |c, v| c.engine.disk_detach_grace_ms = v.0 * 1000;
    /// seconds a re-mounted segment stays frozen while its node announces its replicas (default 30)
    adopt_timeout_sec: Int<1, 3_600> => |c, v| c.engine.adopt_timeout_ms = v.0 * 1000;
    /// with a disk tier: memory use above which objects are offloaded to disk ahead of demand,
    /// in [0, 1] (default 0.80)
    offload_high_watermark_ratio: Ratio => |c, v| c.engine.offload_high_watermark_ratio = v.0;
    /// offloading ahead of demand stops at this memory use, less offloads in flight, in [0, 1]
    /// (default 0.60)
    offload_low_watermark_ratio: Ratio => |c, v| c.engine.offload_low_watermark_ratio = v.0;
    /// how long a put that found no memory waits for offloads to disk before it fails, in ms or
    /// with a unit; 0 = fail at once; keep below the clients' RPC timeout (default 3s)
    put_space_wait: Millis => |c, v| c.engine.put_space_wait_ms = v.0;
    /// disk use above which a disk evicts its least recently used replicas, in [0, 1]
    /// (default 0.95)
    disk_eviction_high_watermark_ratio: Ratio =>
        |c, v| c.engine.disk_eviction_high_watermark_ratio = v.0;
    /// disk eviction stops at this disk use, in [0, 1] (default 0.85)
    disk_eviction_low_watermark_ratio: Ratio =>
        |c, v| c.engine.disk_eviction_low_watermark_ratio = v.0;
    /// how long the answer to a request that removed disk replicas waits for the nodes to
    /// delete the files, in ms or with a unit; 0 = answer at once (default 1s)
    disk_removal_ack_wait: Millis => |c, v| c.engine.disk_removal_ack_wait_ms = v.0;
    /// bring objects read from disk back into memory (default true)
    promotion_on_hit: Flag => |c, v| c.engine.promotion_on_hit = v.0;
    /// reads of a disk-only object before it is promoted to memory, 1..255 (default 2)
    promotion_admission_threshold: Int<1, 255> =>
        |c, v| c.engine.promotion_admission_threshold = v.0 as u32;
    /// most promotions to memory in flight at once (default 50000)
    promotion_queue_limit: Int<1, { 1 << 32 }> => |c, v| c.engine.promotion_queue_limit = v.0;
    /// require tenant registration and enforce quotas (default false)
    enable_multi_tenants: Flag => |c, v| c.engine.enable_multi_tenants = v.0;
    /// elect one leader among several masters through an etcd lease; standbys refuse requests
    /// naming the leader (default false)
    enable_ha: Flag => |c, v| c.enable_ha = v.0;
    /// etcd client endpoints for HA, host:port separated by `;` (an http:// prefix is accepted)
    etcd_endpoints: Text => |c, v| c.etcd_endpoints = v.0;
    /// names this cluster's keys in etcd, /moonkv/<cluster_id>/ (default mooncake_cluster)
    cluster_id: Text => |c, v| c.cluster_id = v.0;
    /// HA leader lease in seconds: a dead leader is replaced within about this long, and a
    /// leader that cannot renew it stops serving a sixth of it earlier (default 3)
    ha_lease_ttl_sec: Int<2, 60> => |c, v| c.ha_lease_ttl_sec = v.0 as i64;
    /// publish the KV event stream over ZMQ (default false)
    enable_kv_events: Flag => |c, v| c.kv_events.enabled = v.0;
    /// ZMQ endpoint the publisher binds, e.g. tcp://127.0.0.1:5557
    kv_events_bind_endpoint: Text => |c, v| c.kv_events.bind_endpoint = v.0;
    /// backend_id carried by every event (required when events are on)
    kv_events_backend_id: Text => |c, v| c.kv_events.backend_id = v.0;
    /// model_name carried by every event (default nil)
    kv_events_model_name: Text => |c, v| c.kv_events.model_name = v.0;
    /// block_size carried by every event (0 = nil)
    kv_events_block_size: Int<0, { u32::MAX as u64 }> =>
        |c, v| c.kv_events.block_size = v.0 as u32;
    /// additional_salt carried by every event (default nil)
    kv_events_additional_salt: Text => |c, v| c.kv_events.additional_salt = v.0;
    /// lora_name carried by every event (default nil)
    kv_events_lora_name: Text => |c, v| c.kv_events.lora_name = v.0;
    /// dp_rank carried by every message and event (default 0)
    kv_events_dp_rank: Int<0, { u32::MAX as u64 }> => |c, v| c.kv_events.dp_rank = v.0 as u32;
    /// also emit legacy type/block_hashes/parent_block_hash fields (default true)
    kv_events_emit_legacy_compat: Flag => |c, v| c.kv_events.emit_legacy_compat = v.0;
    /// emit object_key; false suppresses stored/removed events (default true)
    kv_events_emit_object_key: Flag => |c, v| c.kv_events.emit_object_key = v.0;
    /// publisher queue length; oldest dropped when full, 0 = unbounded (default 65536)
    kv_events_queue_capacity: Int<0, { 1 << 32 }> =>
        |c, v| c.kv_events.queue_capacity = v.0 as usize;
}

fn secret_file(path: &str) -> Result<Secret, BadValue> {
    Secret::from_file(Path::new(path)).map_err(BadValue::Secret)
}

impl ConfigInput {
    /// Reads a mapping of keys to values. `whole` is the key blamed for a problem of the
    /// mapping as a whole.
    pub(super) fn read(map: Map<String, Value>, whole: &str) -> Result<Self, ConfigError> {
        Self::deserialize(Entries::new(map)).map_err(|e| match e {
            ReadError::UnknownKey(key) if UPSTREAM_ONLY_KEYS.contains(&key.as_str()) => {
                ConfigError::new(
                    &key,
                    "this upstream option is not supported by moonkv; remove it",
                )
            }
            ReadError::UnknownKey(key) => ConfigError::new(
                &key,
                "unknown key (see `moonkv master --help` for the accepted keys)",
            ),
            ReadError::BadValue { key, reason } => ConfigError::new(&key, reason),
            ReadError::Document(reason) => ConfigError::new(whole, reason),
        })
    }
}
