//! GET_WHOLE: a get taken whole by the node over the socket (`docs/data-plane.md`, *Callers
//! given the master*). The caller names its keys and how many bytes it takes for each; the
//! node asks its master for the replicas in the caller's tenant and sends, after one answer
//! per key, the bytes of each object it holds in its own memory. The caller's get is one round
//! trip instead of two (the replica list, then the bytes); in `moonkv up` the master runs in
//! the node's process, and that question never leaves it.
//!
//! A key the node does not read (no complete replica in its memory segments, or larger than
//! the caller takes) comes back with its replica list, so the caller reads it the usual way
//! without asking the master again. A master error for a key is that key's answer. Taken by
//! a node that checks no secrets and no grants, as PUT_WHOLE.

use super::get_local::{decode, readable_here};
use super::memory::write_all_vectored;
use super::whole::{in_lock_order, per_key, revalidate, Segments, Target};
use super::{respond, Conn, Served, MAX_DRAIN_BYTES};
use moonkv_dataplane::header::{DataStatus, GotWhole, RequestHeader, ResponseHeader};
use moonkv_proto::msg::{KeysRequest, Request};
use moonkv_proto::types::GetReplicaListResponse;
use moonkv_proto::{Error, ItemResult};
use std::io;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Serves one GET_WHOLE whose body was read.
pub(super) async fn serve_get_whole(
    stream: &mut Conn,
    h: &RequestHeader,
    served: &Served,
    body: &[u8],
) -> io::Result<bool> {
    let Some(master) = served.put_whole_master() else {
        return respond(stream, DataStatus::LocalRefused, h.request_id)
            .await
            .map(|()| false);
    };
    // Larger reads are not sent on one connection (the caller splits them).
    if h.length > MAX_DRAIN_BYTES {
        return respond(stream, DataStatus::TooLarge, h.request_id)
            .await
            .map(|()| false);
    }
    let Some((tenant, keys, capacities)) = decode(body, h.length) else {
        return respond(stream, DataStatus::OutOfRange, h.request_id)
            .await
            .map(|()| false);
    };
    let started = Instant::now();
    let n = keys.len();
    let request = Request::BatchGetReplicaList(KeysRequest {
        tenant: tenant.clone(),
        keys: keys.clone(),
    });
    let lists = per_key::<GetReplicaListResponse>(master.call(request).await, n);
    let mut results: Vec<Result<GotWhole, Error>> = Vec::with_capacity(n);
    let mut targets: Vec<Target> = Vec::new();
    // Each read key's replica id and lease.
    let mut chosen = Vec::new();
    let mut segments = Segments::new(served);
    for (i, list) in lists.into_iter().enumerate() {
        let list = match list {
            Ok(list) => list,
            Err(e) => {
                results.push(Err(e));
                continue;
            }
        };
        let here =
            readable_here(&mut segments, &list.replicas).filter(|(r, _)| r.size <= capacities[i]);
        let Some((replica, segment)) = here else {
            results.push(Ok(GotWhole::Elsewhere(list)));
            continue;
        };
        results.push(Ok(GotWhole::Bytes(replica.size)));
        targets.push(Target {
            key: i,
            segment,
            address: replica.address,
            at: 0,
            size: replica.size,
        });
        chosen.push((i, replica.id, list.lease_ttl_ms, list));
    }
    crate::failpoints::hit(crate::failpoints::GET_WHOLE_LISTED);
    in_lock_order(&mut targets);
    let mut views = Vec::with_capacity(targets.len());
    for t in &targets {
        match t.segment.read_view(t.address, t.size).await {
            Ok(view) => views.push((t.key, view)),
            // Read the usual way, which gives the usual errors.
            Err(_) => {
                if let Some((.., list)) = chosen.iter().find(|c| c.0 == t.key) {
                    results[t.key] = Ok(GotWhole::Elsewhere(list.clone()));
                }
            }
        }
    }
    // A lease that ran out before the ranges were locked: the bytes are the key's only if the
    // master says the replica is still current (they cannot change while locked).
    let leased_for = started.elapsed();
    let expired: Vec<_> = chosen
        .iter()
        .filter(|(i, _, lease_ms, _)| {
            matches!(results[*i], Ok(GotWhole::Bytes(_)))
                && leased_for >= Duration::from_millis(*lease_ms)
        })
        .map(|(i, id, ..)| (*i, *id))
        .collect();
    revalidate(
        master,
        tenant,
        &keys,
        expired,
        &mut results,
        "before the node read it",
    )
    .await;
    // The bytes of every key answered `Bytes`, in key order.
    views.retain(|(i, _)| matches!(results[*i], Ok(GotWhole::Bytes(_))));
    views.sort_by_key(|(i, _)| *i);
    let items: Vec<ItemResult<GotWhole>> = results.into_iter().map(ItemResult).collect();
    let ok = items.iter().all(|r| r.0.is_ok());
    let answer = rmp_serde::to_vec_named(&items).map_err(io::Error::other)?;
    let bytes: u64 = views.iter().map(|(_, v)| v.len() as u64).sum();
    let mut head = Vec::with_capacity(RESPONSE_HEAD + answer.len());
    head.extend_from_slice(
        &ResponseHeader {
            status: DataStatus::Ok,
            request_id: h.request_id,
            length: 4 + answer.len() as u64 + bytes,
        }
        .encode(),
    );
    head.extend_from_slice(&(answer.len() as u32).to_be_bytes());
    head.extend_from_slice(&answer);
    if cfg!(feature = "failpoints") && bytes > 0 {
        // Half of the bytes really reach the caller before the point is passed.
        stream.write_all(&head).await?;
        let mut half = bytes / 2;
        for (_, view) in &views {
            let take = (half as usize).min(view.len());
            stream.write_all(&view[..take]).await?;
            half -= take as u64;
        }
        stream.flush().await?;
        crate::failpoints::hit(crate::failpoints::READ_MID_PAYLOAD);
        let mut skip = bytes / 2;
        for (_, view) in &views {
            let from = (skip as usize).min(view.len());
            stream.write_all(&view[from..]).await?;
            skip -= from as u64;
        }
        return Ok(ok);
    }
    let mut slices: Vec<io::IoSlice<'_>> = std::iter::once(io::IoSlice::new(&head))
        .chain(views.iter().map(|(_, v)| io::IoSlice::new(&v[..])))
        .collect();
    write_all_vectored(stream, &mut slices).await.map(|()| ok)
}

/// Room for the response header and the answer's length.
const RESPONSE_HEAD: usize = moonkv_dataplane::header::RESPONSE_LEN + 4;
