//! Batch forms: one master round trip per phase for all keys, the bytes of all keys in one
//! pipelined burst per connection (a few connections per node), and one result per key (a
//! failing key never fails the others).

use super::transfer::{ReadObject, WriteObject};
use super::{
    check_size, combine_failures, failover, first, fit_parts, lease_expired, no_complete_replica,
    object_size, zeroed, Store, WriteKind,
};
use crate::util::check_key;
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{Error, ErrorCode, Result};
use std::collections::HashMap;
use std::time::Instant;

/// Per-key slots: keys that passed local validation are sent; the others already hold an error.
pub(super) struct Checked {
    pub(super) results: Vec<Option<Error>>,
    pub(super) valid: Vec<usize>,
}

pub(super) fn check_keys(keys: &[&str]) -> Checked {
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
pub(super) fn merge<T>(checked: Checked, answer: Result<Vec<ItemResult<T>>>) -> Vec<Result<T>> {
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

    /// The BatchPutStart of the keys `checked` left valid, with their sizes; `config`'s group
    /// ids, when it has one per key of the whole batch, narrowed to those keys.
    pub(super) fn start_request(
        &self,
        keys: &[&str],
        sizes: &[u64],
        checked: &Checked,
        config: &ReplicateConfig,
    ) -> BatchPutStartRequest {
        let mut config = config.clone();
        if let Some(groups) = &config.group_ids {
            if groups.len() == keys.len() {
                config.group_ids = Some(checked.valid.iter().map(|&i| groups[i].clone()).collect());
            }
        }
        BatchPutStartRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, checked),
            sizes: checked.valid.iter().map(|&i| sizes[i]).collect(),
            config,
        }
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

    /// Drops the replicas of the objects among `keys` that this store wrote last and whose read
    /// leases have run out: all of them (the objects go) when `segment_name` is empty, else
    /// those on the segment of that name. The keys cleared, in the order given; keys that are
    /// not valid keys are skipped, like every key the master leaves as it was.
    pub async fn batch_replica_clear(
        &self,
        keys: &[&str],
        segment_name: &str,
    ) -> Result<Vec<String>> {
        let checked = check_keys(keys);
        let request = BatchReplicaClearRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
            segment_name: segment_name.to_string(),
        };
        self.master.batch_replica_clear(request).await
    }

    /// Stores `values[i]` under `keys[i]` for every i: one BatchPutStart, the bytes of every key
    /// in one pipelined burst per connection (a few connections per node), then one BatchPutEnd
    /// for the keys written and one BatchPutRevoke for the rest. `config.group_ids`, when set,
    /// holds one group per key.
    pub async fn batch_put_from(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let objects: Vec<&[&[u8]]> = values.iter().map(std::slice::from_ref).collect();
        self.batch_write(WriteKind::Put, keys, &objects, config)
            .await
    }

    /// Like [`Store::batch_put_from`], replacing existing values (BatchUpsertStart/End).
    pub async fn batch_upsert_from(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let objects: Vec<&[&[u8]]> = values.iter().map(std::slice::from_ref).collect();
        self.batch_write(WriteKind::Upsert, keys, &objects, config)
            .await
    }

    /// The batch write: object i is the concatenation of `objects[i]`. Keys that failed
    /// because a target node could not be reached were revoked; they are placed again (the
    /// master was told, so it avoids those nodes) while the failover window lasts.
    pub(crate) async fn batch_write(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        if keys.len() != objects.len() {
            return mismatch(keys, objects.len(), "values");
        }
        let valid = check_keys(keys).valid.len() == keys.len()
            && objects
                .iter()
                .all(|parts| check_size(parts.iter().map(|p| p.len() as u64).sum()).is_ok());
        if valid {
            let answers = if self.config.put_local_node.is_some() {
                self.put_through_node(kind, keys, objects, config).await
            } else {
                self.put_whole(kind, keys, objects, config).await
            };
            if let Some(answers) = answers {
                return self
                    .finish_elsewhere(kind, keys, objects, config, answers)
                    .await;
            }
        }
        self.batch_write_usual(kind, keys, objects, config).await
    }

    /// The keys a put through the node left over ([`Store::put_through_node`]), written the
    /// usual way; every key's result.
    async fn finish_elsewhere(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
        answers: super::put_local::NodeAnswers,
    ) -> Vec<Result<()>> {
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| answers[i].is_none()).collect();
        let mut results: Vec<Result<()>> =
            answers.into_iter().map(|a| a.unwrap_or(Ok(()))).collect();
        if rest.is_empty() {
            return results;
        }
        let (sub_keys, sub_objects, sub_config) = part_of(&rest, keys, objects, config);
        let written =
            Box::pin(self.batch_write_usual(kind, &sub_keys, &sub_objects, &sub_config)).await;
        for (i, result) in rest.into_iter().zip(written) {
            results[i] = result;
        }
        results
    }

    /// [`Store::batch_write`] through the master and the data plane, with failover.
    async fn batch_write_usual(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let mut window = failover::Window::start(self);
        let (mut results, mut retry) = self.batch_write_once(kind, keys, objects, config).await;
        loop {
            let again: Vec<usize> = (0..keys.len()).filter(|&i| retry[i].is_some()).collect();
            if again.is_empty() || !window.allows_another() {
                return results;
            }
            let mut down: Vec<String> = again
                .iter()
                .flat_map(|&i| retry[i].take().unwrap_or_default())
                .collect();
            down.sort();
            down.dedup();
            tracing::debug!(keys = again.len(), nodes = ?down, "target nodes unreachable; placing those keys again");
            self.report_unreachable(down).await;
            let (sub_keys, sub_objects, sub_config) = part_of(&again, keys, objects, config);
            let (sub_results, sub_retry) = self
                .batch_write_once(kind, &sub_keys, &sub_objects, &sub_config)
                .await;
            retry = vec![None; keys.len()];
            for ((i, result), r) in again.into_iter().zip(sub_results).zip(sub_retry) {
                let Err(error) = result else {
                    results[i] = Ok(());
                    continue;
                };
                let before = results[i].as_ref().err().cloned();
                let failed =
                    failover::keep_first_cause(failover::Failed { error, retry: r }, before);
                results[i] = Err(failed.error);
                retry[i] = failed.retry;
            }
        }
    }

    /// One attempt of [`Store::batch_write`]: a result per key, and for each key that failed
    /// because a node was unreachable (and was revoked at once), those nodes' endpoints.
    async fn batch_write_once(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> (Vec<Result<()>>, Vec<Option<Vec<String>>>) {
        let sizes: Vec<u64> = objects
            .iter()
            .map(|parts| parts.iter().map(|p| p.len() as u64).sum())
            .collect();
        let mut checked = check_keys(keys);
        checked.valid.retain(|&i| match check_size(sizes[i]) {
            Ok(()) => true,
            Err(e) => {
                checked.results[i] = Some(e);
                false
            }
        });
        let request = self.start_request(keys, &sizes, &checked, config);
        let valid = checked.valid.clone();
        let answer = self
            .master
            .call::<Vec<ItemResult<Vec<ReplicaDescriptor>>>>(kind.batch_start(request))
            .await;
        let started = merge(checked, answer);
        self.whole
            .note(started.iter().filter_map(|r| r.as_deref().ok()));
        // Dropped before it settles its keys (a caller's timeout), the call revokes them.
        let mut cancelled = super::RevokeIfCancelled::new(
            self,
            kind,
            started.iter().enumerate().filter_map(|(i, r)| {
                let ids = r.as_ref().ok()?.iter().map(|d| d.id).collect();
                Some((keys[i].to_string(), ids))
            }),
        );
        crate::failpoints::hit(crate::failpoints::AFTER_PUT_START);

        // Every allocated key's bytes, all at once.
        let allocated: Vec<usize> = valid
            .iter()
            .copied()
            .filter(|&i| started[i].is_ok())
            .collect();
        let writes: Vec<WriteObject<'_>> = allocated
            .iter()
            .map(|&i| WriteObject {
                replicas: started[i].as_deref().unwrap_or_default(),
                meta: self.file_meta(keys[i]),
                parts: objects[i],
            })
            .collect();
        let quiet = self.transfer.quiet_write(
            allocated
                .iter()
                .map(|&i| (started[i].as_deref().unwrap_or_default(), sizes[i] as usize)),
        );
        let written = self.transfer.write_objects(&writes).await;
        drop(writes);

        let mut results: Vec<Result<()>> = started
            .iter()
            .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect();
        let ids = |i: usize| -> ReplicaIds {
            started[i]
                .as_ref()
                .map(|r| r.iter().map(|d| d.id).collect())
                .unwrap_or_default()
        };
        let mut retry: Vec<Option<Vec<String>>> = vec![None; keys.len()];
        let mut end_items = Vec::new();
        // Each with its position in the batch.
        let mut revoke_items: Vec<(usize, RevokeItem)> = Vec::new();
        let mut end_index = Vec::new();
        for (&i, outcome) in allocated.iter().zip(written) {
            let outcome = if ids(i).is_empty() {
                Err(Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    format!("the master allocated no replica for '{}'", keys[i]),
                ))
            } else {
                outcome
            };
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
                    // A candidate for a second placement, if its revoke goes out now and one of
                    // its nodes turns out not to answer (checked below).
                    retry[i] = Some(Vec::new());
                    revoke_items.push((
                        i,
                        RevokeItem {
                            key: keys[i].to_string(),
                            replica_ids: ids(i),
                            unsettled: false,
                        },
                    ));
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
            let answers = self.master.call(kind.batch_end(end)).await;
            for (slot, item) in end_index
                .iter()
                .zip(spread_answer(answers, end_items.len()))
            {
                if let Err(e) = item {
                    revoke_items.push((
                        *slot,
                        RevokeItem {
                            key: keys[*slot].to_string(),
                            replica_ids: ids(*slot),
                            unsettled: false,
                        },
                    ));
                    results[*slot] = Err(e);
                }
            }
        }
        drop(quiet);
        // From here the call revokes its failed keys itself.
        cancelled.disarm();
        // Every failed key is revoked now, so it is free again as the batch returns; the space
        // of a write whose transfer timed out is parked at the master until it settles.
        let mut settling = Vec::new();
        for (i, item) in revoke_items.iter_mut() {
            if let Some(settled) = self.transfer.unsettled(&item.replica_ids) {
                item.unsettled = true;
                // Placed again like any failed key when a node of it does not answer: the new
                // replicas get new space, the old space stays parked until this settles.
                settling.push((*i, settled, item.replica_ids.clone()));
            }
        }
        let (sent_index, revoke_items): (Vec<usize>, Vec<RevokeItem>) =
            revoke_items.into_iter().unzip();
        let mut revoked = vec![false; keys.len()];
        if !revoke_items.is_empty() {
            let revoke = BatchRevokeRequest {
                client_id: self.master.client_id(),
                tenant: self.tenant.clone(),
                replica_type: ReplicaType::All,
                items: revoke_items,
            };
            let answer: Result<Vec<ItemResult<()>>> =
                self.master.call(kind.batch_revoke(revoke)).await;
            match answer {
                Ok(items) => {
                    // A key whose revoke was refused is still taken: no second placement.
                    for (&i, answer) in sent_index.iter().zip(items) {
                        if answer.0.is_err() {
                            retry[i] = None;
                        } else {
                            revoked[i] = true;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "batch revoke did not go through; the master reclaims the space later");
                    retry.iter_mut().for_each(|r| *r = None);
                }
            }
        }
        for (i, settled, ids) in settling {
            if revoked[i] {
                self.release_when_settled(settled, ids.into_vec());
            }
        }
        let mut probed = HashMap::new();
        for i in 0..keys.len() {
            if retry[i].is_none() {
                continue;
            }
            let (Ok(replicas), Err(error)) = (started[i].as_deref(), &results[i]) else {
                retry[i] = None;
                continue;
            };
            let down = self
                .unreachable_endpoints(replicas, error, &mut probed)
                .await;
            retry[i] = (!down.is_empty()).then_some(down);
        }
        (results, retry)
    }

    /// Reads each key into its buffer and returns its size: one BatchGetReplicaList, the bytes
    /// of every key in one pipelined burst per connection, one RevalidateReplicas for the keys
    /// whose lease ran out.
    pub async fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        if keys.len() != bufs.len() {
            return mismatch(keys, bufs.len(), "buffers");
        }
        let targets = bufs.iter_mut().map(|b| vec![&mut **b]).collect();
        self.read_keys_into(keys, targets).await
    }

    /// Reads each key into a new buffer.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        if !keys.is_empty() && keys.iter().all(|k| check_key(k).is_ok()) {
            if let Some(got) = self.batch_get_whole(keys).await {
                return got;
            }
        }
        let (started, lists) = self.batch_lists(keys).await;
        self.batch_get_listed(keys, lists, started).await
    }

    /// `batch_get` through GET_WHOLE (`get_whole.rs`), the keys the node leaves read with the
    /// lists it sent back; `None`: the node read nothing.
    async fn batch_get_whole(&self, keys: &[&str]) -> Option<Vec<Result<Vec<u8>>>> {
        use super::get_whole::{Sink, Took};
        let mut sinks: Vec<Sink<'_>> = keys.iter().map(|_| Sink::Fresh(None)).collect();
        let (started, took) = self.get_whole(keys, &mut sinks).await?;
        let mut results: Vec<Option<Result<Vec<u8>>>> = Vec::with_capacity(keys.len());
        let (mut rest_keys, mut rest_lists, mut rest_at) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (took, sink)) in took.into_iter().zip(sinks).enumerate() {
            results.push(match (took, sink) {
                (Took::Read(_), Sink::Fresh(Some(buf))) => Some(Ok(buf)),
                (Took::Failed(e), _) => Some(Err(e)),
                (Took::Listed(list), _) => {
                    rest_keys.push(keys[i]);
                    rest_lists.push(Ok(list));
                    rest_at.push(i);
                    None
                }
                (Took::Read(_), _) => Some(Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "no buffer for a key the node read",
                ))),
            });
        }
        if !rest_keys.is_empty() {
            let rest = self.batch_get_listed(&rest_keys, rest_lists, started).await;
            for (i, got) in rest_at.into_iter().zip(rest) {
                results[i] = Some(got);
            }
        }
        Some(super::every_key(results))
    }

    /// Reads each key, whose replica list is in `lists` (asked at `started`), into a new
    /// buffer.
    async fn batch_get_listed(
        &self,
        keys: &[&str],
        lists: Vec<Result<GetReplicaListResponse>>,
        started: Instant,
    ) -> Vec<Result<Vec<u8>>> {
        let mut bufs: Vec<Result<Vec<u8>>> = lists
            .iter()
            .zip(keys)
            .map(|(list, key)| {
                list.as_ref()
                    .map_err(Clone::clone)
                    .and_then(|l| zeroed(object_size(key, l)?))
            })
            .collect();
        let targets: Vec<Option<Vec<&mut [u8]>>> = bufs
            .iter_mut()
            .map(|b| b.as_mut().ok().map(|v| vec![v.as_mut_slice()]))
            .collect();
        let sizes = self.read_batch(keys, lists, started, targets).await;
        bufs.into_iter()
            .zip(sizes)
            .map(|(buf, size)| size.and(buf))
            .collect()
    }

    /// Every key's replica list and read lease (one BatchGetReplicaList), and when it was
    /// asked for (the leases run from then).
    pub async fn batch_lists(
        &self,
        keys: &[&str],
    ) -> (Instant, Vec<Result<GetReplicaListResponse>>) {
        let checked = check_keys(keys);
        let request = KeysRequest {
            tenant: self.tenant.clone(),
            keys: self.valid_keys(keys, &checked),
        };
        let started = Instant::now();
        let answer = self.master.batch_get_replica_list(request).await;
        (started, merge(checked, answer))
    }

    /// Reads every listed key into its parts: first all keys at once from their preferred
    /// replica, then, for keys whose preferred replica failed, the other replicas one by one.
    pub(crate) async fn read_batch(
        &self,
        keys: &[&str],
        lists: Vec<Result<GetReplicaListResponse>>,
        started: Instant,
        targets: Vec<Option<Vec<&mut [u8]>>>,
    ) -> Vec<Result<usize>> {
        let mut results: Vec<Result<usize>> = Vec::with_capacity(keys.len());
        let mut reads = Vec::new();
        let mut read_index = Vec::new();
        let mut plans = Vec::with_capacity(keys.len());
        for (i, (list, target)) in lists.iter().zip(targets).enumerate() {
            let planned = list.as_ref().map_err(Clone::clone).and_then(|list| {
                let size = object_size(keys[i], list)?;
                let target = target.ok_or_else(|| {
                    Error::new(ErrorCode::INTERNAL_ERROR, "no buffer for this key")
                })?;
                let parts = fit_parts(keys[i], target, size)?;
                let order = self.read_order(&list.replicas);
                Ok((size, order, parts))
            });
            match planned {
                Ok((size, order, parts)) if !order.is_empty() => {
                    results.push(Ok(size));
                    read_index.push(i);
                    reads.push(ReadObject {
                        replica: order[0],
                        parts,
                    });
                    plans.push(order);
                }
                Ok(_) => {
                    results.push(Err(no_complete_replica(keys[i])));
                    plans.push(Vec::new());
                }
                Err(e) => {
                    results.push(Err(e));
                    plans.push(Vec::new());
                }
            }
        }
        let outcomes = self.transfer.read_objects(&mut reads).await;
        let mut used = vec![None; keys.len()];
        for ((k, &i), outcome) in read_index.iter().enumerate().zip(outcomes) {
            let mut failures = Vec::new();
            let mut outcome = outcome;
            // Fall over to the other replicas of this key, one at a time.
            for replica in plans[i].iter().skip(1) {
                match outcome {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::debug!(key = keys[i], error = %e, "replica read failed");
                        failures.push(e);
                    }
                }
                reads[k].replica = replica;
                outcome = first(self.transfer.read_objects(&mut reads[k..=k]).await);
            }
            match outcome {
                Ok(()) => used[i] = Some(reads[k].replica.id),
                Err(e) => {
                    failures.push(e);
                    results[i] = Err(combine_failures(keys[i], failures));
                }
            }
        }

        // Keys whose lease ran out: confirm with the master in one call.
        let mut expired = Vec::new();
        let mut items = Vec::new();
        for (i, replica) in used.iter().enumerate() {
            if let (Some(replica), Ok(list)) = (replica, &lists[i]) {
                if lease_expired(started, list.lease_ttl_ms) {
                    expired.push(i);
                    items.push(RevalidateItem {
                        key: keys[i].to_string(),
                        replica_ids: vec![*replica],
                    });
                }
            }
        }
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
/// The keys and objects at `positions` of a batch write, and its config with their group ids
/// (when it has one per key).
fn part_of<'k, 'o>(
    positions: &[usize],
    keys: &[&'k str],
    objects: &[&'o [&'o [u8]]],
    config: &ReplicateConfig,
) -> (Vec<&'k str>, Vec<&'o [&'o [u8]]>, ReplicateConfig) {
    let mut sub_config = config.clone();
    if let Some(groups) = config.group_ids.as_ref().filter(|g| g.len() == keys.len()) {
        sub_config.group_ids = Some(positions.iter().map(|&i| groups[i].clone()).collect());
    }
    (
        positions.iter().map(|&i| keys[i]).collect(),
        positions.iter().map(|&i| objects[i]).collect(),
        sub_config,
    )
}

pub(super) fn spread_answer(
    answer: Result<Vec<ItemResult<()>>>,
    expected: usize,
) -> Vec<Result<()>> {
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

/// One error per key when the argument lists do not line up.
pub(crate) fn mismatch<T>(keys: &[&str], other: usize, what: &str) -> Vec<Result<T>> {
    let why = format!("{} keys but {other} {what}", keys.len());
    keys.iter()
        .map(|_| Err(Error::new(ErrorCode::INVALID_PARAMS, why.clone())))
        .collect()
}
