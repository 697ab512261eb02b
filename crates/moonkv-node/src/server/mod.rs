//! The node side of the data plane: accepts connections and serves reads and writes of the
//! segments in its table, and of the files of its disk, one request at a time per connection.
//! With a shared secret, a connection must open with the authentication handshake and every
//! request must carry a grant covering it (`docs/data-plane.md`).
//!
//! This module holds what a connection is served with ([`Access`], the served table, the
//! counters), the listener ([`DataServer`], its accept loop and the TLS opening of a
//! connection) and the answers every operation shares (`respond`, `refuse`, `refuse_write`).
//! The rest is split by operation:
//!
//! - `requests`: the request loop of one connection — header, grant check, dispatch, STATS.
//! - `handshake`: the authentication hello and proof, and ATTACH (same-host copies).
//! - `memory`: READ / WRITE of segment bytes over the socket.
//! - `same_host`: READ_LOCAL / WRITE_LOCAL, copied straight to and from the caller's memory.
//! - `put_local`: PUT_LOCAL, a same-host put the node starts and ends at its master itself.
//! - `put_whole`: PUT_WHOLE, the same over the socket, the bytes following the request.
//! - `get_whole`: GET_WHOLE, a get taken whole over the socket, the bytes following the answer.
//! - `get_local`: GET_LOCAL, a same-host get whose replicas the node asks its master for.
//! - `whole`: what those two share (per-key answers, looking at the caller once per step).
//! - `file`: FILE_READ / FILE_WRITE of the disk tier's files.

mod file;
mod get_local;
mod get_whole;
mod handshake;
mod memory;
mod put_local;
mod put_whole;
mod requests;
mod same_host;
mod whole;

use crate::claims::Claims;
use crate::disk::DiskStore;
use crate::segment::SegmentMemory;
use crate::timed::{Deadlines, Timed};
use moonkv_dataplane::header::{DataOp, DataStatus, NodeStats, RequestHeader, ResponseHeader};
use moonkv_dataplane::stream::{Stream, TlsAcceptor};
use moonkv_proto::auth::Secret;
use moonkv_proto::SegmentId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::io::{BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A refused write at most this long has its payload read and discarded so the connection stays
/// usable; a longer one is answered and the connection closed.
pub(crate) const MAX_DRAIN_BYTES: u64 = 64 << 20;

/// A connection as the request loop sees it: buffered both ways.
pub(crate) type Conn = BufReader<BufWriter<Timed<Stream>>>;

/// The receive low-water mark of a connection's socket while a payload is read from it
/// (`moonkv_dataplane::low_water`).
pub(crate) fn low_water(stream: &Conn) -> moonkv_dataplane::low_water::LowWater {
    moonkv_dataplane::low_water::LowWater::of(stream.get_ref().get_ref().inner())
}

/// Reads a written value's bytes straight into `view`, half and then the rest (a node may be
/// stopped between them in tests); `left`: the payload's bytes still to come, `view`'s
/// included.
pub(super) async fn read_into_view(
    stream: &mut Conn,
    view: &mut [u8],
    left: u64,
    mark: &mut moonkv_dataplane::low_water::LowWater,
) -> io::Result<()> {
    use moonkv_dataplane::low_water::read_payload;
    let half = view.len() / 2;
    read_payload(stream, &mut view[..half], left, mark).await?;
    crate::failpoints::hit(crate::failpoints::WRITE_MID_PAYLOAD);
    read_payload(stream, &mut view[half..], left - half as u64, mark).await
}

/// Buffer of each direction of a connection: pipelined small requests and answers coalesce up
/// to this size; larger payloads go straight between the socket and segment memory.
const CONNECTION_BUFFER: usize = 64 << 10;

/// Segments a node serves, by id.
pub type SegmentTable = Arc<RwLock<HashMap<SegmentId, Arc<SegmentMemory>>>>;

/// What a node requires of data-plane callers.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Callers must complete the handshake proving this secret.
    pub secret: Option<Secret>,
    /// Requests must carry a grant signed with this key.
    pub grant_key: Option<Secret>,
    /// Set: connections must open with a TLS handshake.
    pub tls: Option<TlsAcceptor>,
    /// Which replica owns which range, checked with every grant (shared with the in-process
    /// copy path of an embedding store).
    pub claims: Arc<Claims>,
    /// How long a caller may make no progress inside a request, and stay idle between them.
    pub deadlines: Deadlines,
    /// Most connections open at once; more are closed at accept (`None`: no cap).
    pub max_connections: Option<usize>,
    /// Decline same-host copies: callers on this machine move bytes over the socket too.
    pub refuse_same_host: bool,
    /// Attach callers of another user too, when the node may reach their memory (it runs as
    /// root or with `CAP_SYS_PTRACE`). Off: only processes of the node's own user are attached.
    pub same_host_other_users: bool,
    /// Listen on no local socket: callers on this machine attach over TCP to the loopback
    /// address instead (`docs/data-plane.md`, *The local socket*).
    pub no_local_socket: bool,
    /// The master this node mounts its segments on, told to callers in STATS answers (so a
    /// standalone client that knows only the node finds the cluster).
    pub master_addr: Option<String>,
}

/// Everything a node serves: its segments and, optionally, its disk, to the callers `access`
/// admits.
pub(crate) struct Served {
    pub(crate) segments: SegmentTable,
    pub(crate) disk: Option<Arc<DiskStore>>,
    access: Access,
    pub(crate) counters: Counters,
    pub(crate) metrics: crate::metrics::DataMetrics,
    /// The node's own master client, once it has one: set, it takes same-host puts whole
    /// (PUT_LOCAL) when it checks no secrets and no grants.
    master: std::sync::OnceLock<MasterRoute>,
    /// The name of the node's local socket (`@` and its abstract name), when it listens on one.
    local_socket: Option<String>,
}

/// How the node reaches its master for the puts it takes whole and for its catalog polls: its
/// own client, or the master as a call when it runs in this process (`moonkv up`).
#[derive(Clone)]
pub(crate) struct MasterRoute {
    pub(crate) client: moonkv_client::master_client::MasterClient,
    pub(crate) in_process: Option<Arc<dyn moonkv_proto::local::InProcessMaster>>,
}

impl MasterRoute {
    /// Sends `request` to the master and decodes its answer, within the client's RPC timeout.
    pub(crate) async fn call<T: serde::de::DeserializeOwned + 'static>(
        &self,
        request: moonkv_proto::msg::Request,
    ) -> moonkv_proto::Result<T> {
        self.call_with_timeout(request, self.client.config().rpc_timeout)
            .await
    }

    /// [`MasterRoute::call`], and the request back: it is only lent, to the master in this
    /// process or to the connection that encodes it. `None` only when the master in this
    /// process did not answer in time (it keeps the request then).
    pub(crate) async fn call_keeping<T: serde::de::DeserializeOwned + 'static>(
        &self,
        request: moonkv_proto::msg::Request,
    ) -> (moonkv_proto::Result<T>, Option<moonkv_proto::msg::Request>) {
        self.call_keeping_within(request, self.client.config().rpc_timeout)
            .await
    }

    /// [`MasterRoute::call_keeping`], and what the master in this process left to do once the
    /// answer is passed on (sending the events it published): dropping it does that. `None`
    /// from a master elsewhere, which sends its events itself.
    pub(crate) async fn call_keeping_then<T: serde::de::DeserializeOwned + 'static>(
        &self,
        request: moonkv_proto::msg::Request,
    ) -> (
        moonkv_proto::Result<T>,
        Option<moonkv_proto::msg::Request>,
        Option<Box<dyn Send>>,
    ) {
        let timeout = self.client.config().rpc_timeout;
        let Some(master) = &self.in_process else {
            let (answer, back) = self.call_keeping_within(request, timeout).await;
            return (answer, back, None);
        };
        match tokio::time::timeout(timeout, master.answer_then(request)).await {
            Ok((request, answer, then)) => (answer.take(), Some(request), then),
            Err(_) => (Err(in_process_late(timeout)), None, None),
        }
    }

    /// Sends `request` to the master and decodes its answer, within `timeout`.
    pub(crate) async fn call_with_timeout<T: serde::de::DeserializeOwned + 'static>(
        &self,
        request: moonkv_proto::msg::Request,
        timeout: std::time::Duration,
    ) -> moonkv_proto::Result<T> {
        self.call_keeping_within(request, timeout).await.0
    }

    /// [`MasterRoute::call_keeping`] within `timeout`.
    async fn call_keeping_within<T: serde::de::DeserializeOwned + 'static>(
        &self,
        request: moonkv_proto::msg::Request,
        timeout: std::time::Duration,
    ) -> (moonkv_proto::Result<T>, Option<moonkv_proto::msg::Request>) {
        let Some(master) = &self.in_process else {
            let answer = self.client.call_borrowed(&request, timeout).await;
            return (answer, Some(request));
        };
        match tokio::time::timeout(timeout, master.answer(request)).await {
            Ok((request, answer)) => (answer.take(), Some(request)),
            Err(_) => (Err(in_process_late(timeout)), None),
        }
    }
}

/// The error of a call to the master in this process that took longer than `timeout`.
fn in_process_late(timeout: std::time::Duration) -> moonkv_proto::Error {
    moonkv_proto::Error::new(
        moonkv_proto::ErrorCode::RPC_TIMEOUT,
        format!("the master in this process did not answer within {timeout:?}"),
    )
}

/// The node's data-plane counters (answered to STATS requests).
#[derive(Default)]
pub(crate) struct Counters {
    opened: AtomicU64,
    open: AtomicU64,
    requests: AtomicU64,
    same_host: AtomicU64,
    local_opened: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> NodeStats {
        NodeStats {
            connections_opened: self.opened.load(Ordering::Relaxed),
            connections_open: self.open.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            same_host_requests: self.same_host.load(Ordering::Relaxed),
            local_connections_opened: self.local_opened.load(Ordering::Relaxed),
            master: None,
            put_local: false,
            get_local: false,
            put_whole: false,
            get_whole: false,
            local_socket: None,
        }
    }
}

/// Counts a connection as open while it lives.
struct OpenConnection(Arc<Served>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Served {
    /// The master client PUT_LOCAL and GET_LOCAL go through, when this node takes them.
    pub(crate) fn put_local_master(&self) -> Option<&MasterRoute> {
        self.put_whole_master()
            .filter(|_| !self.access.refuse_same_host)
    }

    /// The master client PUT_WHOLE goes through, when this node takes it: a node that checks
    /// no secrets and no grants (its master trusts what a node asks in a caller's name).
    pub(crate) fn put_whole_master(&self) -> Option<&MasterRoute> {
        let open = self.access.secret.is_none() && self.access.grant_key.is_none();
        self.master.get().filter(|_| open)
    }

    /// What a STATS request is answered with: the counters, the master, whether puts and gets
    /// are taken whole.
    fn stats(&self) -> NodeStats {
        let mut stats = self.counters.snapshot();
        stats.master = self.access.master_addr.clone();
        stats.put_local = self.put_local_master().is_some();
        stats.get_local = stats.put_local;
        stats.put_whole = self.put_whole_master().is_some();
        stats.get_whole = stats.put_whole;
        stats.local_socket = self.local_socket.clone();
        stats
    }

    fn segment(&self, id: SegmentId) -> Option<Arc<SegmentMemory>> {
        self.segments.read().get(&id).cloned()
    }

    fn disk(&self, id: SegmentId) -> Option<&Arc<DiskStore>> {
        self.disk.as_ref().filter(|d| d.id() == id)
    }
}

/// A running data-plane listener.
pub struct DataServer {
    served: Arc<Served>,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl DataServer {
    /// Starts serving `table` (memory only, no authentication) on an already bound listener.
    pub fn spawn(listener: TcpListener, table: SegmentTable) -> io::Result<DataServer> {
        Self::spawn_with_disk(listener, table, None, Access::default())
    }

    /// Starts serving `table` and the files of `disk` on an already bound listener, to the
    /// callers `access` admits.
    pub fn spawn_with_disk(
        listener: TcpListener,
        table: SegmentTable,
        disk: Option<Arc<DiskStore>>,
        access: Access,
    ) -> io::Result<DataServer> {
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        // Same-host copies are offered only on plain connections, so is the local socket.
        let offered = !access.refuse_same_host && !access.no_local_socket;
        let local = if access.tls.is_none() && offered {
            bind_local()
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "no local socket: callers on this machine use TCP")
                })
                .ok()
        } else {
            None
        };
        let (local_socket, local) = local.unzip();
        let served = Arc::new(Served {
            segments: table,
            disk,
            access,
            counters: Counters::default(),
            metrics: Default::default(),
            master: std::sync::OnceLock::new(),
            local_socket,
        });
        let task = tokio::spawn(accept_loop(listener, local, served.clone(), stopped));
        Ok(DataServer {
            served,
            local_addr,
            stop,
            task,
        })
    }

    /// Takes same-host puts whole from now on (PUT_LOCAL), starting and ending them through
    /// `master` (when the node checks no secrets and no grants; else nothing changes).
    pub(crate) fn take_puts_through(&self, master: MasterRoute) {
        let _ = self.served.master.set(master);
    }

    /// Address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections accepted and open, requests answered.
    pub(crate) fn stats(&self) -> NodeStats {
        self.served.stats()
    }

    /// The node's Prometheus metrics (data plane, range locks, disk).
    pub(crate) fn metrics(&self) -> crate::metrics::NodeMetrics {
        crate::metrics::NodeMetrics::new(self.served.clone())
    }

    /// Stops accepting and closes every connection.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Binds the node's local socket: a Unix stream socket in the abstract namespace, so it is
/// reachable from this network namespace only and goes away with the node, under a name no
/// other process can guess before the node holds it. Returns the name as STATS gives it.
fn bind_local() -> io::Result<(String, UnixListener)> {
    let (name, listener) = moonkv_proto::local_socket::bind(moonkv_proto::local_socket::NODE)?;
    Ok((name, UnixListener::from_std(listener)?))
}

/// Waits until `stream` has a byte to read, or has ended (0), without reading it. A stream
/// fresh from accept counts as readable until a read finds nothing, so readiness alone
/// proves nothing: the peek does.
async fn peek_local(stream: &UnixStream) -> io::Result<usize> {
    use rustix::net::RecvFlags;
    loop {
        stream.readable().await?;
        let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut byte = [0u8; 1];
            rustix::net::recv(stream, &mut byte[..], RecvFlags::PEEK | RecvFlags::DONTWAIT)
                .map(|(n, _)| n)
                .map_err(io::Error::from)
        });
        match peeked {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// A connection just accepted, on the TCP listener or the local socket.
enum Accepted {
    Tcp(TcpStream),
    Local(UnixStream),
}

/// The next connection on the local socket, if the node has one (else never).
async fn accept_local(local: &Option<UnixListener>) -> io::Result<UnixStream> {
    match local {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

async fn accept_loop(
    listener: TcpListener,
    local: Option<UnixListener>,
    served: Arc<Served>,
    mut stopped: watch::Receiver<bool>,
) {
    // Dropping the set at the end aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        let (accepted, peer) = tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (Accepted::Tcp(stream), peer.to_string()),
                Err(e) => {
                    tracing::warn!(error = %e, "data-plane accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            accepted = accept_local(&local) => match accepted {
                Ok(stream) => (Accepted::Local(stream), "local socket".to_string()),
                Err(e) => {
                    tracing::warn!(error = %e, "local socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let open_now = served.counters.open.load(Ordering::Relaxed) as usize;
        if served
            .access
            .max_connections
            .is_some_and(|max| open_now >= max)
        {
            tracing::warn!(%peer, open_now, "data-plane connection refused: the node's connection cap is reached");
            served.metrics.refused_connection();
            drop(accepted);
            continue;
        }
        let served = served.clone();
        served.counters.opened.fetch_add(1, Ordering::Relaxed);
        served.counters.open.fetch_add(1, Ordering::Relaxed);
        if matches!(accepted, Accepted::Local(_)) {
            served.counters.local_opened.fetch_add(1, Ordering::Relaxed);
        }
        let open = OpenConnection(served.clone());
        connections.spawn(async move {
            let _open = open;
            let ended = match accepted {
                Accepted::Tcp(stream) => open_and_serve(stream, served).await,
                Accepted::Local(stream) => open_and_serve_local(stream, served).await,
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "data-plane connection ended");
            }
        });
    }
}

/// Serves a connection on the local socket once its caller has sent something (the same
/// opening deadline as over TCP; no TLS).
async fn open_and_serve_local(stream: UnixStream, served: Arc<Served>) -> io::Result<()> {
    let opening_until = tokio::time::Instant::now() + served.access.deadlines.handshake;
    if !first_byte(peek_local(&stream), &served, opening_until).await? {
        return Ok(());
    }
    let ends = crate::same_host::Ends::Local {
        socket: std::os::fd::AsRawFd::as_raw_fd(&stream),
    };
    let stream = Stream::LocalServed(stream);
    Box::pin(serve_connection(stream, served, Some(ends), opening_until)).await
}

/// Whether a new connection's first byte came (`peeked`, without reading it) by
/// `opening_until`; `false` when it ended first or the deadline passed (counted).
async fn first_byte(
    peeked: impl std::future::Future<Output = io::Result<usize>>,
    served: &Served,
    opening_until: tokio::time::Instant,
) -> io::Result<bool> {
    match tokio::time::timeout_at(opening_until, peeked).await {
        Ok(Ok(n)) => Ok(n > 0),
        Err(_) => {
            served.metrics.handshake_timed_out();
            Ok(false)
        }
        Ok(Err(e)) => Err(e),
    }
}

/// How long a new connection may take to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Performs the TLS handshake when the node requires it, then serves the connection.
///
/// Until the caller has sent a byte, the connection costs only this small future: the TLS
/// state, the request loop and its buffers (`CONNECTION_BUFFER` each way) are allocated once
/// a byte has come, so a flood of connections that stay silent, or close, costs next to
/// nothing.
async fn open_and_serve(stream: TcpStream, served: Arc<Served>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The first byte, TLS, and the hello and proof must all be done by this instant.
    let opening_until = tokio::time::Instant::now() + served.access.deadlines.handshake;
    let mut first = [0u8; 1];
    if !first_byte(stream.peek(&mut first), &served, opening_until).await? {
        return Ok(());
    }
    Box::pin(open_and_serve_sending(stream, served, opening_until)).await
}

/// [`open_and_serve`] once the caller has sent its first byte.
async fn open_and_serve_sending(
    stream: TcpStream,
    served: Arc<Served>,
    opening_until: tokio::time::Instant,
) -> io::Result<()> {
    // Same-host copies are offered only on plain connections from this machine.
    let ends = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) if served.access.tls.is_none() && !served.access.refuse_same_host => {
            Some(crate::same_host::Ends::Tcp {
                peer,
                local,
                socket: std::os::fd::AsRawFd::as_raw_fd(&stream),
            })
        }
        _ => None,
    };
    let stream = match &served.access.tls {
        None => Stream::Plain(stream),
        Some(tls) => {
            let mut first = [0u8; 1];
            let peeked = tokio::time::timeout_at(opening_until, stream.peek(&mut first)).await;
            if !matches!(peeked, Ok(Ok(1))) || !moonkv_proto::tls::looks_like_tls(first[0]) {
                // A plaintext caller: close without a TLS alert it could not read anyway.
                served.metrics.refused_handshake();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "plaintext caller on the TLS data plane",
                ));
            }
            let left = opening_until.saturating_duration_since(tokio::time::Instant::now());
            tls.accept(stream, left.min(TLS_HANDSHAKE_TIMEOUT))
                .await
                .inspect_err(|e| {
                    served.metrics.refused_handshake();
                    tracing::warn!(error = %e, "data-plane TLS handshake failed")
                })?
        }
    };
    serve_connection(stream, served, ends, opening_until).await
}

/// Serves one connection until the peer closes it or sends something unrecoverable.
pub(crate) async fn serve_connection(
    stream: Stream,
    served: Arc<Served>,
    ends: Option<crate::same_host::Ends>,
    opening_until: tokio::time::Instant,
) -> io::Result<()> {
    let deadlines = served.access.deadlines;
    let mut conn = BufReader::with_capacity(
        CONNECTION_BUFFER,
        BufWriter::with_capacity(CONNECTION_BUFFER, Timed::new(stream, deadlines.io)),
    );
    let served_until = requests::serve_requests(&mut conn, &served, ends, opening_until).await;
    // Answers still buffered (the last one before a close, say) go out before the socket does.
    let _ = conn.flush().await;
    served_until
}

/// Refuses a request with `status`, consuming a write's payload (see [`refuse_write`]).
async fn refuse(stream: &mut Conn, h: &RequestHeader, status: DataStatus) -> io::Result<()> {
    if h.op == DataOp::Write as u8 || h.op == DataOp::FileWrite as u8 {
        refuse_write(stream, h, status).await
    } else {
        respond(stream, status, h.request_id).await
    }
}

async fn respond(stream: &mut Conn, status: DataStatus, request_id: u64) -> io::Result<()> {
    stream
        .write_all(
            &ResponseHeader {
                status,
                request_id,
                length: 0,
            }
            .encode(),
        )
        .await
}

/// Answers a refused write, keeping the stream in step by discarding its payload when that is
/// cheap enough; otherwise answers and closes.
async fn refuse_write(stream: &mut Conn, h: &RequestHeader, status: DataStatus) -> io::Result<()> {
    if h.length > MAX_DRAIN_BYTES {
        respond(stream, DataStatus::TooLarge, h.request_id).await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("refused write of {} bytes ({status:?})", h.length),
        ));
    }
    let mut scratch = [0u8; 16 * 1024];
    let mut left = h.length;
    while left > 0 {
        let take = left.min(scratch.len() as u64) as usize;
        stream.read_exact(&mut scratch[..take]).await?;
        left -= take as u64;
    }
    respond(stream, status, h.request_id).await
}
