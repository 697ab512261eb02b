//! Reading arguments from Python: keys, lists of keys, addresses, and batches in which some
//! items fail their checks while the rest go to the store.

use moonkv_proto::{Error, ErrorCode};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyList, PyString, PyTuple};

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
///
/// A `list` or `tuple` (not a subclass, which may iterate its own way), what callers nearly
/// always pass, is read directly. Any other iterable goes through Python's iterator protocol,
/// whose size hint calls back into Python (`operator.length_hint`): about 3 µs per argument,
/// three times per batch call.
pub(crate) fn items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
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

/// An unsigned integer argument (an address, a size). Like upstream's bindings, any other type
/// or a value out of range (negative, too large) raises `TypeError`, never `OverflowError`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UInt(pub usize);

impl<'a, 'py> FromPyObject<'a, 'py> for UInt {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        unsigned::<usize>(&obj, "a non-negative integer address or size").map(UInt)
    }
}

/// A non-negative integer that fits in `T`; a float, a non-integer or a value out of `T`'s
/// range raises `TypeError` (pybind11's rule for typed arguments and attributes).
pub(crate) fn unsigned<T: TryFrom<u128>>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    let wrong = || {
        PyTypeError::new_err(format!(
            "expected {what} (0 to {}), got {}",
            max_of::<T>(),
            describe(obj)
        ))
    };
    if obj.is_instance_of::<PyFloat>() {
        return Err(wrong());
    }
    let n: i128 = obj.extract().map_err(|_| wrong())?;
    u128::try_from(n)
        .ok()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(wrong)
}

/// A signed integer in `range`, else `TypeError`.
pub(crate) fn int_in(
    obj: &Bound<'_, PyAny>,
    range: std::ops::RangeInclusive<i64>,
    what: &str,
) -> PyResult<i64> {
    let wrong = || {
        PyTypeError::new_err(format!(
            "expected {what} ({} to {}), got {}",
            range.start(),
            range.end(),
            describe(obj)
        ))
    };
    if obj.is_instance_of::<PyFloat>() {
        return Err(wrong());
    }
    obj.extract::<i64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(wrong)
}

/// A boolean as pybind11 reads one for a typed attribute: `True`/`False`, or anything whose
/// truth is 0 or 1 by `__bool__` (ints, `None`, NumPy booleans); text and containers raise
/// `TypeError`.
pub(crate) fn boolean(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    let numeric = obj.is_none()
        || obj.is_instance_of::<pyo3::types::PyInt>()
        || obj.is_instance_of::<PyFloat>()
        || obj.hasattr("__index__").unwrap_or(false)
        || obj.get_type().name().is_ok_and(|n| n == "bool_");
    if numeric {
        if let Ok(truth) = obj.is_truthy() {
            return Ok(truth);
        }
    }
    Err(PyTypeError::new_err(format!(
        "expected {what} (a bool), got {}",
        describe(obj)
    )))
}

/// A size given to `setup_dummy`/`alloc_from_mem_pool`: a non-negative integer.
pub(crate) fn size_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    unsigned::<u64>(obj, &format!("{name} as a non-negative integer"))
}

fn max_of<T: TryFrom<u128>>() -> u128 {
    // The largest power-of-two-minus-one that converts: 2^8-1 .. 2^128-1.
    [8u32, 16, 32, 64, 128]
        .into_iter()
        .map(|bits| {
            if bits == 128 {
                u128::MAX
            } else {
                (1u128 << bits) - 1
            }
        })
        .take_while(|&m| T::try_from(m).is_ok())
        .last()
        .unwrap_or(0)
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    let shown = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    let shown: String = shown.chars().take(60).collect();
    format!("{} {shown}", type_name(obj))
}
