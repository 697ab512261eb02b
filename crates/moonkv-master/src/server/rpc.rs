//! The RPC server: framed protocol over TCP, pipelined, one task per connection.
//!
//! Frames are parsed straight out of the read buffer; cheap operations run inline and their
//! responses are batched into one write per read. Operations that scan every shard (regex forms,
//! RemoveAll) run on the blocking pool and answer when done, so responses may come back out of
//! order; clients match them by request id.

use super::metrics::Metrics;
use crate::engine::Engine;
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
    pub engine: Arc<Engine>,
    pub metrics: Arc<Metrics>,
    pub max_frame_bytes: u32,
    /// An incomplete frame that gets no new bytes this long closes its connection.
    pub io_timeout: std::time::Duration,
    /// Slots for open connections (`max_connections`).
    pub connections: Arc<Semaphore>,
    /// Announced in every hello answer.
    pub admin_addr: Option<String>,
    pub secret: Option<Secret>,
    /// Set (the grant secret): a connection proving this secret instead of the shared one is a
    /// node's, and only node connections may mount, unmount or serve segments.
    pub node_secret: Option<Secret>,
    /// Set: the port only accepts TLS.
    pub tls: Option<super::tls::RpcTls>,
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
    )
}

macro_rules! gen_dispatch {
    ($($code:literal => $name:ident($req:ty) -> $resp:ty, $method:ident;)*) => {
        /// Runs one request and appends its response frame; returns whether it succeeded.
        pub(crate) fn dispatch(engine: &Engine, request_id: u64, request: &Request, out: &mut Vec<u8>) -> bool {
            match request {
                $(Request::$name(r) => respond(out, request_id, engine.$method(r)),)*
            }
        }
    };
}
moonkv_proto::for_each_op!(gen_dispatch);

pub(super) fn respond<T: Serialize>(
    out: &mut Vec<u8>,
    request_id: u64,
    result: Result<T, Error>,
) -> bool {
    match result {
        Ok(value) => match frame::encode_ok(out, request_id, &value) {
            Ok(()) => true,
            Err(e) => {
                frame::encode_err(out, request_id, &e);
                false
            }
        },
        Err(e) => {
            frame::encode_err(out, request_id, &e);
            false
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
                    let Ok(slot) = shared.connections.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "connection refused: max_connections reached");
                        drop(stream);
                        continue;
                    };
                    let shared = shared.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(e) = serve_connection(stream, shared, shutdown).await {
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

/// Why a connection is being closed by the server.
#[derive(Debug, thiserror::Error)]
enum CloseReason {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<RpcShared>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), CloseReason> {
    stream.set_nodelay(true)?;
    let (mut reader, mut writer) = super::tls::accept(stream, shared.tls.as_ref()).await?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<ScanDone>();
    let scans = Arc::new(Semaphore::new(MAX_SCANS_IN_FLIGHT));
    let mut input: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut output: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut handshake = Handshake::New;
    // Set while frames wait in `input` for a scan slot: the socket is not read meanwhile, so a
    // client that sends scans and never reads their answers stalls itself, not the master.
    let mut paused = false;
    loop {
        tokio::select! {
            read = read_more(&mut reader, &mut input, shared.io_timeout), if !paused => {
                if read? == 0 {
                    return Ok(());
                }
                let verdict =
                    process_input(&shared, &mut input, &mut output, &mut handshake, &done_tx, &scans);
                if !output.is_empty() {
                    writer.write_all(&output).await?;
                    output.clear();
                }
                paused = verdict?;
            }
            Some((bytes, slot)) = done_rx.recv() => {
                writer.write_all(&bytes).await?;
                // The slot frees only once the answer left, so unread answers stay bounded.
                drop(slot);
                if paused {
                    let verdict = process_input(
                        &shared, &mut input, &mut output, &mut handshake, &done_tx, &scans,
                    );
                    if !output.is_empty() {
                        writer.write_all(&output).await?;
                        output.clear();
                    }
                    paused = verdict?;
                }
            }
            _ = shutdown.changed() => return Ok(()),
        }
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
const MAX_SCANS_IN_FLIGHT: usize = 4;

/// A finished scan's response frame and the slot it held.
type ScanDone = (Vec<u8>, tokio::sync::OwnedSemaphorePermit);

/// Handles every complete frame in `input`, appending responses to `output`; `Ok(true)` when
/// it stopped at a scan for want of a scan slot (the frame stays in `input`).
fn process_input(
    shared: &Arc<RpcShared>,
    input: &mut Vec<u8>,
    output: &mut Vec<u8>,
    handshake: &mut Handshake,
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
        let Handshake::Ready(role) = *handshake else {
            match greet(&frame, shared, handshake, output) {
                Ok(next) => *handshake = next,
                Err(reason) => break Err(reason),
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
        if is_scan(op) {
            let Ok(slot) = scans.clone().try_acquire_owned() else {
                // No scan slot: the frame waits in `input` until an answer has left.
                consumed -= used;
                break Ok(true);
            };
            let shared = shared.clone();
            let done_tx = done_tx.clone();
            let request_id = frame.request_id;
            tokio::task::spawn_blocking(move || {
                let started = Instant::now();
                let mut out = Vec::new();
                let before = shared.engine.deletion_seq();
                let ok = dispatch(&shared.engine, request_id, &request, &mut out);
                super::space_wait::wait_for_deletions_blocking(&shared.engine, before);
                shared.metrics.record(op, ok, started.elapsed());
                let _ = done_tx.send((out, slot));
            });
            continue;
        }
        let started = Instant::now();
        // The disk tier may hold the answer: a Start waiting for memory, a removal waiting
        // for its files to be deleted.
        let held = match super::space_wait::answer(
            &shared.engine,
            frame.request_id,
            &request,
            output,
            dispatch,
        ) {
            super::space_wait::Answer::Dispatch => None,
            super::space_wait::Answer::Done(ok) => {
                shared.metrics.record(op, ok, started.elapsed());
                continue;
            }
            super::space_wait::Answer::HeldStart(answer) => {
                match scans.clone().try_acquire_owned() {
                    Ok(slot) => Some((answer, slot)),
                    Err(_) => {
                        // Nothing was changed: the frame runs again once a slot is free.
                        consumed -= used;
                        break Ok(true);
                    }
                }
            }
            super::space_wait::Answer::HeldDeletion(answer) => {
                // Already executed: it is answered, slot or not.
                let slot = match scans.clone().try_acquire_owned() {
                    Ok(slot) => slot,
                    Err(_) => match Arc::new(Semaphore::new(1)).try_acquire_owned() {
                        Ok(slot) => slot,
                        Err(_) => continue,
                    },
                };
                Some((answer, slot))
            }
        };
        if let Some((answer, slot)) = held {
            let (shared, done_tx) = (shared.clone(), done_tx.clone());
            tokio::spawn(async move {
                let (out, ok) = answer.await;
                shared.metrics.record(op, ok, started.elapsed());
                let _ = done_tx.send((out, slot));
            });
            continue;
        }
        let ok = dispatch(&shared.engine, frame.request_id, &request, output);
        shared.metrics.record(op, ok, started.elapsed());
    };
    input.drain(..consumed);
    if result.is_ok() {
        reserve_for_next_frame(input, shared.max_frame_bytes);
    }
    result
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
    frame::encode_ok(output, frame.request_id, &ack)
        .map_err(|e| CloseReason::Protocol(e.to_string()))?;
    Ok(next)
}
