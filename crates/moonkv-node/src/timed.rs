//! Deadlines on every data-plane I/O: a connection whose peer makes no progress for the
//! connection's current limit fails with `TimedOut`, which ends the connection and drops
//! whatever range lock its request held. So a caller that sends a header and never its
//! payload, or stops reading mid-answer, cannot hold a segment's range hostage.
//!
//! The limit is the I/O deadline while a request is in progress and the (longer) idle deadline
//! while the node waits for the next request; the request loop switches between them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How long a peer may make no progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// During a request (header, payload, answer).
    pub io: Duration,
    /// Between requests, waiting for the next header.
    pub idle: Duration,
}

impl Default for Deadlines {
    /// 30 s of no progress inside a request; 10 minutes idle between requests.
    fn default() -> Self {
        Self {
            io: Duration::from_secs(30),
            idle: Duration::from_secs(600),
        }
    }
}

/// A stream whose reads and writes fail once they make no progress for `limit`.
pub(crate) struct Timed<S> {
    inner: S,
    limit: Duration,
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
    /// Whether `limit` has passed since the operation first had to wait.
    fn expired(&mut self, limit: Duration, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            let deadline = tokio::time::Instant::now() + limit;
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
            read_timer: Timer::default(),
            write_timer: Timer::default(),
        }
    }

    /// Sets the limit for the operations from now on.
    pub fn set_limit(&mut self, limit: Duration) {
        if limit != self.limit {
            self.limit = limit;
            self.read_timer.progressed();
            self.write_timer.progressed();
        }
    }
}

fn timed_out(limit: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the peer made no progress for {limit:?}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Timed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(done) => {
                this.read_timer.progressed();
                Poll::Ready(done)
            }
            Poll::Pending if this.read_timer.expired(this.limit, cx) => {
                Poll::Ready(Err(timed_out(this.limit)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> Timed<S> {
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(done) => {
                self.write_timer.progressed();
                Poll::Ready(done)
            }
            Poll::Pending if self.write_timer.expired(self.limit, cx) => {
                Poll::Ready(Err(timed_out(self.limit)))
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
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, polled)
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
}
