//! Running a store's calls on the calling thread, for callers that block (Python bindings,
//! benchmark threads).
//!
//! A [`Store`] built by [`Store::connect`] lives in a multi-threaded runtime: an answer is read
//! by one of its worker threads, which then wakes the thread waiting in `block_on`. Every wait
//! therefore costs two wake-ups, and on virtual machines a wake-up that crosses CPUs is the most
//! expensive part of a small call (a loopback round trip between two sleeping threads is ~70 µs
//! on the 2-vCPU machine of `docs/benchmarks.md`, ~20 µs when the waiting side keeps polling).
//!
//! A [`CallerLane`] is a single-threaded runtime with connections of its own (a
//! [`Store::sibling`]): its `block_on` drives those sockets on the calling thread, so the thread
//! that waits is the one that reads its answer. While it waits it first polls its sockets
//! without sleeping for up to `spin` (each poll is one non-blocking `epoll_wait`), then sleeps
//! in `epoll_wait` as usual; it also sleeps while its call waits for a long same-host copy
//! (`QUIET_BYTES` or more), which the node makes with CPUs the polling would take, or for a
//! long socket transfer (`QUIET_SOCKET_BYTES` or more), which outlasts any poll. At most
//! half the machine's CPUs (at least one) poll at once across
//! the process, so spinning callers cannot starve the runtime's worker threads or an embedded
//! node. Lanes are pooled: a call takes an idle lane (or opens one, up to `cap`), and returns it
//! afterwards; with every lane busy, [`CallerLanes::checkout`] answers `None` and the caller
//! uses the store's own runtime.
//!
//! A lane's connections only make progress while some thread runs a call on it. Background
//! work a call leaves behind (settling a timed-out write, then revoking it) therefore keeps its
//! lane out of the pool: a helper thread drives it until that work is done.

use super::Store;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Threads of this process polling their sockets right now.
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// How many threads may poll at once: half the CPUs, at least one.
fn spin_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get() / 2)
            .max(1)
    })
}

/// A place among the polling threads; given back on drop.
struct SpinSlot;

impl SpinSlot {
    fn take() -> Option<SpinSlot> {
        let limit = spin_limit();
        SPINNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One single-threaded runtime and the sibling store whose connections live in it.
struct Lane {
    runtime: tokio::runtime::Runtime,
    store: Store,
}

/// A pool of lanes for one store.
pub struct CallerLanes {
    base: Store,
    idle: Mutex<Vec<Lane>>,
    /// Lanes that exist (idle or checked out).
    open: AtomicUsize,
    cap: usize,
    spin: Duration,
    closed: std::sync::atomic::AtomicBool,
}

impl CallerLanes {
    /// Lanes for `base`: at most `cap` at once, each polling for up to `spin` before it sleeps.
    /// `None` when `cap` is 0, or when `base` follows the leader of an HA cluster (the leader
    /// lookup keeps an etcd connection that belongs to the store's own runtime).
    pub fn new(base: &Store, cap: usize, spin: Duration) -> Option<CallerLanes> {
        if cap == 0 || base.master().follows_leader() {
            return None;
        }
        Some(CallerLanes {
            base: base.clone(),
            idle: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            cap,
            spin,
            closed: Default::default(),
        })
    }

    /// An idle lane, or a new one while fewer than `cap` exist; `None` when every lane is in
    /// use or the pool is closed (the caller then uses the store's own runtime).
    pub fn checkout(&self) -> Option<CallerLane<'_>> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        if let Some(lane) = self.idle.lock().pop() {
            return Some(CallerLane {
                lanes: self,
                lane: Some(lane),
            });
        }
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()?;
        match self.open_lane() {
            Some(lane) => Some(CallerLane {
                lanes: self,
                lane: Some(lane),
            }),
            None => {
                self.open.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    fn open_lane(&self) -> Option<Lane> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .inspect_err(|e| tracing::warn!(error = %e, "cannot build a caller lane's runtime"))
            .ok()?;
        let store = self
            .base
            .sibling()
            .inspect_err(|e| tracing::warn!(error = %e, "cannot build a caller lane's store"))
            .ok()?;
        Some(Lane { runtime, store })
    }

    /// Lanes that exist now (idle or in use).
    pub fn open_lanes(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Closes the idle lanes' connections; lanes in use close when their call returns, and no
    /// new lane is handed out.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let idle = std::mem::take(&mut *self.idle.lock());
        for lane in idle {
            self.retire(lane);
        }
    }

    fn retire(&self, lane: Lane) {
        lane.runtime.block_on(lane.store.master().close());
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    fn give_back(&self, lane: Lane) {
        if lane.store.background_tasks() > 0 {
            // Its connections move only while a thread drives the lane: finish the work on a
            // thread of its own, then close it.
            self.open.fetch_sub(1, Ordering::AcqRel);
            let spawned = std::thread::Builder::new()
                .name("moonkv-lane-drain".into())
                .spawn(move || drain(lane));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread to finish a lane's background work; it is dropped");
            }
            return;
        }
        if self.closed.load(Ordering::Acquire) {
            self.retire(lane);
        } else {
            self.idle.lock().push(lane);
        }
    }
}

/// Drives a lane until its background work ended, then closes it.
fn drain(lane: Lane) {
    lane.runtime.block_on(async {
        while lane.store.background_tasks() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lane.store.master().close().await;
    });
}

/// A lane checked out for one call; goes back to its pool on drop.
pub struct CallerLane<'a> {
    lanes: &'a CallerLanes,
    lane: Option<Lane>,
}

impl CallerLane<'_> {
    /// The lane's store (a clone; its connections belong to this lane's runtime, so use it only
    /// inside [`CallerLane::block_on`]).
    pub fn store(&self) -> Store {
        self.lane().store.clone()
    }

    fn lane(&self) -> &Lane {
        self.lane
            .as_ref()
            .expect("a checked-out lane holds its lane until dropped")
    }

    /// Runs `work` to completion on the calling thread, which must not be inside an async
    /// runtime: first polling for up to the pool's `spin` (when a polling slot is free), then
    /// sleeping until its sockets are ready.
    pub fn block_on<F: Future>(&self, work: F) -> F::Output {
        let spin = self.lanes.spin;
        let store = &self.lane().store;
        self.lane().runtime.block_on(async move {
            settle().await;
            let mut work = std::pin::pin!(work);
            if spin.is_zero() {
                return work.await;
            }
            let mut until = Instant::now() + spin;
            while let Some(slot) = SpinSlot::take() {
                loop {
                    if let Poll::Ready(out) = poll_once(work.as_mut()).await {
                        return out;
                    }
                    if store.waits_quietly() {
                        break;
                    }
                    if Instant::now() >= until {
                        return work.await;
                    }
                    // Deferred until the runtime polled its sockets without waiting.
                    tokio::task::yield_now().await;
                }
                // A long same-host copy: the node needs the CPUs more than this thread, which
                // sleeps until the copy is over (then polls again, with a fresh budget) or the
                // call is done.
                drop(slot);
                match quietly(work.as_mut(), || store.waits_quietly()).await {
                    Poll::Ready(out) => return out,
                    Poll::Pending => until = Instant::now() + spin,
                }
            }
            work.await
        })
    }
}

/// Drives `work` without polling: ready with its output, or pending once `quiet()` turns false
/// (checked after each poll of `work`, which is what ends a long same-host copy).
async fn quietly<F: Future>(mut work: Pin<&mut F>, quiet: impl Fn() -> bool) -> Poll<F::Output> {
    std::future::poll_fn(|cx| match work.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Poll::Ready(out)),
        Poll::Pending if quiet() => Poll::Pending,
        Poll::Pending => Poll::Ready(Poll::Pending),
    })
    .await
}

impl Drop for CallerLane<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            self.lanes.give_back(lane);
        }
    }
}

/// Lets the lane's connection tasks see what arrived while it sat idle (a connection the master
/// closed is then known to be dead before a request is written to it).
async fn settle() {
    for _ in 0..2 {
        tokio::task::yield_now().await;
    }
}

/// Polls `fut` once.
async fn poll_once<F: Future>(mut fut: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_quiet_wait_ends_with_the_work_or_with_the_quiet() {
        // The work finishes while quiet: its output comes back.
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let work = std::pin::pin!(async move { rx.await.unwrap() });
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(5).unwrap();
        });
        assert_eq!(quietly(work, || true).await, Poll::Ready(5));

        // The work's long copy ends (it clears the flag) but the work goes on: the wait ends
        // without an output, so the caller can poll again, and the work is left intact.
        let quiet = Arc::new(AtomicBool::new(true));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (tx2, rx2) = tokio::sync::oneshot::channel::<u32>();
        let flag = quiet.clone();
        let mut work = std::pin::pin!(async move {
            rx.await.unwrap();
            flag.store(false, Ordering::Release);
            rx2.await.unwrap()
        });
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(()).unwrap();
        });
        let state = quiet.clone();
        assert_eq!(
            quietly(work.as_mut(), || state.load(Ordering::Acquire)).await,
            Poll::Pending
        );
        tx2.send(9).unwrap();
        assert_eq!(work.await, 9);
    }
}
