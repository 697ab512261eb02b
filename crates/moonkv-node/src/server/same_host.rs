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
                // Part of a long call, or past the cache's streaming bound: its bytes go into
                // the segment by streaming stores.
                let stream = plan.flags & LocalPlan::LONG_CALL != 0
                    || view.len() >= crate::copy::cache_stream_min();
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
                let stream = view.len() >= crate::copy::cache_stream_min();
                copy_local(peer, plan, view.len(), mid, |at, end, ranges| {
                    peer.write_to(&view[at..end], ranges, stream)
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
    let index = RangeIndex::new(&plan.ranges);
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
        let ranges = index.between(at as u64, (end - at) as u64);
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

/// The caller's ranges under one copy: nearly always one (a caller's buffer for a key is
/// contiguous), kept inline.
pub(super) type Ranges = smallvec::SmallVec<[(u64, u64); 2]>;

/// A plan's ranges, with where each starts when they are laid end to end: finds the ranges
/// under any span in O(log n), so the copies of a request of many keys cost no more per key
/// than those of a request of few ([`RangeIndex::between`]).
pub(super) struct RangeIndex<'r> {
    ranges: &'r [(u64, u64)],
    starts: Vec<u64>,
}

impl<'r> RangeIndex<'r> {
    pub(super) fn new(ranges: &'r [(u64, u64)]) -> RangeIndex<'r> {
        let mut pos = 0u64;
        let starts = ranges
            .iter()
            .map(|&(_, size)| {
                let start = pos;
                pos = pos.saturating_add(size);
                start
            })
            .collect();
        RangeIndex { ranges, starts }
    }

    /// The part of the ranges covering `[from, from + len)`.
    pub(super) fn between(&self, from: u64, len: u64) -> Ranges {
        let end = from.saturating_add(len);
        // The last range starting at or before `from`.
        let first = self
            .starts
            .partition_point(|&start| start <= from)
            .saturating_sub(1);
        let mut out = Ranges::new();
        for (&(address, size), &pos) in self.ranges.iter().zip(&self.starts).skip(first) {
            if pos >= end {
                break;
            }
            let (start, stop) = (pos.max(from), pos.saturating_add(size).min(end));
            if start < stop {
                out.push((address + (start - pos), stop - start));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::RangeIndex;

    /// The ranges under `[from, from + len)`, found by walking all of them.
    fn walked(ranges: &[(u64, u64)], from: u64, len: u64) -> Vec<(u64, u64)> {
        let (end, mut pos, mut out) = (from + len, 0u64, Vec::new());
        for &(address, size) in ranges {
            let (start, stop) = (pos.max(from), (pos + size).min(end));
            if start < stop {
                out.push((address + (start - pos), stop - start));
            }
            pos += size;
        }
        out
    }

    #[test]
    fn the_index_finds_the_ranges_a_walk_finds() {
        // Sizes with empty ranges, single bytes and larger ones, at scattered addresses.
        let sizes = [0u64, 5, 1, 0, 0, 7, 3, 64, 1, 0, 9];
        let ranges: Vec<(u64, u64)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| (1_000 * (i as u64 + 1) + 13 * i as u64, size))
            .collect();
        let total: u64 = sizes.iter().sum();
        let index = RangeIndex::new(&ranges);
        for from in 0..=total + 2 {
            for len in 0..=total + 2 - from {
                assert_eq!(
                    index.between(from, len).to_vec(),
                    walked(&ranges, from, len),
                    "from {from} len {len}"
                );
            }
        }
        assert!(RangeIndex::new(&[]).between(0, 10).is_empty());
    }
}
