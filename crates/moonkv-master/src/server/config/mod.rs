//! Master configuration: upstream key names, one schema for config files and flags.
//!
//! - `keys`: the table of accepted keys (type, range, help, effect), from which come the typed
//!   input serde reads and [`CONFIG_KEYS`], the flags of `moonkv master`.
//! - `values`: the value types and why a value is refused.
//! - `read`: feeding a parsed document to serde key by key, so errors name their key.
//!
//! A config file (YAML or JSON) and each command-line flag are read through the same table, so
//! a bad value gets the same message naming the key wherever it came from.

mod keys;
mod read;
mod values;

pub use keys::{ConfigKey, CONFIG_KEYS};

use crate::engine::EngineConfig;
use keys::ConfigInput;
use moonkv_proto::tls::TlsServerConfig;
use serde_json::{Map, Value};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

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
    /// `rpc_local_socket`: also serve RPC on an abstract Unix socket, named in every hello
    /// answer, for callers on this machine (never with TLS).
    pub rpc_local_socket: bool,
    /// Admin HTTP listen address.
    pub admin_addr: SocketAddr,
    /// Worker threads (0 = one per core).
    pub rpc_threads: usize,
    /// Largest accepted frame.
    pub max_frame_bytes: u32,
    /// `rpc_io_timeout`: an incomplete frame that gets no new bytes this long closes its
    /// connection.
    pub rpc_io_timeout_ms: u64,
    /// `max_connections`: RPC connections past their handshake open at once.
    pub max_connections: usize,
    /// `handshake_timeout`: an RPC connection's hello (and proof) must be accepted this long
    /// after accept, else it is closed.
    pub handshake_timeout_ms: u64,
    /// `max_handshaking_connections`: RPC connections in their handshake at once; a new one
    /// over the cap evicts the oldest.
    pub max_handshaking_connections: usize,
    /// `max_handshaking_per_source`: the same, per source address.
    pub max_handshaking_per_source: usize,
    /// `admin_header_timeout`: an admin HTTP request's headers must arrive within this long of
    /// the connection opening or of the previous answer.
    pub admin_header_timeout_ms: u64,
    /// `admin_idle_timeout`: an admin HTTP connection on which no byte moves this long is
    /// closed.
    pub admin_idle_timeout_ms: u64,
    /// `admin_max_connections`: admin HTTP connections open at once.
    pub admin_max_connections: usize,
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
    /// `enable_ha`: elect a leader through etcd ([`MasterConfig::ha`]).
    pub enable_ha: bool,
    /// `etcd_endpoints`, as given.
    pub etcd_endpoints: String,
    /// `cluster_id`.
    pub cluster_id: String,
    /// `ha_lease_ttl_sec`.
    pub ha_lease_ttl_sec: i64,
}

impl Default for MasterConfig {
    fn default() -> Self {
        let localhost = IpAddr::from([127, 0, 0, 1]);
        Self {
            rpc_addr: SocketAddr::new(localhost, 50051),
            rpc_local_socket: true,
            admin_addr: SocketAddr::new(localhost, 9003),
            rpc_threads: 0,
            max_frame_bytes: moonkv_proto::frame::DEFAULT_MAX_FRAME_BYTES,
            rpc_io_timeout_ms: 30_000,
            max_connections: 10_000,
            handshake_timeout_ms: 10_000,
            max_handshaking_connections: 256,
            max_handshaking_per_source: 64,
            admin_header_timeout_ms: 30_000,
            admin_idle_timeout_ms: 60_000,
            admin_max_connections: 256,
            engine: EngineConfig::default(),
            kv_events: KvEventsSettings::default(),
            auth_secret: None,
            grant_secret: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            enable_ha: false,
            etcd_endpoints: String::new(),
            cluster_id: moonkv_proto::ha::DEFAULT_CLUSTER_ID.to_string(),
            ha_lease_ttl_sec: crate::server::ha::DEFAULT_LEASE_TTL_SEC,
        }
    }
}

/// A rejected configuration, naming the key at fault (`config_path` for the file itself).
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    /// The key at fault.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
    /// The I/O or parse error behind it, when the file could not be read or parsed.
    #[source]
    pub cause: Option<ConfigCause>,
}

/// Why a config file could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigCause {
    /// Reading the file failed.
    #[error(transparent)]
    Io(std::io::Error),
    /// The file is not valid JSON.
    #[error(transparent)]
    Json(serde_json::Error),
    /// The file is not valid YAML.
    #[error(transparent)]
    Yaml(serde_yaml::Error),
}

impl ConfigError {
    fn new(key: &str, reason: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            reason: reason.into(),
            cause: None,
        }
    }

    fn file(reason: String, cause: ConfigCause) -> Self {
        Self {
            cause: Some(cause),
            ..Self::new("config_path", reason)
        }
    }
}

/// The top-level keys of a config document, in order and with repeats (values skipped).
#[derive(Default)]
struct TopKeys(Vec<String>);

impl<'de> serde::Deserialize<'de> for TopKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = TopKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, _)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
                    keys.push(key);
                }
                Ok(TopKeys(keys))
            }
            fn visit_unit<E>(self) -> Result<TopKeys, E> {
                Ok(TopKeys::default())
            }
        }
        d.deserialize_any(Keys)
    }
}

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
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
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::file(format!("cannot read {shown}"), ConfigCause::Io(e)))?;
        let doc: Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| {
                ConfigError::file(format!("{shown} is not valid JSON"), ConfigCause::Json(e))
            })?
        } else {
            serde_yaml::from_str(&text).map_err(|e| {
                ConfigError::file(format!("{shown} is not valid YAML"), ConfigCause::Yaml(e))
            })?
        };
        // A key given twice would silently keep its last value; say which one instead.
        let keys = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str::<TopKeys>(&text)
                .map(|k| k.0)
                .unwrap_or_default()
        } else {
            serde_yaml::from_str::<TopKeys>(&text)
                .map(|k| k.0)
                .unwrap_or_default()
        };
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = keys.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(bad(twice, format!("appears more than once in {shown}")));
        }
        match doc {
            Value::Object(map) => ConfigInput::read(map, "config_path")?.apply_to(self),
            Value::Null => Ok(()),
            _ => Err(bad(
                "config_path",
                format!("{shown} must hold a mapping of keys to values"),
            )),
        }
    }

    /// Applies one key, as named in upstream configs, checking type and range.
    pub fn apply(&mut self, key: &str, value: &Value) -> Result<(), ConfigError> {
        let mut entry = Map::new();
        entry.insert(key.to_string(), value.clone());
        ConfigInput::read(entry, key)
            .and_then(|input| input.apply_to(self))
            // One key was given, so it is the one at fault, under the name it was given.
            .map_err(|e| ConfigError {
                key: key.to_string(),
                ..e
            })
    }

    /// Takes the secret from `MOONKV_AUTH_SECRET[_FILE]` when no `auth_secret_file` was given,
    /// and the grant secret from `MOONKV_GRANT_SECRET[_FILE]` when no `grant_secret_file` was.
    pub fn secret_from_env(&mut self) -> Result<(), ConfigError> {
        if self.auth_secret.is_none() {
            self.auth_secret = moonkv_proto::auth::Secret::from_env()
                .map_err(|e| bad("auth_secret_file", e.to_string()))?;
        }
        if self.grant_secret.is_none() {
            self.grant_secret = moonkv_proto::auth::Secret::grant_secret_from_env()
                .map_err(|e| bad("grant_secret_file", e.to_string()))?;
        }
        Ok(())
    }

    /// Checks rules that span several keys; called once everything is applied.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine
            .validate()
            .map_err(|e| bad(e.key(), e.to_string()))?;
        self.check_tls()?;
        self.ha()?;
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
    /// The HA settings when `enable_ha` is on, checked; `None` = a single master.
    pub fn ha(&self) -> Result<Option<crate::server::ha::HaSettings>, ConfigError> {
        use moonkv_proto::ha::{parse_endpoints, validate_cluster_id};
        if !self.enable_ha {
            return Ok(None);
        }
        if self.etcd_endpoints.trim().is_empty() {
            return Err(bad("etcd_endpoints", "required when enable_ha is true"));
        }
        let endpoints = parse_endpoints(&self.etcd_endpoints)
            .map_err(|e| bad("etcd_endpoints", e.to_string()))?;
        validate_cluster_id(&self.cluster_id).map_err(|e| bad("cluster_id", e.to_string()))?;
        if self.rpc_addr.ip().is_unspecified() {
            return Err(bad(
                "rpc_address",
                "with enable_ha the leader key advertises this address: give the address clients reach, not 0.0.0.0",
            ));
        }
        Ok(Some(crate::server::ha::HaSettings {
            endpoints,
            cluster_id: self.cluster_id.clone(),
            lease_ttl_sec: self.ha_lease_ttl_sec,
        }))
    }

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
            load_certs(&tls.cert_file).map_err(|e| bad("tls_cert_file", e.to_string()))?;
            load_key(&tls.key_file).map_err(|e| bad("tls_key_file", e.to_string()))?;
            if let Some(ca) = &tls.client_ca_file {
                load_certs(ca).map_err(|e| bad("tls_client_ca_file", e.to_string()))?;
            }
        }
        tls.check().map_err(|e| bad("tls_cert_file", e.to_string()))
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
            .apply("enable_oplog", &json!(true))
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
    fn shard_count_defaults_by_cpus_and_takes_a_setting_within_bounds() {
        let c = MasterConfig::default();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.engine.shard_count, crate::engine::default_shard_count());
        assert!((64..=1024).contains(&c.engine.shard_count));
        assert!(c.engine.shard_count.is_power_of_two());
        assert!(c.engine.shard_count >= (cpus * 32).min(1024));
        let mut c = MasterConfig::default();
        c.apply("shard_count", &json!(16)).unwrap();
        assert_eq!(c.engine.shard_count, 16);
        c.validate().unwrap();
        for bad in [json!(0), json!(65537), json!("many")] {
            assert_eq!(c.apply("shard_count", &bad).unwrap_err().key, "shard_count");
        }
        assert_eq!(c.engine.shard_count, 16);
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
    fn ha_needs_endpoints_a_cluster_id_and_an_advertised_address() {
        let mut c = MasterConfig::default();
        c.apply("enable_ha", &json!(true)).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "etcd_endpoints");
        c.apply("etcd_endpoints", &json!("127.0.0.1")).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "etcd_endpoints");
        c.apply(
            "etcd_endpoints",
            &json!("http://127.0.0.1:2379;127.0.0.2:2379"),
        )
        .unwrap();
        c.apply("cluster_id", &json!("a/b")).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "cluster_id");
        c.apply("cluster_id", &json!("prod-1")).unwrap();
        let ha = c.ha().unwrap().unwrap();
        assert_eq!(ha.endpoints, ["127.0.0.1:2379", "127.0.0.2:2379"]);
        assert_eq!(ha.lease_ttl_sec, 3);
        assert!(c.apply("ha_lease_ttl_sec", &json!(1)).is_err());
        c.apply("rpc_address", &json!("0.0.0.0")).unwrap();
        assert_eq!(c.validate().unwrap_err().key, "rpc_address");
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
        let err = c.load_file(&yaml).unwrap_err();
        assert_eq!(err.key, "config_path");
        assert!(matches!(err.cause, Some(ConfigCause::Yaml(_))), "{err:?}");
        let err = c.load_file(&dir.join("missing.yaml")).unwrap_err();
        assert!(matches!(err.cause, Some(ConfigCause::Io(_))), "{err:?}");
        assert!(std::error::Error::source(&err).is_some());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unknown_and_unsupported_keys_are_refused_with_their_own_message() {
        let mut c = MasterConfig::default();
        let err = c.apply("evicton_ratio", &json!(0.1)).unwrap_err();
        assert_eq!(err.key, "evicton_ratio");
        assert!(err.reason.starts_with("unknown key"), "{err}");
        let err = c.apply("enable_oplog", &json!(false)).unwrap_err();
        assert_eq!(err.key, "enable_oplog");
        assert!(err.reason.contains("not supported"), "{err}");
        for key in CONFIG_KEYS {
            // Every listed key reaches its value type, which refuses null.
            let err = c.apply(key.name, &Value::Null).unwrap_err();
            assert_eq!(err.key, key.name);
            assert!(!err.reason.starts_with("unknown key"), "{err}");
        }
    }

    #[test]
    fn a_key_given_twice_in_a_file_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("moonkv-dup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            (
                "dup.yaml",
                "default_kv_lease_ttl: 100\neviction_ratio: 0.1\ndefault_kv_lease_ttl: 200\n",
            ),
            (
                "dup.json",
                r#"{"default_kv_lease_ttl": 100, "default_kv_lease_ttl": 200}"#,
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let err = MasterConfig::default().load_file(&path).unwrap_err();
            assert_eq!(err.key, "default_kv_lease_ttl", "{name}: {err}");
            assert!(err.to_string().contains("more than once"), "{err}");
        }
        let once = dir.join("once.yaml");
        std::fs::write(&once, "default_kv_lease_ttl: 100\n").unwrap();
        MasterConfig::default().load_file(&once).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wrong_types_in_a_file_name_their_key() {
        let dir = std::env::temp_dir().join(format!("moonkv-config-types-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("rpc_port: abc\n", "rpc_port", "expected a whole number"),
            (
                "enable_kv_events: [1]\n",
                "enable_kv_events",
                "expected true or false",
            ),
            (
                "kv_events_backend_id: {a: 1}\n",
                "kv_events_backend_id",
                "expected text",
            ),
            (
                "metrics_host: ~\n",
                "metrics_host",
                "expected text, got null",
            ),
            ("client_ttl: 0\n", "client_ttl", "out of range"),
            (
                "eviction_ratio: 0.5\nenable_cxl: true\n",
                "enable_cxl",
                "not supported",
            ),
        ];
        for (i, (text, key, reason)) in cases.into_iter().enumerate() {
            let path = dir.join(format!("master-{i}.yaml"));
            std::fs::write(&path, text).unwrap();
            let err = MasterConfig::default().load_file(&path).unwrap_err();
            assert_eq!(err.key, key, "{text}");
            assert!(err.reason.contains(reason), "{text}: {err}");
        }
        let path = dir.join("alias.yaml");
        std::fs::write(&path, "client_ttl: 20\n").unwrap();
        let mut c = MasterConfig::default();
        c.load_file(&path).unwrap();
        assert_eq!(c.engine.client_live_ttl_ms, 20_000);
        std::fs::remove_dir_all(&dir).ok();
    }
}
