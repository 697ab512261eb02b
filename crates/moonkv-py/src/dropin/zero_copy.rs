//! Calls on registered memory: every address range is checked against the registry, leased
//! for the call, and only then turned into the slice the store reads from or writes into (the
//! bytes go between the socket, or the embedded node's segment, and the caller's memory with no
//! staging copy).

// Unsafe here: slices of registered memory, made only from ranges that `registry` checked to lie
// inside one registration, while the call holds that registration's lease; no two mutable
// slices of one call overlap (`overlapping` is checked first).
#![allow(unsafe_code)]

use super::copying::keep_groups_of;
use crate::args::Split;
use crate::engine::Engine;
use crate::errors::invalid;
use crate::registry::{self, overlapping, Lease, Range};
use moonkv_proto::types::ReplicateConfig;
use moonkv_proto::Error;
use pyo3::prelude::*;

/// Leases `ranges` and reports, per range, why it cannot be used (outside every registered
/// buffer, or, when `writable`, overlapping another range of the same call).
pub(super) fn check(
    engine: &Engine,
    ranges: &[Range],
    writable: bool,
) -> (Lease, Vec<Option<Error>>) {
    let (lease, mut errors) = engine.registry.lease(ranges);
    if writable {
        for (i, overlaps) in overlapping(ranges).into_iter().enumerate() {
            if overlaps && errors[i].is_none() {
                errors[i] = Some(invalid(format!(
                    "buffer {:#x}+{} overlaps another destination of the same call",
                    ranges[i].ptr, ranges[i].len
                )));
            }
        }
    }
    (lease, errors)
}

/// `put_from` / `upsert_from`.
pub(super) fn put_from(
    py: Python<'_>,
    engine: &Engine,
    key: &str,
    range: Range,
    config: &ReplicateConfig,
    upsert: bool,
) -> Result<(), Error> {
    let (lease, mut errors) = check(engine, &[range], false);
    if let Some(e) = errors.pop().flatten() {
        return Err(e);
    }
    // SAFETY: `check` found the range inside a registered buffer that `lease` keeps registered.
    let value = unsafe { registry::slice(range, &lease) };
    engine.run(py, |store| async move {
        if upsert {
            store.upsert(key, value, config).await
        } else {
            store.put_from(key, value, config).await
        }
    })
}

/// `get_into`: the object's size, or why not.
pub(super) fn get_into(
    py: Python<'_>,
    engine: &Engine,
    key: &str,
    range: Range,
) -> Result<usize, Error> {
    let (lease, mut errors) = check(engine, &[range], true);
    if let Some(e) = errors.pop().flatten() {
        return Err(e);
    }
    // SAFETY: checked and leased as above; it is the call's only destination.
    let buf = unsafe { registry::slice_mut(range, &lease) };
    engine.run(py, |store| async move { store.get_into(key, buf).await })
}

/// `batch_put_from` / `batch_upsert_from`: one result per key.
pub(super) fn batch_put_from(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
    ranges: &[Range],
    mut config: ReplicateConfig,
    upsert: bool,
) -> Vec<Result<(), Error>> {
    let n = keys.len();
    let (lease, errors) = check(engine, ranges, false);
    let checked = keys
        .into_iter()
        .zip(ranges.iter().zip(errors))
        .map(|(key, (range, error))| match error {
            Some(e) => Err(e),
            // SAFETY: no error means `check` found the range inside a leased registration.
            None => key.map(|k| (k, unsafe { registry::slice(*range, &lease) })),
        })
        .collect();
    let split = Split::new(checked);
    keep_groups_of(&mut config, &split.valid_positions(), n);
    let keys: Vec<&str> = split.valid.iter().map(|(k, _)| k.as_str()).collect();
    let values: Vec<&[u8]> = split.valid.iter().map(|(_, v)| *v).collect();
    let (keys, values, config) = (&keys, &values, &config);
    let results = engine.run(py, |store| async move {
        if upsert {
            store.batch_upsert_from(keys, values, config).await
        } else {
            store.batch_put_from(keys, values, config).await
        }
    });
    split.merge(results)
}

/// `batch_get_into`: each object's size, or why not.
pub(super) fn batch_get_into(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
    ranges: &[Range],
) -> Vec<Result<usize, Error>> {
    let (lease, errors) = check(engine, ranges, true);
    let checked = keys
        .into_iter()
        .zip(ranges.iter().zip(errors))
        .map(|(key, (range, error))| match error {
            Some(e) => Err(e),
            // SAFETY: checked, leased, and no other destination of this call overlaps it.
            None => key.map(|k| (k, unsafe { registry::slice_mut(*range, &lease) })),
        })
        .collect();
    let mut split = Split::new(checked);
    let (keys, mut bufs): (Vec<String>, Vec<&mut [u8]>) = split.valid.drain(..).unzip();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (key_refs, bufs) = (&key_refs, &mut bufs);
    let results = engine.run(py, |store| async move {
        store.batch_get_into(key_refs, bufs).await
    });
    split.merge(results)
}

/// Objects made of several parts (`put_parts`): one result per key.
pub(super) fn put_parts(
    py: Python<'_>,
    engine: &Engine,
    _method: &str,
    keys: &[&str],
    parts: &[Vec<&[u8]>],
    config: &ReplicateConfig,
) -> PyResult<Vec<Result<(), Error>>> {
    Ok(engine.wait(py, engine.store.batch_put_parts(keys, parts, config)))
}

/// Turns `(ptrs, sizes)` lists into ranges; `None` when the two lengths differ.
pub(super) fn ranges(ptrs: &[usize], sizes: &[usize]) -> Option<Vec<Range>> {
    (ptrs.len() == sizes.len()).then(|| {
        ptrs.iter()
            .zip(sizes)
            .map(|(&ptr, &len)| Range { ptr, len })
            .collect()
    })
}

/// Per item, the first error among its ranges (`errors` lists them all in item order).
fn item_errors(ranges: &[Vec<Range>], errors: Vec<Option<Error>>) -> Vec<Option<Error>> {
    let mut errors = errors.into_iter();
    ranges
        .iter()
        .map(|rs| errors.by_ref().take(rs.len()).flatten().next())
        .collect()
}

/// `batch_put_from_multi_buffers` / `put_from_with_metadata`, and with `upsert`
/// `batch_upsert_from_multi_buffers`: object i is the concatenation of its ranges.
pub(super) fn batch_put_multi(
    py: Python<'_>,
    engine: &Engine,
    upsert: bool,
    keys: Vec<Result<String, Error>>,
    ranges: &[Vec<Range>],
    mut config: ReplicateConfig,
) -> PyResult<Vec<Result<(), Error>>> {
    let n = keys.len();
    let flat: Vec<Range> = ranges.iter().flatten().copied().collect();
    let (lease, errors) = check(engine, &flat, false);
    let checked = keys
        .into_iter()
        .zip(ranges.iter().zip(item_errors(ranges, errors)))
        .map(|(key, (rs, error))| {
            if let Some(e) = error {
                return Err(e);
            }
            let key = key?;
            // SAFETY: no error means `check` found every range inside a leased registration.
            let parts: Vec<&[u8]> = rs
                .iter()
                .map(|r| unsafe { registry::slice(*r, &lease) })
                .collect();
            Ok((key, parts))
        })
        .collect();
    let split = Split::new(checked);
    keep_groups_of(&mut config, &split.valid_positions(), n);
    let keys: Vec<&str> = split.valid.iter().map(|(k, _)| k.as_str()).collect();
    let parts: Vec<Vec<&[u8]>> = split.valid.iter().map(|(_, p)| p.clone()).collect();
    let results = if upsert {
        engine.wait(py, engine.store.batch_upsert_parts(&keys, &parts, &config))
    } else {
        engine.wait(py, engine.store.batch_put_parts(&keys, &parts, &config))
    };
    Ok(split.merge(results))
}

/// `batch_get_into_multi_buffers`: object i spread in order over its ranges.
pub(super) fn batch_get_multi(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
    ranges: &[Vec<Range>],
) -> PyResult<Vec<Result<usize, Error>>> {
    let flat: Vec<Range> = ranges.iter().flatten().copied().collect();
    let (lease, errors) = check(engine, &flat, true);
    let checked = keys
        .into_iter()
        .zip(ranges.iter().zip(item_errors(ranges, errors)))
        .map(|(key, (rs, error))| {
            if let Some(e) = error {
                return Err(e);
            }
            let key = key?;
            // SAFETY: checked, leased, and no other destination of this call overlaps them.
            let bufs: Vec<&mut [u8]> = rs
                .iter()
                .map(|r| unsafe { registry::slice_mut(*r, &lease) })
                .collect();
            Ok((key, bufs))
        })
        .collect();
    let mut split = Split::new(checked);
    let (keys, mut bufs): (Vec<String>, Vec<Vec<&mut [u8]>>) = split.valid.drain(..).unzip();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let results = engine.wait(py, engine.store.batch_get_into_parts(&key_refs, &mut bufs));
    Ok(split.merge(results))
}

/// One `get_into_ranges` request: per buffer, per key, the (dst offset, src offset, size)
/// of each range.
pub(super) struct RangeRequest {
    pub buffer_ptrs: Vec<usize>,
    pub keys: Vec<Vec<Result<String, Error>>>,
    pub dst: Vec<Vec<Vec<usize>>>,
    pub src: Vec<Vec<Vec<usize>>>,
    pub sizes: Vec<Vec<Vec<usize>>>,
}

/// The answer to a `get_into_ranges` that fails as a whole: the error for every range.
pub(super) fn shaped_failure(request: &RangeRequest, error: &Error) -> Vec<Vec<Vec<i64>>> {
    let code = crate::errors::code(error) as i64;
    request
        .dst
        .iter()
        .map(|per_key| {
            per_key
                .iter()
                .map(|per_range| vec![code; per_range.len()])
                .collect()
        })
        .collect()
}
