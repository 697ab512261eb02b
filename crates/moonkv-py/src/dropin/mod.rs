//! `MooncakeDistributedStore`: upstream's class, method for method — names, positional order,
//! keyword names and integer results (0 or a negative upstream code; byte counts for reads; a
//! result per key in batch forms; 1/0/negative from `is_exist`; `b""` from `get` on a miss).
//! Only wrong argument types raise (`TypeError`), as upstream's bindings do.
//!
//! - this file: lifecycle, the copying calls (bounded by `local_buffer_size`), metadata.
//! - [`zero_copy`]: calls on registered memory (`put_from`, `get_into`, batch and multi-buffer
//!   forms, `get_into_ranges`).
//! - [`sessions`]: put and get sessions and their ranged calls.
//!
//! Methods upstream has and moonkv lacks are added by the Python subclass in
//! `moonkv/__init__.py`, each raising `NotImplementedError` naming itself.

mod copying;
mod ranges;
mod sessions;
mod zero_copy;

pub(crate) use sessions::Sessions;

use crate::args::{self, Split, UInt};
use crate::config::PyReplicateConfig;
use crate::engine::{Engine, EngineSlot, StoreTuning, NOT_INITIALIZED};
use crate::errors::{code, invalid, not_set_up, write_code};
use crate::pybuf::Pinned;
use crate::registry::Range;
use crate::replica::{buffer_handle, PyReplicaDescriptor};
use crate::settings::RawSetup;
use copying::first_failure;
use moonkv_proto::msg::KeysRequest;
use moonkv_proto::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::sync::Arc;

/// The store object of upstream's Python API.
#[pyclass(module = "moonkv._moonkv", name = "MooncakeDistributedStore", subclass)]
pub(crate) struct DropIn {
    engine: EngineSlot,
}

/// Logs through Python's `logging` (logger `moonkv`), where upstream's users look for the reason
/// behind a non-zero return.
fn log(py: Python<'_>, level: &str, message: &str) {
    let logger = py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("moonkv",)));
    if let Ok(logger) = logger {
        let _ = logger.call_method1(level, (message,));
    }
}

/// Logs why `call` failed and returns its code.
fn failed(py: Python<'_>, call: &str, error: &Error) -> i32 {
    log(py, "error", &format!("{call}: {}", error.message));
    code(error)
}

impl DropIn {
    /// Before a `setup` or `setup_dummy`: the store must not run yet, and the environment's
    /// tuning must parse. `Err` is the code to return (the reason is logged).
    fn ready_to_start(&self, py: Python<'_>, call: &str) -> Result<StoreTuning, i32> {
        if self.engine.is_set() {
            return Err(failed(
                py,
                call,
                &invalid("this store is already set up; close() it first"),
            ));
        }
        StoreTuning::from_env().map_err(|e| failed(py, call, &e))
    }

    /// Keeps a freshly started engine; 0, or an error code when another `setup` won the race.
    fn installed(&self, py: Python<'_>, engine: Engine) -> i32 {
        if self.engine.install(py, engine) {
            0
        } else {
            log(
                py,
                "error",
                "setup: this store was set up by another thread meanwhile",
            );
            code(&invalid("already set up"))
        }
    }

    fn engine(&self) -> Result<Arc<Engine>, Error> {
        self.engine.get().ok_or_else(not_set_up)
    }

    /// The engine for a session call `call`; `None` (logged) when the store is not set up, where
    /// upstream's session calls answer an empty list.
    fn session_engine(&self, py: Python<'_>, call: &str) -> Option<Arc<Engine>> {
        let engine = self.engine.get();
        if engine.is_none() {
            log(py, "error", &format!("{call}: the store is not set up"));
        }
        engine
    }

    /// `batch_put_from_multi_buffers`, or with `upsert` `batch_upsert_from_multi_buffers`.
    fn put_multi(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let ptrs = args::nested_numbers(all_buffer_ptrs, "all_buffer_ptrs")?;
        let sizes = args::nested_numbers(all_sizes, "all_sizes")?;
        let n = keys.len();
        let prepared = self.engine().and_then(|engine| {
            let ranges = nested_ranges(n, &ptrs, &sizes)?;
            let config = crate::config::wire(config.as_deref(), engine.local_segment.as_deref())?;
            Ok((engine, ranges, config))
        });
        let (engine, ranges, config) = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(all_failed(n, &e)),
        };
        let results = zero_copy::batch_put_multi(py, &engine, upsert, keys, &ranges, config)?;
        Ok(results.iter().map(|r| write_code(r) as i64).collect())
    }
}

/// An int result for each item: the error code, or what `ok` makes of the value.
fn codes<T>(results: Vec<Result<T, Error>>, ok: impl Fn(T) -> i64) -> Vec<i64> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(v) => ok(v),
            Err(e) => code(&e) as i64,
        })
        .collect()
}

/// `n` copies of one error code (a batch refused as a whole).
fn all_failed(n: usize, error: &Error) -> Vec<i64> {
    vec![code(error) as i64; n]
}

#[pymethods]
impl DropIn {
    #[new]
    fn new() -> Self {
        DropIn {
            engine: EngineSlot::default(),
        }
    }

    /// Connects to the master; with `global_segment_size > 0` also starts a node in this process
    /// that contributes that much memory. Sizes are integers or text such as `"16MB"`/`"4gb"`.
    /// `metadata_server` and `rdma_devices` are accepted and unused (moonkv needs no metadata
    /// service and moves bytes over TCP). Also takes upstream's dict form: `setup({...})`.
    /// `enable_standalone=True` (or `MOONCAKE_ENABLE_STANDALONE=true`) runs a master inside
    /// this process and uses it instead of `master_server_addr`.
    /// Returns 0, or a negative error code (the reason is logged on logger `moonkv`).
    #[pyo3(signature = (
        local_hostname = None, metadata_server = None, global_segment_size = None,
        local_buffer_size = None, protocol = None, rdma_devices = None, master_server_addr = None,
        engine = None, enable_ssd_offload = false, ssd_offload_path = None, tenant_id = None,
        enable_client_http_server = false, client_http_port = None, config = None,
        enable_standalone = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn setup<'py>(
        &self,
        py: Python<'py>,
        local_hostname: Option<Bound<'py, PyAny>>,
        metadata_server: Option<String>,
        global_segment_size: Option<Bound<'py, PyAny>>,
        local_buffer_size: Option<Bound<'py, PyAny>>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<Bound<'py, PyAny>>,
        enable_ssd_offload: bool,
        ssd_offload_path: Option<String>,
        tenant_id: Option<String>,
        enable_client_http_server: bool,
        client_http_port: Option<i64>,
        config: Option<Bound<'py, PyDict>>,
        enable_standalone: bool,
    ) -> PyResult<i32> {
        let _ = (rdma_devices, ssd_offload_path, client_http_port);
        let dict = match (&config, &local_hostname) {
            (Some(d), _) => Some(d.clone()),
            (None, Some(first)) => first.cast::<PyDict>().ok().cloned(),
            _ => None,
        };
        let mut raw = match dict {
            Some(d) => RawSetup::from_dict(&d)?,
            None => RawSetup {
                local_hostname: local_hostname.map(|h| h.extract::<String>()).transpose()?,
                metadata_server,
                global_segment_size,
                local_buffer_size,
                protocol,
                master_server_addr,
                tenant_id,
                enable_ssd_offload,
                enable_client_http_server,
                enable_standalone,
            },
        };
        if engine.is_some_and(|e| !e.is_none()) {
            log(
                py,
                "error",
                "setup: engine= (a TransferEngine to reuse) is not supported by moonkv",
            );
            return Ok(code(&invalid("engine")));
        }
        let tuning = match self.ready_to_start(py, "setup") {
            Ok(t) => t,
            Err(rc) => return Ok(rc),
        };
        match crate::settings::standalone_from_env() {
            // The keyword counts in the dict form too, as does upstream's variable.
            Ok(on) => raw.enable_standalone |= enable_standalone || on,
            Err(e) => return Ok(failed(py, "setup", &e)),
        }
        let settings = match raw.validate() {
            Ok(s) => s,
            Err(e) => return Ok(failed(py, "setup", &e)),
        };
        match py.detach(|| Engine::start(&settings, tuning)) {
            Ok(engine) => Ok(self.installed(py, engine)),
            Err(e) => {
                log(py, "error", &format!("setup: {e}"));
                Ok(code(&e))
            }
        }
    }

    /// Unmounts this process's memory, disconnects and returns 0; later calls fail.
    fn close(&self, py: Python<'_>) -> i32 {
        self.engine.close(py);
        0
    }

    /// Standalone mode: this process becomes a pure client of the node at `server_address` (the
    /// `"data"` address `moonkv node` or `moonkv up` prints, on this machine), which names its
    /// master. The process holds no segment; the node copies straight to and from its memory.
    /// `mem_pool_size` bytes are reserved for `alloc_from_mem_pool`; `local_buffer_size` bounds
    /// the copying calls as in `setup`. Returns 0 or a negative error code (reason logged).
    #[pyo3(signature = (mem_pool_size, local_buffer_size, server_address))]
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: &Bound<'_, PyAny>,
        local_buffer_size: &Bound<'_, PyAny>,
        server_address: String,
    ) -> PyResult<i32> {
        let mem_pool_size = args::size_arg(mem_pool_size, "mem_pool_size")?;
        let local_buffer_size = args::size_arg(local_buffer_size, "local_buffer_size")?;
        let tuning = match self.ready_to_start(py, "setup_dummy") {
            Ok(t) => t,
            Err(rc) => return Ok(rc),
        };
        let started = py.detach(|| {
            Engine::start_standalone(
                server_address.trim(),
                local_buffer_size,
                mem_pool_size,
                "default",
                tuning,
            )
        });
        match started {
            Ok(engine) => Ok(self.installed(py, engine)),
            Err(e) => {
                log(
                    py,
                    "error",
                    &format!("setup_dummy: through node {server_address}: {e}"),
                );
                Ok(code(&e))
            }
        }
    }

    /// Standalone mode: the address of `size` bytes of the memory pool reserved by
    /// `setup_dummy` (zeroed, 64-byte aligned, already registered), or 0 when the pool has no
    /// room left or the store is not in standalone mode. The memory stays valid until `close()`.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<usize> {
        let size = args::size_arg(size, "size")?;
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => {
                log(py, "error", &format!("alloc_from_mem_pool: {}", e.message));
                return Ok(0);
            }
        };
        let Some(pool) = engine.pool.as_ref() else {
            log(py, "error", "alloc_from_mem_pool: the store has no memory pool (set it up with setup_dummy and a mem_pool_size > 0)");
            return Ok(0);
        };
        let got = usize::try_from(size).ok().and_then(|s| pool.alloc(s));
        Ok(got.unwrap_or_else(|| {
            log(
                py,
                "error",
                &format!(
                    "alloc_from_mem_pool({size}): the pool has {} bytes left",
                    pool.free_bytes()
                ),
            );
            0
        }))
    }

    /// 0 healthy, 1 not set up or closed, 2 master unreachable.
    fn health_check(&self, py: Python<'_>) -> i32 {
        match self.engine() {
            Ok(engine) => py.detach(|| engine.health()),
            Err(_) => NOT_INITIALIZED,
        }
    }

    /// The embedded node's data-plane endpoint `host:port` (also its segment name, for
    /// `ReplicateConfig.preferred_segments`); `local_hostname` for a pure requester.
    fn get_hostname(&self) -> String {
        self.engine()
            .map(|e| e.hostname.clone())
            .unwrap_or_default()
    }

    /// Registers `[buffer_ptr, buffer_ptr + size)` for the zero-copy calls. The memory must stay
    /// valid until `unregister_buffer`; it is never touched outside calls that name it.
    fn register_buffer(&self, buffer_ptr: UInt, size: UInt) -> i32 {
        match self
            .engine()
            .and_then(|e| e.registry.register(buffer_ptr.0, size.0))
        {
            Ok(()) => 0,
            Err(e) => code(&e),
        }
    }

    /// Whether `[buffer_ptr, buffer_ptr + size)` lies inside one registered buffer (the
    /// tensor helpers check this before they read a header from caller memory).
    fn _is_registered(&self, buffer_ptr: UInt, size: UInt) -> bool {
        self.engine().is_ok_and(|e| {
            e.registry.covers(Range {
                ptr: buffer_ptr.0,
                len: size.0,
            })
        })
    }

    /// Unregisters the buffer starting at `buffer_ptr`, once calls using it have finished.
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: UInt) -> i32 {
        let result = self
            .engine()
            .and_then(|e| py.detach(|| e.registry.unregister(buffer_ptr.0)));
        match result {
            Ok(()) => 0,
            Err(e) => code(&e),
        }
    }

    // ---- copying calls -------------------------------------------------------------------

    /// Stores `value` (any contiguous buffer) under `key`; 0 also when the key already exists.
    #[pyo3(signature = (key, value, config = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let value = Pinned::read(value)?;
        let key = args::key(key)?;
        Ok(write_code(&self.copy_write(
            py,
            key,
            &[&value],
            config.as_deref(),
            false,
        )))
    }

    /// Stores the concatenation of `parts` under `key`.
    #[pyo3(signature = (key, *parts, config = None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned: Vec<Pinned> = parts
            .iter()
            .map(|p| Pinned::read(&p))
            .collect::<PyResult<_>>()?;
        let key = args::key(key)?;
        let refs: Vec<&Pinned> = pinned.iter().collect();
        Ok(write_code(&self.put_parts_of(
            py,
            key,
            &refs,
            config.as_deref(),
        )?))
    }

    /// Stores `values[i]` under `keys[i]`; one code for the whole batch (the first failure).
    #[pyo3(signature = (keys, values, config = None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned: Vec<Pinned> = args::items(values, "values")?
            .iter()
            .map(Pinned::read)
            .collect::<PyResult<_>>()?;
        let keys = args::keys(keys)?;
        let results = self.copy_batch_write(py, keys, &pinned, config.as_deref(), false);
        Ok(first_failure(&results))
    }

    /// Stores or replaces `value` under `key`.
    #[pyo3(signature = (key, value, config = None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let value = Pinned::read(value)?;
        let key = args::key(key)?;
        Ok(write_code(&self.copy_write(
            py,
            key,
            &[&value],
            config.as_deref(),
            true,
        )))
    }

    /// Stores or replaces the concatenation of `parts` under `key`.
    #[pyo3(signature = (key, *parts, config = None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned: Vec<Pinned> = parts
            .iter()
            .map(|p| Pinned::read(&p))
            .collect::<PyResult<_>>()?;
        let key = args::key(key)?;
        let refs: Vec<&Pinned> = pinned.iter().collect();
        Ok(write_code(&self.copy_write(
            py,
            key,
            &refs,
            config.as_deref(),
            true,
        )))
    }

    /// Stores or replaces `values[i]` under `keys[i]`; one code for the whole batch.
    #[pyo3(signature = (keys, values, config = None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned: Vec<Pinned> = args::items(values, "values")?
            .iter()
            .map(Pinned::read)
            .collect::<PyResult<_>>()?;
        let keys = args::keys(keys)?;
        let results = self.copy_batch_write(py, keys, &pinned, config.as_deref(), true);
        Ok(first_failure(&results))
    }

    /// The object's bytes; `b""` on a miss or any error (upstream cannot tell them apart
    /// either; use `get_size` or `is_exist` for that).
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let key = args::key(key)?;
        let read = self.copy_read(py, key);
        Ok(match read {
            Ok((bytes, _lease)) => PyBytes::new(py, &bytes),
            Err(_) => PyBytes::new(py, b""),
        })
    }

    /// The bytes of each key; `b""` for a key that is missing or failed.
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let keys = args::keys(keys)?;
        let read = self.copy_batch_read(py, keys);
        Ok(read
            .into_iter()
            .map(|r| match r {
                Ok((bytes, _lease)) => PyBytes::new(py, &bytes),
                Err(_) => PyBytes::new(py, b""),
            })
            .collect())
    }

    /// The object in a `BufferHandle` (a bytearray with `ptr()` and `size()`) charged to the local
    /// buffer while it lives; `None` on a miss or error.
    fn get_buffer<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let key = args::key(key)?;
        match self.copy_read(py, key) {
            Ok((bytes, lease)) => buffer_handle(py, &bytes, lease).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// `get_buffer` for each key (`None` where it failed).
    fn batch_get_buffer<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let keys = args::keys(keys)?;
        self.copy_batch_read(py, keys)
            .into_iter()
            .map(|r| match r {
                Ok((bytes, lease)) => buffer_handle(py, &bytes, lease).map(Some),
                Err(_) => Ok(None),
            })
            .collect()
    }

    // ---- zero-copy calls on registered memory ---------------------------------------------

    /// Stores the `size` bytes at `buffer_ptr` (inside a registered buffer) under `key`.
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let key = args::key(key)?;
        let result = self.single_write(
            py,
            key,
            Range {
                ptr: buffer_ptr.0,
                len: size.0,
            },
            config.as_deref(),
            false,
        );
        Ok(write_code(&result))
    }

    /// Stores or replaces the `size` bytes at `buffer_ptr` under `key`.
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: UInt,
        size: UInt,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let key = args::key(key)?;
        let result = self.single_write(
            py,
            key,
            Range {
                ptr: buffer_ptr.0,
                len: size.0,
            },
            config.as_deref(),
            true,
        );
        Ok(write_code(&result))
    }

    /// Reads the object into `[buffer_ptr, buffer_ptr + size)` (registered); its size, or a
    /// negative code (`INVALID_PARAMS` when the buffer is too small or not registered).
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: UInt,
        size: UInt,
    ) -> PyResult<i64> {
        let key = args::key(key)?;
        let result = self.with_key(key, |engine, key| {
            zero_copy::get_into(
                py,
                engine,
                &key,
                Range {
                    ptr: buffer_ptr.0,
                    len: size.0,
                },
            )
        });
        Ok(codes(vec![result], |n| n as i64).remove(0))
    }

    /// `put_from` for each key, in one batch; a code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i64>> {
        self.batch_write(py, keys, buffer_ptrs, sizes, config.as_deref(), false)
    }

    /// `upsert_from` for each key; a code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i64>> {
        self.batch_write(py, keys, buffer_ptrs, sizes, config.as_deref(), true)
    }

    /// `get_into` for each key, in one batch; a size or code per key.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let ptrs = args::numbers(buffer_ptrs, "buffer_ptrs")?;
        let sizes = args::numbers(sizes, "sizes")?;
        let n = keys.len();
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return Ok(all_failed(n, &e)),
        };
        let ranges = match zero_copy::ranges(&ptrs, &sizes).filter(|r| r.len() == n) {
            Some(r) => r,
            None => return Ok(all_failed(n, &mismatch(n, ptrs.len(), sizes.len()))),
        };
        Ok(codes(
            zero_copy::batch_get_into(py, &engine, keys, &ranges),
            |s| s as i64,
        ))
    }

    /// Object i is the concatenation of the buffers `all_buffer_ptrs[i]` (sizes
    /// `all_sizes[i]`); a code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i64>> {
        self.put_multi(py, keys, all_buffer_ptrs, all_sizes, config, false)
    }

    /// `batch_put_from_multi_buffers` that replaces existing values; a code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn batch_upsert_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i64>> {
        self.put_multi(py, keys, all_buffer_ptrs, all_sizes, config, true)
    }

    /// Object i spread in order over the buffers `all_buffer_ptrs[i]`; its size or a code per
    /// key. `prefer_alloc_in_same_node` is accepted for compatibility (reads always prefer
    /// this process's replicas).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        prefer_alloc_in_same_node: bool,
    ) -> PyResult<Vec<i64>> {
        let _ = prefer_alloc_in_same_node;
        let keys = args::keys(keys)?;
        let ptrs = args::nested_numbers(all_buffer_ptrs, "all_buffer_ptrs")?;
        let sizes = args::nested_numbers(all_sizes, "all_sizes")?;
        let n = keys.len();
        let prepared = self
            .engine()
            .and_then(|engine| Ok((engine, nested_ranges(n, &ptrs, &sizes)?)));
        let (engine, ranges) = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(all_failed(n, &e)),
        };
        let results = zero_copy::batch_get_multi(py, &engine, keys, &ranges)?;
        Ok(codes(results, |s| s as i64))
    }

    /// Stores `metadata_size` bytes at `metadata_buffer_ptr` followed by `size` bytes at
    /// `buffer_ptr` as one object (both registered).
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: UInt,
        metadata_buffer_ptr: UInt,
        size: UInt,
        metadata_size: UInt,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let key = args::key(key)?;
        let prepared = self.engine().and_then(|engine| {
            let config = crate::config::wire(config.as_deref(), engine.local_segment.as_deref())?;
            Ok((engine, config))
        });
        let (engine, config) = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(code(&e)),
        };
        let ranges = vec![vec![
            Range {
                ptr: metadata_buffer_ptr.0,
                len: metadata_size.0,
            },
            Range {
                ptr: buffer_ptr.0,
                len: size.0,
            },
        ]];
        let mut results =
            zero_copy::batch_put_multi(py, &engine, false, vec![key], &ranges, config)?;
        Ok(results.pop().map_or(0, |r| write_code(&r)))
    }

    /// Buffer-major ranged reads: for buffer b, key k and range r, copies `all_sizes[b][k][r]`
    /// bytes from offset `all_src_offsets[b][k][r]` of object `all_keys[b][k]` to
    /// `buffer_ptrs[b] + all_dst_offsets[b][k][r]` (registered). Returns the bytes copied or a
    /// negative code for each range.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: &Bound<'_, PyAny>,
        all_keys: &Bound<'_, PyAny>,
        all_dst_offsets: &Bound<'_, PyAny>,
        all_src_offsets: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Vec<Vec<i64>>>> {
        let deep = |obj: &Bound<'_, PyAny>, what: &str| -> PyResult<Vec<Vec<Vec<usize>>>> {
            args::items(obj, what)?
                .iter()
                .map(|inner| args::nested_numbers(inner, what))
                .collect()
        };
        let request = zero_copy::RangeRequest {
            buffer_ptrs: args::numbers(buffer_ptrs, "buffer_ptrs")?,
            keys: args::items(all_keys, "all_keys")?
                .iter()
                .map(args::keys)
                .collect::<PyResult<_>>()?,
            dst: deep(all_dst_offsets, "all_dst_offsets")?,
            src: deep(all_src_offsets, "all_src_offsets")?,
            sizes: deep(all_sizes, "all_sizes")?,
        };
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return Ok(zero_copy::shaped_failure(&request, &e)),
        };
        ranges::get_into_ranges(py, &engine, request)
    }

    // ---- sessions ------------------------------------------------------------------------

    /// Starts a put session per key (one BatchPutStart): space is reserved, and the bytes are
    /// written in ranges by `batch_put_from_multi_buffer_ranges` until
    /// `batch_put_session_end` makes the objects readable (or `batch_put_session_revoke`).
    /// Per key 0 or a code; `[]` when the store is not set up.
    #[pyo3(signature = (keys, sizes, config = None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let sizes = args::numbers(sizes, "sizes")?;
        let Some(engine) = self.session_engine(py, "batch_put_session_start") else {
            return Ok(Vec::new());
        };
        let n = keys.len();
        let config = match crate::config::wire(config.as_deref(), engine.local_segment.as_deref()) {
            Ok(c) => c,
            Err(e) => return Ok(all_failed(n, &e)),
        };
        let results = sessions::put_start(py, &engine, keys, sizes, config);
        Ok(codes(results, |()| 0))
    }

    /// Writes ranges of put-session objects: buffer j of key i (`all_sizes[i][j]` bytes at
    /// `all_buffer_ptrs[i][j]`, registered) goes to offset `all_dst_offsets[i][j]` of the
    /// object, in every replica. Per key the bytes written, or a code.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        all_dst_offsets: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<i64>> {
        let lists = sessions::RangeLists {
            keys: args::keys(keys)?,
            ptrs: args::nested_numbers(all_buffer_ptrs, "all_buffer_ptrs")?,
            sizes: args::nested_numbers(all_sizes, "all_sizes")?,
            offsets: args::nested_numbers(all_dst_offsets, "all_dst_offsets")?,
        };
        let Some(engine) = self.session_engine(py, "batch_put_from_multi_buffer_ranges") else {
            return Ok(Vec::new());
        };
        let results = sessions::put_ranges(py, &engine, lists);
        Ok(codes(results, |n| n as i64))
    }

    /// Ends put sessions (one BatchPutEnd): the objects become readable. Waits for the
    /// sessions' range writes still running in other threads. Per key 0 or a code; a session
    /// whose end failed stays open for `batch_put_session_revoke`.
    fn batch_put_session_end(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let Some(engine) = self.session_engine(py, "batch_put_session_end") else {
            return Ok(Vec::new());
        };
        let results = sessions::put_end(py, &engine, keys);
        Ok(codes(results, |()| 0))
    }

    /// Revokes put sessions (one BatchPutRevoke): nothing of them becomes readable. Per key 0
    /// or a code; the sessions are closed either way.
    fn batch_put_session_revoke(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let Some(engine) = self.session_engine(py, "batch_put_session_revoke") else {
            return Ok(Vec::new());
        };
        let results = sessions::put_revoke(py, &engine, keys);
        Ok(codes(results, |()| 0))
    }

    /// Starts a get session per key (one BatchGetReplicaList): its replica and read lease are
    /// kept for `batch_get_into_multi_buffer_ranges`. Per key 0 or a code.
    fn batch_get_session_start(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<i64>> {
        let keys = args::keys(keys)?;
        let Some(engine) = self.session_engine(py, "batch_get_session_start") else {
            return Ok(Vec::new());
        };
        let results = sessions::get_start(py, &engine, keys);
        Ok(codes(results, |()| 0))
    }

    /// Reads ranges of get-session objects: `all_sizes[i][j]` bytes from offset
    /// `all_src_offsets[i][j]` of key i into `all_buffer_ptrs[i][j]` (registered). Per key the
    /// bytes read, or a code (`LEASE_EXPIRED` once the session's lease ran out).
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &Bound<'_, PyAny>,
        all_src_offsets: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<i64>> {
        let lists = sessions::RangeLists {
            keys: args::keys(keys)?,
            ptrs: args::nested_numbers(all_buffer_ptrs, "all_buffer_ptrs")?,
            sizes: args::nested_numbers(all_sizes, "all_sizes")?,
            offsets: args::nested_numbers(all_src_offsets, "all_src_offsets")?,
        };
        let Some(engine) = self.session_engine(py, "batch_get_into_multi_buffer_ranges") else {
            return Ok(Vec::new());
        };
        let results = sessions::get_ranges(py, &engine, lists);
        Ok(codes(results, |n| n as i64))
    }

    /// Ends get sessions: forgets their replicas. 0, or a code when the store is not set up.
    fn batch_get_session_end(&self, keys: &Bound<'_, PyAny>) -> PyResult<i32> {
        let keys = args::keys(keys)?;
        Ok(match self.engine() {
            Ok(engine) => {
                sessions::get_end(&engine, &keys);
                0
            }
            Err(e) => code(&e),
        })
    }

    // ---- metadata ------------------------------------------------------------------------

    /// 1 if the object exists, 0 if not, a negative code on error.
    fn is_exist(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = args::key(key)?;
        let result = self.with_key(key, |engine, key| {
            engine.run(py, |store| async move { store.exists(&key).await })
        });
        Ok(codes(vec![result], i64::from).remove(0))
    }

    /// `is_exist` for each key.
    fn batch_is_exist(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let split = Split::new(args::keys(keys)?);
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return Ok(all_failed(split.merge::<()>(vec![]).len(), &e)),
        };
        let refs: Vec<&str> = split.valid.iter().map(String::as_str).collect();
        let refs = &refs;
        let results = engine.run(py, |store| async move { store.batch_exists(refs).await });
        Ok(codes(split.merge(results), i64::from))
    }

    /// The object's size in bytes, or a negative code (`OBJECT_NOT_FOUND` on a miss).
    fn get_size(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = args::key(key)?;
        let result = self.with_key(key, |engine, key| {
            let list = engine.wait(py, engine.store.replicas(&key))?;
            list.replicas.first().map(|r| r.size).ok_or_else(|| {
                Error::new(
                    moonkv_proto::ErrorCode::REPLICA_IS_NOT_READY,
                    "no readable replica",
                )
            })
        });
        Ok(codes(vec![result], |size| size as i64).remove(0))
    }

    /// The object's readable replicas; empty on a miss or error.
    fn get_replica_desc(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<PyReplicaDescriptor>> {
        let key = args::key(key)?;
        let result = self.with_key(key, |engine, key| {
            engine.wait(py, engine.store.replicas(&key))
        });
        Ok(result
            .map(|list| {
                list.replicas
                    .into_iter()
                    .map(PyReplicaDescriptor::new)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `{key: [replicas]}` for the keys that exist.
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let split = Split::new(args::keys(keys)?);
        let out = PyDict::new(py);
        let Ok(engine) = self.engine() else {
            return Ok(out);
        };
        let request = KeysRequest {
            tenant: engine.store.tenant().to_string(),
            keys: split.valid.clone(),
        };
        let answer = engine.wait(py, engine.store.master().batch_get_replica_list(request));
        if let Ok(items) = answer {
            for (key, item) in split.valid.iter().zip(items) {
                if let Ok(list) = item.0 {
                    let replicas: Vec<PyReplicaDescriptor> = list
                        .replicas
                        .into_iter()
                        .map(PyReplicaDescriptor::new)
                        .collect();
                    out.set_item(key, replicas)?;
                }
            }
        }
        Ok(out)
    }

    /// Removes the object; `force` ignores read leases. 0 or a negative code.
    #[pyo3(signature = (key, force = false))]
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>, force: bool) -> PyResult<i32> {
        let key = args::key(key)?;
        let result = self.with_key(key, |engine, key| {
            engine.wait(py, engine.store.remove(&key, force))
        });
        Ok(result.map_or_else(|e| code(&e), |()| 0))
    }

    /// `remove` for each key.
    #[pyo3(signature = (keys, force = false))]
    fn batch_remove(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        force: bool,
    ) -> PyResult<Vec<i64>> {
        let split = Split::new(args::keys(keys)?);
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return Ok(all_failed(split.merge::<()>(vec![]).len(), &e)),
        };
        let refs: Vec<&str> = split.valid.iter().map(String::as_str).collect();
        let results = engine.wait(py, engine.store.batch_remove(&refs, force));
        Ok(codes(split.merge(results), |()| 0))
    }

    /// Drops the replicas of the objects among `keys` that this store wrote whose read leases
    /// have run out: all of them (the objects go) when `segment_name` is empty, else those on
    /// the segment of that name. Returns the keys cleared; keys left as they were (absent,
    /// another client's, leased, being written, nothing on that segment) are not in it, and a
    /// call that fails as a whole (no store, no master) returns an empty list and logs why.
    #[pyo3(signature = (keys, segment_name = ""))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        segment_name: &str,
    ) -> PyResult<Vec<String>> {
        // A key that is not a valid key names no object: it is skipped, as the master skips
        // the keys it leaves.
        let keys: Vec<String> = args::keys(keys)?.into_iter().flatten().collect();
        let result = self.engine().and_then(|engine| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            engine.wait(py, engine.store.batch_replica_clear(&refs, segment_name))
        });
        Ok(result.unwrap_or_else(|e| {
            tracing::warn!(error = %e, keys = keys.len(), "batch_replica_clear failed; nothing was cleared");
            Vec::new()
        }))
    }

    /// Removes every object whose key matches `regex_pattern`; how many, or a negative code.
    #[pyo3(signature = (regex_pattern, force = false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        let result = self
            .engine()
            .and_then(|e| e.wait(py, e.store.remove_by_regex(regex_pattern, force)));
        result.unwrap_or_else(|e| code(&e) as i64)
    }

    /// Removes every object of this tenant; how many, or a negative code.
    #[pyo3(signature = (force = false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let result = self
            .engine()
            .and_then(|e| e.wait(py, e.store.remove_all(force)));
        result.unwrap_or_else(|e| code(&e) as i64)
    }
}

/// The error of a batch whose lists do not line up.
fn mismatch(keys: usize, ptrs: usize, sizes: usize) -> Error {
    invalid(format!("{keys} keys, {ptrs} buffer pointers and {sizes} sizes: the lists must have the same length"))
}

/// Ranges of the multi-buffer forms, or why the lists do not line up.
fn nested_ranges(
    n: usize,
    ptrs: &[Vec<usize>],
    sizes: &[Vec<usize>],
) -> Result<Vec<Vec<Range>>, Error> {
    if ptrs.len() != n || sizes.len() != n {
        return Err(mismatch(n, ptrs.len(), sizes.len()));
    }
    ptrs.iter()
        .zip(sizes)
        .map(|(p, s)| {
            zero_copy::ranges(p, s).ok_or_else(|| {
                invalid(format!(
                    "{} buffer pointers but {} sizes for one key",
                    p.len(),
                    s.len()
                ))
            })
        })
        .collect()
}
