//! Multi-buffer forms: one object assembled from, or spread over, several caller buffers (one
//! per model layer, say). Each part moves straight between its buffer and the replica's range at
//! the part's offset, in the same pipelined bursts as the batch forms; nothing is staged.

use super::batch::mismatch;
use super::{first_of, Store, WriteKind};
use moonkv_proto::{ReplicateConfig, Result};

impl Store {
    /// Stores under `key` the concatenation of `parts`.
    pub async fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<()> {
        first_of(
            self.batch_write(WriteKind::Put, &[key], &[parts], config)
                .await,
        )
    }

    /// Stores object i, the concatenation of `parts[i]`, under `keys[i]`, for every i; one
    /// result per key, as [`Store::batch_put_from`].
    pub async fn batch_put_parts(
        &self,
        keys: &[&str],
        parts: &[Vec<&[u8]>],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let objects: Vec<&[&[u8]]> = parts.iter().map(Vec::as_slice).collect();
        self.batch_write(WriteKind::Put, keys, &objects, config)
            .await
    }

    /// Like [`Store::batch_put_parts`], replacing existing values.
    pub async fn batch_upsert_parts(
        &self,
        keys: &[&str],
        parts: &[Vec<&[u8]>],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let objects: Vec<&[&[u8]]> = parts.iter().map(Vec::as_slice).collect();
        self.batch_write(WriteKind::Upsert, keys, &objects, config)
            .await
    }

    /// Reads object i into `bufs[i]`, filling its buffers in order, and returns its size; an
    /// object larger than its buffers together fails with `INVALID_PARAMS` (the others are
    /// unaffected). Buffers past the object's end are left untouched.
    pub async fn batch_get_into_parts(
        &self,
        keys: &[&str],
        bufs: &mut [Vec<&mut [u8]>],
    ) -> Vec<Result<usize>> {
        if keys.len() != bufs.len() {
            return mismatch(keys, bufs.len(), "buffer lists");
        }
        let targets = bufs
            .iter_mut()
            .map(|parts| parts.iter_mut().map(|p| &mut **p).collect())
            .collect();
        self.read_keys_into(keys, targets).await
    }
}
