//! What `setup` is given, in either of upstream's two forms, checked and parsed.

use crate::errors::invalid;
use moonkv_proto::Error;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Upstream's default master address.
pub(crate) const DEFAULT_MASTER: &str = "127.0.0.1:50051";
/// Upstream's default segment and buffer size in the dict form (16 MiB).
const DEFAULT_SIZE: u64 = 16 << 20;

/// A validated `setup`.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Host (optionally `host:port`) the embedded node serves on; also its segment name.
    pub local_hostname: String,
    /// Bytes this process contributes to the cluster; 0 = a pure requester.
    pub global_segment_size: u64,
    /// Bound on the copying calls (`put`, `get`, `get_buffer`, ...).
    pub local_buffer_size: u64,
    /// Master RPC address `host:port`.
    pub master_server_addr: String,
    /// Tenant of every call ("default" unless told).
    pub tenant_id: String,
    /// Run a master inside this process and use it (`enable_standalone`, or
    /// `MOONCAKE_ENABLE_STANDALONE`); `master_server_addr` is then ignored.
    pub embedded_master: bool,
}

/// Upstream's variable that makes every `setup` embed a master, as `enable_standalone=True`.
pub(crate) const ENABLE_STANDALONE_ENV: &str = "MOONCAKE_ENABLE_STANDALONE";

/// The raw values, as Python passed them.
#[derive(Default)]
pub(crate) struct RawSetup<'py> {
    pub local_hostname: Option<String>,
    pub metadata_server: Option<String>,
    pub global_segment_size: Option<Bound<'py, PyAny>>,
    pub local_buffer_size: Option<Bound<'py, PyAny>>,
    pub protocol: Option<String>,
    pub master_server_addr: Option<String>,
    pub tenant_id: Option<String>,
    pub enable_ssd_offload: bool,
    pub enable_client_http_server: bool,
    pub enable_standalone: bool,
}

impl<'py> RawSetup<'py> {
    /// Reads the dict form. Values may be strings or numbers, as upstream accepts; unknown
    /// keys are ignored like upstream does.
    pub(crate) fn from_dict(dict: &Bound<'py, PyDict>) -> PyResult<RawSetup<'py>> {
        let text = |name: &str| -> PyResult<Option<String>> {
            match dict.get_item(name)? {
                Some(v) if !v.is_none() => Ok(Some(v.str()?.to_cow()?.into_owned())),
                _ => Ok(None),
            }
        };
        let flag = |name: &str| -> PyResult<bool> {
            Ok(text(name)?.is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
            }))
        };
        Ok(RawSetup {
            local_hostname: text("local_hostname")?,
            metadata_server: text("metadata_server")?,
            global_segment_size: dict.get_item("global_segment_size")?,
            local_buffer_size: dict.get_item("local_buffer_size")?,
            protocol: text("protocol")?,
            master_server_addr: match text("master_server_addr")? {
                Some(v) => Some(v),
                // The spelling of upstream's JSON configs.
                None => text("master_server_address")?,
            },
            tenant_id: text("tenant_id")?,
            enable_ssd_offload: flag("enable_ssd_offload")?,
            enable_client_http_server: flag("enable_client_http_server")?,
            enable_standalone: flag("enable_standalone")?,
        })
    }

    /// Checks everything and parses the sizes.
    pub(crate) fn validate(self) -> Result<Settings, Error> {
        let local_hostname = self
            .local_hostname
            .filter(|h| !h.trim().is_empty())
            .ok_or_else(|| {
                invalid("setup needs local_hostname (the host this process serves on)")
            })?;
        if self.metadata_server.is_none() {
            return Err(invalid(
                "setup needs metadata_server (moonkv does not use it; pass \"P2PHANDSHAKE\")",
            ));
        }
        let protocol = self.protocol.unwrap_or_else(|| "tcp".into());
        if !protocol.eq_ignore_ascii_case("tcp") {
            return Err(invalid(format!(
                "protocol '{protocol}' is not supported: moonkv moves bytes over TCP only (use protocol=\"tcp\")"
            )));
        }
        if self.enable_ssd_offload {
            return Err(invalid(
                "enable_ssd_offload is not supported in setup: give a moonkv node a disk directory instead (docs/disk-tier.md)",
            ));
        }
        if self.enable_client_http_server {
            return Err(invalid(
                "enable_client_http_server is not supported: the master's admin HTTP serves health and metrics",
            ));
        }
        let embedded_master = self.enable_standalone;
        let master_server_addr = if embedded_master {
            // Filled in with the embedded master's address when it has started.
            String::new()
        } else {
            let addr = self
                .master_server_addr
                .unwrap_or_else(|| DEFAULT_MASTER.to_string());
            // host:port, or etcd://host:port[;host:port...] to follow an HA cluster's leader.
            moonkv_proto::ha::MasterAddr::parse(&addr)
                .map_err(|e| invalid(format!("master_server_addr '{addr}': {}", e.message)))?;
            addr
        };
        Ok(Settings {
            local_hostname: local_hostname.trim().to_string(),
            global_segment_size: size("global_segment_size", self.global_segment_size.as_ref())?,
            local_buffer_size: size("local_buffer_size", self.local_buffer_size.as_ref())?,
            master_server_addr,
            tenant_id: self.tenant_id.unwrap_or_else(|| "default".into()),
            embedded_master,
        })
    }
}

/// Whether [`ENABLE_STANDALONE_ENV`] asks for an embedded master; a value that is neither on
/// nor off is an error naming it.
pub(crate) fn standalone_from_env() -> Result<bool, Error> {
    let Ok(value) = std::env::var(ENABLE_STANDALONE_ENV) else {
        return Ok(false);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        other => Err(invalid(format!(
            "{ENABLE_STANDALONE_ENV}={other:?}: expected true/false, 1/0, yes/no or on/off"
        ))),
    }
}

/// A size given as an integer or as text such as `"16MB"`, `"4gb"` or `"512MiB"`.
fn size(name: &str, value: Option<&Bound<'_, PyAny>>) -> Result<u64, Error> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(DEFAULT_SIZE);
    };
    if let Ok(n) = value.extract::<i128>() {
        return u64::try_from(n).map_err(|_| invalid(format!("{name} must be >= 0, got {n}")));
    }
    let text = value
        .str()
        .and_then(|s| s.to_cow().map(|c| c.into_owned()))
        .map_err(|_| {
            invalid(format!(
                "{name} must be a number of bytes or a size such as \"4GB\""
            ))
        })?;
    moonkv_proto::units::parse_size(&text).map_err(|e| invalid(format!("{name}: {}", e.message)))
}

/// Splits `host[:port]`; a port of 0 or none means "pick one".
pub(crate) fn host_and_port(local_hostname: &str) -> Result<(String, u16), Error> {
    let bad = || {
        invalid(format!(
            "local_hostname '{local_hostname}' is not host or host:port"
        ))
    };
    if let Some(rest) = local_hostname.strip_prefix('[') {
        // [v6]:port or [v6]
        let (host, tail) = rest.split_once(']').ok_or_else(bad)?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if tail.is_empty() => 0,
            None => return Err(bad()),
        };
        return Ok((format!("[{host}]"), port));
    }
    match local_hostname.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            Ok((host.to_string(), port.parse().map_err(|_| bad())?))
        }
        _ => Ok((local_hostname.to_string(), 0)),
    }
}
