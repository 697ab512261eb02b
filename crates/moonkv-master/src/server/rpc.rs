//! The RPC server: framed protocol over TCP, pipelined, one task per connection.
//!
//! Frames are parsed straight out of the read buffer; cheap operations run inline and their
//! responses are batched into one write per read. Operations that scan every shard (regex forms,
//! RemoveAll) run on the blocking pool and answer when done, so responses may come back out of
//! order; clients match them by request id.

use super::ha::Gate;
use super::metrics::Metrics;
use super::pending::{Connections, Established, Pending};
use crate::engine::{Engine, PendingNotices};
use moonkv_proto::auth::{Secret, NONCE_LEN};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::*;
use moonkv_proto::{Error, ErrorCode, PROTOCOL_MAGIC, PROTOCOL_VERSION};
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// State every connection shares.
pub(crate) struct RpcShared {
    /// Admits each request (HA: only a leader within its write deadline) and holds the engine.
    pub gate: Arc<Gate>,
    pub metrics: Arc<Metrics>,
    pub max_frame_bytes: u32,
    /// An incomplete frame that gets no new bytes this long closes its connection.
    pub io_timeout: std::time::Duration,
    /// Connections in their handshake (deadline, caps, eviction) and the `max_connections`
    /// slots of established ones.
    pub connections: Arc<Connections>,
    /// Announced in every hello answer.
    pub admin_addr: Option<String>,
    /// This master's local socket (`@moonkv-master-…`), announced in every hello answer:
    /// callers on this machine may reconnect there.
    pub local_socket: Option<String>,
    pub secret: Option<Secret>,
    /// Set (the grant secret): a connection proving this secret instead of the shared one is a
    /// node's, and only node connections may mount, unmount or serve segments.
    pub node_secret: Option<Secret>,
    /// Set: the port only accepts TLS.
    pub tls: Option<super::tls::RpcTls>,
    /// Wakes the nodes' catalog long polls and the removals waiting for their drop notices.
    pub catalog: Arc<CatalogSignals>,
}

/// The two wake-ups of the catalog stream (`engine::catalog`).
#[derive(Debug, Default)]
pub(crate) struct CatalogSignals {
    /// A notice was queued for some node.
    pub notices: tokio::sync::Notify,
    /// A notice was queued that must leave without lingering (a drop, a reset, a full
    /// answer's worth): a poll holding commits back waits only for this.
    pub urgent: tokio::sync::Notify,
    /// Some node acknowledged notices.
    pub acks: tokio::sync::Notify,
    /// When each node was last sent commit notices (see `COMMIT_LINGER`).
    pub last_commits:
        parking_lot::Mutex<std::collections::HashMap<moonkv_proto::ClientId, tokio::time::Instant>>,
}

impl CatalogSignals {
    /// Wires `engine`'s notice queue to these signals (every engine of every term).
    pub(crate) fn wire(self: &Arc<Self>, engine: &Engine) {
        let weak = Arc::downgrade(self);
        engine.set_catalog_waker(Arc::new(move |urgent| {
            if let Some(s) = weak.upgrade() {
                s.notices.notify_waiters();
                if urgent {
                    s.urgent.notify_waiters();
                }
            }
        }));
    }
}

/// Least time between two answers carrying only commit notices to one node: commits that come
/// sooner wait for the rest of it (a stream of puts), others go at once; drops never wait.
const COMMIT_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Longest a node's SyncCatalog is held when nothing is pending.
const MAX_CATALOG_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest a removal or replacement waits for its drop notices to be acknowledged.
const FENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A node that has not polled its catalog for this long is not waited for (it cannot be
/// reached now; see the residual risks in docs/operations.md).
const FENCE_STALE_MS: u64 = 3_000;

/// Operations that acknowledge that committed replicas a client asked to be gone are gone:
/// their answer waits until the nodes holding those replicas acknowledged the drop, so an
/// acknowledged removal or replacement survives a master crash. An UpsertStart drops the value
/// it replaces but acknowledges nothing yet: its drops are waited for by the write's End
/// (`CatalogBook::hold_replaced`), while the bytes are moving, so a replacement costs no extra
/// round trip to the nodes.
fn is_fenced(op: Op) -> bool {
    matches!(
        op,
        Op::Remove
            | Op::BatchRemove
            | Op::RemoveByRegex
            | Op::RemoveAll
            | Op::BatchReplicaClear
            | Op::UpsertEnd
            | Op::BatchUpsertEnd
    )
}

/// An answer that is not ready yet (its encoded frame).
type HeldOut = std::pin::Pin<Box<dyn std::future::Future<Output = Vec<u8>> + Send>>;

/// A deferred answer leaves only if this master still serves the term it was admitted under;
/// otherwise it becomes the refusal (HA fencing, as `Serving::seal` does for inline answers).
fn seal_deferred(shared: &RpcShared, term: u64, request_id: u64, out: &mut Vec<u8>) {
    if !shared.gate.still_serving(term, Instant::now()) {
        out.clear();
        frame::encode_err(out, request_id, &shared.gate.refusal());
    }
}

/// Waits (bounded) until the drop notices of `fence` were acknowledged.
async fn wait_fence(shared: &RpcShared, engine: &Engine, fence: crate::engine::CatalogFence) {
    let deadline = tokio::time::Instant::now() + FENCE_TIMEOUT;
    loop {
        let acked = shared.catalog.acks.notified();
        tokio::pin!(acked);
        acked.as_mut().enable();
        if engine.catalog_fence_passed(&fence, FENCE_STALE_MS) {
            return;
        }
        if tokio::time::timeout_at(deadline, acked).await.is_err() {
            tracing::warn!(
                nodes = fence.len(),
                "drop notices not acknowledged in time; answering anyway"
            );
            return;
        }
    }
}

/// SyncCatalog: answers at once when drops are pending or when commits are and the node was
/// not sent any in the last `COMMIT_LINGER` (else when that time is up), and otherwise holds
/// the poll until a notice is queued or the node's wait ends.
async fn sync_catalog(
    shared: &RpcShared,
    engine: &Engine,
    req: &SyncCatalogRequest,
) -> Result<SyncCatalogResponse, Error> {
    let wait = std::time::Duration::from_millis(u64::from(req.wait_ms)).min(MAX_CATALOG_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut answer_by = deadline;
    let mut first = true;
    loop {
        let queued = shared.catalog.notices.notified();
        let urgent = shared.catalog.urgent.notified();
        tokio::pin!(queued, urgent);
        queued.as_mut().enable();
        urgent.as_mut().enable();
        let pending = engine.catalog_acknowledge(req);
        if first {
            // This poll acknowledged notices: removals waiting for them may answer.
            shared.catalog.acks.notify_waiters();
            first = false;
        }
        let lingering = if pending != PendingNotices::Nothing {
            match commits_may_wait(shared, req.client_id, pending) {
                // Commits in a stream of puts: they wait for the next ones.
                Some(until) if until > tokio::time::Instant::now() => {
                    answer_by = until.min(deadline);
                    true
                }
                _ => return Ok(sent(shared, req.client_id, engine.sync_catalog(req)?)),
            }
        } else {
            false
        };
        // Commits held back wait for the time to be up, or for a notice that must not wait:
        // further commits join them without waking this poll (one wake-up per End of a put
        // stream otherwise, and a fresh look at the mailbox each time).
        let woken = if lingering {
            tokio::time::timeout_at(answer_by, urgent).await
        } else {
            tokio::time::timeout_at(answer_by, queued).await
        };
        if woken.is_err() {
            return Ok(sent(shared, req.client_id, engine.sync_catalog(req)?));
        }
    }
}

/// Until when the notices pending for `node` may wait for more: only when they are commits
/// alone and the node was sent some less than `COMMIT_LINGER` ago (a stream of puts, which then
/// costs the node one answer per few puts, not one each). Drops (a removal waits for them),
/// resets and commits after a pause go at once.
fn commits_may_wait(
    shared: &RpcShared,
    node: moonkv_proto::ClientId,
    pending: PendingNotices,
) -> Option<tokio::time::Instant> {
    if pending == PendingNotices::Urgent {
        return None;
    }
    let last = shared.catalog.last_commits.lock().get(&node).copied();
    last.map(|sent| sent + COMMIT_LINGER)
}

/// `answer`, noted as sent to `node` now when it carries notices (see [`commits_may_wait`]).
fn sent(
    shared: &RpcShared,
    node: moonkv_proto::ClientId,
    answer: SyncCatalogResponse,
) -> SyncCatalogResponse {
    if !answer.notices.is_empty() {
        let now = tokio::time::Instant::now();
        let mut sent = shared.catalog.last_commits.lock();
        if sent.len() >= 1024 {
            // Nodes come and go (every Python store with a segment is one): only the recent
            // ones matter.
            sent.retain(|_, at| now.duration_since(*at) < COMMIT_LINGER);
        }
        sent.insert(node, now);
    }
    answer
}

/// A connection's handshake and, once accepted, its `max_connections` slot.
struct Opening {
    handshake: Handshake,
    established: Option<Established>,
}

/// Where a connection is in its handshake.
enum Handshake {
    /// Nothing received yet.
    New,
    /// The master sent this challenge and waits for the proof.
    Challenged(Vec<u8>),
    /// Requests are accepted, within what the connection's role allows.
    Ready(Role),
}

/// What a connection proved in its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// No distinction is configured: anything goes (no secret, or no separate node secret).
    Any,
    /// Proved the shared (client) secret: data operations of its tenants only.
    Client,
    /// Proved the node secret: segment and disk-tier operations too.
    Node,
}

/// Operations only a node may perform: they decide where other tenants' bytes go.
fn node_only(op: moonkv_proto::msg::Op) -> bool {
    use moonkv_proto::msg::Op;
    matches!(
        op,
        Op::MountSegment
            | Op::ReMountSegment
            | Op::UnmountSegment
            | Op::GracefulUnmountSegment
            | Op::MountDiskSegment
            | Op::UnmountDiskSegment
            | Op::OffloadHeartbeat
            | Op::NotifyOffload
            | Op::SyncCatalog
            | Op::AdoptReplicas
    )
}

macro_rules! gen_dispatch {
    ($($code:literal => $name:ident($req:ty) -> $resp:ty, $method:ident;)*) => {
        /// Runs one request, appends its response frame and counts it in `metrics`.
        pub(crate) fn dispatch(shared: &RpcShared, engine: &Engine, request_id: u64, request: &Request, out: &mut Vec<u8>) {
            let started = Instant::now();
            match request {
                $(Request::$name(r) => {
                    let reply = engine.$method(r);
                    let encoded = respond(out, request_id, &reply);
                    shared.metrics.record_reply(request, &reply, encoded, started.elapsed());
                })*
            }
        }

        /// Runs one request for the node in this process and counts it in `metrics`: its
        /// answer as a value, not encoded.
        fn dispatch_value(shared: &RpcShared, engine: &Engine, request: &Request) -> Result<Box<dyn std::any::Any + Send>, Error> {
            let started = Instant::now();
            match request {
                $(Request::$name(r) => {
                    let reply = engine.$method(r);
                    shared.metrics.record_reply(request, &reply, true, started.elapsed());
                    reply.map(|value| Box::new(value) as Box<dyn std::any::Any + Send>)
                })*
            }
        }
    };
}
moonkv_proto::for_each_op!(gen_dispatch);

/// Appends the answer frame; false when the value could not be encoded (an error went out).
pub(super) fn respond<T: Serialize>(
    out: &mut Vec<u8>,
    request_id: u64,
    result: &Result<T, Error>,
) -> bool {
    match result {
        Ok(value) => match frame::encode_ok(out, request_id, value) {
            Ok(()) => true,
            Err(e) => {
                frame::encode_err(out, request_id, &e);
                false
            }
        },
        Err(e) => {
            frame::encode_err(out, request_id, e);
            true
        }
    }
}

/// Operations that walk every shard; they leave the connection task so it keeps serving.
fn is_scan(op: Op) -> bool {
    matches!(
        op,
        Op::GetReplicaListByRegex | Op::RemoveByRegex | Op::RemoveAll
    )
}

/// Accepts connections until `shutdown` flips.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<RpcShared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // The handshake's place: a deadline, and caps that evict the oldest
                    // pending connection rather than refuse the newest (`pending.rs`).
                    let Some(pending) = shared.connections.begin(peer.ip()) else {
                        tracing::debug!(%peer, "connection closed at accept: every handshake place is held by a connection too young to evict");
                        drop(stream);
                        continue;
                    };
                    let deadline = tokio::time::Instant::now() + shared.connections.deadline();
                    let shared = shared.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        // Until its first byte a connection costs only this small task: the
                        // connection's state (TLS included) is allocated once the client speaks.
                        let mut first = [0u8; 1];
                        let mut stop = shutdown.clone();
                        let evicted = pending.eviction();
                        tokio::select! {
                            peeked = stream.peek(&mut first) => {
                                if !matches!(peeked, Ok(n) if n > 0) {
                                    return;
                                }
                                pending.spoke();
                            }
                            _ = tokio::time::sleep_until(deadline) => {
                                shared.connections.metrics().closed("deadline");
                                tracing::debug!(%peer, "closed: no hello within handshake_timeout");
                                return;
                            }
                            _ = evicted.notified() => return,
                            _ = stop.changed() => return,
                        }
                        let served = serve_connection(stream, shared, shutdown, pending, deadline);
                        if let Err(e) = Box::pin(served).await {
                            tracing::debug!(%peer, error = %e, "connection closed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

/// Accepts connections on the master's local socket until `shutdown` flips. They are served
/// as TCP ones are (handshake, deadline, caps); their handshake places are counted against
/// the loopback address, which callers on this machine otherwise use.
pub(crate) async fn serve_local(
    listener: tokio::net::UnixListener,
    shared: Arc<RpcShared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let source = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some(pending) = shared.connections.begin(source) else {
                        tracing::debug!("local connection closed at accept: every handshake place is held by a connection too young to evict");
                        drop(stream);
                        continue;
                    };
                    shared.connections.metrics().local_opened();
                    let deadline = tokio::time::Instant::now() + shared.connections.deadline();
                    let shared = shared.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        let (reader, writer) = stream.into_split();
                        let served = serve_halves(
                            Box::new(reader),
                            Box::new(writer),
                            shared,
                            shutdown,
                            pending,
                            deadline,
                        );
                        if let Err(e) = Box::pin(served).await {
                            tracing::debug!(error = %e, "local connection closed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the local socket failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

/// Why a connection is being closed by the server.
#[derive(Debug, thiserror::Error)]
enum CloseReason {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("refused: {0}")]
    Full(String),
    #[error("handshake not finished within handshake_timeout")]
    HandshakeTimeout,
    #[error("evicted during its handshake by a newer connection")]
    Evicted,
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<RpcShared>,
    shutdown: watch::Receiver<bool>,
    pending: Pending,
    deadline: tokio::time::Instant,
) -> Result<(), CloseReason> {
    stream.set_nodelay(true)?;
    let evicted = pending.eviction();
    let (reader, writer) = tokio::select! {
        opened = super::tls::accept(stream, shared.tls.as_ref()) => opened?,
        _ = tokio::time::sleep_until(deadline) => {
            shared.connections.metrics().closed("deadline");
            return Err(CloseReason::HandshakeTimeout);
        }
        _ = evicted.notified() => return Err(CloseReason::Evicted),
    };
    serve_halves(reader, writer, shared, shutdown, pending, deadline).await
}

/// Serves a connection whose stream is open (TLS accepted, when the port has it): its
/// handshake within `deadline`, then its requests until it closes or `shutdown` flips.
async fn serve_halves(
    mut reader: super::tls::Reader,
    mut writer: super::tls::Writer,
    shared: Arc<RpcShared>,
    mut shutdown: watch::Receiver<bool>,
    pending: Pending,
    deadline: tokio::time::Instant,
) -> Result<(), CloseReason> {
    let evicted = pending.eviction();
    let mut pending = Some(pending);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<ScanDone>();
    let scans = Arc::new(Semaphore::new(MAX_SCANS_IN_FLIGHT));
    // Both start empty, so an idle connection costs little (see `READ_ROOM`).
    let mut input: Vec<u8> = Vec::new();
    let mut output: Vec<u8> = Vec::new();
    let mut opening = Opening {
        handshake: Handshake::New,
        established: None,
    };
    let mut serving = Serving::new(&shared.gate);
    // Set while frames wait in `input` for a scan slot: the socket is not read meanwhile, so a
    // client that sends scans and never reads their answers stalls itself, not the master.
    let mut paused = false;
    loop {
        tokio::select! {
            read = read_more(&mut reader, &mut input, shared.io_timeout), if !paused => {
                if read? == 0 {
                    return Ok(());
                }
                if let Some(pending) = &pending {
                    // Marked at its first byte (a local connection is not peeked at accept).
                    pending.spoke();
                }
                // The events of the frames answered here leave with their answers.
                let verdict = serving.engine.clone().reporting_inline(|| process_input(
                    &shared, &mut serving, &mut input, &mut output, &mut opening,
                    &done_tx, &scans,
                ));
                if opening.established.is_some() {
                    // Accepted: the handshake's place goes back.
                    pending = None;
                }
                if !output.is_empty() {
                    serving.seal(&shared.gate, &mut output);
                    writer.write_all(&output).await?;
                    output.clear();
                    give_back_if_large(&mut output);
                }
                paused = verdict?;
            }
            Some((bytes, slot)) = done_rx.recv() => {
                writer.write_all(&bytes).await?;
                // The slot frees only once the answer left, so unread answers stay bounded.
                drop(slot);
                if paused {
                    let verdict = serving.engine.clone().reporting_inline(|| process_input(
                        &shared, &mut serving, &mut input, &mut output, &mut opening, &done_tx, &scans,
                    ));
                    if !output.is_empty() {
                        serving.seal(&shared.gate, &mut output);
                        writer.write_all(&output).await?;
                        output.clear();
                        give_back_if_large(&mut output);
                    }
                    paused = verdict?;
                }
            }
            _ = tokio::time::sleep_until(deadline), if pending.is_some() => {
                shared.connections.metrics().closed("deadline");
                return Err(CloseReason::HandshakeTimeout);
            }
            _ = evicted.notified(), if pending.is_some() => return Err(CloseReason::Evicted),
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// Room a read asks for when the input buffer is full: as much as the buffer holds, from 1 KiB
/// to 64 KiB. Buffers start empty and double by reads, so thousands of idle connections cost
/// little, and a busy one's grows to its bursts.
const READ_ROOM: std::ops::RangeInclusive<usize> = 1 << 10..=64 << 10;
/// A buffer that grew past this (a large frame or answer) is given back once it is empty, so a
/// connection does not keep a 16 MiB frame's buffer for the rest of its life.
const KEEP_BUFFER: usize = 256 << 10;

fn give_back_if_large(buffer: &mut Vec<u8>) {
    if buffer.is_empty() && buffer.capacity() > KEEP_BUFFER {
        *buffer = Vec::new();
    }
}

/// Reads more bytes; while a frame is partly received, the peer must send more within
/// `limit` (a half-sent frame cannot pin its buffer forever). Between frames there is no
/// limit: clients keep their connection open while idle.
async fn read_more(
    reader: &mut super::tls::Reader,
    input: &mut Vec<u8>,
    limit: std::time::Duration,
) -> std::io::Result<usize> {
    if input.len() == input.capacity() {
        input.reserve(input.capacity().clamp(*READ_ROOM.start(), *READ_ROOM.end()));
    }
    if input.is_empty() {
        return reader.read_buf(input).await;
    }
    tokio::time::timeout(limit, reader.read_buf(input))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("a frame stayed incomplete for {limit:?}"),
            ))
        })
}

/// Scans one connection may have running or answered-but-unsent at a time.
const MAX_SCANS_IN_FLIGHT: usize = 2;

/// A finished scan's response frame and the slot it held.
type ScanDone = (Vec<u8>, tokio::sync::OwnedSemaphorePermit);

/// Handles every complete frame in `input`, appending responses to `output`; `Ok(true)` when
/// it stopped at a scan for want of a scan slot (the frame stays in `input`).
fn process_input(
    shared: &Arc<RpcShared>,
    serving: &mut Serving,
    input: &mut Vec<u8>,
    output: &mut Vec<u8>,
    opening: &mut Opening,
    done_tx: &mpsc::UnboundedSender<ScanDone>,
    scans: &Arc<Semaphore>,
) -> Result<bool, CloseReason> {
    let mut consumed = 0;
    let result = loop {
        let (frame, used) = match frame::decode(&input[consumed..], shared.max_frame_bytes) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => break Ok(false),
            Err(e) => {
                frame::encode_err(
                    output,
                    0,
                    &Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("{e}; closing connection"),
                    ),
                );
                break Err(CloseReason::Protocol(e.to_string()));
            }
        };
        consumed += used;
        let Handshake::Ready(role) = opening.handshake else {
            match greet(
                &frame,
                shared,
                &opening.handshake,
                &mut opening.established,
                output,
            ) {
                Ok(next) => opening.handshake = next,
                Err(reason) => {
                    if !matches!(reason, CloseReason::Full(_)) {
                        shared.metrics.record_refused_handshake();
                    }
                    break Err(reason);
                }
            }
            continue;
        };
        if frame.kind != FrameKind::Request {
            let msg = format!(
                "expected a request frame, got {:?}; closing connection",
                frame.kind
            );
            frame::encode_err(
                output,
                frame.request_id,
                &Error::new(ErrorCode::INVALID_PARAMS, msg.clone()),
            );
            break Err(CloseReason::Protocol(msg));
        }
        let request = match frame::decode_request(&frame) {
            Ok(request) => request,
            Err(e) => {
                shared.metrics.record_malformed();
                frame::encode_err(output, frame.request_id, &e);
                continue;
            }
        };
        let op = request.op();
        let started = Instant::now();
        if let Err(refusal) = serving.admit(&shared.gate, started, output.len()) {
            shared.metrics.record(op, false, std::time::Duration::ZERO);
            frame::encode_err(output, frame.request_id, &refusal);
            continue;
        }
        if role == Role::Client && node_only(op) {
            shared.metrics.record(op, false, std::time::Duration::ZERO);
            frame::encode_err(
                output,
                frame.request_id,
                &Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("{op:?} is for nodes: this connection proved the client secret, not the node secret"),
                ),
            );
            continue;
        }
        let request_id = frame.request_id;
        if let Request::SyncCatalog(req) = &request {
            let Ok(slot) = scans.clone().try_acquire_owned() else {
                // No slot: the frame waits in `input` until an answer has left.
                consumed -= used;
                break Ok(true);
            };
            let shared = shared.clone();
            let done_tx = done_tx.clone();
            let req = req.clone();
            let term = serving.term;
            let engine = serving.engine.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut out = Vec::new();
                let reply = sync_catalog(&shared, &engine, &req).await;
                let encoded = respond(&mut out, request_id, &reply);
                shared
                    .metrics
                    .record_reply(&request, &reply, encoded, started.elapsed());
                seal_deferred(&shared, term, request_id, &mut out);
                let _ = done_tx.send((out, slot));
            });
            continue;
        }
        if is_scan(op) {
            let Ok(slot) = scans.clone().try_acquire_owned() else {
                consumed -= used;
                break Ok(true);
            };
            let shared = shared.clone();
            let done_tx = done_tx.clone();
            let runtime = tokio::runtime::Handle::current();
            let term = serving.term;
            let engine = serving.engine.clone();
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                let before = engine.deletion_seq();
                let ((), fence) = engine.reporting_inline(|| {
                    crate::engine::fence_scope(|| {
                        dispatch(&shared, &engine, request_id, &request, &mut out)
                    })
                });
                // Files of removed disk replicas are deleted before the answer leaves.
                super::space_wait::wait_for_deletions_blocking(&engine, before);
                if fence.is_empty() {
                    // The answer leaves only if this master still serves the term it started in.
                    seal_deferred(&shared, term, request_id, &mut out);
                    let _ = done_tx.send((out, slot));
                } else {
                    runtime.spawn(async move {
                        wait_fence(&shared, &engine, fence).await;
                        seal_deferred(&shared, term, request_id, &mut out);
                        let _ = done_tx.send((out, slot));
                    });
                }
            });
            continue;
        }
        if !super::space_wait::may_delete_files(op) {
            dispatch(shared, &serving.engine, request_id, &request, output);
            continue;
        }
        // Writes and removals: the disk tier may hold the answer (a Start waiting for memory,
        // a removal waiting for its files to be deleted), and one that dropped committed memory
        // replicas waits for their nodes to acknowledge the drop (`is_fenced`).
        let engine = &serving.engine;
        let (answer, fence) = crate::engine::fence_scope(|| {
            super::space_wait::answer(shared, engine, request_id, &request)
        });
        let fence = if is_fenced(op) {
            fence
        } else {
            crate::engine::CatalogFence::default()
        };
        let held = match answer {
            super::space_wait::Answer::Done(out) if fence.is_empty() => {
                output.extend_from_slice(&out);
                continue;
            }
            super::space_wait::Answer::Done(out) => Box::pin(async move { out }) as HeldOut,
            super::space_wait::Answer::HeldDeletion(answer) => answer,
            super::space_wait::Answer::HeldStart(answer) => {
                match scans.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let (shared, done_tx) = (shared.clone(), done_tx.clone());
                        let (term, engine) = (serving.term, engine.clone());
                        tokio::spawn(async move {
                            let (mut out, fence) = answer.await;
                            wait_fence(&shared, &engine, fence).await;
                            seal_deferred(&shared, term, request_id, &mut out);
                            let _ = done_tx.send((out, slot));
                        });
                        continue;
                    }
                    // Nothing was changed: the frame runs again once a slot is free.
                    Err(_) => {
                        consumed -= used;
                        break Ok(true);
                    }
                }
            }
        };
        // Already executed: it is answered, slot or not (a wait is bounded in time).
        let slot = match scans.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => match Arc::new(Semaphore::new(1)).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => continue,
            },
        };
        let (shared, done_tx) = (shared.clone(), done_tx.clone());
        let (term, engine) = (serving.term, engine.clone());
        tokio::spawn(async move {
            let mut out = held.await;
            wait_fence(&shared, &engine, fence).await;
            seal_deferred(&shared, term, request_id, &mut out);
            let _ = done_tx.send((out, slot));
        });
    };
    input.drain(..consumed);
    give_back_if_large(input);
    if result.is_ok() {
        reserve_for_next_frame(input, shared.max_frame_bytes);
    }
    result
}

/// Answers a request of the node in this process (`moonkv up`'s own node) as on a node's
/// connection: admitted, held for file deletions, fenced and sealed alike, without a socket,
/// and as a value (`moonkv_proto::local`), so nothing is encoded or decoded. Single Starts,
/// which may be held for space (`space_wait`), are answered as frames. With `defer_events`, the
/// events the answer published leave when the third value is dropped (by the node, once it
/// answered its caller); otherwise before this returns.
pub(crate) async fn answer_in_process(
    shared: Arc<RpcShared>,
    request: Request,
    defer_events: bool,
) -> (Request, moonkv_proto::local::Answer, Option<Box<dyn Send>>) {
    use moonkv_proto::local::Answer;
    let op = request.op();
    if is_scan(op) {
        // A scan holds the engine for long; a connection runs it on a blocking thread. The
        // node asks in process only for writes, replica lists and catalog polls.
        let refused = Error::new(
            ErrorCode::NOT_SUPPORTED,
            format!("{op:?} is answered on a connection, not by a call in process"),
        );
        return (request, Answer::Value(Err(refused)), None);
    }
    let mut serving = Serving::new(&shared.gate);
    if let Err(refusal) = serving.admit(&shared.gate, Instant::now(), 0) {
        return (request, Answer::Value(Err(refusal)), None);
    }
    let (term, engine) = (serving.term, serving.engine.clone());
    if matches!(op, Op::PutStart | Op::UpsertStart) {
        let frame = start_as_frame(&shared, &engine, term, &request).await;
        return (request, Answer::Frame(frame), None);
    }
    let mut events = None;
    let answer = if let Request::SyncCatalog(req) = &request {
        let started = Instant::now();
        let reply = sync_catalog(&shared, &engine, req).await;
        shared
            .metrics
            .record_reply(&request, &reply, true, started.elapsed());
        reply.map(|value| Box::new(value) as Box<dyn std::any::Any + Send>)
    } else {
        let before = engine.deletion_seq();
        let work = || crate::engine::fence_scope(|| dispatch_value(&shared, &engine, &request));
        let (answer, fence) = if defer_events {
            let (out, deferred) = engine.reporting_deferred(work);
            events = deferred;
            out
        } else {
            engine.reporting_inline(work)
        };
        let after = engine.deletion_seq();
        if super::space_wait::may_delete_files(op)
            && after > before
            && !engine.deletions_done_through(after)
        {
            super::space_wait::wait_for_deletions(&engine, after).await;
        }
        if is_fenced(op) {
            wait_fence(&shared, &engine, fence).await;
        }
        answer
    };
    let answer = if shared.gate.still_serving(term, Instant::now()) {
        answer
    } else {
        Err(shared.gate.refusal())
    };
    (request, Answer::Value(answer), events)
}

/// A single Start of the node in this process, admitted under `term`: its encoded answer,
/// once any wait for space (`space_wait`) is over.
async fn start_as_frame(
    shared: &Arc<RpcShared>,
    engine: &Arc<Engine>,
    term: u64,
    request: &Request,
) -> Vec<u8> {
    let mut out = match super::space_wait::answer(shared, engine, 0, request) {
        super::space_wait::Answer::Done(out) => out,
        super::space_wait::Answer::HeldDeletion(answer) => answer.await,
        super::space_wait::Answer::HeldStart(answer) => {
            let (out, held) = answer.await;
            wait_fence(shared, engine, held).await;
            out
        }
    };
    seal_deferred(shared, term, 0, &mut out);
    out
}

/// A connection's view of the gate: the engine of the term it last saw, and which terms the
/// answers waiting in its output buffer were admitted under.
struct Serving {
    term: u64,
    engine: Arc<Engine>,
    /// Where in the output buffer the first answer admitted under `term` starts (HA only).
    pending: Option<usize>,
    /// Answers in the output buffer were admitted under more than one term.
    mixed: bool,
}

impl Serving {
    fn new(gate: &Gate) -> Serving {
        let (term, engine) = gate.current();
        Serving {
            term,
            engine,
            pending: None,
            mixed: false,
        }
    }

    /// Admits a request starting at `now` whose answer will start at `at` in the output
    /// buffer; `self.engine` is then the engine of the term it runs under.
    #[inline]
    fn admit(&mut self, gate: &Gate, now: Instant, at: usize) -> Result<(), Error> {
        let term = gate.admit(now)?;
        if term != self.term {
            self.mixed |= self.pending.is_some();
            let (current, engine) = gate.current();
            self.term = current;
            self.engine = engine;
        }
        if gate.is_ha() && self.pending.is_none() {
            self.pending = Some(at);
        }
        Ok(())
    }

    /// Right before the output buffer is written: if this master stopped serving the term its
    /// answers were admitted under (the write deadline passed, or it stepped down), every
    /// answer in it becomes the refusal, so no write that crossed the deadline is reported OK.
    fn seal(&mut self, gate: &Gate, output: &mut Vec<u8>) {
        let Some(from) = self.pending.take() else {
            return;
        };
        let mixed = std::mem::take(&mut self.mixed);
        if !mixed && gate.still_serving(self.term, Instant::now()) {
            return;
        }
        let refusal = gate.refusal();
        let mut ids = Vec::new();
        let mut at = from;
        while let Ok(Some((frame, used))) = frame::decode(&output[at..], u32::MAX) {
            ids.push(frame.request_id);
            at += used;
        }
        output.truncate(from);
        for id in ids {
            frame::encode_err(output, id, &refusal);
        }
    }
}

/// When a large frame is partly read, make room for all of it at once (the length was checked).
fn reserve_for_next_frame(input: &mut Vec<u8>, max: u32) {
    if input.len() >= 4 {
        let len = u32::from_be_bytes([input[0], input[1], input[2], input[3]]);
        if len <= max {
            let total = 4 + len as usize;
            input.reserve(total.saturating_sub(input.len()));
        }
    }
}

fn refuse(
    frame: &frame::Frame<'_>,
    output: &mut Vec<u8>,
    code: ErrorCode,
    msg: String,
) -> Result<Handshake, CloseReason> {
    frame::encode_err(output, frame.request_id, &Error::new(code, msg.clone()));
    Err(CloseReason::Protocol(msg))
}

/// Handles a frame that arrives before the handshake completed; returns the next state.
fn greet(
    frame: &frame::Frame<'_>,
    shared: &RpcShared,
    state: &Handshake,
    established: &mut Option<Established>,
    output: &mut Vec<u8>,
) -> Result<Handshake, CloseReason> {
    if frame.kind != FrameKind::Hello {
        let msg = match state {
            Handshake::Challenged(_) => {
                "authentication required: answer the challenge with a second hello"
            }
            _ => "the first frame must be a hello (kind 3)",
        };
        let code = if matches!(state, Handshake::Challenged(_)) {
            ErrorCode::ILLEGAL_CLIENT
        } else {
            ErrorCode::INVALID_PARAMS
        };
        return refuse(frame, output, code, msg.into());
    }
    let hello: Hello = match rmp_serde::from_slice(frame.body) {
        Ok(h) => h,
        Err(e) => {
            return refuse(
                frame,
                output,
                ErrorCode::INVALID_PARAMS,
                format!("malformed hello: {e}"),
            )
        }
    };
    if hello.magic != PROTOCOL_MAGIC {
        return refuse(
            frame,
            output,
            ErrorCode::INVALID_PARAMS,
            format!("bad magic {:?}; not a moonkv client", hello.magic),
        );
    }
    if hello.protocol_version != PROTOCOL_VERSION {
        let msg = format!(
            "protocol version {} is not supported; this master speaks version {PROTOCOL_VERSION}",
            hello.protocol_version
        );
        return refuse(frame, output, ErrorCode::NOT_SUPPORTED, msg);
    }
    let mut ack = HelloAck {
        protocol_version: PROTOCOL_VERSION,
        server_version: env!("CARGO_PKG_VERSION").to_string(),
        max_frame_bytes: shared.max_frame_bytes,
        challenge: None,
        server_proof: None,
        admin_addr: shared.admin_addr.clone(),
        local_socket: shared.local_socket.clone(),
    };
    let next = match (&shared.secret, state) {
        (None, _) => Handshake::Ready(Role::Any),
        (Some(_), Handshake::New) => {
            let challenge: [u8; NONCE_LEN] = rand::random();
            ack.challenge = Some(challenge.to_vec());
            Handshake::Challenged(challenge.to_vec())
        }
        (Some(secret), Handshake::Challenged(challenge)) => {
            let Some(auth) = hello.auth else {
                return refuse(
                    frame,
                    output,
                    ErrorCode::ILLEGAL_CLIENT,
                    "authentication required: the hello carries no proof".into(),
                );
            };
            let proves = |s: &Secret| {
                auth.client_nonce.len() == NONCE_LEN
                    && s.verify_client(challenge, &auth.client_nonce, &auth.proof)
            };
            let (proven, role) = match &shared.node_secret {
                Some(node) if proves(node) => (node, Role::Node),
                Some(_) if proves(secret) => (secret, Role::Client),
                None if proves(secret) => (secret, Role::Any),
                _ => {
                    tracing::warn!(client = %hello.client_name, "authentication failed");
                    return refuse(
                        frame,
                        output,
                        ErrorCode::ILLEGAL_CLIENT,
                        "authentication failed: wrong shared secret".into(),
                    );
                }
            };
            ack.server_proof = Some(proven.server_proof(challenge, &auth.client_nonce));
            Handshake::Ready(role)
        }
        (Some(_), Handshake::Ready(role)) => Handshake::Ready(*role),
    };
    if matches!(next, Handshake::Ready(_)) && established.is_none() {
        // Only an accepted handshake takes one of the `max_connections` slots.
        let Some(slot) = shared.connections.establish() else {
            shared.metrics.record_refused_connection();
            let max = shared.connections.max_established();
            let msg =
                format!("the master has max_connections ({max}) connections open; try again later");
            frame::encode_err(
                output,
                frame.request_id,
                &Error::new(ErrorCode::RPC_FAIL, msg.clone()),
            );
            return Err(CloseReason::Full(msg));
        };
        *established = Some(slot);
    }
    frame::encode_ok(output, frame.request_id, &ack)
        .map_err(|e| CloseReason::Protocol(e.to_string()))?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, ManualClock, NoopSink};
    use moonkv_proto::ha::{is_not_leader, LeaderRecord};
    use std::time::Duration;

    fn ha_gate() -> Gate {
        Gate::for_ha(|_| {
            Engine::new(
                EngineConfig::default(),
                Arc::new(ManualClock::new(0)),
                Arc::new(NoopSink),
            )
        })
    }

    fn lead(gate: &Gate, term: u64) {
        let record = LeaderRecord {
            term,
            rpc_addr: "127.0.0.1:1".into(),
            admin_addr: "127.0.0.1:2".into(),
            events_endpoint: None,
        };
        gate.become_leader(term, Instant::now() + Duration::from_secs(60), record);
    }

    /// The frames in `out`: (request id, error code).
    fn frames(out: &[u8]) -> Vec<(u64, i32)> {
        let mut at = 0;
        let mut seen = Vec::new();
        while let Ok(Some((f, used))) = frame::decode(&out[at..], u32::MAX) {
            seen.push((f.request_id, f.code));
            at += used;
        }
        seen
    }

    #[test]
    fn answers_of_a_term_that_ended_before_they_left_become_refusals() {
        let gate = ha_gate();
        lead(&gate, 1);
        let mut serving = Serving::new(&gate);
        let mut out = Vec::new();
        // An answer written before the first admitted request (a hello ack) stays as it is.
        frame::encode_ok(&mut out, 1, &()).unwrap();
        serving.admit(&gate, Instant::now(), out.len()).unwrap();
        frame::encode_ok(&mut out, 2, &()).unwrap();
        serving.admit(&gate, Instant::now(), out.len()).unwrap();
        frame::encode_ok(&mut out, 3, &()).unwrap();
        gate.step_down("lease lapsed");
        serving.seal(&gate, &mut out);
        let code = ErrorCode::UNAVAILABLE_IN_CURRENT_MODE.as_i32();
        assert_eq!(frames(&out), [(1, 0), (2, code), (3, code)]);
        assert!(is_not_leader(&gate.refusal()));
    }

    #[test]
    fn answers_of_the_live_term_leave_untouched() {
        let gate = ha_gate();
        lead(&gate, 4);
        let mut serving = Serving::new(&gate);
        let mut out = Vec::new();
        serving.admit(&gate, Instant::now(), out.len()).unwrap();
        frame::encode_ok(&mut out, 7, &()).unwrap();
        let before = out.clone();
        serving.seal(&gate, &mut out);
        assert_eq!(out, before);
        // A closed gate admits nothing.
        gate.step_down("etcd unreachable");
        assert!(serving.admit(&gate, Instant::now(), 0).is_err());
    }
}
