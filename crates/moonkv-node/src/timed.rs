//! Deadlines on every data-plane I/O: a connection whose peer makes no progress for the
//! connection's current limit fails with `TimedOut`, which ends the connection and drops
//! whatever range lock its request held. So a caller that sends a header and never its
//! payload, or stops reading mid-answer, cannot hold a segment's range hostage.
//!
//! The limit is the I/O deadline while a request is in progress and the (longer) idle deadline
//! while the node waits for the next request; the request loop switches between them.
//!
//! A request also has a time cap for all its transfers together ([`Deadlines::request_cap`]:
//! a floor plus its length at a minimum rate), so a caller that trickles a byte just inside
//! each I/O deadline loses its connection, and its range lock, once the cap has passed. The
//! cap counts from the request's first transfer, not from its header: waiting for another
//! request's range lock is not charged to it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a peer may make no progress, and how long a request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// From accept until the first byte, and, with a secret, until the proof is checked.
    pub handshake: Duration,
    /// During a request (header, payload, answer).
    pub io: Duration,
    /// Between requests, waiting for the next header.
    pub idle: Duration,
    /// Every request's transfers may take this long, plus its length at `min_rate`.
    pub request_floor: Duration,
    /// Bytes per second a request's payload must at least move at, on top of the floor.
    pub min_rate: u64,
}

impl Default for Deadlines {
    /// 10 s to open (first byte, hello and proof); 30 s of no progress inside a request; 10 minutes idle between requests; a request may
    /// take 60 s plus one second per MiB.
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            io: Duration::from_secs(30),
            idle: Duration::from_secs(600),
            request_floor: Duration::from_secs(60),
            min_rate: 1 << 20,
        }
    }
}

impl Deadlines {
    /// How long the transfers of a request of `length` bytes may take in all.
    pub fn request_cap(&self, length: u64) -> Duration {
        let at_min_rate = u128::from(length) * 1000 / u128::from(self.min_rate.max(1));
        let at_min_rate = Duration::from_millis(u64::try_from(at_min_rate).unwrap_or(u64::MAX));
        self.request_floor.saturating_add(at_min_rate)
    }
}

/// A stream whose reads and writes fail once they make no progress for `limit`, or once the
/// current request's cap has passed.
pub(crate) struct Timed<S> {
    inner: S,
    limit: Duration,
    /// The cap of the request under way, if one is.
    budget: Option<Duration>,
    /// When the request's transfers must be done: set at its first transfer.
    deadline: Option<Instant>,
    read_timer: Timer,
    write_timer: Timer,
}

/// One direction's no-progress timer: allocated once, re-armed at the first `Pending` after
/// progress (so the data path does not allocate a timer per wait).
#[derive(Default)]
struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl Timer {
    /// Whether `limit` has passed since the operation first had to wait, or `cap` has come.
    fn expired(&mut self, limit: Duration, cap: Option<Instant>, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            let no_progress = Instant::now() + limit;
            let deadline = cap.map_or(no_progress, |cap| cap.min(no_progress));
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        let Some(sleep) = &mut self.sleep else {
            return false;
        };
        if sleep.as_mut().poll(cx).is_ready() {
            self.armed = false;
            return true;
        }
        false
    }

    /// The operation made progress: the next wait starts a new period.
    fn progressed(&mut self) {
        self.armed = false;
    }
}

impl<S> Timed<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            budget: None,
            deadline: None,
            read_timer: Timer::default(),
            write_timer: Timer::default(),
        }
    }

    /// The stream inside.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Sets the limit for the operations from now on.
    pub fn set_limit(&mut self, limit: Duration) {
        if limit != self.limit {
            self.limit = limit;
            self.read_timer.progressed();
            self.write_timer.progressed();
        }
    }

    /// A request begins: its transfers, counted from the first, may take `cap` in all.
    pub fn begin_request(&mut self, cap: Duration) {
        self.budget = Some(cap);
        self.deadline = None;
        self.read_timer.progressed();
        self.write_timer.progressed();
    }

    /// The request is done: no cap until the next one begins.
    pub fn end_request(&mut self) {
        self.budget = None;
        self.deadline = None;
    }

    /// Starts the request's clock at its first transfer; `Err` once its cap has passed.
    fn within_cap(&mut self) -> io::Result<()> {
        let Some(cap) = self.budget else {
            return Ok(());
        };
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + cap);
        if Instant::now() >= deadline {
            return Err(over_cap(cap));
        }
        Ok(())
    }

    /// Why a timer fired: the request's cap, or no progress.
    fn timed_out(&self) -> io::Error {
        match (self.budget, self.deadline) {
            (Some(cap), Some(deadline)) if Instant::now() >= deadline => over_cap(cap),
            _ => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer made no progress for {:?}", self.limit),
            ),
        }
    }
}

fn over_cap(cap: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the request's transfers took longer than its cap of {cap:?}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Timed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Err(e) = this.within_cap() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(done) => {
                this.read_timer.progressed();
                Poll::Ready(done)
            }
            Poll::Pending if this.read_timer.expired(this.limit, this.deadline, cx) => {
                Poll::Ready(Err(this.timed_out()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> Timed<S> {
    /// Runs one write-side poll within the request's cap and the no-progress limit.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Err(e) = self.within_cap() {
            return Poll::Ready(Err(e));
        }
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(done) => {
                self.write_timer.progressed();
                Poll::Ready(done)
            }
            Poll::Pending if self.write_timer.expired(self.limit, self.deadline, cx) => {
                Poll::Ready(Err(self.timed_out()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Timed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.guard(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.guard(cx, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.guard(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.guard(cx, |inner, cx| inner.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_progress_resets_the_clock() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut timed = Timed::new(ours, Duration::from_secs(5));
        theirs.write_all(b"ab").await.unwrap();
        let mut two = [0u8; 2];
        timed.read_exact(&mut two).await.unwrap();
        let mut more = [0u8; 1];
        let err = timed.read_exact(&mut more).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // A full pipe that the peer never drains times the writer out too.
        let err = timed.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_peer_fails_at_the_request_cap() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut timed = Timed::new(ours, Duration::from_secs(1));
        timed.begin_request(Duration::from_secs(3));
        let started = Instant::now();
        let trickle = tokio::spawn(async move {
            // One byte every half second: never a second without progress.
            for _ in 0..100 {
                if theirs.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let mut payload = [0u8; 100];
        let err = timed.read_exact(&mut payload).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("cap"), "{err}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(3) && took < Duration::from_secs(4),
            "{took:?}"
        );
        // Between requests there is no cap, only the no-progress limit.
        timed.end_request();
        drop(timed);
        trickle.await.unwrap();
    }

    #[test]
    fn the_cap_grows_with_the_length_at_the_minimum_rate() {
        let deadlines = Deadlines {
            request_floor: Duration::from_secs(60),
            min_rate: 1 << 20,
            ..Deadlines::default()
        };
        assert_eq!(deadlines.request_cap(0), Duration::from_secs(60));
        assert_eq!(deadlines.request_cap(16 << 20), Duration::from_secs(76));
        assert!(deadlines.request_cap(u64::MAX) > Duration::from_secs(1 << 40));
    }
}
