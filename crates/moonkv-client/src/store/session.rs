//! Sessions: the pieces of a layer-by-layer transfer. A put session starts a batch of writes
//! once (BatchPutStart), writes their bytes in ranges over as many calls as the caller likes
//! ([`Store::write_ranges`]), and ends or revokes them once; a read session fetches a batch's
//! replica lists once and reads ranges of them ([`Store::read_ranges`]). Between start and end
//! no request goes to the master. What a session holds between calls (the replicas, the lease)
//! is the caller's to keep: these are the steps, not the bookkeeping.

use super::batch::{check_keys, merge, spread_answer};
use super::transfer::{ReadObject, WriteObject};
use super::Store;
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{Error, ErrorCode, ReplicaId, Result};

/// The byte ranges of one object written by [`Store::write_ranges`]: `(offset in the object,
/// bytes)` each.
pub struct RangeWrite<'a> {
    /// The object's replicas, as its session's start returned them.
    pub replicas: &'a [ReplicaDescriptor],
    /// The object's size.
    pub size: u64,
    pub pieces: Vec<(u64, &'a [u8])>,
}

/// The byte ranges of one object read by [`Store::read_ranges`]: `(offset in the object,
/// destination)` each.
pub struct RangeRead<'a> {
    /// The replica to read, from its session's replica list.
    pub replica: &'a ReplicaDescriptor,
    pub pieces: Vec<(u64, &'a mut [u8])>,
}

/// `[offset, offset + len)` lies inside an object of `size` bytes.
fn check_range(offset: u64, len: usize, size: u64) -> Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("the range {offset}+{len} lies outside the object's {size} bytes"),
        )),
    }
}

/// The part of `replica` from `offset`, `len` bytes long: a range of its memory that the data
/// plane reads or writes like a whole replica (its grant, if any, covers it).
fn sub_replica(replica: &ReplicaDescriptor, offset: u64, len: usize) -> ReplicaDescriptor {
    ReplicaDescriptor {
        address: replica.address + offset,
        size: len as u64,
        ..replica.clone()
    }
}

/// Sums one object's piece results: its bytes moved, or the first failure.
fn per_object(
    objects: usize,
    owner: &[usize],
    pieces: Vec<Result<()>>,
    lens: &[usize],
) -> Vec<Result<u64>> {
    let mut out: Vec<Result<u64>> = (0..objects).map(|_| Ok(0)).collect();
    for ((&i, result), &len) in owner.iter().zip(pieces).zip(lens) {
        match (&mut out[i], result) {
            (Ok(total), Ok(())) => *total += len as u64,
            (slot @ Ok(_), Err(e)) => *slot = Err(e),
            (Err(_), _) => {}
        }
    }
    out
}

impl Store {
    /// Starts writing every key (one BatchPutStart): each key's replicas, to write with
    /// [`Store::write_ranges`] and end with [`Store::end_writes`] or revoke with
    /// [`Store::revoke_writes`]. Sessions write memory replicas: a config asking for a disk
    /// replica is refused for every key.
    pub async fn start_writes(
        &self,
        keys: &[&str],
        sizes: &[u64],
        config: &ReplicateConfig,
    ) -> Vec<Result<Vec<ReplicaDescriptor>>> {
        let refuse = |why: &str| {
            keys.iter()
                .map(|_| Err(Error::new(ErrorCode::INVALID_PARAMS, why.to_string())))
                .collect()
        };
        if sizes.len() != keys.len() {
            return refuse("one size per key");
        }
        if config.with_disk_replica {
            return refuse("a put session writes memory replicas only (with_disk_replica is set)");
        }
        let mut checked = check_keys(keys);
        checked
            .valid
            .retain(|&i| match super::check_size(sizes[i]) {
                Ok(()) => true,
                Err(e) => {
                    checked.results[i] = Some(e);
                    false
                }
            });
        if config
            .group_ids
            .as_ref()
            .is_some_and(|g| g.len() != keys.len())
        {
            return refuse("group_ids must have one entry per key");
        }
        let request = self.start_request(keys, sizes, &checked, config);
        let answer = self
            .master
            .call::<Vec<ItemResult<Vec<ReplicaDescriptor>>>>(Request::BatchPutStart(request))
            .await;
        merge(checked, answer)
    }

    /// Writes each object's pieces into every one of its replicas: per object, the bytes
    /// written, or the first failure (a piece outside the object fails its object only).
    pub async fn write_ranges(&self, writes: &[RangeWrite<'_>]) -> Vec<Result<u64>> {
        let mut bad: Vec<Option<Error>> = writes
            .iter()
            .map(|w| {
                w.pieces
                    .iter()
                    .find_map(|(offset, bytes)| check_range(*offset, bytes.len(), w.size).err())
            })
            .collect();
        let mut owner = Vec::new();
        let mut lens = Vec::new();
        let mut replicas: Vec<Vec<ReplicaDescriptor>> = Vec::new();
        let mut parts: Vec<[&[u8]; 1]> = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            if bad[i].is_some() {
                continue;
            }
            for (offset, bytes) in &w.pieces {
                owner.push(i);
                lens.push(bytes.len());
                replicas.push(
                    w.replicas
                        .iter()
                        .map(|r| sub_replica(r, *offset, bytes.len()))
                        .collect(),
                );
                parts.push([*bytes]);
            }
        }
        let objects: Vec<WriteObject<'_>> = replicas
            .iter()
            .zip(&parts)
            .map(|(replicas, parts)| WriteObject {
                replicas,
                meta: self.file_meta(""),
                parts,
            })
            .collect();
        let written = self.transfer.write_objects(&objects).await;
        let mut out = per_object(writes.len(), &owner, written, &lens);
        for (slot, error) in out.iter_mut().zip(bad.iter_mut()) {
            if let Some(e) = error.take() {
                *slot = Err(e);
            }
        }
        out
    }

    /// Whether a write into any of `ids` may still be landing (a range write that timed out or
    /// was cancelled), so the object must not be ended: late bytes could change it afterwards.
    /// Each failed write is reported once; the caller keeps the answer (and revokes with
    /// `unsettled`).
    pub fn writes_unsettled(&self, ids: &[ReplicaId]) -> bool {
        use futures_util::FutureExt;
        // Settled already (its connection drained or closed): nothing can land any more. The
        // connections settle on their own; nobody needs to wait for them here.
        match self.transfer.unsettled(ids) {
            None => false,
            Some(settled) => !matches!(settled.now_or_never(), Some(true)),
        }
    }

    /// Ends the writes `(key, replica ids)` (one BatchPutEnd): one result per item.
    pub async fn end_writes(&self, items: &[(&str, Vec<ReplicaId>)]) -> Vec<Result<()>> {
        if items.is_empty() {
            return Vec::new();
        }
        let end = BatchEndRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            replica_type: ReplicaType::All,
            items: items
                .iter()
                .map(|(key, ids)| EndItem {
                    key: key.to_string(),
                    replica_ids: ids.iter().copied().collect(),
                    checksum: None,
                })
                .collect(),
        };
        spread_answer(
            self.master.call(Request::BatchPutEnd(end)).await,
            items.len(),
        )
    }

    /// Revokes the writes `(key, replica ids, unsettled)` (one BatchPutRevoke): one result per
    /// item. `unsettled`: a write into them may still land, so the master parks their space.
    pub async fn revoke_writes(&self, items: &[(&str, Vec<ReplicaId>, bool)]) -> Vec<Result<()>> {
        if items.is_empty() {
            return Vec::new();
        }
        let revoke = BatchRevokeRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            replica_type: ReplicaType::All,
            items: items
                .iter()
                .map(|(key, ids, unsettled)| RevokeItem {
                    key: key.to_string(),
                    replica_ids: ids.iter().copied().collect(),
                    unsettled: *unsettled,
                })
                .collect(),
        };
        spread_answer(
            self.master.call(Request::BatchPutRevoke(revoke)).await,
            items.len(),
        )
    }

    /// The replica a session reads: a complete memory replica, this process's own first.
    pub fn session_replica<'r>(
        &self,
        list: &'r GetReplicaListResponse,
    ) -> Option<&'r ReplicaDescriptor> {
        self.read_order(&list.replicas)
            .into_iter()
            .find(|r| r.kind == ReplicaKind::Memory)
    }

    /// Reads each object's pieces from its replica: per object, the bytes read, or the first
    /// failure (a piece outside the object fails its object only).
    pub async fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Vec<Result<u64>> {
        let mut bad: Vec<Option<Error>> = reads
            .iter()
            .map(|r| {
                r.pieces
                    .iter()
                    .find_map(|(offset, buf)| check_range(*offset, buf.len(), r.replica.size).err())
            })
            .collect();
        let mut owner = Vec::new();
        let mut lens = Vec::new();
        let mut subs: Vec<ReplicaDescriptor> = Vec::new();
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        for (i, r) in reads.iter_mut().enumerate() {
            if bad[i].is_some() {
                continue;
            }
            let replica = r.replica;
            for (offset, buf) in r.pieces.iter_mut() {
                owner.push(i);
                lens.push(buf.len());
                subs.push(sub_replica(replica, *offset, buf.len()));
                bufs.push(&mut **buf);
            }
        }
        let mut objects: Vec<ReadObject<'_>> = subs
            .iter()
            .zip(bufs)
            .map(|(replica, buf)| ReadObject {
                replica,
                parts: vec![buf],
            })
            .collect();
        let read = self.transfer.read_objects(&mut objects).await;
        drop(objects);
        let mut out = per_object(reads.len(), &owner, read, &lens);
        for (slot, error) in out.iter_mut().zip(bad.iter_mut()) {
            if let Some(e) = error.take() {
                *slot = Err(e);
            }
        }
        out
    }
}
