//! What reads hand back besides integers: replica descriptors with upstream's accessors, and
//! the `BufferHandle` of `get_buffer`.

// Unsafe here: filling a bytearray this module has just created, before any Python code can see
// (and resize) it.
#![allow(unsafe_code)]

use crate::engine::StagingLease;
use crate::errors::HOOKS;
use moonkv_proto::types::{ReplicaDescriptor, ReplicaKind};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// One replica of an object, as the master lists it.
#[pyclass(module = "moonkv", name = "ReplicaDescriptor", frozen)]
pub(crate) struct PyReplicaDescriptor {
    inner: ReplicaDescriptor,
}

/// Where a memory replica lives (`get_memory_descriptor().buffer_descriptor`).
#[pyclass(module = "moonkv", name = "Descriptor", frozen)]
pub(crate) struct PyBufferDescriptor {
    /// Object size in bytes.
    #[pyo3(get)]
    size: u64,
    /// Absolute address inside the owning node's segment.
    #[pyo3(get)]
    buffer_address: u64,
    /// Data-plane endpoint `host:port` of the owning node.
    #[pyo3(get)]
    transport_endpoint: String,
}

/// The memory side of a replica.
#[pyclass(module = "moonkv", name = "MemoryDescriptor", frozen)]
pub(crate) struct PyMemoryDescriptor {
    #[pyo3(get)]
    buffer_descriptor: Py<PyBufferDescriptor>,
}

/// The disk side of a replica. moonkv's disk replicas are files owned by a node, so
/// `file_path` is a locator (`moonkv-disk://<endpoint>/<file id>`), not a local path.
#[pyclass(module = "moonkv", name = "DiskDescriptor", frozen)]
pub(crate) struct PyDiskDescriptor {
    #[pyo3(get)]
    file_path: String,
    #[pyo3(get)]
    object_size: u64,
}

impl PyReplicaDescriptor {
    pub(crate) fn new(inner: ReplicaDescriptor) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyReplicaDescriptor {
    /// Upstream's `ReplicaStatus` number: 2 PROCESSING, 3 COMPLETE.
    #[getter]
    fn status(&self) -> u8 {
        self.inner.status.into()
    }

    /// Replica id (moonkv's; stable for the life of the replica).
    #[getter]
    fn id(&self) -> String {
        self.inner.id.to_string()
    }

    /// Object size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size
    }

    /// Segment (memory) or disk name holding the bytes.
    #[getter]
    fn segment_name(&self) -> &str {
        &self.inner.segment_name
    }

    /// Data-plane endpoint of the node holding the bytes.
    #[getter]
    fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    fn is_memory_replica(&self) -> bool {
        self.inner.kind == ReplicaKind::Memory
    }

    fn is_disk_replica(&self) -> bool {
        self.inner.kind == ReplicaKind::LocalDisk
    }

    fn is_local_disk_replica(&self) -> bool {
        self.inner.kind == ReplicaKind::LocalDisk
    }

    /// The memory location; `ValueError` for a disk replica.
    fn get_memory_descriptor(&self, py: Python<'_>) -> PyResult<PyMemoryDescriptor> {
        if self.inner.kind != ReplicaKind::Memory {
            return Err(PyValueError::new_err("not a memory replica"));
        }
        Ok(PyMemoryDescriptor {
            buffer_descriptor: Py::new(
                py,
                PyBufferDescriptor {
                    size: self.inner.size,
                    buffer_address: self.inner.address,
                    transport_endpoint: self.inner.endpoint.to_string(),
                },
            )?,
        })
    }

    /// The disk location; `ValueError` for a memory replica.
    fn get_disk_descriptor(&self) -> PyResult<PyDiskDescriptor> {
        if self.inner.kind != ReplicaKind::LocalDisk {
            return Err(PyValueError::new_err("not a disk replica"));
        }
        Ok(PyDiskDescriptor {
            file_path: format!(
                "moonkv-disk://{}/{:016x}",
                self.inner.endpoint, self.inner.address
            ),
            object_size: self.inner.size,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicaDescriptor(kind={:?}, status={:?}, size={}, segment={:?}, endpoint={:?})",
            self.inner.kind,
            self.inner.status,
            self.inner.size,
            self.inner.segment_name,
            self.inner.endpoint
        )
    }
}

/// Holds part of the local buffer for as long as a `BufferHandle` lives.
#[pyclass(module = "moonkv._moonkv", name = "_StagingLease", frozen)]
pub(crate) struct PyStagingLease {
    _lease: StagingLease,
}

/// A `moonkv.BufferHandle` (a bytearray subclass) holding `bytes`, charged to the local buffer
/// until it is garbage-collected.
pub(crate) fn buffer_handle<'py>(
    py: Python<'py>,
    bytes: &[u8],
    lease: StagingLease,
) -> PyResult<Bound<'py, PyAny>> {
    let class = HOOKS
        .get(py)
        .map(|h| h.buffer_handle.bind(py).clone())
        .ok_or_else(|| PyRuntimeError::new_err("import moonkv, not moonkv._moonkv"))?;
    let handle = class.call1((bytes.len(),))?;
    {
        let array = handle.cast::<PyByteArray>()?;
        // SAFETY: the bytearray was created just now and no Python code has seen it, so
        // nothing else can resize or read it while it is filled.
        unsafe { array.as_bytes_mut() }.copy_from_slice(bytes);
    }
    handle.setattr("_lease", PyStagingLease { _lease: lease })?;
    Ok(handle)
}

/// Address of a bytearray's bytes (`BufferHandle.ptr()`); valid until it is resized.
#[pyfunction]
pub(crate) fn _bytearray_address(array: &Bound<'_, PyByteArray>) -> usize {
    array.data() as usize
}
