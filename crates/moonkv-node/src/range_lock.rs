//! Byte-range reader/writer lock: overlapping accesses exclude each other when one of them
//! writes; disjoint ranges never wait for each other. The table of held ranges is guarded by a
//! short critical section only, never across I/O.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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

impl RangeLock {
    /// Waits until `[start, end)` can be held (shared, or exclusive when `exclusive`).
    pub async fn acquire(&self, start: usize, end: usize, exclusive: bool) -> RangeGuard<'_> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let mut waiting_since: Option<std::time::Instant> = None;
        loop {
            // Register interest before checking, so a release between the check and the wait is
            // not missed.
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
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
                    drop(held);
                    if let Some(since) = waiting_since {
                        let waited = since.elapsed().as_micros();
                        self.waited_us
                            .fetch_add(waited.min(u64::MAX as u128) as u64, Ordering::Relaxed);
                    }
                    return RangeGuard { lock: self, token };
                }
            }
            if waiting_since.is_none() {
                waiting_since = Some(std::time::Instant::now());
                self.waits.fetch_add(1, Ordering::Relaxed);
            }
            notified.await;
        }
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
        self.lock.released.notify_waiters();
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
}
