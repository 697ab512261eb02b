//! The copying calls' plumbing: values read straight from Python buffers, charged to the
//! local buffer like upstream stages them there.

use super::zero_copy;
use super::DropIn;
use crate::args::Split;
use crate::config::{wire, PyReplicateConfig};
use crate::engine::{Engine, StagingLease};
use crate::errors::{invalid, write_code};
use crate::pybuf::Pinned;
use moonkv_client::ErrorExt;
use moonkv_proto::Error;
use pyo3::prelude::*;

/// 0, or the first failure's code, ignoring "already exists" like upstream's batch put.
pub(super) fn first_failure(results: &[Result<(), Error>]) -> i32 {
    results
        .iter()
        .map(write_code)
        .find(|&c| c != 0)
        .unwrap_or(0)
}

impl DropIn {
    /// Runs `op` on a valid key with the engine, or reports why it cannot run.
    pub(super) fn with_key<T>(
        &self,
        key: Result<String, Error>,
        op: impl FnOnce(&Engine, String) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let engine = self.engine()?;
        op(&engine, key?)
    }

    /// One copying write (`put`, `upsert`, their `_parts` forms): the parts are concatenated,
    /// as upstream stages them in its local buffer.
    pub(super) fn copy_write(
        &self,
        py: Python<'_>,
        key: Result<String, Error>,
        parts: &[&Pinned],
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> Result<(), Error> {
        let engine = self.engine()?;
        let key = key?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let _lease = engine.staging.reserve(total as u64)?;
        let config = wire(config, engine.local_segment.as_deref())?;
        let joined;
        let value: &[u8] = match parts {
            [one] => one.bytes(),
            _ => {
                joined = parts
                    .iter()
                    .flat_map(|p| p.bytes().iter().copied())
                    .collect::<Vec<u8>>();
                &joined
            }
        };
        let (key, config) = (&key, &config);
        engine.run(py, |store| async move {
            if upsert {
                store.upsert(key, value, config).await
            } else {
                store.put(key, value, config).await
            }
        })
    }

    /// `put_batch` / `upsert_batch`: every value read straight from its Python buffer.
    pub(super) fn copy_batch_write(
        &self,
        py: Python<'_>,
        keys: Vec<Result<String, Error>>,
        values: &[Pinned],
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> Vec<Result<(), Error>> {
        let n = keys.len();
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return vec![Err(e); n],
        };
        if n != values.len() {
            return vec![Err(invalid(format!("{n} keys but {} values", values.len()))); n];
        }
        let total: usize = values.iter().map(Pinned::len).sum();
        let _lease = match engine.staging.reserve(total as u64) {
            Ok(l) => l,
            Err(e) => return vec![Err(e); n],
        };
        let checked: Vec<Result<(String, &[u8]), Error>> = keys
            .into_iter()
            .zip(values)
            .map(|(k, v)| k.map(|k| (k, v.bytes())))
            .collect();
        let split = Split::new(checked);
        let mut config = match wire(config, engine.local_segment.as_deref()) {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        keep_groups_of(&mut config, &split.valid_positions(), n);
        let keys: Vec<&str> = split.valid.iter().map(|(k, _)| k.as_str()).collect();
        let values: Vec<&[u8]> = split.valid.iter().map(|(_, v)| *v).collect();
        let store = &engine.store;
        let results = engine.wait(py, async {
            if upsert {
                store.batch_upsert_from(&keys, &values, &config).await
            } else {
                store.batch_put_from(&keys, &values, &config).await
            }
        });
        split.merge(results)
    }

    /// `put_parts`: the parts go to the store as they are, without concatenating them.
    pub(super) fn put_parts_of(
        &self,
        py: Python<'_>,
        key: Result<String, Error>,
        parts: &[&Pinned],
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Result<(), Error>> {
        let checked: Result<_, Error> = (|| {
            let engine = self.engine()?;
            let key = key?;
            let total: usize = parts.iter().map(|p| p.len()).sum();
            let lease = engine.staging.reserve(total as u64)?;
            let config = wire(config, engine.local_segment.as_deref())?;
            Ok((engine, key, lease, config))
        })();
        let (engine, key, _lease, config) = match checked {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        if parts.iter().all(|p| p.len() == 0) {
            return Ok(Err(invalid("put_parts needs at least one non-empty part")));
        }
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.bytes()).collect();
        let mut results = zero_copy::put_parts(
            py,
            &engine,
            "put_parts",
            &[key.as_str()],
            &[slices],
            &config,
        )?;
        Ok(results.pop().unwrap_or_else(|| Err(invalid("no result"))))
    }

    /// A copying read: the object's bytes and the local-buffer share they occupy.
    pub(super) fn copy_read(
        &self,
        py: Python<'_>,
        key: Result<String, Error>,
    ) -> Result<(Vec<u8>, StagingLease), Error> {
        let engine = self.engine()?;
        let key = key?;
        let wanted = key.as_str();
        let got = engine.run(py, |store| async move { store.get(wanted).await });
        let bytes = got.inspect_err(|e| {
            if !e.is_not_found() {
                tracing::debug!(%key, error = %e, "get failed");
            }
        })?;
        let lease = engine.staging.reserve(bytes.len() as u64)?;
        Ok((bytes, lease))
    }

    pub(super) fn copy_batch_read(
        &self,
        py: Python<'_>,
        keys: Vec<Result<String, Error>>,
    ) -> Vec<Result<(Vec<u8>, StagingLease), Error>> {
        let split = Split::new(keys);
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => return split.merge((0..split.valid.len()).map(|_| Err(e.clone())).collect()),
        };
        let refs: Vec<&str> = split.valid.iter().map(String::as_str).collect();
        let results = engine.wait(py, engine.store.batch_get(&refs));
        let leased = results
            .into_iter()
            .map(|r| {
                let bytes = r?;
                let lease = engine.staging.reserve(bytes.len() as u64)?;
                Ok((bytes, lease))
            })
            .collect();
        split.merge(leased)
    }
}

/// Group ids are one per key of the whole batch; keep those of the keys that are sent.
pub(crate) fn keep_groups_of(config: &mut moonkv_proto::ReplicateConfig, sent: &[usize], n: usize) {
    if let Some(groups) = &config.group_ids {
        if groups.len() == n && sent.len() != n {
            config.group_ids = Some(sent.iter().map(|&i| groups[i].clone()).collect());
        }
    }
}

impl DropIn {
    /// `put_from` / `upsert_from` on a checked key.
    pub(super) fn single_write(
        &self,
        py: Python<'_>,
        key: Result<String, Error>,
        range: crate::registry::Range,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> Result<(), Error> {
        let engine = self.engine()?;
        let key = key?;
        let config = wire(config, engine.local_segment.as_deref())?;
        zero_copy::put_from(py, &engine, &key, range, &config, upsert)
    }

    /// `batch_put_from` / `batch_upsert_from`.
    pub(super) fn batch_write(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let keys = crate::args::keys(keys)?;
        let ptrs = crate::args::numbers(buffer_ptrs, "buffer_ptrs")?;
        let sizes = crate::args::numbers(sizes, "sizes")?;
        let n = keys.len();
        let prepared = self.engine().and_then(|engine| {
            let ranges = zero_copy::ranges(&ptrs, &sizes)
                .filter(|r| r.len() == n)
                .ok_or_else(|| invalid(format!("{n} keys, {} buffer pointers and {} sizes: the lists must have the same length", ptrs.len(), sizes.len())))?;
            let config = wire(config, engine.local_segment.as_deref())?;
            Ok((engine, ranges, config))
        });
        let (engine, ranges, config) = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(vec![crate::errors::code(&e) as i64; n]),
        };
        let results = zero_copy::batch_put_from(py, &engine, keys, &ranges, config, upsert);
        Ok(results.iter().map(|r| write_code(r) as i64).collect())
    }
}
