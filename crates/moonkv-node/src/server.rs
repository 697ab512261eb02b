//! The node side of the data plane: accepts connections and serves reads and writes of the
//! segments in its table, and of the files of its disk, one request at a time per connection.
//! With a shared secret, a connection must open with the authentication handshake and every
//! request must carry a grant covering it (`docs/data-plane.md`).

use crate::claims::Claims;
use crate::disk::{format::MAX_TENANT_LEN, with_cause, DiskFault, DiskStore, WriteError};
use crate::same_host;
use crate::segment::SegmentMemory;
use crate::timed::{Deadlines, Timed};
use moonkv_dataplane::handshake::{self, Answer, Mode, HELLO_LEN, HELLO_MAGIC, PROOF_LEN};
use moonkv_dataplane::header::{
    AttachRequest, DataOp, DataStatus, FileMeta, LocalPlan, NodeStats, RequestHeader,
    ResponseHeader, REQUEST_LEN,
};
use moonkv_dataplane::stream::{Stream, TlsAcceptor};
use moonkv_proto::auth::{Secret, NONCE_LEN};
use moonkv_proto::grant::{self, Grant, Refusal, GRANT_LEN};
use moonkv_proto::SegmentId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufRead, AsyncReadExt, AsyncWriteExt};
use tokio::io::{BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A refused write at most this long has its payload read and discarded so the connection stays
/// usable; a longer one is answered and the connection closed.
pub const MAX_DRAIN_BYTES: u64 = 64 << 20;

/// A connection as the request loop sees it: buffered both ways.
pub(crate) type Conn = BufReader<BufWriter<Timed<Stream>>>;

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
}

/// The node's data-plane counters (answered to STATS requests).
#[derive(Default)]
pub(crate) struct Counters {
    opened: AtomicU64,
    open: AtomicU64,
    requests: AtomicU64,
    same_host: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> NodeStats {
        NodeStats {
            connections_opened: self.opened.load(Ordering::Relaxed),
            connections_open: self.open.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            same_host_requests: self.same_host.load(Ordering::Relaxed),
            master: None,
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
        let served = Arc::new(Served {
            segments: table,
            disk,
            access,
            counters: Counters::default(),
            metrics: Default::default(),
        });
        let task = tokio::spawn(accept_loop(listener, served.clone(), stopped));
        Ok(DataServer {
            served,
            local_addr,
            stop,
            task,
        })
    }

    /// Address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections accepted and open, requests answered.
    pub fn stats(&self) -> NodeStats {
        self.served.counters.snapshot()
    }

    /// The node's Prometheus metrics (data plane, range locks, disk).
    pub fn metrics(&self) -> crate::metrics::NodeMetrics {
        crate::metrics::NodeMetrics::new(self.served.clone())
    }

    /// Stops accepting and closes every connection.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    served: Arc<Served>,
    mut stopped: watch::Receiver<bool>,
) {
    // Dropping the set at the end aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let open_now = served.counters.open.load(Ordering::Relaxed) as usize;
                    if served.access.max_connections.is_some_and(|max| open_now >= max) {
                        tracing::warn!(%peer, open_now, "data-plane connection refused: the node's connection cap is reached");
                        served.metrics.refused_connection();
                        drop(stream);
                        continue;
                    }
                    let served = served.clone();
                    served.counters.opened.fetch_add(1, Ordering::Relaxed);
                    served.counters.open.fetch_add(1, Ordering::Relaxed);
                    let open = OpenConnection(served.clone());
                    connections.spawn(async move {
                        let _open = open;
                        if let Err(e) = open_and_serve(stream, served).await {
                            tracing::debug!(%peer, error = %e, "data-plane connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "data-plane accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
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
    let mut first = [0u8; 1];
    // Like the rest of a request's header, the first byte must come within the I/O deadline.
    match tokio::time::timeout(served.access.deadlines.io, stream.peek(&mut first)).await {
        Ok(Ok(0)) | Err(_) => return Ok(()),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e),
    }
    Box::pin(open_and_serve_sending(stream, served)).await
}

/// [`open_and_serve`] once the caller has sent its first byte.
async fn open_and_serve_sending(stream: TcpStream, served: Arc<Served>) -> io::Result<()> {
    // Same-host copies are offered only on plain connections from this machine.
    let ends = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) if served.access.tls.is_none() && !served.access.refuse_same_host => {
            Some(same_host::Ends {
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
            let peeked = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
            if !matches!(peeked, Ok(Ok(1))) || !moonkv_proto::tls::looks_like_tls(first[0]) {
                // A plaintext caller: close without a TLS alert it could not read anyway.
                served.metrics.refused_handshake();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "plaintext caller on the TLS data plane",
                ));
            }
            tls.accept(stream, TLS_HANDSHAKE_TIMEOUT)
                .await
                .inspect_err(|e| {
                    served.metrics.refused_handshake();
                    tracing::warn!(error = %e, "data-plane TLS handshake failed")
                })?
        }
    };
    serve_connection(stream, served, ends).await
}

/// Serves one connection until the peer closes it or sends something unrecoverable.
pub(crate) async fn serve_connection(
    stream: Stream,
    served: Arc<Served>,
    ends: Option<same_host::Ends>,
) -> io::Result<()> {
    let deadlines = served.access.deadlines;
    let mut conn = BufReader::with_capacity(
        CONNECTION_BUFFER,
        BufWriter::with_capacity(CONNECTION_BUFFER, Timed::new(stream, deadlines.io)),
    );
    let served_until = serve_requests(&mut conn, &served, ends).await;
    // Answers still buffered (the last one before a close, say) go out before the socket does.
    let _ = conn.flush().await;
    served_until
}

/// The request loop of one connection. Answers are buffered while more requests are already
/// waiting, so a pipelined burst is answered with few writes, and flushed before the loop waits
/// for the caller.
async fn serve_requests(
    stream: &mut Conn,
    served: &Served,
    ends: Option<same_host::Ends>,
) -> io::Result<()> {
    let mut raw = [0u8; REQUEST_LEN];
    if !read_header(stream, &mut raw[..HELLO_MAGIC.len()], 0).await? {
        return Ok(());
    }
    let mut filled = HELLO_MAGIC.len();
    if raw[..HELLO_MAGIC.len()] == HELLO_MAGIC {
        greet(stream, served).await?;
        filled = 0;
    } else if served.access.secret.is_some() {
        // A request without the handshake: answer it by its id, then close.
        served.metrics.refused_handshake();
        read_header(stream, &mut raw, filled).await?;
        let request_id = RequestHeader::decode(&raw).map_or_else(|id| id, |h| h.request_id);
        return refuse_connection(stream, request_id, "request without the handshake").await;
    }
    let mut grant = [0u8; GRANT_LEN];
    let deadlines = served.access.deadlines;
    // The caller process, once it attached this connection for same-host copies.
    let mut attached: Option<same_host::Peer> = None;
    loop {
        if stream.buffer().is_empty() && !more_waiting(stream)? {
            stream.flush().await?;
        }
        // Waiting for the next request may take long; once it is here, it must keep moving.
        stream.get_mut().get_mut().end_request();
        stream.get_mut().get_mut().set_limit(deadlines.idle);
        let arrived = read_header(stream, &mut raw, filled).await;
        stream.get_mut().get_mut().set_limit(deadlines.io);
        if !arrived? {
            return Ok(());
        }
        filled = 0;
        let header = match RequestHeader::decode(&raw) {
            Ok(h) => h,
            Err(request_id) => {
                respond(stream, DataStatus::BadHeader, request_id).await?;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad data-plane header",
                ));
            }
        };
        let grant_len = usize::from(header.grant_len);
        if grant_len != 0 && grant_len != GRANT_LEN {
            respond(stream, DataStatus::BadHeader, header.request_id).await?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad data-plane grant length",
            ));
        }
        stream.read_exact(&mut grant[..grant_len]).await?;
        if header.op == DataOp::Attach as u8 {
            // Grants nothing by itself: every same-host request still needs its grant.
            attached = attach(stream, &header, ends).await?;
            continue;
        }
        let plan = if DataOp::is_local(header.op) {
            match read_plan(stream, &header).await? {
                Ok(plan) => Some(plan),
                Err(status) => {
                    respond(stream, status, header.request_id).await?;
                    continue;
                }
            }
        } else {
            None
        };
        let mut granted_file_size = None;
        if let Some(key) = &served.access.grant_key {
            match check_grant(key, &served.access.claims, &header, &grant[..grant_len]) {
                Ok(size) => granted_file_size = size,
                Err(refusal) => {
                    tracing::debug!(
                        op = header.op,
                        segment = %header.segment_id,
                        address = header.address,
                        length = header.length,
                        reason = refusal.describe(),
                        "data-plane request refused"
                    );
                    served.metrics.refused_grant(refusal);
                    refuse(stream, &header, DataStatus::Forbidden).await?;
                    continue;
                }
            }
        }
        served.counters.requests.fetch_add(1, Ordering::Relaxed);
        // From its first transfer on (after any wait for a range lock), the request has a time
        // cap: a caller trickling its payload cannot keep the lock past it.
        stream
            .get_mut()
            .get_mut()
            .begin_request(deadlines.request_cap(header.length));
        let id = header.segment_id;
        let started = std::time::Instant::now();
        let ok = match header.op {
            op if op == DataOp::Stats as u8 => serve_stats(stream, &header, served).await?,
            op if op == DataOp::Read as u8 => {
                serve_read(stream, &header, served.segment(id)).await?
            }
            op if op == DataOp::Write as u8 => {
                serve_write(stream, &header, served.segment(id)).await?
            }
            op if DataOp::is_local(op) => {
                let plan = plan.as_ref().expect("read with the header");
                let ok = serve_local(stream, &header, served.segment(id), attached.as_ref(), plan)
                    .await?;
                if ok {
                    served.counters.same_host.fetch_add(1, Ordering::Relaxed);
                }
                ok
            }
            op if op == DataOp::FileRead as u8 => {
                serve_file_read(stream, &header, served.disk(id)).await?
            }
            op if op == DataOp::FileWrite as u8 => {
                serve_file_write(stream, &header, served.disk(id), granted_file_size).await?
            }
            // An unknown op carries no payload by definition, so the stream is still in step.
            _ => respond(stream, DataStatus::BadOp, header.request_id)
                .await
                .map(|()| false)?,
        };
        served
            .metrics
            .served(header.op, ok, header.length, started.elapsed());
    }
}

/// Whether the next request's bytes are already here (a pipelined burst): its answers can keep
/// gathering in the connection's buffer instead of going out one small write each. Looks
/// without waiting.
fn more_waiting(stream: &mut Conn) -> io::Result<bool> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(&mut *stream).poll_fill_buf(&mut cx) {
        std::task::Poll::Ready(Ok(buf)) => Ok(!buf.is_empty()),
        std::task::Poll::Ready(Err(e)) => Err(e),
        std::task::Poll::Pending => Ok(false),
    }
}

/// Fills `raw` from byte `filled` on; `Ok(false)` on a clean end of stream before the first
/// byte.
async fn read_header(stream: &mut Conn, raw: &mut [u8], mut filled: usize) -> io::Result<bool> {
    while filled < raw.len() {
        let n = stream.read(&mut raw[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated data-plane header",
            ));
        }
        filled += n;
    }
    Ok(true)
}

/// Answers a hello (its magic already read): open without a secret; with one, sends the
/// challenge and the node's proof, then checks the caller's proof. A failed handshake is
/// answered `UNAUTHENTICATED` and ends the connection (`Err`).
async fn greet(stream: &mut Conn, served: &Served) -> io::Result<()> {
    let mut hello = [0u8; HELLO_LEN];
    hello[..HELLO_MAGIC.len()].copy_from_slice(&HELLO_MAGIC);
    stream.read_exact(&mut hello[HELLO_MAGIC.len()..]).await?;
    let Some(client_nonce) = handshake::hello_nonce(&hello) else {
        respond(stream, DataStatus::BadHeader, 0).await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad data-plane hello",
        ));
    };
    let Some(secret) = served.access.secret.as_ref() else {
        return stream.write_all(&Answer::open().encode()).await;
    };
    let challenge: [u8; NONCE_LEN] = rand::random();
    let mut server_proof = [0u8; PROOF_LEN];
    server_proof.copy_from_slice(&secret.server_proof(&challenge, &client_nonce));
    let answer = Answer {
        mode: Mode::ProofRequired,
        challenge,
        server_proof,
    };
    stream.write_all(&answer.encode()).await?;
    // The caller waits for the answer before it sends its proof.
    stream.flush().await?;
    let mut proof = [0u8; PROOF_LEN];
    stream.read_exact(&mut proof).await?;
    if !secret.verify_client(&challenge, &client_nonce, &proof) {
        served.metrics.refused_handshake();
        return refuse_connection(stream, 0, "wrong handshake proof").await;
    }
    Ok(())
}

/// Answers `UNAUTHENTICATED` and ends the connection. What the caller already sent is read
/// (bounded) first, so the answer is not lost to a connection reset.
async fn refuse_connection(stream: &mut Conn, request_id: u64, why: &str) -> io::Result<()> {
    respond(stream, DataStatus::Unauthenticated, request_id).await?;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut scratch = [0u8; 16 * 1024];
        let mut left = MAX_DRAIN_BYTES;
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(n) if n > 0 => left = left.saturating_sub(n as u64),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        why.to_string(),
    ))
}

/// Checks the request's grant (and, for memory ranges, the claims: see [`crate::claims`]); for
/// file writes returns the granted object size.
fn check_grant(
    secret: &Secret,
    claims: &Claims,
    h: &RequestHeader,
    token: &[u8],
) -> Result<Option<u64>, Refusal> {
    let grant = Grant::open(secret, h.segment_id, token)?;
    let now = moonkv_proto::grant::unix_now_ms();
    match DataOp::as_socket_op(h.op) {
        op if op == DataOp::Read as u8 => {
            claims.admit_range(h.segment_id, &grant, h.address, h.length, false)
        }
        op if op == DataOp::Write as u8 => {
            claims.admit_range(h.segment_id, &grant, h.address, h.length, true)
        }
        op if op == DataOp::FileRead as u8 => {
            grant.permits_file(grant::READ, h.address, now)?;
            if h.length != grant.size {
                return Err(Refusal::OutOfRange);
            }
            Ok(())
        }
        op if op == DataOp::FileWrite as u8 => {
            grant.permits_file(grant::WRITE, h.address, now)?;
            if h.length < grant.size {
                return Err(Refusal::OutOfRange);
            }
            return Ok(Some(grant.size));
        }
        // Unknown ops are answered BAD_OP by the dispatcher.
        _ => Ok(()),
    }
    .map(|()| None)
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

/// Answers a STATS request with the counters as JSON.
async fn serve_stats(stream: &mut Conn, h: &RequestHeader, served: &Served) -> io::Result<bool> {
    if h.length != 0 {
        return respond(stream, DataStatus::BadOp, h.request_id)
            .await
            .map(|()| false);
    }
    let mut stats = served.counters.snapshot();
    stats.master = served.access.master_addr.clone();
    let body = serde_json::to_vec(&stats).map_err(io::Error::other)?;
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: body.len() as u64,
    };
    stream.write_all(&ok.encode()).await?;
    stream.write_all(&body).await.map(|()| true)
}

async fn serve_read(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<bool> {
    let Some(segment) = segment else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id)
            .await
            .map(|()| false);
    };
    let view = match segment.read_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return respond(stream, status, h.request_id).await.map(|()| false),
    };
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: h.length,
    }
    .encode();
    if cfg!(feature = "failpoints") {
        stream.write_all(&ok).await?;
        let half = view.len() / 2;
        stream.write_all(&view[..half]).await?;
        // The caller has really received half of the bytes when the point is passed.
        stream.flush().await?;
        crate::failpoints::hit(crate::failpoints::READ_MID_PAYLOAD);
        return stream.write_all(&view[half..]).await.map(|()| true);
    }
    // Small answers coalesce in the connection's buffer; a large one goes out with its header in
    // one vectored write, straight from segment memory to the socket.
    write_all_vectored(
        stream,
        &mut [io::IoSlice::new(&ok), io::IoSlice::new(&view)],
    )
    .await
    .map(|()| true)
}

/// Writes every byte of `slices`, in order, with as few writes as the stream allows.
async fn write_all_vectored(
    stream: &mut Conn,
    mut slices: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = stream.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

async fn serve_write(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<bool> {
    let checked = match &segment {
        None => Err(DataStatus::UnknownSegment),
        Some(segment) => segment.check(h.address, h.length).map(|_| ()),
    };
    if let Err(status) = checked {
        return refuse_write(stream, h, status).await.map(|()| false);
    }
    let Some(segment) = segment else {
        return Ok(false);
    };
    let mut view = match segment.write_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return refuse_write(stream, h, status).await.map(|()| false),
    };
    // Straight from the socket into segment memory; acknowledged only once all bytes landed.
    let half = view.len() / 2;
    stream.read_exact(&mut view[..half]).await?;
    crate::failpoints::hit(crate::failpoints::WRITE_MID_PAYLOAD);
    stream.read_exact(&mut view[half..]).await?;
    drop(view);
    respond(stream, DataStatus::Ok, h.request_id)
        .await
        .map(|()| true)
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

/// Answers an ATTACH request: verifies that the process it names is the caller at the other
/// end of this connection and that its memory can be reached (see [`crate::same_host`]).
/// Returns the attached caller, or `None` (answered `LOCAL_REFUSED`) when same-host copies are
/// off, the connection is not from this machine, or the check fails.
async fn attach(
    stream: &mut Conn,
    h: &RequestHeader,
    ends: Option<same_host::Ends>,
) -> io::Result<Option<same_host::Peer>> {
    let pid = h.length;
    let verified = match (ends, AttachRequest::from_header(h)) {
        (_, None) => Err(format!("{} is not a process id", h.length)),
        (None, _) => Err("same-host copies are off on this connection".to_string()),
        (Some(ends), Some(request)) => tokio::task::spawn_blocking(move || {
            same_host::verify(
                request.pid,
                ends.peer,
                ends.local,
                request.probe_address,
                request.probe,
            )
            .map(|peer| peer.watching(ends.socket))
        })
        .await
        .unwrap_or_else(|e| Err(format!("verification failed: {e}"))),
    };
    match verified {
        Ok(peer) => {
            tracing::debug!(pid, "data-plane connection attached for same-host copies");
            respond(stream, DataStatus::Ok, h.request_id).await?;
            Ok(Some(peer))
        }
        Err(why) => {
            tracing::debug!(pid, %why, "same-host attach declined");
            respond(stream, DataStatus::LocalRefused, h.request_id).await?;
            Ok(None)
        }
    }
}

/// Reads the plan of a same-host request. A plan listing too many ranges cannot be skipped
/// safely: answered `BAD_HEADER` and the connection closed (`Err`). One whose ranges do not add
/// up to the header's length is consumed and refused (`Ok(Err)`).
async fn read_plan(
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
const LOCAL_STEP: usize = 4 << 20;

/// Serves READ_LOCAL / WRITE_LOCAL: the range is checked and locked exactly as for READ / WRITE,
/// then copied straight between segment memory and the caller's ranges, in steps, each only
/// while the caller's deadline has not passed and the caller still runs.
async fn serve_local(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
    peer: Option<&same_host::Peer>,
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
                copy_local(peer, plan, view.len(), mid, |at, end, ranges| {
                    peer.read_from(&mut view[at..end], ranges)
                })
                .await
            }
            Err(status) => Err(status),
        }
    } else {
        match segment.read_view(h.address, h.length).await {
            Ok(view) => {
                let mid = crate::failpoints::READ_MID_PAYLOAD;
                copy_local(peer, plan, view.len(), mid, |at, end, ranges| {
                    peer.write_to(&view[at..end], ranges)
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
async fn copy_local(
    peer: &same_host::Peer,
    plan: &LocalPlan,
    len: usize,
    mid: &str,
    mut step: impl FnMut(usize, usize, &[(u64, u64)]) -> io::Result<()>,
) -> Result<(), DataStatus> {
    let half = cfg!(feature = "failpoints").then_some(len / 2);
    if half == Some(0) {
        crate::failpoints::hit(mid);
    }
    let mut at = 0;
    while at < len {
        // Past the deadline, the caller gone, or the caller shut its side of the connection
        // (it gave up the call and waits for this node to let go of its memory): no more steps.
        if moonkv_dataplane::same_host::monotonic_now_ns() >= plan.deadline_ns
            || !peer.alive()
            || peer.gave_up()
        {
            return Err(DataStatus::LocalRefused);
        }
        // The worst moment to be descheduled: checks passed, copy not started.
        crate::failpoints::hit(crate::failpoints::LOCAL_STEP_STALL);
        let mut end = (at + LOCAL_STEP).min(len);
        if let Some(half) = half.filter(|h| at < *h) {
            end = end.min(half);
        }
        let ranges = ranges_between(&plan.ranges, at as u64, (end - at) as u64);
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

/// The part of `ranges` (laid end to end) covering bytes `[from, from + len)`.
fn ranges_between(ranges: &[(u64, u64)], from: u64, len: u64) -> Vec<(u64, u64)> {
    let (end, mut pos) = (from + len, 0u64);
    let mut out = Vec::new();
    for &(address, size) in ranges {
        let (start, stop) = (pos.max(from), (pos + size).min(end));
        if start < stop {
            out.push((address + (start - pos), stop - start));
        }
        pos += size;
        if pos >= end {
            break;
        }
    }
    out
}

/// The data-plane answer to a disk fault.
fn fault_status(fault: DiskFault) -> DataStatus {
    match fault {
        DiskFault::NotFound => DataStatus::FileNotFound,
        DiskFault::Corrupt => DataStatus::FileCorrupt,
        DiskFault::Full => DataStatus::DiskFull,
        DiskFault::ReadFailed => DataStatus::FileReadFail,
        DiskFault::WriteFailed => DataStatus::FileWriteFail,
    }
}

/// Streams a disk file: its header and length are verified first (a bad one is refused with
/// nothing sent), then the payload goes out in steps of [`FILE_STEP`] bytes with its checksum
/// computed on the way, and a one-byte trailer says whether it matched (or the file failed
/// mid-read, the rest then zero-filled so the connection stays in step). A 1 GiB file never
/// needs more than one step of node memory.
async fn serve_file_read(
    stream: &mut Conn,
    h: &RequestHeader,
    disk: Option<&Arc<DiskStore>>,
) -> io::Result<bool> {
    let Some(disk) = disk else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id)
            .await
            .map(|()| false);
    };
    let mut file = match disk.open_stream(h.address, h.length).await {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(file = h.address, error = %with_cause(&e), "disk file read refused");
            return respond(stream, fault_status(e.fault()), h.request_id)
                .await
                .map(|()| false);
        }
    };
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: h.length,
    }
    .encode();
    stream.write_all(&ok).await?;
    let mut buf = vec![0u8; FILE_STEP.min(h.length as usize).max(1)];
    let mut failed = None;
    while file.remaining() > 0 {
        match file.next(&mut buf).await {
            Ok(chunk) => stream.write_all(chunk).await?,
            Err(e) => {
                tracing::warn!(file = h.address, error = %with_cause(&e), "disk file read failed mid-stream");
                failed = Some(DataStatus::FileReadFail);
                break;
            }
        }
    }
    if failed.is_some() {
        let mut left = file.remaining();
        buf.fill(0);
        while left > 0 {
            let take = left.min(buf.len() as u64) as usize;
            stream.write_all(&buf[..take]).await?;
            left -= take as u64;
        }
    }
    let trailer = match failed {
        Some(status) => status,
        None => match file.finish() {
            Ok(()) => DataStatus::Ok,
            Err(e) => fault_status(e.fault()),
        },
    };
    stream
        .write_all(&[trailer as u8])
        .await
        .map(|()| trailer == DataStatus::Ok)
}

/// Bytes of a disk file sent per step.
const FILE_STEP: usize = 1 << 20;

/// Writes a disk file from the payload; acknowledged once the file is synced under its name.
/// With a grant, `granted_size` is the object size it allows.
async fn serve_file_write(
    stream: &mut Conn,
    h: &RequestHeader,
    disk: Option<&Arc<DiskStore>>,
    granted_size: Option<u64>,
) -> io::Result<bool> {
    let Some(disk) = disk else {
        return refuse_write(stream, h, DataStatus::UnknownSegment)
            .await
            .map(|()| false);
    };
    if h.length < FileMeta::FIXED_LEN as u64 {
        return refuse_write(stream, h, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    }
    let mut fixed = [0u8; FileMeta::FIXED_LEN];
    stream.read_exact(&mut fixed).await?;
    let rest = h.length - FileMeta::FIXED_LEN as u64;
    let tenant_len = u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]) as u64;
    let key_len = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]) as u64;
    let sane = tenant_len <= MAX_TENANT_LEN as u64
        && key_len <= moonkv_proto::MAX_KEY_LEN as u64
        && tenant_len + key_len < rest
        && h.address != 0;
    if !sane {
        let skipped = RequestHeader { length: rest, ..*h };
        return refuse_write(stream, &skipped, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    }
    let mut text = vec![0u8; (tenant_len + key_len) as usize];
    stream.read_exact(&mut text).await?;
    let size = rest - tenant_len - key_len;
    if granted_size.is_some_and(|granted| granted != size) {
        let skipped = RequestHeader { length: size, ..*h };
        return refuse_write(stream, &skipped, DataStatus::Forbidden)
            .await
            .map(|()| false);
    }
    let (tenant, key) = text.split_at(tenant_len as usize);
    let (Ok(tenant), Ok(key)) = (std::str::from_utf8(tenant), std::str::from_utf8(key)) else {
        let skipped = RequestHeader { length: size, ..*h };
        return refuse_write(stream, &skipped, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    };
    match disk.write_from(h.address, tenant, key, size, stream).await {
        Ok(()) => respond(stream, DataStatus::Ok, h.request_id)
            .await
            .map(|()| true),
        Err(WriteError::Disk(e)) => {
            tracing::debug!(file = h.address, error = %with_cause(&e), "disk file write refused");
            respond(stream, fault_status(e.fault()), h.request_id)
                .await
                .map(|()| false)
        }
        Err(WriteError::Payload(e)) => Err(e),
    }
}
