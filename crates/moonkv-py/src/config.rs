//! `ReplicateConfig` with upstream's attribute names, and its translation to moonkv's.

use crate::args;
use crate::errors::invalid;
use moonkv_proto::types::{ReplicateConfig as WireConfig, SoftPinAction};
use moonkv_proto::Error;
use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Placement and pinning of a write.
///
/// Attributes (upstream names): `replica_num` (memory replicas, default 1), `with_hard_pin`
/// (never evicted), `soft_pin_action` (`SoftPinAction.PRESERVE`/`ENABLE`/`DISABLE`),
/// `soft_pin_ttl_ms`, `preferred_segments` (segment names, i.e. `get_hostname()` of the
/// processes to try first), `preferred_segment` (deprecated single name), `prefer_alloc_in_same_node`
/// (this process's segment first), `group_ids` (one group per key), `data_type` (a tag, kept
/// but unused). `nof_replica_num`, `dfs_replica_num` and `preferred_nof_segments` exist for
/// compatibility; moonkv has no NVMe-oF or shared-filesystem tier, so setting them raises
/// `NotImplementedError`. `with_disk_replica` is moonkv's own: also write a disk replica.
/// Like upstream's bindings, assigning a value of the wrong type or out of the attribute's
/// range raises `TypeError`; `None` clears the optional ones (`soft_pin_ttl_ms`, `group_ids`).
#[pyclass(module = "moonkv", name = "ReplicateConfig")]
#[derive(Clone, Debug)]
pub(crate) struct PyReplicateConfig {
    replica_num: u32,
    soft_pin_action: u8,
    soft_pin_ttl_ms: Option<u64>,
    with_hard_pin: bool,
    #[pyo3(get, set)]
    preferred_segments: Vec<String>,
    #[pyo3(get, set)]
    preferred_segment: String,
    prefer_alloc_in_same_node: bool,
    #[pyo3(get, set)]
    group_ids: Option<Vec<String>>,
    data_type: i64,
    with_disk_replica: bool,
}

impl Default for PyReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            soft_pin_action: 0,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            group_ids: None,
            data_type: 0,
            with_disk_replica: false,
        }
    }
}

#[pymethods]
impl PyReplicateConfig {
    /// A default config; keyword arguments set attributes (`ReplicateConfig(replica_num=2)`).
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<Self>> {
        let config = Py::new(py, PyReplicateConfig::default())?;
        if let Some(kwargs) = kwargs {
            let bound = config.bind(py);
            for (name, value) in kwargs.iter() {
                bound.setattr(name.str()?, value)?;
            }
        }
        Ok(config)
    }

    /// `SoftPinAction` as an integer (PRESERVE 0, ENABLE 1, DISABLE 2).
    #[getter]
    fn soft_pin_action(&self) -> u8 {
        self.soft_pin_action
    }

    #[setter]
    fn set_soft_pin_action(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.soft_pin_action = args::int_in(
            value,
            0..=2,
            "a SoftPinAction: PRESERVE 0, ENABLE 1 or DISABLE 2",
        )? as u8;
        Ok(())
    }

    /// Memory replicas wanted (1 by default).
    #[getter]
    fn replica_num(&self) -> u32 {
        self.replica_num
    }

    #[setter]
    fn set_replica_num(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.replica_num = args::unsigned(value, "replica_num as an unsigned 32-bit integer")?;
        Ok(())
    }

    /// Soft-pin lifetime in milliseconds; `None` is the master's default.
    #[getter]
    fn soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.soft_pin_ttl_ms = if value.is_none() {
            None
        } else {
            Some(args::unsigned(
                value,
                "soft_pin_ttl_ms as an unsigned 64-bit number of milliseconds, or None",
            )?)
        };
        Ok(())
    }

    /// Never evicted.
    #[getter]
    fn with_hard_pin(&self) -> bool {
        self.with_hard_pin
    }

    #[setter]
    fn set_with_hard_pin(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_hard_pin = args::boolean(value, "with_hard_pin")?;
        Ok(())
    }

    /// This process's segment first (needs `replica_num == 1`).
    #[getter]
    fn prefer_alloc_in_same_node(&self) -> bool {
        self.prefer_alloc_in_same_node
    }

    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.prefer_alloc_in_same_node = args::boolean(value, "prefer_alloc_in_same_node")?;
        Ok(())
    }

    /// Also write a disk replica (moonkv's own).
    #[getter]
    fn with_disk_replica(&self) -> bool {
        self.with_disk_replica
    }

    #[setter]
    fn set_with_disk_replica(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_disk_replica = args::boolean(value, "with_disk_replica")?;
        Ok(())
    }

    /// `ObjectDataType` as an integer (a tag kept for compatibility).
    #[getter]
    fn data_type(&self) -> i64 {
        self.data_type
    }

    #[setter]
    fn set_data_type(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.data_type = args::int_in(value, 0..=9, "an ObjectDataType")?;
        Ok(())
    }

    /// Legacy boolean spelling: True is `soft_pin_action = ENABLE`.
    #[getter]
    fn with_soft_pin(&self) -> bool {
        self.soft_pin_action == 1
    }

    #[setter]
    fn set_with_soft_pin(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.soft_pin_action = if args::boolean(value, "with_soft_pin")? {
            1
        } else {
            0
        };
        Ok(())
    }

    /// Always 0: moonkv has no NVMe-oF tier.
    #[getter]
    fn nof_replica_num(&self) -> u32 {
        0
    }

    #[setter]
    fn set_nof_replica_num(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value: u32 = args::unsigned(value, "nof_replica_num as an unsigned 32-bit integer")?;
        unsupported("nof_replica_num", value != 0)
    }

    /// Always 0: moonkv has no shared-filesystem tier.
    #[getter]
    fn dfs_replica_num(&self) -> u32 {
        0
    }

    #[setter]
    fn set_dfs_replica_num(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value: u32 = args::unsigned(value, "dfs_replica_num as an unsigned 32-bit integer")?;
        unsupported("dfs_replica_num", value != 0)
    }

    /// Always empty: moonkv has no NVMe-oF tier.
    #[getter]
    fn preferred_nof_segments(&self) -> Vec<String> {
        Vec::new()
    }

    #[setter]
    fn set_preferred_nof_segments(&mut self, value: Vec<String>) -> PyResult<()> {
        unsupported("preferred_nof_segments", !value.is_empty())
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicateConfig(replica_num={}, with_hard_pin={}, soft_pin_action={}, soft_pin_ttl_ms={:?}, preferred_segments={:?}, preferred_segment={:?}, prefer_alloc_in_same_node={}, group_ids={:?}, with_disk_replica={})",
            self.replica_num,
            py_bool(self.with_hard_pin),
            self.soft_pin_action,
            self.soft_pin_ttl_ms,
            self.preferred_segments,
            self.preferred_segment,
            py_bool(self.prefer_alloc_in_same_node),
            self.group_ids,
            py_bool(self.with_disk_replica),
        )
    }

    fn __str__(&self) -> String {
        self.__repr__()
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn unsupported(name: &str, set: bool) -> PyResult<()> {
    if set {
        return Err(PyNotImplementedError::new_err(format!(
            "ReplicateConfig.{name} is not implemented by moonkv (it has memory and local-disk replicas only)"
        )));
    }
    Ok(())
}

impl PyReplicateConfig {
    /// moonkv's config for a write from this process; `own_segment` is the embedded node's
    /// segment, if any.
    pub(crate) fn to_wire(&self, own_segment: Option<&str>) -> Result<WireConfig, Error> {
        let mut preferred = Vec::new();
        if self.prefer_alloc_in_same_node {
            if self.replica_num > 1 {
                return Err(invalid("prefer_alloc_in_same_node needs replica_num == 1"));
            }
            if let Some(own) = own_segment {
                preferred.push(own.to_string());
            }
        }
        if !self.preferred_segment.is_empty() {
            preferred.push(self.preferred_segment.clone());
        }
        preferred.extend(self.preferred_segments.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        preferred.retain(|name| seen.insert(name.clone()));
        Ok(WireConfig {
            replica_num: self.replica_num,
            soft_pin_action: SoftPinAction::from(self.soft_pin_action),
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            with_hard_pin: self.with_hard_pin,
            preferred_segments: preferred,
            group_ids: self.group_ids.clone(),
            with_disk_replica: self.with_disk_replica,
        })
    }
}

/// The wire config of an optional Python config (upstream's default when absent).
pub(crate) fn wire(
    config: Option<&PyReplicateConfig>,
    own_segment: Option<&str>,
) -> Result<WireConfig, Error> {
    match config {
        Some(c) => c.to_wire(own_segment),
        None => Ok(WireConfig::default()),
    }
}
