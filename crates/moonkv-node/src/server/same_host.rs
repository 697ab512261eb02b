//! READ_LOCAL and WRITE_LOCAL on an attached connection: the plan naming the caller's ranges,
//! and the copy between segment memory and those ranges, in steps that each look at the
//! caller's deadline, process and connection first (see [`crate::same_host`]).

use super::{respond, Conn};
use crate::segment::SegmentMemory;
use moonkv_dataplane::header::{DataOp, DataStatus, LocalPlan, RequestHeader};
use std::io;
use std::sync::Arc;
use tokio::io::AsyncReadExt;

/// Reads the plan of a same-host request. A plan listing too many ranges cannot be skipped
/// safely: answered `BAD_HEADER` and the connection closed (`Err`). One whose ranges do not add
/// up to the header's length is consumed and refused (`Ok(Err)`).
pub(super) async fn read_plan(
    stream: &mut Conn,
    h: &RequestHeader,
) -> io::Result<Result<LocalPlan, DataStatus>> {
    let mut fixed = [0u8; LocalPlan::FIXED_LEN];
    stream.read_exact(&mut fixed).await?;
    let Some(count) = LocalPlan::count(&fixed) else {
        respond(stream, DataStatus::BadHeader, h.request_id).await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "same-host request with too many ranges",
        ));
    };
    let mut ranges = vec![0u8; count * 16];
    stream.read_exact(&mut ranges).await?;
    Ok(LocalPlan::decode(&fixed, &ranges, h.length).ok_or(DataStatus::OutOfRange))
}

/// Bytes a same-host copy moves between two looks at the caller's deadline and the runtime.
pub(super) const LOCAL_STEP: usize = 4 << 20;

/// Serves READ_LOCAL / WRITE_LOCAL: the range is checked and locked exactly as for READ / WRITE,
/// then copied straight between segment memory and the caller's ranges, in steps, each only
/// while the caller's deadline has not passed and the caller still runs.
pub(super) async fn serve_local(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
    peer: Option<&crate::same_host::Peer>,
    plan: &LocalPlan,
) -> io::Result<bool> {
    let Some(segment) = segment else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id)
            .await
            .map(|()| false);
    };
    let Some(peer) = peer else {
        return respond(stream, DataStatus::LocalRefused, h.request_id)
            .await
            .map(|()| false);
    };
    // The views check the range, as for READ / WRITE.
    let copied = if h.op == DataOp::WriteLocal as u8 {
        match segment.write_view(h.address, h.length).await {
            Ok(mut view) => {
                let mid = crate::failpoints::WRITE_MID_PAYLOAD;
                // Part of a long call: its bytes go into the segment by streaming stores.
                let stream = plan.flags & LocalPlan::LONG_CALL != 0;
                copy_local(peer, plan, view.len(), mid, |at, end, ranges| {
                    peer.read_from(&mut view[at..end], ranges, stream)
                })
                .await
            }
            Err(status) => Err(status),
        }
    } else {
        match segment.read_view(h.address, h.length).await {
            Ok(view) => {
                let mid = crate::failpoints::READ_MID_PAYLOAD;
                copy_local(peer, plan, view.len(), mid, |at, end, ranges| {
                    peer.write_to(&view[at..end], ranges)
                })
                .await
            }
            Err(status) => Err(status),
        }
    };
    let status = copied.err().unwrap_or(DataStatus::Ok);
    respond(stream, status, h.request_id)
        .await
        .map(|()| status == DataStatus::Ok)
}

/// Runs `step(from, to, caller ranges)` over `len` bytes in steps of at most [`LOCAL_STEP`];
/// with fault points compiled in, a step ends half-way and passes `mid` there, as the socket
/// path does.
pub(super) async fn copy_local(
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    len: usize,
    mid: &str,
    mut step: impl FnMut(usize, usize, &[(u64, u64)]) -> io::Result<()>,
) -> Result<(), DataStatus> {
    let half = cfg!(feature = "failpoints").then_some(len / 2);
    if half == Some(0) {
        crate::failpoints::hit(mid);
    }
    let mut at = 0;
    while at < len {
        // Past the deadline, the caller gone, or the caller shut its side of the connection
        // (it gave up the call and waits for this node to let go of its memory): no more steps.
        if !peer.waiting(plan.deadline_ns) {
            return Err(DataStatus::LocalRefused);
        }
        // The worst moment to be descheduled: checks passed, copy not started.
        crate::failpoints::hit(crate::failpoints::LOCAL_STEP_STALL);
        let mut end = (at + LOCAL_STEP).min(len);
        if let Some(half) = half.filter(|h| at < *h) {
            end = end.min(half);
        }
        let ranges = ranges_between(&plan.ranges, at as u64, (end - at) as u64);
        if let Err(e) = step(at, end, &ranges) {
            tracing::debug!(error = %e, "same-host copy failed");
            return Err(DataStatus::LocalRefused);
        }
        at = end;
        if half == Some(at) {
            crate::failpoints::hit(mid);
        }
        if at < len {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// One large object's copy (at least [`SPLIT_COPY_BYTES`]) on this thread and the process's
/// copy helper ([`crate::copy_helper`]): `pieces` are the node's side of the object cut up,
/// each with its offset in the object, and each thread takes the next piece not yet taken;
/// `step(piece, caller ranges)` copies one. Each piece is a step that looks at the caller
/// first, as in [`copy_local`]. Blocks the calling thread until the helper is out of the copy.
///
/// [`SPLIT_COPY_BYTES`]: moonkv_dataplane::same_host::SPLIT_COPY_BYTES
pub(super) fn copy_split<P: Send>(
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    pieces: Vec<(usize, usize, P)>,
    step: impl Fn(P, &[(u64, u64)]) -> io::Result<()> + Sync,
) -> Result<(), DataStatus> {
    let done = crate::copy_helper::split(pieces, true, |(at, len, piece)| {
        if !peer.waiting(plan.deadline_ns) {
            return Err(io::Error::other("the caller stopped waiting"));
        }
        crate::failpoints::hit(crate::failpoints::LOCAL_STEP_STALL);
        let ranges = ranges_between(&plan.ranges, at as u64, len as u64);
        step(piece, &ranges)
    });
    done.map_err(|e| {
        tracing::debug!(error = %e, "same-host copy failed");
        DataStatus::LocalRefused
    })
}

/// `dst` cut in [`crate::copy_helper::piece_len`] pieces for [`copy_split`].
pub(super) fn pieces_mut(dst: &mut [u8]) -> Vec<(usize, usize, &mut [u8])> {
    let piece = crate::copy_helper::piece_len(dst.len());
    dst.chunks_mut(piece)
        .enumerate()
        .map(|(i, p)| (i * piece, p.len(), p))
        .collect()
}

/// `src` cut in [`crate::copy_helper::piece_len`] pieces for [`copy_split`].
pub(super) fn pieces(src: &[u8]) -> Vec<(usize, usize, &[u8])> {
    let piece = crate::copy_helper::piece_len(src.len());
    src.chunks(piece)
        .enumerate()
        .map(|(i, p)| (i * piece, p.len(), p))
        .collect()
}

/// The part of `ranges` (laid end to end) covering bytes `[from, from + len)`.
pub(super) fn ranges_between(ranges: &[(u64, u64)], from: u64, len: u64) -> Vec<(u64, u64)> {
    let (end, mut pos) = (from + len, 0u64);
    let mut out = Vec::new();
    for &(address, size) in ranges {
        let (start, stop) = (pos.max(from), (pos + size).min(end));
        if start < stop {
            out.push((address + (start - pos), stop - start));
        }
        pos += size;
        if pos >= end {
            break;
        }
    }
    out
}
