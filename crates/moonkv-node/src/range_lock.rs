//! Byte-range reader/writer lock: overlapping accesses exclude each other when one of them
//! writes; disjoint ranges never wait for each other. The table of held ranges is guarded by a
//! short critical section only, never across I/O.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

struct Held {
    token: u64,
    start: usize,
    end: usize,
    exclusive: bool,
}

/// The lock table of one segment.
#[derive(Default)]
pub(crate) struct RangeLock {
    held: Mutex<Vec<Held>>,
    released: Notify,
    /// Acquisitions waiting for a release right now: a release with none skips the wake-up.
    waiting: AtomicUsize,
    next_token: AtomicU64,
    /// Acquisitions that found their range held and had to wait.
    waits: AtomicU64,
    /// Time those acquisitions waited, in microseconds.
    waited_us: AtomicU64,
}

/// A held range; released on drop.
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    token: u64,
}

/// Counts an acquisition in [`RangeLock::waiting`] while it waits (also when it is dropped
/// waiting).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RangeLock {
    /// Waits until `[start, end)` can be held (shared, or exclusive when `exclusive`).
    pub async fn acquire(&self, start: usize, end: usize, exclusive: bool) -> RangeGuard<'_> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        if self.try_hold(token, start, end, exclusive) {
            return RangeGuard { lock: self, token };
        }
        // Counted before the check below: a release that removes a range after that check
        // then sees a waiter, and wakes it.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        self.waits.fetch_add(1, Ordering::Relaxed);
        let since = std::time::Instant::now();
        loop {
            // Register interest before checking, so a release between the check and the wait is
            // not missed.
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.try_hold(token, start, end, exclusive) {
                let waited = since.elapsed().as_micros();
                self.waited_us
                    .fetch_add(waited.min(u64::MAX as u128) as u64, Ordering::Relaxed);
                return RangeGuard { lock: self, token };
            }
            notified.await;
        }
    }

    /// Holds `[start, end)` under `token` if no held range conflicts with it.
    fn try_hold(&self, token: u64, start: usize, end: usize, exclusive: bool) -> bool {
        let mut held = self.held.lock();
        let conflict = held
            .iter()
            .any(|h| h.start < end && start < h.end && (h.exclusive || exclusive));
        if !conflict {
            held.push(Held {
                token,
                start,
                end,
                exclusive,
            });
        }
        !conflict
    }

    /// Acquisitions that had to wait, and the microseconds they waited in total.
    pub fn waits(&self) -> (u64, u64) {
        (
            self.waits.load(Ordering::Relaxed),
            self.waited_us.load(Ordering::Relaxed),
        )
    }

    #[cfg(test)]
    fn held_count(&self) -> usize {
        self.held.lock().len()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.lock.held.lock();
        if let Some(i) = held.iter().position(|h| h.token == self.token) {
            held.swap_remove(i);
        }
        drop(held);
        if self.lock.waiting.load(Ordering::SeqCst) > 0 {
            self.lock.released.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn disjoint_ranges_and_shared_reads_do_not_wait() {
        let lock = RangeLock::default();
        let _a = lock.acquire(0, 10, true).await;
        let _b = lock.acquire(10, 20, true).await;
        let _c = lock.acquire(20, 30, false).await;
        let _d = lock.acquire(25, 30, false).await;
        assert_eq!(lock.held_count(), 4);
        assert_eq!(lock.waits().0, 0);
    }

    #[tokio::test]
    async fn an_overlapping_writer_waits_for_the_reader() {
        let lock = std::sync::Arc::new(RangeLock::default());
        let reader = lock.acquire(0, 100, false).await;
        let lock2 = lock.clone();
        let writer = tokio::spawn(async move {
            let _g = lock2.acquire(50, 60, true).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!writer.is_finished());
        assert_eq!(lock.waits().0, 1, "the writer's wait is counted once");
        drop(reader);
        tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lock.held_count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_writers_of_one_range_take_turns_and_none_is_left_waiting() {
        // Writers that find the range free take it without registering for a wake-up; those
        // that find it held must still be woken by every release.
        let lock = std::sync::Arc::new(RangeLock::default());
        let inside = std::sync::Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (lock, inside) = (lock.clone(), inside.clone());
                tokio::spawn(async move {
                    for i in 0..300 {
                        let _g = lock.acquire(t, 64 + (i % 7), true).await;
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two writers in");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a writer was never woken")
                .unwrap();
        }
        assert_eq!(lock.held_count(), 0);
        assert_eq!(lock.waiting.load(Ordering::SeqCst), 0);
    }
}
