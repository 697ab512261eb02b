//! The admin HTTP listener: HTTP/1 connections around the admin router, with the limits a port
//! anyone can reach needs, so half-sent requests and connection floods cannot pile up memory:
//!
//! - at most `admin_max_connections` are open at once. A connection beyond that evicts the
//!   oldest open connection that is not in the middle of a request (silent, half-sent, or
//!   kept alive between requests); only when every connection is serving a request is the new
//!   one closed at accept. So a flood of idle or half-sent connections cannot keep `/health`,
//!   `/role` or `/metrics` from answering: a probe sends its request at once and is served,
//!   while the flood's connections make room for it;
//! - a request's headers must arrive within `admin_header_timeout` of the connection opening or
//!   of the previous answer (hyper's header timer, which also runs while a kept-alive
//!   connection waits for its next request), and may not exceed [`MAX_HEAD_BYTES`];
//! - a connection on which no byte moves either way for `admin_idle_timeout` is closed (a body
//!   that stops coming, an answer nobody reads).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
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
    let slots = Slots::new(limits.max_connections);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some(slot) = slots.admit() else {
                        tracing::warn!(%peer, "admin HTTP connection refused: admin_max_connections are all serving requests");
                        drop(stream);
                        continue;
                    };
                    let router = router.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        serve_connection(stream, router, limits, shutdown, slot).await;
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
    slot: Slot,
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
    let service = Counted {
        inner: TowerToHyperService::new(router),
        busy: slot.busy.clone(),
    };
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let evicted = slot.evict.clone();
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
            _ = evicted.notified() => {
                tracing::debug!(?peer, "admin HTTP connection closed: its slot went to a newer one");
                return;
            }
            _ = shutdown.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The admin port's connection slots: a new connection over the cap takes the slot of the
/// oldest connection that is not serving a request.
struct Slots {
    max: usize,
    table: parking_lot::Mutex<(u64, BTreeMap<u64, SlotEntry>)>,
}

struct SlotEntry {
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

/// One connection's slot; gives it back when dropped.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// Requests this connection is serving now.
    busy: Arc<AtomicUsize>,
    /// Fires when a newer connection took this one's slot.
    evict: Arc<Notify>,
}

impl Slots {
    fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            table: parking_lot::Mutex::new((0, BTreeMap::new())),
        })
    }

    /// A slot for a new connection, evicting the oldest idle one when all are taken; `None`
    /// when every open connection is serving a request.
    fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut guard = self.table.lock();
        let (next, table) = &mut *guard;
        if table.len() >= self.max {
            let idle = table
                .iter()
                .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
                .map(|(id, _)| *id)?;
            if let Some(victim) = table.remove(&idle) {
                victim.evict.notify_one();
            }
        }
        let id = *next;
        *next += 1;
        let entry = SlotEntry {
            busy: Arc::new(AtomicUsize::new(0)),
            evict: Arc::new(Notify::new()),
        };
        let slot = Slot {
            slots: self.clone(),
            id,
            busy: entry.busy.clone(),
            evict: entry.evict.clone(),
        };
        table.insert(id, entry);
        Some(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table.lock().1.remove(&self.id);
    }
}

/// The router, counting the requests in service so an idle connection can be told apart.
#[derive(Clone)]
struct Counted {
    inner: TowerToHyperService<Router>,
    busy: Arc<AtomicUsize>,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Counted {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
    >>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
    >>::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let busy = Busy::enter(self.busy.clone());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answered = answer.await;
            drop(busy);
            answered
        })
    }
}

/// A request in service; counted until dropped (answered or cancelled).
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(count: Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::AcqRel);
        Busy(count)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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

    #[test]
    fn a_full_port_evicts_its_oldest_idle_connection_and_never_a_busy_one() {
        let slots = Slots::new(2);
        let first = slots.admit().expect("a free slot");
        let second = slots.admit().expect("a free slot");
        let busy = Busy::enter(first.busy.clone());
        // The first is serving a request: the second, idle, gives way.
        let third = slots.admit().expect("an idle slot to take");
        assert!(
            Arc::strong_count(&second.evict) == 1,
            "the evicted slot's notifier is shared with the table no more"
        );
        assert_eq!(slots.table.lock().1.len(), 2);
        // Both remaining are busy: a newcomer is refused.
        let _busy3 = Busy::enter(third.busy.clone());
        assert!(slots.admit().is_none(), "every slot serves a request");
        drop(busy);
        assert!(slots.admit().is_some(), "an idle one gives way again");
    }

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
