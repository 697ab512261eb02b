//! Reading arguments from Python: keys, lists of keys, addresses, and batches in which some
//! items fail their checks while the rest go to the store.

use moonkv_proto::{Error, ErrorCode};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A key given as `str` or `bytes` (upstream's bindings take both). Wrong types raise
/// `TypeError`; text that is not UTF-8 is an `INVALID_KEY` error for the caller to report.
pub(crate) fn key(obj: &Bound<'_, PyAny>) -> PyResult<Result<String, Error>> {
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(text.to_cow().map(|k| k.into_owned()).map_err(|_| {
            Error::new(
                ErrorCode::INVALID_KEY,
                "the key is not valid UTF-8 (it contains unpaired surrogates)",
            )
        }));
    }
    if let Ok(raw) = obj.cast::<PyBytes>() {
        return Ok(std::str::from_utf8(raw.as_bytes())
            .map(str::to_owned)
            .map_err(|e| {
                Error::new(
                    ErrorCode::INVALID_KEY,
                    format!("the key is not valid UTF-8 ({e})"),
                )
            }));
    }
    Err(PyTypeError::new_err(format!(
        "a key must be str or bytes, not {}",
        type_name(obj)
    )))
}

/// A list (or tuple, or other sequence) of keys; a lone `str` or `bytes` is refused so a
/// single key is not taken for a list of one-character keys.
pub(crate) fn keys(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Result<String, Error>>> {
    items(obj, "keys")?.iter().map(key).collect()
}

/// The items of a sequence argument (not `str`/`bytes`).
pub(crate) fn items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a list, not {}",
            type_name(obj)
        )));
    }
    obj.try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!("{what} must be a list, not {}", type_name(obj)))
        })?
        .collect()
}

/// A list of non-negative integers (addresses, sizes, offsets).
pub(crate) fn numbers(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    items(obj, what)?
        .iter()
        .map(|item| {
            item.extract::<usize>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{what} must hold non-negative integers, found {}",
                    type_name(item)
                ))
            })
        })
        .collect()
}

/// A list of lists of non-negative integers.
pub(crate) fn nested_numbers(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Vec<usize>>> {
    items(obj, what)?
        .iter()
        .map(|inner| numbers(inner, what))
        .collect()
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown type".into())
}

/// A batch whose items were checked one by one: the valid ones (in order) go to the store,
/// the others already hold their error.
pub(crate) struct Split<T> {
    pub valid: Vec<T>,
    /// Position `i` of the batch: `None` when it is in `valid`.
    failed: Vec<Option<Error>>,
}

impl<T> Split<T> {
    pub(crate) fn new(checked: Vec<Result<T, Error>>) -> Split<T> {
        let mut valid = Vec::with_capacity(checked.len());
        let failed = checked
            .into_iter()
            .map(|item| match item {
                Ok(v) => {
                    valid.push(v);
                    None
                }
                Err(e) => Some(e),
            })
            .collect();
        Split { valid, failed }
    }

    /// Indices (in the whole batch) of the valid items.
    pub(crate) fn valid_positions(&self) -> Vec<usize> {
        (0..self.failed.len())
            .filter(|&i| self.failed[i].is_none())
            .collect()
    }

    /// One result per item of the whole batch, given one per valid item.
    pub(crate) fn merge<R>(&self, results: Vec<Result<R, Error>>) -> Vec<Result<R, Error>> {
        let mut results = results.into_iter();
        self.failed
            .iter()
            .map(|failed| match failed {
                Some(e) => Err(e.clone()),
                None => results.next().unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "no result for this item",
                    ))
                }),
            })
            .collect()
    }
}
