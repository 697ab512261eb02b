//! Borrowing the memory of Python objects that export the buffer protocol (bytes, bytearray,
//! memoryview, NumPy arrays, mmap) for the duration of one call, without copying.
//!
//! The stable ABI declares `PyObject_GetBuffer` only from CPython 3.11, but the function and
//! the `Py_buffer` layout below are the same in every CPython 3 (3.3 onwards) and the
//! interpreter exports the symbol, so the package declares them itself and keeps one wheel
//! for CPython >= 3.9.

// Unsafe here: CPython's buffer protocol through FFI. A view is taken with
// `PyObject_GetBuffer`, released exactly once when its guard drops, and the slices made from it
// never outlive the guard, which the call holds while the bytes move.
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::{c_char, c_int, c_void};

/// CPython's `Py_buffer`.
#[repr(C)]
struct RawView {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// A contiguous buffer without format or shape information.
const PYBUF_SIMPLE: c_int = 0;
/// ... that the caller may write to.
const PYBUF_WRITABLE: c_int = 0x0001;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawView);
}

/// A buffer export held open: the exporter keeps the memory in place (a bytearray cannot be
/// resized, an mmap cannot be closed) until this is dropped.
pub(crate) struct Pinned {
    // Boxed so the view keeps its address: exporters may keep pointers into it.
    view: Box<RawView>,
    writable: bool,
}

// SAFETY: the export stays valid on any thread until it is released; the bytes are read or
// written while the calling Python thread waits (GIL released), and the release in `Drop`
// attaches to the interpreter first.
unsafe impl Send for Pinned {}
// SAFETY: shared access only hands out `&[u8]`; writing needs `&mut self`.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Borrows `obj` for reading; it must be one contiguous block of bytes.
    pub(crate) fn read(obj: &Bound<'_, PyAny>) -> PyResult<Pinned> {
        Pinned::get(obj, PYBUF_SIMPLE)
    }

    /// Borrows `obj` for writing; it must be one writable contiguous block of bytes.
    pub(crate) fn write(obj: &Bound<'_, PyAny>) -> PyResult<Pinned> {
        Pinned::get(obj, PYBUF_WRITABLE)
    }

    fn get(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<Pinned> {
        let mut view = Box::new(RawView {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`) and `view` points to
        // writable storage of the declared layout.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            // The exporter set TypeError or BufferError (e.g. "not writable", "not contiguous").
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Pinned {
            view,
            writable: flags & PYBUF_WRITABLE != 0,
        })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        // A successful export has a non-negative length.
        usize::try_from(self.view.len).unwrap_or(0)
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` until the release.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len()) }
    }

    /// The bytes, for writing; `None` when the export was requested read-only.
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !self.writable {
            return None;
        }
        if self.len() == 0 {
            return Some(&mut []);
        }
        // SAFETY: a PYBUF_WRITABLE export guarantees `len` writable bytes at `buf`; `&mut self`
        // makes this the only slice handed out from this export.
        Some(unsafe { std::slice::from_raw_parts_mut(self.view.buf as *mut u8, self.len()) })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view came from a successful PyObject_GetBuffer and is released once.
            unsafe { PyBuffer_Release(&mut *self.view) }
        });
    }
}
