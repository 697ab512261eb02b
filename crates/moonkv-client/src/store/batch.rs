//! Batch forms: one master round trip per phase for all keys, transfers of all keys in
//! parallel, and one result per key (a failing key never fails the others).

use super::{buffer_for, check_value, lease_expired, object_size, zeroed, Store, WriteKind};
use crate::util::check_key;
use futures_util::future::join_all;
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{Error, ErrorCode, ReplicaId, Result};
use std::time::Instant;

/// Per-key slots: keys that passed local validation are sent; the others already hold an error.
struct Checked {
    results: Vec<Option<Error>>,
    valid: Vec<usize>,
}

fn check_keys(keys: &[&str]) -> Checked {
    let mut results = Vec::with_capacity(keys.len());
    let mut valid = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        match check_key(key) {
            Ok(()) => {
                valid.push(i);
                results.push(None);
            }
            Err(e) => results.push(Some(e)),
        }
    }
    Checked { results, valid }
}

/// Spreads one batch RPC's answer (for `valid` keys) back over every key.
fn merge<T>(checked: Checked, answer: Result<Vec<ItemResult<T>>>) -> Vec<Result<T>> {
    let mut out: Vec<Result<T>> = checked
        .results
        .into_iter()
        .map(|e| {
            Err(e
                .unwrap_or_else(|| Error::new(ErrorCode::INTERNAL_ERROR, "no answer for this key")))
        })
        .collect();
    match answer {
        Ok(items) if items.len() == checked.valid.len() => {
            for (i, item) in checked.valid.into_iter().zip(items) {
                out[i] = item.0;
            }
        }
        Ok(items) => {
            let why = format!(
                "the master answered {} items for {} keys",
                items.len(),
                checked.valid.len()
            );
            for i in checked.valid {
                out[i] = Err(Error::new(ErrorCode::INTERNAL_ERROR, why.clone()));
            }
        }
        Err(e) => {
            for i in checked.valid {
                out[i] = Err(e.clone());
            }
        }
    }
    out
}

impl Store {
    fn valid_keys(&self, keys: &[&str], checked: &Checked) -> Vec<String> {
        checked.valid.iter().map(|&i| keys[i].to_string()).collect()
    }

    /// Whether each key exists.
    pub async fn batch_exists(&self, keys: &[&str]) -> Vec<Result<bool>> {
        let checked = check_keys(keys);
        let request = KeysRequest {
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
        };
        let answer = self.master.batch_exist_key(request).await;
        merge(checked, answer)
    }

    /// Removes each key; `force` ignores read leases.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<Result<()>> {
        let checked = check_keys(keys);
        let request = BatchRemoveRequest {
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
            force,
        };
        let answer = self.master.batch_remove(request).await;
        merge(checked, answer)
    }

    /// Stores `values[i]` under `keys[i]` for every i: one BatchPutStart, all transfers in
    /// parallel, then one BatchPutEnd for the keys written and one BatchPutRevoke for the rest.
    /// `config.group_ids`, when set, holds one group per key.
    pub async fn batch_put_from(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        if keys.len() != values.len() {
            let why = format!("{} keys but {} values", keys.len(), values.len());
            return keys
                .iter()
                .map(|_| Err(Error::new(ErrorCode::INVALID_PARAMS, why.clone())))
                .collect();
        }
        let mut checked = check_keys(keys);
        checked.valid.retain(|&i| match check_value(values[i]) {
            Ok(()) => true,
            Err(e) => {
                checked.results[i] = Some(e);
                false
            }
        });
        let mut config = config.clone();
        if let Some(groups) = &config.group_ids {
            if groups.len() == keys.len() {
                config.group_ids = Some(checked.valid.iter().map(|&i| groups[i].clone()).collect());
            }
        }
        let request = BatchPutStartRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
            sizes: checked
                .valid
                .iter()
                .map(|&i| values[i].len() as u64)
                .collect(),
            config,
        };
        let valid = checked.valid.clone();
        let started = merge(checked, self.master.batch_put_start(request).await);

        // Write every allocated key in parallel.
        let writes = valid.iter().filter_map(|&i| match &started[i] {
            Ok(replicas) => {
                Some(async move { (i, self.write_replicas(keys[i], replicas, values[i]).await) })
            }
            Err(_) => None,
        });
        let written = join_all(writes).await;

        let mut results: Vec<Result<()>> = started
            .iter()
            .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect();
        let ids = |i: usize| -> Vec<ReplicaId> {
            started[i]
                .as_ref()
                .map(|r| r.iter().map(|d| d.id).collect())
                .unwrap_or_default()
        };
        let mut end_items = Vec::new();
        let mut revoke_items = Vec::new();
        let mut end_index = Vec::new();
        for (i, outcome) in written {
            match outcome {
                Ok(()) => {
                    end_items.push(EndItem {
                        key: keys[i].to_string(),
                        replica_ids: ids(i),
                        checksum: None,
                    });
                    end_index.push(i);
                }
                Err(e) => {
                    revoke_items.push(RevokeItem {
                        key: keys[i].to_string(),
                        replica_ids: ids(i),
                    });
                    results[i] = Err(e);
                }
            }
        }
        if !end_items.is_empty() {
            let end = BatchEndRequest {
                client_id: self.master.client_id(),
                tenant: self.tenant.clone(),
                replica_type: ReplicaType::All,
                items: end_items.clone(),
            };
            let answers = self.master.batch_put_end(end).await;
            for (slot, item) in end_index
                .iter()
                .zip(spread_answer(answers, end_items.len()))
            {
                if let Err(e) = item {
                    revoke_items.push(RevokeItem {
                        key: keys[*slot].to_string(),
                        replica_ids: ids(*slot),
                    });
                    results[*slot] = Err(e);
                }
            }
        }
        revoke_items
            .retain(|item| !self.defer_revoke(WriteKind::Put, &item.key, &item.replica_ids));
        if !revoke_items.is_empty() {
            let revoke = BatchRevokeRequest {
                client_id: self.master.client_id(),
                tenant: self.tenant.clone(),
                replica_type: ReplicaType::All,
                items: revoke_items,
            };
            if let Err(e) = self.master.batch_put_revoke(revoke).await {
                tracing::warn!(error = %e, "batch revoke did not go through; the master reclaims the space later");
            }
        }
        results
    }

    /// Reads each key into its buffer and returns its size: one BatchGetReplicaList, all
    /// transfers in parallel, one RevalidateReplicas for the keys whose lease ran out.
    pub async fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        if keys.len() != bufs.len() {
            let why = format!("{} keys but {} buffers", keys.len(), bufs.len());
            return keys
                .iter()
                .map(|_| Err(Error::new(ErrorCode::INVALID_PARAMS, why.clone())))
                .collect();
        }
        let (started, lists) = self.batch_lists(keys).await;
        let targets: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Some(&mut **b)).collect();
        self.read_batch(keys, lists, started, targets).await
    }

    /// Reads each key into a new buffer.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        let (started, lists) = self.batch_lists(keys).await;
        let mut bufs: Vec<Result<Vec<u8>>> = lists
            .iter()
            .zip(keys)
            .map(|(list, key)| {
                list.as_ref()
                    .map_err(Clone::clone)
                    .and_then(|l| zeroed(object_size(key, l)?))
            })
            .collect();
        let targets: Vec<Option<&mut [u8]>> = bufs
            .iter_mut()
            .map(|b| b.as_mut().ok().map(|v| v.as_mut_slice()))
            .collect();
        let sizes = self.read_batch(keys, lists, started, targets).await;
        bufs.into_iter()
            .zip(sizes)
            .map(|(buf, size)| size.and(buf))
            .collect()
    }

    async fn batch_lists(&self, keys: &[&str]) -> (Instant, Vec<Result<GetReplicaListResponse>>) {
        let checked = check_keys(keys);
        let request = KeysRequest {
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
        };
        let started = Instant::now();
        let answer = self.master.batch_get_replica_list(request).await;
        (started, merge(checked, answer))
    }

    async fn read_batch(
        &self,
        keys: &[&str],
        lists: Vec<Result<GetReplicaListResponse>>,
        started: Instant,
        targets: Vec<Option<&mut [u8]>>,
    ) -> Vec<Result<usize>> {
        let reads = lists
            .iter()
            .zip(targets)
            .zip(keys)
            .map(|((list, target), key)| async move {
                let list = list.as_ref().map_err(Clone::clone)?;
                let size = object_size(key, list)?;
                let target = target.ok_or_else(|| {
                    Error::new(ErrorCode::INTERNAL_ERROR, "no buffer for this key")
                })?;
                let buf = buffer_for(key, target, size)?;
                let replica = self.read_any_replica(key, &list.replicas, buf).await?;
                Ok::<_, Error>((size, replica))
            });
        let read = join_all(reads).await;

        // Keys whose lease ran out: confirm with the master in one call.
        let mut expired = Vec::new();
        let mut items = Vec::new();
        for (i, outcome) in read.iter().enumerate() {
            if let (Ok((_, replica)), Ok(list)) = (outcome, &lists[i]) {
                if lease_expired(started, list.lease_ttl_ms) {
                    expired.push(i);
                    items.push(RevalidateItem {
                        key: keys[i].to_string(),
                        replica_ids: vec![*replica],
                    });
                }
            }
        }
        let mut results: Vec<Result<usize>> =
            read.into_iter().map(|r| r.map(|(size, _)| size)).collect();
        if !items.is_empty() {
            for (i, verdict) in expired.into_iter().zip(self.revalidate(items).await) {
                if let Err(e) = verdict {
                    results[i] = Err(e);
                }
            }
        }
        results
    }
}

/// One result per item of a batch End/Revoke answer, or the call's error for each.
fn spread_answer(answer: Result<Vec<ItemResult<()>>>, expected: usize) -> Vec<Result<()>> {
    match answer {
        Ok(items) if items.len() == expected => items.into_iter().map(|i| i.0).collect(),
        Ok(items) => {
            let why = format!(
                "the master answered {} items for {expected} keys",
                items.len()
            );
            (0..expected)
                .map(|_| Err(Error::new(ErrorCode::INTERNAL_ERROR, why.clone())))
                .collect()
        }
        Err(e) => (0..expected).map(|_| Err(e.clone())).collect(),
    }
}
