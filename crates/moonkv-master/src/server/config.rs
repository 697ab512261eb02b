//! Master configuration: upstream key names, one validation path for config files and flags.
//!
//! A config file (YAML or JSON) and command-line flags both end up in [`MasterConfig::apply`],
//! so a bad value gets the same message naming the key wherever it came from.

use crate::engine::{AllocationStrategy, EngineConfig};
use moonkv_proto::tls::TlsServerConfig;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// A config key the master accepts: its upstream name and a one-line description.
pub struct ConfigKey {
    /// Upstream config key (flags use the kebab-case form).
    pub name: &'static str,
    /// What it sets.
    pub help: &'static str,
}

macro_rules! keys {
    ($($name:literal => $help:literal,)*) => {
        /// Every key accepted in a config file or as a flag.
        pub const CONFIG_KEYS: &[ConfigKey] = &[$(ConfigKey { name: $name, help: $help },)*];
    };
}

keys! {
    "rpc_address" => "address the RPC server binds (default 127.0.0.1)",
    "rpc_port" => "RPC port (default 50051; 0 picks a free port)",
    "metrics_host" => "address the admin HTTP server binds (default 127.0.0.1)",
    "metrics_port" => "admin HTTP port: /metrics, /health, ... (default 9003; 0 picks a free port)",
    "tls_cert_file" => "certificate chain (PEM) the RPC port presents; with tls_key_file the port only accepts TLS (default: plaintext)",
    "tls_key_file" => "private key (PEM) of tls_cert_file",
    "tls_client_ca_file" => "CA (PEM) client certificates must chain to; set = clients must present one (mutual TLS)",
    "rpc_thread_num" => "RPC worker threads (0 = one per core)",
    "max_frame_bytes" => "largest accepted protocol frame in bytes (default 16 MiB)",
    "auth_secret_file" => "file holding the shared secret clients must prove (also MOONKV_AUTH_SECRET[_FILE]); unset = no authentication",
    "grant_secret_file" => "file holding the secret that signs data-plane grants, shared with the nodes only (also MOONKV_GRANT_SECRET[_FILE]); unset = the auth secret",
    "default_kv_lease_ttl" => "read lease in ms, or with a unit: 10s, 500ms (default 10000)",
    "data_grant_read_ttl" => "with a shared secret: lifetime of the read grants handed to clients, in ms or with a unit (default: the read lease plus 2s)",
    "default_kv_soft_pin_ttl" => "soft pin TTL in ms or with a unit (default 30m)",
    "max_kv_soft_pin_ttl" => "longest soft pin a write may ask for (default 24h)",
    "allow_evict_soft_pinned_objects" => "let eviction take soft-pinned objects last (default true)",
    "eviction_ratio" => "fraction of objects evicted per round, in [0, 1] (default 0.05)",
    "eviction_high_watermark_ratio" => "memory use that triggers eviction, in [0, 1] (default 0.90)",
    "client_live_ttl_sec" => "seconds without a ping before a client's segments are unmounted (default 10)",
    "put_start_discard_timeout_sec" => "age after which an unfinished put may be replaced (default 30)",
    "put_start_release_timeout_sec" => "age after which an unfinished put is reclaimed (default 600)",
    "allocation_strategy" => "replica placement: random | free_ratio_first (default random)",
    "disk_detach_grace_sec" => "seconds a gone node's disk replicas stay revivable before they are dropped (default 300)",
    "enable_multi_tenants" => "require tenant registration and enforce quotas (default false)",
    "enable_kv_events" => "publish the KV event stream over ZMQ (default false)",
    "kv_events_bind_endpoint" => "ZMQ endpoint the publisher binds, e.g. tcp://127.0.0.1:5557",
    "kv_events_backend_id" => "backend_id carried by every event (required when events are on)",
    "kv_events_model_name" => "model_name carried by every event (default nil)",
    "kv_events_block_size" => "block_size carried by every event (0 = nil)",
    "kv_events_additional_salt" => "additional_salt carried by every event (default nil)",
    "kv_events_lora_name" => "lora_name carried by every event (default nil)",
    "kv_events_dp_rank" => "dp_rank carried by every message and event (default 0)",
    "kv_events_emit_legacy_compat" => "also emit legacy type/block_hashes/parent_block_hash fields (default true)",
    "kv_events_emit_object_key" => "emit object_key; false suppresses stored/removed events (default true)",
    "kv_events_queue_capacity" => "publisher queue length; oldest dropped when full, 0 = unbounded (default 65536)",
}

/// Upstream keys recognised but not offered here, so a ported config fails with a useful message.
const UPSTREAM_ONLY_KEYS: &[&str] = &[
    "enable_ha",
    "ha_backend_type",
    "ha_backend_connstring",
    "etcd_endpoints",
    "enable_oplog",
    "enable_snapshot",
    "enable_snapshot_restore",
    "root_fs_dir",
    "enable_offload",
    "enable_cxl",
    "memory_allocator",
    "enable_http_metadata_server",
    "nof_eviction_ratio",
    "cluster_id",
];

/// Event stream settings (the `kv_events_*` keys).
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsSettings {
    /// `enable_kv_events`.
    pub enabled: bool,
    /// `kv_events_bind_endpoint`.
    pub bind_endpoint: String,
    /// `kv_events_backend_id`.
    pub backend_id: String,
    /// `kv_events_model_name` (empty = nil).
    pub model_name: String,
    /// `kv_events_block_size` (0 = nil).
    pub block_size: u32,
    /// `kv_events_additional_salt` (empty = nil).
    pub additional_salt: String,
    /// `kv_events_lora_name` (empty = nil).
    pub lora_name: String,
    /// `kv_events_dp_rank`.
    pub dp_rank: u32,
    /// `kv_events_emit_legacy_compat`.
    pub emit_legacy_compat: bool,
    /// `kv_events_emit_object_key`.
    pub emit_object_key: bool,
    /// `kv_events_queue_capacity` (0 = unbounded).
    pub queue_capacity: usize,
}

impl Default for KvEventsSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            bind_endpoint: String::new(),
            backend_id: String::new(),
            model_name: String::new(),
            block_size: 0,
            additional_salt: String::new(),
            lora_name: String::new(),
            dp_rank: 0,
            emit_legacy_compat: true,
            emit_object_key: true,
            queue_capacity: 65536,
        }
    }
}

/// Everything the master process needs.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// RPC listen address.
    pub rpc_addr: SocketAddr,
    /// Admin HTTP listen address.
    pub admin_addr: SocketAddr,
    /// Worker threads (0 = one per core).
    pub rpc_threads: usize,
    /// Largest accepted frame.
    pub max_frame_bytes: u32,
    /// Engine settings.
    pub engine: EngineConfig,
    /// Event stream settings.
    pub kv_events: KvEventsSettings,
    /// Shared secret clients must prove in the handshake; `None` = open (loopback default).
    pub auth_secret: Option<moonkv_proto::auth::Secret>,
    /// Secret that signs data-plane grants, known to the master and the nodes but not to
    /// clients; `None` = grants are signed with `auth_secret`.
    pub grant_secret: Option<moonkv_proto::auth::Secret>,
    /// `tls_cert_file`: with `tls_key_file`, the RPC port only accepts TLS.
    pub tls_cert_file: Option<PathBuf>,
    /// `tls_key_file`.
    pub tls_key_file: Option<PathBuf>,
    /// `tls_client_ca_file`: clients must present a certificate this CA signed.
    pub tls_client_ca_file: Option<PathBuf>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        let localhost = IpAddr::from([127, 0, 0, 1]);
        Self {
            rpc_addr: SocketAddr::new(localhost, 50051),
            admin_addr: SocketAddr::new(localhost, 9003),
            rpc_threads: 0,
            max_frame_bytes: moonkv_proto::frame::DEFAULT_MAX_FRAME_BYTES,
            engine: EngineConfig::default(),
            kv_events: KvEventsSettings::default(),
            auth_secret: None,
            grant_secret: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
        }
    }
}

/// A rejected configuration value, naming its key.
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    /// The key at fault.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        reason: reason.into(),
    }
}

impl MasterConfig {
    /// A configuration for tests and embedding: loopback, ephemeral ports, defaults otherwise.
    pub fn ephemeral() -> Self {
        let mut config = Self::default();
        config.rpc_addr.set_port(0);
        config.admin_addr.set_port(0);
        config
    }

    /// Loads a YAML or JSON file (by extension; YAML otherwise) over the current values.
    pub fn load_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            bad(
                "config_path",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let is_json = path.extension().is_some_and(|e| e == "json");
        let doc: Value = if is_json {
            serde_json::from_str(&text).map_err(|e| {
                bad(
                    "config_path",
                    format!("{} is not valid JSON: {e}", path.display()),
                )
            })?
        } else {
            serde_yaml::from_str(&text).map_err(|e| {
                bad(
                    "config_path",
                    format!("{} is not valid YAML: {e}", path.display()),
                )
            })?
        };
        match doc {
            Value::Object(map) => {
                for (key, value) in &map {
                    self.apply(key, value)?;
                }
                Ok(())
            }
            Value::Null => Ok(()),
            _ => Err(bad(
                "config_path",
                format!("{} must hold a mapping of keys to values", path.display()),
            )),
        }
    }

    /// Applies one key, as named in upstream configs, checking type and range.
    pub fn apply(&mut self, key: &str, value: &Value) -> Result<(), ConfigError> {
        let e = &mut self.engine;
        let ev = &mut self.kv_events;
        match key {
            "rpc_address" => self.rpc_addr.set_ip(ip(key, value)?),
            "rpc_port" => self.rpc_addr.set_port(int(key, value, 0, 65535)? as u16),
            "metrics_host" => self.admin_addr.set_ip(ip(key, value)?),
            "metrics_port" => self.admin_addr.set_port(int(key, value, 0, 65535)? as u16),
            "auth_secret_file" => {
                let path = string(key, value)?;
                let secret = moonkv_proto::auth::Secret::from_file(Path::new(&path))
                    .map_err(|e| bad(key, e))?;
                self.auth_secret = Some(secret);
            }
            "grant_secret_file" => {
                let path = string(key, value)?;
                let secret = moonkv_proto::auth::Secret::from_file(Path::new(&path))
                    .map_err(|e| bad(key, e))?;
                self.grant_secret = Some(secret);
            }
            "tls_cert_file" => self.tls_cert_file = Some(string(key, value)?.into()),
            "tls_key_file" => self.tls_key_file = Some(string(key, value)?.into()),
            "tls_client_ca_file" => self.tls_client_ca_file = Some(string(key, value)?.into()),
            "rpc_thread_num" => self.rpc_threads = int(key, value, 0, 1024)? as usize,
            "max_frame_bytes" => {
                self.max_frame_bytes = int(key, value, 4096, u32::MAX as u64)? as u32
            }
            "default_kv_lease_ttl" => e.default_kv_lease_ttl_ms = duration_ms(key, value)?,
            "data_grant_read_ttl" => e.read_grant_ttl_ms = Some(duration_ms(key, value)?),
            "default_kv_soft_pin_ttl" => e.default_kv_soft_pin_ttl_ms = duration_ms(key, value)?,
            "max_kv_soft_pin_ttl" => e.max_kv_soft_pin_ttl_ms = duration_ms(key, value)?,
            "allow_evict_soft_pinned_objects" => {
                e.allow_evict_soft_pinned_objects = boolean(key, value)?
            }
            "eviction_ratio" => e.eviction_ratio = ratio(key, value)?,
            "eviction_high_watermark_ratio" => e.eviction_high_watermark_ratio = ratio(key, value)?,
            "client_live_ttl_sec" | "client_ttl" => {
                e.client_live_ttl_ms = int(key, value, 1, 86_400)? * 1000
            }
            "put_start_discard_timeout_sec" => {
                e.put_start_discard_timeout_ms = int(key, value, 0, 86_400 * 30)? * 1000
            }
            "put_start_release_timeout_sec" => {
                e.put_start_release_timeout_ms = int(key, value, 1, 86_400 * 30)? * 1000
            }
            "disk_detach_grace_sec" => {
                e.disk_detach_grace_ms = int(key, value, 0, 86_400 * 30)? * 1000
            }
            "allocation_strategy" => {
                e.allocation_strategy = match string(key, value)?.as_str() {
                    "random" => AllocationStrategy::Random,
                    "free_ratio_first" => AllocationStrategy::FreeRatioFirst,
                    other => {
                        return Err(bad(
                            key,
                            format!(
                                "unknown strategy `{other}`; expected random or free_ratio_first"
                            ),
                        ))
                    }
                }
            }
            "enable_multi_tenants" => e.enable_multi_tenants = boolean(key, value)?,
            "enable_kv_events" => ev.enabled = boolean(key, value)?,
            "kv_events_bind_endpoint" => ev.bind_endpoint = string(key, value)?,
            "kv_events_backend_id" => ev.backend_id = string(key, value)?,
            "kv_events_model_name" => ev.model_name = string(key, value)?,
            "kv_events_block_size" => ev.block_size = int(key, value, 0, u32::MAX as u64)? as u32,
            "kv_events_additional_salt" => ev.additional_salt = string(key, value)?,
            "kv_events_lora_name" => ev.lora_name = string(key, value)?,
            "kv_events_dp_rank" => ev.dp_rank = int(key, value, 0, u32::MAX as u64)? as u32,
            "kv_events_emit_legacy_compat" => ev.emit_legacy_compat = boolean(key, value)?,
            "kv_events_emit_object_key" => ev.emit_object_key = boolean(key, value)?,
            "kv_events_queue_capacity" => ev.queue_capacity = int(key, value, 0, 1 << 32)? as usize,
            other if UPSTREAM_ONLY_KEYS.contains(&other) => {
                return Err(bad(
                    other,
                    "this upstream option is not supported by moonkv; remove it",
                ))
            }
            other => {
                return Err(bad(
                    other,
                    "unknown key (see `moonkv master --help` for the accepted keys)",
                ))
            }
        }
        Ok(())
    }

    /// Takes the secret from `MOONKV_AUTH_SECRET[_FILE]` when no `auth_secret_file` was given,
    /// and the grant secret from `MOONKV_GRANT_SECRET[_FILE]` when no `grant_secret_file` was.
    pub fn secret_from_env(&mut self) -> Result<(), ConfigError> {
        if self.auth_secret.is_none() {
            self.auth_secret =
                moonkv_proto::auth::Secret::from_env().map_err(|e| bad("auth_secret_file", e))?;
        }
        if self.grant_secret.is_none() {
            self.grant_secret = moonkv_proto::auth::Secret::grant_secret_from_env()
                .map_err(|e| bad("grant_secret_file", e))?;
        }
        Ok(())
    }

    /// Checks rules that span several keys; called once everything is applied.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine.validate().map_err(|reason| {
            let key = reason
                .split_whitespace()
                .next()
                .unwrap_or("config")
                .trim_matches('`')
                .to_string();
            ConfigError { key, reason }
        })?;
        self.check_tls()?;
        let ev = &self.kv_events;
        if ev.enabled {
            if ev.bind_endpoint.is_empty() {
                return Err(bad(
                    "kv_events_bind_endpoint",
                    "required when enable_kv_events is true",
                ));
            }
            if ev.backend_id.is_empty() {
                return Err(bad(
                    "kv_events_backend_id",
                    "required (non-empty) when enable_kv_events is true",
                ));
            }
        }
        Ok(())
    }
}

impl MasterConfig {
    /// The TLS settings of the RPC port; `None` = plaintext.
    pub fn tls(&self) -> Option<TlsServerConfig> {
        Some(TlsServerConfig {
            cert_file: self.tls_cert_file.clone()?,
            key_file: self.tls_key_file.clone()?,
            client_ca_file: self.tls_client_ca_file.clone(),
        })
    }

    /// Both or neither of the certificate and key; each file readable and usable.
    fn check_tls(&self) -> Result<(), ConfigError> {
        let Some(tls) = self.tls() else {
            return match (&self.tls_cert_file, &self.tls_key_file, &self.tls_client_ca_file) {
                (Some(_), None, _) => Err(bad("tls_key_file", "required with tls_cert_file")),
                (None, Some(_), _) => Err(bad("tls_cert_file", "required with tls_key_file")),
                (None, None, Some(_)) => Err(bad(
                    "tls_client_ca_file",
                    "needs tls_cert_file and tls_key_file (client certificates are checked over TLS)",
                )),
                _ => Ok(()),
            };
        };
        #[cfg(feature = "tls")]
        {
            use moonkv_proto::tls::{load_certs, load_key};
            load_certs(&tls.cert_file).map_err(|e| bad("tls_cert_file", e))?;
            load_key(&tls.key_file).map_err(|e| bad("tls_key_file", e))?;
            if let Some(ca) = &tls.client_ca_file {
                load_certs(ca).map_err(|e| bad("tls_client_ca_file", e))?;
            }
        }
        tls.check().map_err(|e| bad("tls_cert_file", e))
    }
}

/// Turns a flag's text into the value `apply` expects (numbers and booleans typed, rest text).
pub fn flag_value(text: &str) -> Value {
    if let Ok(b) = text.parse::<bool>() {
        return Value::Bool(b);
    }
    if let Ok(n) = text.parse::<u64>() {
        return Value::from(n);
    }
    if let Ok(f) = text.parse::<f64>() {
        if f.is_finite() {
            return Value::from(f);
        }
    }
    Value::String(text.to_string())
}

fn int(key: &str, value: &Value, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    }
    .ok_or_else(|| bad(key, format!("expected a whole number, got {value}")))?;
    if n < min || n > max {
        return Err(bad(key, format!("{n} is out of range [{min}, {max}]")));
    }
    Ok(n)
}

fn ratio(key: &str, value: &Value) -> Result<f64, ConfigError> {
    let r = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .ok_or_else(|| bad(key, format!("expected a number in [0, 1], got {value}")))?;
    if !(0.0..=1.0).contains(&r) {
        return Err(bad(key, format!("{r} is out of range [0, 1]")));
    }
    Ok(r)
}

fn boolean(key: &str, value: &Value) -> Result<bool, ConfigError> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s == "1" => Ok(true),
        Value::String(s) if s == "false" || s == "0" => Ok(false),
        Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
        Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
        _ => Err(bad(key, format!("expected true or false, got {value}"))),
    }
}

fn string(key: &str, value: &Value) -> Result<String, ConfigError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(bad(key, format!("expected text, got {value}"))),
    }
}

fn ip(key: &str, value: &Value) -> Result<IpAddr, ConfigError> {
    let text = string(key, value)?;
    text.parse()
        .map_err(|_| bad(key, format!("`{text}` is not an IP address")))
}

/// Milliseconds from a number (ms) or text with a unit: `250ms`, `10s`, `30m`, `24h`.
fn duration_ms(key: &str, value: &Value) -> Result<u64, ConfigError> {
    if let Value::Number(n) = value {
        return n
            .as_u64()
            .ok_or_else(|| bad(key, format!("expected milliseconds, got {value}")));
    }
    let text = string(key, value)?;
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        bad(
            key,
            format!("`{text}` is not a duration like 500ms, 10s, 30m or 24h"),
        )
    })?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(bad(
                key,
                format!("unknown unit `{unit}` in `{text}`; use ms, s, m or h"),
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| bad(key, format!("`{text}` is too long")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn upstream_keys_apply() {
        let mut c = MasterConfig::default();
        c.apply("default_kv_lease_ttl", &json!("5s")).unwrap();
        c.apply("eviction_ratio", &json!(0.1)).unwrap();
        c.apply("client_live_ttl_sec", &json!(60)).unwrap();
        c.apply("disk_detach_grace_sec", &json!(7)).unwrap();
        assert_eq!(c.engine.disk_detach_grace_ms, 7000);
        c.apply("rpc_port", &flag_value("0")).unwrap();
        c.apply("enable_kv_events", &flag_value("true")).unwrap();
        assert_eq!(c.engine.default_kv_lease_ttl_ms, 5000);
        assert_eq!(c.engine.eviction_ratio, 0.1);
        assert_eq!(c.engine.client_live_ttl_ms, 60_000);
        assert_eq!(c.rpc_addr.port(), 0);
        assert!(c.kv_events.enabled);
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut c = MasterConfig::default();
        let err = c.apply("eviction_ratio", &json!(1.5)).unwrap_err();
        assert_eq!(err.key, "eviction_ratio");
        assert!(err.to_string().contains("out of range"), "{err}");
        assert_eq!(
            c.apply("no_such_key", &json!(1)).unwrap_err().key,
            "no_such_key"
        );
        assert!(c
            .apply("enable_ha", &json!(true))
            .unwrap_err()
            .reason
            .contains("not supported"));
        assert!(c
            .apply("default_kv_lease_ttl", &json!("10 parsecs"))
            .is_err());
        assert!(c.apply("rpc_port", &json!(70000)).is_err());
        assert!(c.apply("enable_multi_tenants", &json!("maybe")).is_err());
        assert!(c.apply("allocation_strategy", &json!("cxl")).is_err());
    }

    #[test]
    fn events_need_endpoint_and_backend() {
        let mut c = MasterConfig::default();
        c.apply("enable_kv_events", &json!(true)).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "kv_events_bind_endpoint");
        c.apply("kv_events_bind_endpoint", &json!("tcp://127.0.0.1:5557"))
            .unwrap();
        assert_eq!(c.validate().unwrap_err().key, "kv_events_backend_id");
        c.apply("kv_events_backend_id", &json!("b0")).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn config_files_load_and_reject_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("moonkv-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("master.yaml");
        std::fs::write(&yaml, "eviction_ratio: 0.2\nclient_live_ttl_sec: 30\n").unwrap();
        let mut c = MasterConfig::default();
        c.load_file(&yaml).unwrap();
        assert_eq!(c.engine.eviction_ratio, 0.2);
        let json_path = dir.join("master.json");
        std::fs::write(&json_path, r#"{"eviction_ratio": 0.3, "typo_key": 1}"#).unwrap();
        assert_eq!(c.load_file(&json_path).unwrap_err().key, "typo_key");
        std::fs::write(&yaml, "[1, 2").unwrap();
        assert_eq!(c.load_file(&yaml).unwrap_err().key, "config_path");
        assert!(c.load_file(&dir.join("missing.yaml")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
