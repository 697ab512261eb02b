//! What PUT_LOCAL and GET_LOCAL (requests the node serves whole) share: the key limit, the
//! master's batch answers as one result per key, the answer to the caller, and copying all the
//! keys of one request together, looking at the caller once per step ([`Copies`]).

use super::same_host::{RangeIndex, LOCAL_STEP};
use super::Conn;
use crate::same_host::IOV_MAX;
use crate::segment::SegmentMemory;
use moonkv_dataplane::header::{DataStatus, LocalPlan, RequestHeader, ResponseHeader};
use moonkv_proto::{Error, ErrorCode, ItemResult};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Most keys one request served whole may carry.
pub(crate) const MAX_KEYS: usize = 4096;

/// A batch answer of the master as one result per key (`n` of them): the whole call's error
/// for every key, or an error for every key when the count is off.
pub(super) fn per_key<T>(
    answer: Result<Vec<ItemResult<T>>, Error>,
    n: usize,
) -> Vec<Result<T, Error>> {
    match answer {
        Ok(items) if items.len() == n => items.into_iter().map(|i| i.0).collect(),
        Ok(items) => {
            let why = format!("the master answered {} items for {n} keys", items.len());
            (0..n)
                .map(|_| Err(Error::new(ErrorCode::INTERNAL_ERROR, why.clone())))
                .collect()
        }
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
}

/// Asks the master whether the replicas read for the keys of `expired` (key index, replica id:
/// reads whose lease ran out) are still current; a key whose replica is not gets
/// `LEASE_EXPIRED` in `results`, `when` saying when the lease ran out.
pub(super) async fn revalidate<T>(
    master: &super::MasterRoute,
    tenant: String,
    keys: &[String],
    expired: Vec<(usize, moonkv_proto::ReplicaId)>,
    results: &mut [Result<T, Error>],
    when: &str,
) {
    use moonkv_proto::msg::{Request, RevalidateItem, RevalidateRequest};
    if expired.is_empty() {
        return;
    }
    let request = Request::RevalidateReplicas(RevalidateRequest {
        tenant,
        items: expired
            .iter()
            .map(|(i, id)| RevalidateItem {
                key: keys[*i].clone(),
                replica_ids: vec![*id],
            })
            .collect(),
    });
    let verdicts = per_key::<()>(master.call(request).await, expired.len());
    for ((i, _), verdict) in expired.into_iter().zip(verdicts) {
        if let Err(e) = verdict {
            results[i] = Err(Error::new(
                ErrorCode::LEASE_EXPIRED,
                format!(
                    "the read lease of '{}' expired {when} and the replica read is no longer current ({e})",
                    keys[i]
                ),
            ));
        }
    }
}

/// Answers a request the node served whole with one result per key; `Ok(true)` when every key
/// succeeded.
pub(super) async fn answer_items<T: serde::Serialize>(
    stream: &mut Conn,
    h: &RequestHeader,
    results: &[ItemResult<T>],
) -> io::Result<bool> {
    let ok = results.iter().all(|r| r.0.is_ok());
    let answer = rmp_serde::to_vec_named(results).map_err(io::Error::other)?;
    let header = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: answer.len() as u64,
    };
    stream.write_all(&header.encode()).await?;
    stream.write_all(&answer).await.map(|()| ok)
}

/// [`answer_items`], and then what the master in this process left to do once the answer is
/// passed on (`then`, from [`super::MasterRoute::call_keeping_then`]: sending the End's
/// events, one per key): the answer is flushed first, so the caller need not wait for it.
pub(super) async fn answer_items_then<T: serde::Serialize>(
    stream: &mut Conn,
    h: &RequestHeader,
    results: &[ItemResult<T>],
    then: Option<Box<dyn Send>>,
) -> io::Result<bool> {
    let answered = answer_items(stream, h, results).await;
    if then.is_some() && answered.is_ok() {
        // A failed flush fails this connection's next write too; the events still leave.
        let _ = tokio::io::AsyncWriteExt::flush(stream).await;
    }
    drop(then);
    answered
}

/// The node's segments as one request finds them: the last one found is kept, so a batch whose
/// keys lie in one segment looks it up once, not once per key.
pub(super) struct Segments<'s> {
    served: &'s super::Served,
    last: Option<(moonkv_proto::SegmentId, Arc<SegmentMemory>)>,
}

impl<'s> Segments<'s> {
    pub(super) fn new(served: &'s super::Served) -> Segments<'s> {
        Segments { served, last: None }
    }

    /// Segment `id`, when this node serves it.
    pub(super) fn get(&mut self, id: moonkv_proto::SegmentId) -> Option<Arc<SegmentMemory>> {
        match &self.last {
            Some((last, segment)) if *last == id => Some(segment.clone()),
            _ => {
                let segment = self.served.segment(id)?;
                self.last = Some((id, segment.clone()));
                Some(segment)
            }
        }
    }
}

/// One replica of a key, copied with the request's other keys ([`Copies`]).
pub(super) struct Target {
    pub(super) key: usize,
    pub(super) segment: Arc<SegmentMemory>,
    pub(super) address: u64,
    /// Where the key's bytes start in the plan's ranges laid end to end.
    pub(super) at: u64,
    pub(super) size: u64,
}

/// Sorts `targets` in address order, the order their ranges are locked in, so that two
/// requests never wait on each other's ranges.
pub(super) fn in_lock_order(targets: &mut [Target]) {
    targets.sort_by_key(|t| (Arc::as_ptr(&t.segment), t.address));
}

/// Before [`Copies`] locks anything: whether the caller still waits. If it does not, every
/// key of `targets` gets `stopped()` in `results`.
pub(super) fn caller_waits<T>(
    peer: &crate::same_host::Peer,
    plan: &LocalPlan,
    targets: &[Target],
    results: &mut [Result<T, Error>],
    stopped: impl Fn() -> Error,
) -> bool {
    if peer.waiting(plan.deadline_ns) {
        return true;
    }
    for t in targets {
        results[t.key] = Err(stopped());
    }
    false
}

/// After [`Copies::run`]: a key of `targets` not copied whole gets `stopped()` in `results` if
/// the caller gave up, `failed()` otherwise (unless it already has an error).
pub(super) fn settle<T>(
    targets: &[Target],
    (whole, gave_up): (Vec<bool>, bool),
    results: &mut [Result<T, Error>],
    stopped: impl Fn() -> Error,
    failed: impl Fn() -> Error,
) {
    for t in targets {
        if results[t.key].is_ok() && !whole[t.key] {
            results[t.key] = Err(if gave_up { stopped() } else { failed() });
        }
    }
}

/// Keys up to this long are copied whole by one thread; longer ones are cut in pieces.
const WHOLE_MAX: usize = 256 << 10;

/// One copy of [`Copies`]: the key, the node's bytes (or a piece of them), the caller's ranges.
pub(super) type Item<P> = (usize, P, super::same_host::Ranges);

/// `items` in runs of neighbours of at least `target` bytes each (the last one may be shorter),
/// none of more than [`IOV_MAX`] items or caller ranges: each run is copied by one system call
/// when the caller's memory is not a shared pool, so a batch of small keys costs as few calls
/// as one object of its size.
fn runs<P: AsRef<[u8]>>(items: Vec<Item<P>>, target: usize) -> Vec<Vec<Item<P>>> {
    let mut runs = Vec::new();
    let mut run: Vec<Item<P>> = Vec::new();
    let (mut bytes, mut ranges) = (0usize, 0usize);
    for item in items {
        let (len, n) = (item.1.as_ref().len(), item.2.len());
        if !run.is_empty() && (run.len() == IOV_MAX || ranges + n > IOV_MAX) {
            runs.push(std::mem::take(&mut run));
            (bytes, ranges) = (0, 0);
        }
        bytes += len;
        ranges += n;
        run.push(item);
        if bytes >= target {
            runs.push(std::mem::take(&mut run));
            (bytes, ranges) = (0, 0);
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// Items are shared with the copy helper only when they average at least this many bytes.
const SHARED_ITEM_MIN: u64 = 32 << 10;

/// The copies of one request's keys, all together: shared between the request's thread and
/// the copy helper ([`crate::copy_helper`]), the caller looked at once per [`LOCAL_STEP`]
/// copied (so a batch of small keys costs no more system calls than one object of its size).
/// Each item is a key (or a piece of one) with the caller's ranges for it; a key is copied when
/// all its items are.
pub(super) struct Copies<'p, P> {
    plan: &'p LocalPlan,
    /// The plan's ranges, found by position.
    index: RangeIndex<'p>,
    items: Vec<Item<P>>,
    wanted: Vec<usize>,
    bytes: u64,
}

impl<'p, P: Send + AsRef<[u8]>> Copies<'p, P> {
    /// No copies yet, for a request of `keys` keys to and from the caller's `plan`.
    pub(super) fn new(keys: usize, plan: &'p LocalPlan) -> Copies<'p, P> {
        Copies {
            plan,
            index: RangeIndex::new(&plan.ranges),
            items: Vec::new(),
            wanted: vec![0; keys],
            bytes: 0,
        }
    }

    /// Adds key `key`'s copy between `view` (its bytes on this node, cut by `cut`) and the
    /// caller's bytes at `at` in the plan's ranges laid end to end.
    pub(super) fn add<V, I: IntoIterator<Item = P>>(
        &mut self,
        key: usize,
        at: u64,
        view: V,
        cut: impl FnOnce(V, usize) -> I,
        len: usize,
    ) {
        let piece = if len <= WHOLE_MAX {
            len.max(1)
        } else {
            crate::copy_helper::piece_len(len)
        };
        let mut from = at;
        for part in cut(view, piece) {
            let n = part.as_ref().len() as u64;
            self.items.push((key, part, self.index.between(from, n)));
            self.wanted[key] += 1;
            from += n;
        }
        self.bytes += len as u64;
    }

    /// Makes the copies, in runs of neighbouring items ([`runs`]): `step(run)` copies each
    /// item of a run (its bytes to or from its caller ranges). A run that fails leaves its keys
    /// not copied. Returns which keys were copied whole, and whether the caller stopped waiting
    /// before all were made.
    pub(super) fn run(
        self,
        peer: &crate::same_host::Peer,
        step: impl Fn(&mut [Item<P>]) -> io::Result<()> + Sync,
    ) -> (Vec<bool>, bool) {
        let deadline_ns = self.plan.deadline_ns;
        let made: Vec<AtomicUsize> = self.wanted.iter().map(|_| AtomicUsize::new(0)).collect();
        let since_look = AtomicUsize::new(0);
        crate::failpoints::hit(crate::failpoints::LOCAL_STEP_STALL);
        // Items of a few KiB are over before a hand-over pays: one thread copies them.
        let share = self.bytes >= crate::copy_helper::SPLIT_MIN as u64
            && self.bytes >= SHARED_ITEM_MIN * self.items.len() as u64;
        // Shared, runs as long as a piece of one object of the request's size, so both threads
        // get about as many; otherwise one thread copies runs of up to a step.
        let target = if share {
            crate::copy_helper::piece_len(self.bytes as usize)
        } else {
            LOCAL_STEP
        };
        let runs = runs(self.items, target);
        let copied = crate::copy_helper::split(runs, share, |mut run: Vec<Item<P>>| {
            let len: usize = run.iter().map(|(_, part, _)| part.as_ref().len()).sum();
            if since_look.fetch_add(len, Ordering::Relaxed) >= LOCAL_STEP {
                if !peer.waiting(deadline_ns) {
                    return Err(io::Error::other("the caller stopped waiting"));
                }
                since_look.store(len, Ordering::Relaxed);
            }
            match step(&mut run) {
                Ok(()) => {
                    for (key, _, _) in &run {
                        made[*key].fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "same-host copy failed"),
            }
            Ok(())
        });
        let whole = made
            .iter()
            .zip(&self.wanted)
            .map(|(made, wanted)| *wanted > 0 && made.load(Ordering::Relaxed) == *wanted)
            .collect();
        (whole, copied.is_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: usize, len: usize, ranges: usize) -> Item<Vec<u8>> {
        (
            key,
            vec![0; len],
            (0..ranges).map(|r| (r as u64, 1)).collect(),
        )
    }

    fn shape(runs: &[Vec<Item<Vec<u8>>>]) -> Vec<Vec<usize>> {
        runs.iter()
            .map(|run| run.iter().map(|(key, _, _)| *key).collect())
            .collect()
    }

    #[test]
    fn runs_gather_neighbours_up_to_the_target_and_the_iovec_limit_in_order() {
        // 32 keys of 128 KiB with a 256 KiB target: pairs, as one object's 16 pieces.
        let items = (0..32).map(|k| item(k, 128 << 10, 1)).collect();
        let pairs = runs(items, 256 << 10);
        assert_eq!(pairs.len(), 16);
        assert!(shape(&pairs)
            .iter()
            .enumerate()
            .all(|(i, run)| *run == [2 * i, 2 * i + 1]));
        // 128 keys of 4 KiB under one step: one run.
        let items = (0..128).map(|k| item(k, 4096, 1)).collect();
        assert_eq!(
            shape(&runs(items, LOCAL_STEP)),
            [(0..128).collect::<Vec<_>>()]
        );
        // A run closes at the item that reaches the target; a short tail is kept.
        let items = vec![
            item(0, 10, 1),
            item(1, 100, 1),
            item(2, 10, 1),
            item(3, 10, 1),
        ];
        assert_eq!(shape(&runs(items, 50)), [vec![0, 1], vec![2, 3]]);
        // Never more than IOV_MAX items, nor more than IOV_MAX caller ranges, in one run.
        let items = (0..2_500).map(|k| item(k, 1, 1)).collect();
        let lens: Vec<usize> = runs(items, usize::MAX).iter().map(Vec::len).collect();
        assert_eq!(lens, [IOV_MAX, IOV_MAX, 2_500 - 2 * IOV_MAX]);
        let items = (0..10).map(|k| item(k, 1, 300)).collect();
        let lens: Vec<usize> = runs(items, usize::MAX).iter().map(Vec::len).collect();
        assert_eq!(lens, [3, 3, 3, 1]);
        // One item with more ranges than the limit still makes a run (the copy splits it).
        let items = vec![item(0, 1, 2_000), item(1, 1, 1)];
        assert_eq!(shape(&runs(items, usize::MAX)), [vec![0], vec![1]]);
    }
}
