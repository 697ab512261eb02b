//! `moonkv.Client`: the Pythonic layer. Values are any contiguous buffer (bytes, bytearray,
//! memoryview, NumPy arrays) read or written in place; failures raise `moonkv.MoonkvError`
//! subclasses carrying the upstream error name and code; batch calls return one entry per key
//! (a value, or the exception object for that key) and raise only for bad arguments.

use crate::args;
use crate::config::{wire, PyReplicateConfig};
use crate::engine::{Engine, EngineSlot, StoreTuning, HEALTHY};
use crate::errors::{exception, invalid, raise};
use crate::pybuf::Pinned;
use crate::replica::PyReplicaDescriptor;
use crate::settings::{RawSetup, DEFAULT_MASTER};
use moonkv_proto::{Error, ErrorCode, MAX_KEY_LEN};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::sync::Arc;
use std::time::Duration;

/// A connection to a moonkv cluster (see the package docstring).
#[pyclass(module = "moonkv", name = "Client")]
pub(crate) struct Client {
    engine: EngineSlot,
}

/// A key for the Pythonic layer: every problem raises.
fn strict_key(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let key = args::key(obj)?.map_err(|e| raise(py, &e))?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        let why = format!(
            "the key is {} bytes long; keys are 1 to {MAX_KEY_LEN} bytes",
            key.len()
        );
        return Err(raise(py, &Error::new(ErrorCode::INVALID_KEY, why)));
    }
    Ok(key)
}

fn strict_keys(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let keys: Vec<String> = args::items(obj, "keys")?
        .iter()
        .map(|k| strict_key(py, k))
        .collect::<PyResult<_>>()?;
    if keys.is_empty() {
        return Err(raise(
            py,
            &invalid("the batch is empty: pass at least one key"),
        ));
    }
    Ok(keys)
}

fn same_length(py: Python<'_>, keys: usize, other: usize, what: &str) -> PyResult<()> {
    if keys != other {
        return Err(raise(
            py,
            &invalid(format!("{keys} keys but {other} {what}: one per key")),
        ));
    }
    Ok(())
}

/// A batch answer: the value for each key, or its exception object.
fn per_key<'py, T>(
    py: Python<'py>,
    results: Vec<Result<T, Error>>,
    ok: impl Fn(T) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(v) => ok(v),
            Err(e) => Ok(exception(py, &e)),
        })
        .collect()
}

#[pymethods]
impl Client {
    /// Connects to the master at `master` (`host:port`). With `segment_size` > 0 (bytes, or
    /// text such as `"1GiB"`) this process also contributes that much memory, served from
    /// `hostname`. `rpc_timeout` (seconds) bounds each request to the master.
    #[new]
    #[pyo3(signature = (master = DEFAULT_MASTER.to_string(), *, segment_size = None, hostname = "127.0.0.1".to_string(), tenant = "default".to_string(), rpc_timeout = None))]
    fn new(
        py: Python<'_>,
        master: String,
        segment_size: Option<Bound<'_, PyAny>>,
        hostname: String,
        tenant: String,
        rpc_timeout: Option<f64>,
    ) -> PyResult<Client> {
        let rpc_timeout = rpc_timeout
            .map(|t| {
                Duration::try_from_secs_f64(t)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        raise(
                            py,
                            &invalid(format!(
                                "rpc_timeout must be a positive number of seconds, got {t}"
                            )),
                        )
                    })
            })
            .transpose()?;
        let zero = 0u64.into_pyobject(py)?.into_any();
        let raw = RawSetup {
            local_hostname: Some(hostname),
            metadata_server: Some(String::new()),
            global_segment_size: Some(segment_size.unwrap_or(zero)),
            local_buffer_size: None,
            protocol: None,
            master_server_addr: Some(master),
            tenant_id: Some(tenant),
            enable_ssd_offload: false,
            enable_client_http_server: false,
            enable_standalone: false,
        };
        let settings = raw.validate().map_err(|e| raise(py, &e))?;
        let tuning = StoreTuning {
            rpc_timeout,
            ..StoreTuning::from_env().map_err(|e| raise(py, &e))?
        };
        let engine = py
            .detach(|| Engine::start(&settings, tuning))
            .map_err(|e| raise(py, &e))?;
        let client = Client {
            engine: EngineSlot::default(),
        };
        client.engine.install(py, engine);
        Ok(client)
    }

    /// Unmounts this process's memory (if any) and disconnects; idempotent.
    fn close(&self, py: Python<'_>) {
        self.engine.close(py);
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        !self.engine.is_set()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// This process's data-plane endpoint when it contributes memory (also its segment name,
    /// for `ReplicateConfig.preferred_segments`), else the `hostname` given.
    #[getter]
    fn hostname(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.engine(py)?.hostname.clone())
    }

    /// Whether the master answers within two seconds.
    fn healthy(&self, py: Python<'_>) -> bool {
        match self.engine(py) {
            Ok(engine) => py.detach(|| engine.health()) == HEALTHY,
            Err(_) => false,
        }
    }

    /// Stores `value` under `key`. Raises `ObjectExistsError` if the key exists (objects are
    /// immutable; use `upsert` to replace).
    #[pyo3(signature = (key, value, *, config = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<()> {
        self.write(py, key, value, config.as_deref(), false)
    }

    /// Stores or replaces `value` under `key`.
    #[pyo3(signature = (key, value, *, config = None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<()> {
        self.write(py, key, value, config.as_deref(), true)
    }

    /// The object's bytes. Raises `ObjectNotFoundError` (a `KeyError`) on a miss.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let key = strict_key(py, key)?;
        let engine = self.engine(py)?;
        let bytes = engine
            .wait(py, engine.store.get(&key))
            .map_err(|e| raise(py, &e))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Reads the object into `buffer` (any writable contiguous buffer at least as large) without
    /// an intermediate copy; returns the object's size.
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let key = strict_key(py, key)?;
        let mut pinned = Pinned::write(buffer)?;
        let engine = self.engine(py)?;
        let dest = pinned
            .bytes_mut()
            .ok_or_else(|| raise(py, &invalid("the buffer is not writable")))?;
        engine
            .wait(py, engine.store.get_into(&key, dest))
            .map_err(|e| raise(py, &e))
    }

    /// Whether the object exists.
    fn exists(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = strict_key(py, key)?;
        let engine = self.engine(py)?;
        engine
            .wait(py, engine.store.exists(&key))
            .map_err(|e| raise(py, &e))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.exists(py, key)
    }

    /// The object's size in bytes; raises `ObjectNotFoundError` on a miss.
    fn size(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<u64> {
        let list = self.replica_list(py, key)?;
        Ok(list.first().map_or(0, |r| r.size))
    }

    /// The object's readable replicas; raises `ObjectNotFoundError` on a miss.
    fn replicas(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<PyReplicaDescriptor>> {
        Ok(self
            .replica_list(py, key)?
            .into_iter()
            .map(PyReplicaDescriptor::new)
            .collect())
    }

    /// Removes the object; `force` ignores read leases. Raises `ObjectNotFoundError` on a miss.
    #[pyo3(signature = (key, *, force = false))]
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>, force: bool) -> PyResult<()> {
        let key = strict_key(py, key)?;
        let engine = self.engine(py)?;
        engine
            .wait(py, engine.store.remove(&key, force))
            .map_err(|e| raise(py, &e))
    }

    /// Removes every object whose key matches `pattern` (regex search); returns how many.
    #[pyo3(signature = (pattern, *, force = false))]
    fn remove_by_regex(&self, py: Python<'_>, pattern: &str, force: bool) -> PyResult<i64> {
        let engine = self.engine(py)?;
        engine
            .wait(py, engine.store.remove_by_regex(pattern, force))
            .map_err(|e| raise(py, &e))
    }

    /// Removes every object of this tenant; returns how many.
    #[pyo3(signature = (*, force = false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> PyResult<i64> {
        let engine = self.engine(py)?;
        engine
            .wait(py, engine.store.remove_all(force))
            .map_err(|e| raise(py, &e))
    }

    /// Stores `values[i]` under `keys[i]` in one batch; for each key `None` or its exception.
    #[pyo3(signature = (keys, values, *, config = None))]
    fn put_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let keys = strict_keys(py, keys)?;
        let pinned: Vec<Pinned> = args::items(values, "values")?
            .iter()
            .map(Pinned::read)
            .collect::<PyResult<_>>()?;
        same_length(py, keys.len(), pinned.len(), "values")?;
        let engine = self.engine(py)?;
        let config =
            wire(config.as_deref(), engine.local_segment.as_deref()).map_err(|e| raise(py, &e))?;
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values: Vec<&[u8]> = pinned.iter().map(Pinned::bytes).collect();
        let results = engine.wait(py, engine.store.batch_put_from(&key_refs, &values, &config));
        per_key(py, results, |()| Ok(py.None().into_bound(py)))
    }

    /// The bytes of each key, or its exception (`ObjectNotFoundError` for a miss).
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let keys = strict_keys(py, keys)?;
        let engine = self.engine(py)?;
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let results = engine.wait(py, engine.store.batch_get(&key_refs));
        per_key(py, results, |bytes| Ok(PyBytes::new(py, &bytes).into_any()))
    }

    /// Reads each key into its buffer in one batch; for each key its size, or its exception.
    fn get_into_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        buffers: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let keys = strict_keys(py, keys)?;
        let mut pinned: Vec<Pinned> = args::items(buffers, "buffers")?
            .iter()
            .map(Pinned::write)
            .collect::<PyResult<_>>()?;
        same_length(py, keys.len(), pinned.len(), "buffers")?;
        distinct_buffers(py, &pinned)?;
        let engine = self.engine(py)?;
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut dests: Vec<&mut [u8]> = pinned.iter_mut().filter_map(Pinned::bytes_mut).collect();
        let results = engine.wait(py, engine.store.batch_get_into(&key_refs, &mut dests));
        per_key(py, results, |size| Ok(size.into_pyobject(py)?.into_any()))
    }

    /// Whether each key exists; raises if the master cannot answer.
    fn exists_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let keys = strict_keys(py, keys)?;
        let engine = self.engine(py)?;
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let results = engine.wait(py, engine.store.batch_exists(&key_refs));
        results
            .into_iter()
            .map(|r| r.map_err(|e| raise(py, &e)))
            .collect()
    }

    /// Removes each key; for each key `None` or its exception.
    #[pyo3(signature = (keys, *, force = false))]
    fn remove_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        force: bool,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let keys = strict_keys(py, keys)?;
        let engine = self.engine(py)?;
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let results = engine.wait(py, engine.store.batch_remove(&key_refs, force));
        per_key(py, results, |()| Ok(py.None().into_bound(py)))
    }

    fn __repr__(&self) -> String {
        match self.engine.get() {
            Some(e) => format!("moonkv.Client(hostname={:?})", e.hostname),
            None => "moonkv.Client(closed)".into(),
        }
    }
}

/// Two destinations of one batch must not share memory.
fn distinct_buffers(py: Python<'_>, pinned: &[Pinned]) -> PyResult<()> {
    let ranges: Vec<crate::registry::Range> = pinned
        .iter()
        .map(|p| crate::registry::Range {
            ptr: p.bytes().as_ptr() as usize,
            len: p.len(),
        })
        .collect();
    if crate::registry::overlapping(&ranges).into_iter().any(|o| o) {
        return Err(raise(py, &invalid("two buffers of the batch share memory")));
    }
    Ok(())
}

impl Client {
    fn engine(&self, py: Python<'_>) -> PyResult<Arc<Engine>> {
        self.engine.get().ok_or_else(|| {
            raise(
                py,
                &Error::new(
                    ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                    "the client is closed",
                ),
            )
        })
    }

    fn write(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<()> {
        let key = strict_key(py, key)?;
        let value = Pinned::read(value)?;
        let engine = self.engine(py)?;
        let config = wire(config, engine.local_segment.as_deref()).map_err(|e| raise(py, &e))?;
        let store = &engine.store;
        let bytes = value.bytes();
        engine
            .wait(py, async {
                if upsert {
                    store.upsert(&key, bytes, &config).await
                } else {
                    store.put(&key, bytes, &config).await
                }
            })
            .map_err(|e| raise(py, &e))
    }

    fn replica_list(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<moonkv_proto::types::ReplicaDescriptor>> {
        let key = strict_key(py, key)?;
        let engine = self.engine(py)?;
        let list = engine
            .wait(py, engine.store.replicas(&key))
            .map_err(|e| raise(py, &e))?;
        Ok(list.replicas)
    }
}
