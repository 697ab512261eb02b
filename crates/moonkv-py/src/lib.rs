//! `moonkv._moonkv`, the extension module of the Python package `moonkv` (the package's Python
//! sources are in `python/moonkv`; build and install with `pip install ./crates/moonkv-py`).
//!
//! - [`dropin`]: `MooncakeDistributedStore`, upstream's class with its names, argument order and
//!   integer results, so a connector switches by changing one import.
//! - [`client`]: `Client`, the Pythonic layer (exceptions, buffer-protocol objects, context
//!   manager).
//! - [`engine`]: what both share — a tokio runtime per store, the connection to the master,
//!   the embedded node (`global_segment_size > 0`) and the local-buffer budget.
//! - [`mempool`]: standalone mode's memory pool (`setup_dummy`, `alloc_from_mem_pool`).
//! - [`registry`]: registered memory, the only raw addresses ever turned into slices.
//! - [`pybuf`]: borrowing Python buffers (bytes, bytearray, memoryview, NumPy) without copying.
//! - [`config`], [`replica`], [`settings`], [`args`], [`errors`]: `ReplicateConfig`, replica
//!   descriptors and `BufferHandle`, `setup` parsing, argument reading, error mapping.
//!
//! Every wait on the network releases the GIL; one store may be shared by many threads.

mod args;
mod client;
mod config;
mod dropin;
mod engine;
mod errors;
mod mempool;
mod pybuf;
mod registry;
mod replica;
mod settings;

use pyo3::prelude::*;

/// Runs the `moonkv` command with `argv` (program name first) and returns its exit status;
/// the package's `moonkv` script calls it. The interpreter lock is released for the whole run.
#[pyfunction]
fn _cli_main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| moonkv::main_with_args(argv))
}

#[pymodule]
fn _moonkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<dropin::DropIn>()?;
    m.add_class::<client::Client>()?;
    m.add_class::<config::PyReplicateConfig>()?;
    m.add_class::<replica::PyReplicaDescriptor>()?;
    m.add_class::<replica::PyBufferDescriptor>()?;
    m.add_class::<replica::PyMemoryDescriptor>()?;
    m.add_class::<replica::PyDiskDescriptor>()?;
    m.add_function(wrap_pyfunction!(errors::_install, m)?)?;
    m.add_function(wrap_pyfunction!(engine::_close_all, m)?)?;
    m.add_function(wrap_pyfunction!(replica::_bytearray_address, m)?)?;
    m.add_function(wrap_pyfunction!(_cli_main, m)?)?;
    m.add("MAX_KEY_LEN", moonkv_proto::MAX_KEY_LEN)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
