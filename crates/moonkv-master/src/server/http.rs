//! The admin HTTP listener: HTTP/1 connections around the admin router, with the limits a port
//! anyone can reach needs, so half-sent requests and connection floods cannot pile up memory:
//!
//! - at most `admin_max_connections` are open at once; more are closed at accept;
//! - a request's headers must arrive within `admin_header_timeout` of the connection opening or
//!   of the previous answer (hyper's header timer, which also runs while a kept-alive
//!   connection waits for its next request), and may not exceed [`MAX_HEAD_BYTES`];
//! - a connection on which no byte moves either way for `admin_idle_timeout` is closed (a body
//!   that stops coming, an answer nobody reads).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Largest request head (request line and headers) read; a longer one is answered 431.
pub(crate) const MAX_HEAD_BYTES: usize = 16 << 10;

/// How long connections may finish the request they are on once the master stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The admin port's connection limits (config keys `admin_header_timeout`,
/// `admin_idle_timeout`, `admin_max_connections`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// Accepts connections until `shutdown` flips, then gives open ones [`SHUTDOWN_GRACE`] to end.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "admin HTTP connection refused: admin_max_connections reached");
                        drop(stream);
                        continue;
                    };
                    let router = router.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        let _slot = slot;
                        serve_connection(stream, router, limits, shutdown).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admin HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    // Connections saw the same signal and finish the request they are on; the rest are cut
    // when the set drops.
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, drained).await;
}

/// Serves one connection until it ends, its header timer fires, or no byte moved for the idle
/// timeout.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().ok();
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let conn = builder.serve_connection(io, TowerToHyperService::new(router));
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let quiet_until = activity.last() + limits.idle_timeout;
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(?peer, error = %e, "admin HTTP connection ended");
                }
                return;
            }
            _ = tokio::time::sleep_until(quiet_until) => {
                if activity.last() + limits.idle_timeout <= Instant::now() {
                    tracing::debug!(?peer, "admin HTTP connection closed: idle timeout");
                    return;
                }
            }
            _ = shutdown.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When bytes last moved on a connection, either way.
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened`.
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A stream that stamps [`Activity`] whenever bytes move.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl Watched {
    fn stamp(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stamp(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stamp(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn activity_moves_the_idle_deadline_forward() {
        let activity = Activity::new();
        let opened = activity.last();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(activity.last(), opened);
        activity.touch();
        assert_eq!(activity.last(), opened + Duration::from_millis(1500));
    }
}
