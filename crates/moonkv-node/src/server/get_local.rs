//! GET_LOCAL: a same-host get taken whole by the node (`docs/data-plane.md`, *Gets through
//! the node*). The caller names its keys and its buffers once; the node asks its master for
//! the replicas in the caller's tenant, copies each object it holds in its own memory into the
//! caller's buffer, and confirms with the master the reads whose lease ran out, so the
//! caller's get crosses processes once instead of twice. In `moonkv up` the master runs in the
//! node's process, and that question never leaves it.
//!
//! Taken only on an attached connection, by a node that checks no secrets and no grants (as
//! PUT_LOCAL). A key the node cannot read itself (no complete replica in its memory segments,
//! a buffer too small) is answered `NOT_SUPPORTED` with nothing written, so the caller reads
//! it the usual way, which also gives the usual errors. A master error for a key (not found,
//! not ready) is that key's answer. The copy follows the rules of READ_LOCAL: nothing after
//! the caller's deadline, nothing once the caller is gone or gave up.

use super::whole::{
    answer_items, caller_waits, in_lock_order, per_key, revalidate, settle, Copies, Item, Segments,
    Target, MAX_KEYS,
};
use super::{respond, Conn, MasterRoute, Served};
use crate::segment::SegmentMemory;
use moonkv_dataplane::header::{DataStatus, LocalPlan, RequestHeader};
use moonkv_proto::msg::{KeysRequest, Request};
use moonkv_proto::types::GetReplicaListResponse;
use moonkv_proto::{
    Error, ErrorCode, ItemResult, ReplicaDescriptor, ReplicaId, ReplicaKind, ReplicaStatus,
};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Serves one GET_LOCAL whose plan and body were read.
pub(super) async fn serve_get_local(
    stream: &mut Conn,
    h: &RequestHeader,
    served: &Served,
    peer: Option<&crate::same_host::Peer>,
    plan: &LocalPlan,
    body: &[u8],
) -> io::Result<bool> {
    let (Some(peer), Some(master)) = (peer, served.put_local_master()) else {
        return respond(stream, DataStatus::LocalRefused, h.request_id)
            .await
            .map(|()| false);
    };
    let Some((tenant, keys, capacities)) = decode(body, h.length) else {
        return respond(stream, DataStatus::OutOfRange, h.request_id)
            .await
            .map(|()| false);
    };
    crate::copy_helper::warm(h.length);
    let results = get(served, master, peer, plan, tenant, keys, &capacities).await;
    let answered = answer_items(stream, h, &results).await;
    crate::copy_helper::answered(h.length);
    answered
}

/// The body, when it is well formed: as many buffer sizes as keys (at least one, at most
/// [`MAX_KEYS`]), adding up to the header's length.
pub(super) fn decode(body: &[u8], length: u64) -> Option<(String, Vec<String>, Vec<u64>)> {
    let (tenant, keys, capacities): (String, Vec<String>, Vec<u64>) =
        rmp_serde::from_slice(body).ok()?;
    let n = keys.len();
    let total = capacities
        .iter()
        .try_fold(0u64, |sum, size| sum.checked_add(*size))?;
    (n > 0 && n <= MAX_KEYS && capacities.len() == n && total == length)
        .then_some((tenant, keys, capacities))
}

/// The answer for a key this node leaves to the caller.
fn elsewhere(why: &str) -> Error {
    Error::new(
        ErrorCode::NOT_SUPPORTED,
        format!("{why}: read by the caller"),
    )
}

/// Replica lists, copies, revalidation: one result per key (its size).
async fn get(
    served: &Served,
    master: &MasterRoute,
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    tenant: String,
    keys: Vec<String>,
    capacities: &[u64],
) -> Vec<ItemResult<u64>> {
    let n = keys.len();
    let started = Instant::now();
    // The keys are lent to the request, and come back with it.
    let request = Request::BatchGetReplicaList(KeysRequest {
        tenant: tenant.clone(),
        keys,
    });
    let (answer, back) = master.call_keeping(request).await;
    let keys = match back {
        Some(Request::BatchGetReplicaList(request)) => request.keys,
        // The master in this process did not answer in time: every key failed, and no key is
        // revalidated, so none is read.
        _ => vec![String::new(); n],
    };
    let lists = per_key::<GetReplicaListResponse>(answer, n);
    let mut results: Vec<Result<u64, Error>> = Vec::with_capacity(n);
    // The replica of every key read here, copied together (`copy_keys`).
    let mut targets: Vec<Target> = Vec::new();
    // The replica each key is read from, with its lease.
    let mut chosen: Vec<Option<(ReplicaId, u64)>> = Vec::with_capacity(n);
    let mut segments = Segments::new(served);
    let mut offset = 0u64;
    for (i, list) in lists.into_iter().enumerate() {
        let at = offset;
        offset += capacities[i];
        chosen.push(None);
        let list = match list {
            Ok(list) => list,
            Err(e) => {
                results.push(Err(e));
                continue;
            }
        };
        let Some((replica, segment)) = readable_here(&mut segments, &list.replicas) else {
            results.push(Err(elsewhere("no complete replica in this node's memory")));
            continue;
        };
        if replica.size > capacities[i] {
            results.push(Err(elsewhere("the buffer is too small")));
            continue;
        }
        results.push(Ok(replica.size));
        targets.push(Target {
            key: i,
            segment,
            address: replica.address,
            at,
            size: replica.size,
        });
        chosen[i] = Some((replica.id, list.lease_ttl_ms));
    }
    copy_keys(peer, plan, targets, &mut results).await;
    // Reads whose lease ran out while this node copied: still current only if the master
    // says the replica read is.
    let leased_for = started.elapsed();
    let expired: Vec<(usize, ReplicaId)> = chosen
        .into_iter()
        .enumerate()
        .filter(|(i, _)| results[*i].is_ok())
        .filter_map(|(i, chosen)| {
            chosen
                .filter(|(_, lease_ms)| leased_for >= Duration::from_millis(*lease_ms))
                .map(|(id, _)| (i, id))
        })
        .collect();
    revalidate(
        master,
        tenant,
        &keys,
        expired,
        &mut results,
        "during the copy",
    )
    .await;
    results.into_iter().map(ItemResult).collect()
}

/// The answer for a key whose bytes were not copied because the caller gave up.
fn stopped_waiting() -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        "the caller stopped waiting before its bytes were copied",
    )
}

/// The answer for a key whose bytes could not be copied.
fn not_copied(status: DataStatus) -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        format!(
            "the node could not copy into the caller's buffer: {}",
            status.describe()
        ),
    )
}

/// Copies the keys of one request all together ([`Copies`]), their ranges locked in address
/// order first. A key whose copy failed, or was not made, gets its error in `results`.
async fn copy_keys(
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    mut targets: Vec<Target>,
    results: &mut [Result<u64, Error>],
) {
    if targets.is_empty() || !caller_waits(peer, plan, &targets, results, stopped_waiting) {
        return;
    }
    in_lock_order(&mut targets);
    let mut views = Vec::with_capacity(targets.len());
    for t in &targets {
        match t.segment.read_view(t.address, t.size).await {
            Ok(view) => views.push((t, view)),
            Err(status) => results[t.key] = Err(not_copied(status)),
        }
    }
    let mut copies = Copies::new(results.len(), plan);
    for (t, view) in &views {
        copies.add(t.key, t.at, &view[..], cut, view.len());
    }
    let pool_ids = crate::same_host::PoolIds::default();
    // A get of the cache's streaming bound or more streams into the caller's buffers
    // (`crate::copy::cache_stream_min`): its lines would not stay in the cache anyway.
    let bytes: usize = views.iter().map(|(_, v)| v.len()).sum();
    let stream = bytes >= crate::copy::cache_stream_min();
    let copied = copies.run(peer, |run: &mut [Item<&[u8]>]| {
        let parts = run.iter().map(|(_, src, r)| (*src, &r[..]));
        peer.write_many_seen(parts, stream, &pool_ids)
    });
    drop(views);
    settle(&targets, copied, results, stopped_waiting, || {
        not_copied(DataStatus::LocalRefused)
    });
}

fn cut(view: &[u8], piece: usize) -> std::slice::Chunks<'_, u8> {
    view.chunks(piece)
}

/// The replica this node reads a key from, and its segment: the first complete memory replica
/// in one of its own segments.
pub(super) fn readable_here<'r>(
    segments: &mut Segments<'_>,
    replicas: &'r [ReplicaDescriptor],
) -> Option<(&'r ReplicaDescriptor, Arc<SegmentMemory>)> {
    replicas.iter().find_map(|r| {
        (r.status == ReplicaStatus::Complete && r.kind == ReplicaKind::Memory)
            .then(|| segments.get(r.segment_id).map(|s| (r, s)))
            .flatten()
    })
}
