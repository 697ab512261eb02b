//! PUT_LOCAL: a same-host put taken whole by the node (`docs/data-plane.md`, *Puts through
//! the node*). The caller names its keys, sizes and memory once; the node starts the write at
//! its master as that caller, copies the bytes from the caller's memory into its own
//! segments, and ends it, so the caller's put crosses processes once instead of three times.
//! In `moonkv up` the master runs in the node's process, and the start and end never leave it.
//!
//! Taken only on an attached connection, by a node that checks no secrets and no grants (its
//! master trusts what a node asks in a caller's name, so a node that must check callers leaves
//! them on the three-step path). A key whose replicas the master placed anywhere but this
//! node's memory segments is revoked and answered `NOT_SUPPORTED`, so the caller writes it the
//! usual way. The copy follows the same rules as WRITE_LOCAL: nothing after the caller's
//! deadline, nothing once the caller is gone or gave up; a key not wholly copied is revoked,
//! never ended.

use super::whole::{
    answer_items_then, caller_waits, in_lock_order, per_key, settle, Copies, Item, Segments,
    Target, MAX_KEYS,
};
use super::{respond, Conn, MasterRoute, Served};
use moonkv_dataplane::header::{DataStatus, LocalPlan, RequestHeader};
use moonkv_proto::msg::{
    BatchEndRequest, BatchPutStartRequest, BatchRevokeRequest, EndItem, ReplicaIds, Request,
    RevokeItem,
};
use moonkv_proto::{
    ClientId, Error, ErrorCode, ItemResult, ReplicaDescriptor, ReplicaKind, ReplicaType,
};
use std::io;

/// Serves one PUT_LOCAL whose plan and body were read.
pub(super) async fn serve_put_local(
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
    let Some((upsert, request)) = decode(body, h.length) else {
        return respond(stream, DataStatus::OutOfRange, h.request_id)
            .await
            .map(|()| false);
    };
    crate::copy_helper::warm(h.length);
    let (results, events) = put(served, master, peer, plan, upsert, request).await;
    let answered = answer_items_then(stream, h, &results, events).await;
    crate::copy_helper::answered(h.length);
    answered
}

/// The body, when it is well formed: as many sizes as keys (at least one, at most
/// [`MAX_KEYS`]), adding up to the header's length.
pub(super) fn decode(body: &[u8], length: u64) -> Option<(bool, BatchPutStartRequest)> {
    let (upsert, request): (bool, BatchPutStartRequest) = rmp_serde::from_slice(body).ok()?;
    let n = request.keys.len();
    let total = request
        .sizes
        .iter()
        .try_fold(0u64, |sum, size| sum.checked_add(*size))?;
    (n > 0 && n <= MAX_KEYS && request.sizes.len() == n && total == length)
        .then_some((upsert, request))
}

/// Start, copy, end (or revoke): one result per key, and the End's events when the master in
/// this process left them to be sent (dropping them sends them).
async fn put(
    served: &Served,
    master: &MasterRoute,
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    upsert: bool,
    request: BatchPutStartRequest,
) -> (Vec<ItemResult<()>>, Option<Box<dyn Send>>) {
    let mut started = start(served, master, upsert, request).await;
    let targets = std::mem::take(&mut started.targets);
    let stream = streams(plan.flags, upsert, targets.iter().map(|t| t.size).sum());
    copy_keys(peer, plan, targets, stream, &mut started.results).await;
    // The caller gave up (or its time ran out) while this node copied: whatever was copied may
    // have changed under the copy, so none of it is ended.
    if !peer.waiting(plan.deadline_ns) {
        started.give_up(|| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                "the caller stopped waiting before its put was ended; revoked",
            )
        });
    }
    finish(master, started).await
}

/// Puts of at least this many bytes, into space the master has just allocated, are copied with
/// streaming stores ([`streams`]).
pub(crate) const FRESH_STREAM_MIN: u64 = crate::copy_helper::SPLIT_MIN as u64;

/// Whether a put's copies use streaming stores (`crate::copy`): for a long call (the caller's
/// `LONG_CALL`), for a put (not an upsert) of [`FRESH_STREAM_MIN`] bytes or more, and for any
/// put of the cache's streaming bound or more ([`crate::copy::cache_stream_min`]). A put's
/// ranges are newly allocated, so they are rarely in a cache: ordinary stores would read every
/// line before writing it. An upsert may rewrite an object of the same size in place, whose
/// lines a loop of rewrites keeps in the cache while the object and its source fit there, where
/// ordinary stores are faster. `flags` are the caller's plan's, `bytes` what the put copies into
/// this node.
fn streams(flags: u32, upsert: bool, bytes: u64) -> bool {
    streams_within(flags, upsert, bytes, crate::copy::cache_stream_min() as u64)
}

/// [`streams`] with the cache's streaming bound given.
fn streams_within(flags: u32, upsert: bool, bytes: u64, cache_min: u64) -> bool {
    flags & LocalPlan::LONG_CALL != 0
        || (!upsert && bytes >= FRESH_STREAM_MIN)
        || bytes >= cache_min
}

/// A write the node started at its master in a caller's name: each key's outcome so far, and
/// what ending or revoking it needs.
pub(super) struct Started {
    upsert: bool,
    client_id: ClientId,
    tenant: String,
    keys: Vec<String>,
    /// Each key's bytes, in the order they are laid end to end.
    pub(super) sizes: Vec<u64>,
    /// Each key's outcome so far.
    pub(super) results: Vec<Result<(), Error>>,
    /// The replica ids of the keys the master started, to end or revoke.
    ids: Vec<Option<ReplicaIds>>,
    /// Every replica in this node's memory of every key placed wholly here, in key order.
    pub(super) targets: Vec<Target>,
}

impl Started {
    /// Every started key not failed yet fails with `error()`: it is revoked, never ended.
    pub(super) fn give_up(&mut self, error: impl Fn() -> Error) {
        for (result, ids) in self.results.iter_mut().zip(&self.ids) {
            if ids.is_some() && result.is_ok() {
                *result = Err(error());
            }
        }
    }
}

/// Starts the write of `request` at the master as its caller; finds where each started key's
/// replicas are in this node's memory.
pub(super) async fn start(
    served: &Served,
    master: &MasterRoute,
    upsert: bool,
    request: BatchPutStartRequest,
) -> Started {
    let n = request.keys.len();
    let (client_id, tenant) = (request.client_id, request.tenant.clone());
    let sizes = request.sizes.clone();
    let start = if upsert {
        Request::BatchUpsertStart(request)
    } else {
        Request::BatchPutStart(request)
    };
    let (answer, back) = master
        .call_keeping::<Vec<ItemResult<Vec<ReplicaDescriptor>>>>(start)
        .await;
    let keys = match back {
        Some(Request::BatchPutStart(request) | Request::BatchUpsertStart(request)) => request.keys,
        // The master in this process did not answer in time: every key failed, and none is
        // ended or revoked (the master frees them at its release timeout), so no key is read.
        _ => vec![String::new(); n],
    };
    let outcomes = per_key(answer, n);
    let mut results: Vec<Result<(), Error>> = Vec::with_capacity(n);
    let mut ids: Vec<Option<ReplicaIds>> = Vec::with_capacity(n);
    let mut targets: Vec<Target> = Vec::with_capacity(n);
    let mut segments = Segments::new(served);
    let mut offset = 0u64;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let size = sizes[i];
        let at = offset;
        offset += size;
        let replicas = match outcome {
            Ok(replicas) => replicas,
            Err(e) => {
                results.push(Err(e));
                ids.push(None);
                continue;
            }
        };
        ids.push(Some(replicas.iter().map(|r| r.id).collect()));
        results.push(place_here(
            &mut segments,
            &replicas,
            i,
            at,
            size,
            &mut targets,
        ));
    }
    Started {
        upsert,
        client_id,
        tenant,
        keys,
        sizes,
        results,
        ids,
        targets,
    }
}

/// An End of at least this many keys leaves its events (one per key) to be sent after the
/// node's answer, when the master is in the node's process: encoding 32 of them took about
/// 20 µs of a 32 × 128 KiB put on the development VM. A smaller End sends them before the
/// answer: one 4 MiB put measured slower when its one event was sent after it.
const EVENTS_AFTER_ANSWER_MIN: usize = 8;

/// Ends every started key whose bytes are in, revokes every other started key; one result per
/// key, and what the End left to send ([`MasterRoute::call_keeping_then`]).
pub(super) async fn finish(
    master: &MasterRoute,
    started: Started,
) -> (Vec<ItemResult<()>>, Option<Box<dyn Send>>) {
    let Started {
        upsert,
        client_id,
        tenant,
        mut keys,
        mut results,
        ids,
        ..
    } = started;
    let mut events = None;
    let mut ended: Vec<(usize, ReplicaIds)> = Vec::new();
    let mut revoked: Vec<(usize, ReplicaIds)> = Vec::new();
    for (i, ids) in ids.into_iter().enumerate() {
        if let Some(ids) = ids {
            match results[i] {
                Ok(()) => ended.push((i, ids)),
                Err(_) => revoked.push((i, ids)),
            }
        }
    }
    if !ended.is_empty() {
        // The keys and ids are lent to the end, and come back with it.
        let items = ended
            .iter_mut()
            .map(|(i, ids)| EndItem {
                key: std::mem::take(&mut keys[*i]),
                replica_ids: std::mem::take(ids),
                checksum: None,
            })
            .collect();
        let end = BatchEndRequest {
            client_id,
            tenant: tenant.clone(),
            replica_type: ReplicaType::All,
            items,
        };
        let request = if upsert {
            Request::BatchUpsertEnd(end)
        } else {
            Request::BatchPutEnd(end)
        };
        let (answer, back, then) = master
            .call_keeping_then::<Vec<ItemResult<()>>>(request)
            .await;
        // A small End's events leave now, before the answer.
        events = then.filter(|_| ended.len() >= EVENTS_AFTER_ANSWER_MIN);
        // A master in this process that did not answer in time keeps what it was lent: the
        // keys it did not end are then not revoked, and it frees them at its release timeout.
        if let Some(Request::BatchPutEnd(end) | Request::BatchUpsertEnd(end)) = back {
            for ((i, ids), item) in ended.iter_mut().zip(end.items) {
                keys[*i] = item.key;
                *ids = item.replica_ids;
            }
        }
        let answers = per_key::<()>(answer, ended.len());
        for ((i, ids), answer) in ended.into_iter().zip(answers) {
            if let Err(e) = answer {
                results[i] = Err(e);
                revoked.push((i, ids));
            }
        }
    }
    if !revoked.is_empty() {
        let items = revoked
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(i, ids)| RevokeItem {
                key: keys[*i].clone(),
                replica_ids: ids.clone(),
                unsettled: false,
            })
            .collect::<Vec<_>>();
        if !items.is_empty() {
            let revoke = BatchRevokeRequest {
                client_id,
                tenant,
                replica_type: ReplicaType::All,
                items,
            };
            let request = if upsert {
                Request::BatchUpsertRevoke(revoke)
            } else {
                Request::BatchPutRevoke(revoke)
            };
            if let Err(e) = master.call::<Vec<ItemResult<()>>>(request).await {
                // The master frees them at its release timeout.
                tracing::debug!(error = %e, "revoking a put taken whole failed");
            }
        }
    }
    (results.into_iter().map(ItemResult).collect(), events)
}

/// The answer for a key whose bytes were not copied because the caller gave up.
fn stopped_waiting() -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        "the caller stopped waiting before its bytes were copied; revoked",
    )
}

/// The answer for a key whose bytes could not be copied.
pub(super) fn not_copied(status: DataStatus) -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        format!(
            "the node could not copy the caller's bytes: {}",
            status.describe()
        ),
    )
}

/// Adds to `targets` the copy of key `key` (`size` bytes at `at` in the caller's plan) into
/// each of its `replicas`, all of which must be memory replicas in this node's segments; adds
/// nothing, and answers why, when one is not.
fn place_here(
    segments: &mut Segments<'_>,
    replicas: &[ReplicaDescriptor],
    key: usize,
    at: u64,
    size: u64,
    targets: &mut Vec<Target>,
) -> Result<(), Error> {
    if replicas.is_empty() {
        return Err(Error::new(
            ErrorCode::NO_AVAILABLE_HANDLE,
            "the master placed no replica",
        ));
    }
    let before = targets.len();
    for r in replicas {
        let segment = (r.kind == ReplicaKind::Memory && r.size == size)
            .then(|| segments.get(r.segment_id))
            .flatten();
        let Some(segment) = segment else {
            targets.truncate(before);
            return Err(Error::new(
                ErrorCode::NOT_SUPPORTED,
                format!(
                    "a replica is not in this node's memory ({:?} on {}): written by the caller",
                    r.kind, r.endpoint
                ),
            ));
        };
        targets.push(Target {
            key,
            segment,
            address: r.address,
            at,
            size,
        });
    }
    Ok(())
}

/// Copies the keys of one request all together ([`Copies`]), their ranges locked in address
/// order first; `stream`: with streaming stores ([`streams`]). A key any of whose copies
/// failed, or was not made, gets its error in `results`.
async fn copy_keys(
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    mut targets: Vec<Target>,
    stream: bool,
    results: &mut [Result<(), Error>],
) {
    if targets.is_empty() || !caller_waits(peer, plan, &targets, results, stopped_waiting) {
        return;
    }
    in_lock_order(&mut targets);
    let mut views = Vec::with_capacity(targets.len());
    for t in &targets {
        match t.segment.write_view(t.address, t.size).await {
            Ok(view) => views.push((t, view)),
            Err(status) => results[t.key] = Err(not_copied(status)),
        }
    }
    let mut copies = Copies::new(results.len(), plan);
    for (t, view) in &mut views {
        let len = view.len();
        copies.add(t.key, t.at, &mut view[..], cut_mut, len);
    }
    // The caller's pool ids, read once for all the keys of this request.
    let pool_ids = crate::same_host::PoolIds::default();
    let copied = copies.run(peer, |run: &mut [Item<Piece<'_>>]| {
        let parts = run.iter_mut().map(|(_, dst, r)| (&mut *dst.0, &r[..]));
        peer.read_many_seen(parts, stream, &pool_ids)
    });
    drop(views);
    settle(&targets, copied, results, stopped_waiting, || {
        not_copied(DataStatus::LocalRefused)
    });
}

/// A piece of the node's side of a put.
struct Piece<'a>(&'a mut [u8]);

impl AsRef<[u8]> for Piece<'_> {
    fn as_ref(&self) -> &[u8] {
        self.0
    }
}

fn cut_mut(view: &mut [u8], piece: usize) -> impl Iterator<Item = Piece<'_>> {
    view.chunks_mut(piece).map(Piece)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_calls_large_fresh_puts_and_copies_past_the_cache_bound_stream() {
        let long = LocalPlan::LONG_CALL;
        // With the bound of a 32 MiB cache (8 MiB): a put of 2 MiB or more goes to newly
        // allocated space and streams; an upsert, which may rewrite in place while it fits in
        // the cache, keeps ordinary stores below the bound unless its call is long.
        let big = 8 << 20;
        assert!(streams_within(0, false, FRESH_STREAM_MIN, big));
        assert!(streams_within(0, false, 4 << 20, big));
        assert!(!streams_within(0, false, FRESH_STREAM_MIN - 1, big));
        assert!(!streams_within(0, false, 4096, big));
        assert!(!streams_within(0, true, 4 << 20, big));
        assert!(streams_within(0, true, 8 << 20, big));
        assert!(streams_within(0, true, 64 << 20, big));
        assert!(streams_within(long, true, 4 << 20, big));
        assert!(streams_within(long, false, 4096, big));
        // With the bound of an 8 MiB cache (2 MiB), a 4 MiB upsert streams too.
        assert!(streams_within(0, true, 4 << 20, 2 << 20));
        assert!(!streams_within(0, true, (2 << 20) - 1, 2 << 20));
        // This machine's bound is what `streams` uses.
        let here = crate::copy::cache_stream_min() as u64;
        assert!(streams(0, true, here));
        assert!(!streams(0, true, here - 1));
    }
}
