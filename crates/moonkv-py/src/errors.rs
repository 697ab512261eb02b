//! Turning store errors into what each layer returns: upstream integers for the drop-in class,
//! exception objects of the `moonkv.errors` hierarchy for the Pythonic one.

use moonkv_proto::{Error, ErrorCode};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Python hooks registered by `moonkv/__init__.py`: how to build an exception for an error, and
/// the class `get_buffer` returns. Kept in Python so the hierarchy and docstrings live there.
pub(crate) struct Hooks {
    pub error_for: Py<PyAny>,
    pub buffer_handle: Py<PyAny>,
}

pub(crate) static HOOKS: PyOnceLock<Hooks> = PyOnceLock::new();

/// Registers the Python side of the package; called once when `moonkv` is imported.
#[pyfunction]
pub(crate) fn _install(py: Python<'_>, error_for: Py<PyAny>, buffer_handle: Py<PyAny>) {
    // A second import of the package (importlib.reload) keeps the first hooks; they are equal.
    let _ = HOOKS.set(
        py,
        Hooks {
            error_for,
            buffer_handle,
        },
    );
}

/// The exception instance for `error` (a subclass of `moonkv.MoonkvError` chosen by its code).
pub(crate) fn exception<'py>(py: Python<'py>, error: &Error) -> Bound<'py, PyAny> {
    let built = HOOKS.get(py).and_then(|hooks| {
        hooks
            .error_for
            .bind(py)
            .call1((
                error.code.as_i32(),
                error.code.name(),
                error.message.as_ref(),
            ))
            .ok()
    });
    match built {
        Some(instance) => instance,
        // Only when the extension is imported without its package: still say what failed.
        None => PyRuntimeError::new_err(error.to_string())
            .into_value(py)
            .into_bound(py)
            .into_any(),
    }
}

/// The Python exception to raise for `error`.
pub(crate) fn raise(py: Python<'_>, error: &Error) -> PyErr {
    PyErr::from_value(exception(py, error))
}

/// Upstream's integer for a failed call.
pub(crate) fn code(error: &Error) -> i32 {
    error.code.as_i32()
}

/// Upstream's integer for a write: `OBJECT_ALREADY_EXISTS` counts as success there (the first
/// writer wins and later puts of the same key are no-ops).
pub(crate) fn write_code(result: &Result<(), Error>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => 0,
        Err(e) => code(e),
    }
}

/// `INVALID_PARAMS` with a message.
pub(crate) fn invalid(message: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

/// The error every call on a store that is not set up (or closed) gets; upstream answers
/// `INVALID_PARAMS` there too.
pub(crate) fn not_set_up() -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        "the store is not set up (call setup() first) or was closed",
    )
}
