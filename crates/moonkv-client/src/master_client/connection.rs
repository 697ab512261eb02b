//! One multiplexed connection to the master (TCP, TLS, or the master's local socket): an
//! outbox, a reader task and the map of requests waiting for their response.
//!
//! A caller's request frame goes onto the socket from the caller's own thread when nothing is
//! queued before it and the socket takes it at once (plain TCP or the local socket); otherwise
//! it joins the outbox, which the writer task drains in order, coalescing what queued up into
//! one write. The direct path saves a task wake-up (a hop to another thread) on every round
//! trip.

use super::handshake::{Handshake, Step};
use super::MAX_RESPONSE_BYTES;
use moonkv_dataplane::stream::{ConnectFailure, Stream, TlsConnector};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Hello, HelloAck};
use moonkv_proto::{Error, ErrorCode, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};

/// A response as it came off the wire: status code and MessagePack body.
pub(crate) struct RawResponse {
    pub code: i32,
    pub body: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<RawResponse>>;

/// A live connection. Dropping the last handle stops its tasks.
pub(crate) struct Connection {
    outbox: Arc<Outbox>,
    pending: Arc<Mutex<HashMap<u64, Waiter>>>,
    alive: Arc<AtomicBool>,
    tasks: [tokio::task::AbortHandle; 2],
    /// Largest frame the server accepts.
    pub max_frame_bytes: u32,
    /// The master's local socket, when it offered one over a plain TCP connection to a
    /// loopback address (so from this machine): a connection there may replace this one.
    pub local_offer: Option<String>,
    /// Whether this connection is to the master's local socket.
    pub is_local: bool,
}

impl Connection {
    /// Connects to `addr`, performs the hello exchange and starts the reader and writer tasks.
    pub async fn open(
        addr: &str,
        client_name: &str,
        connect_timeout: Duration,
        secret: Option<&moonkv_proto::auth::Secret>,
        tls: Option<&TlsConnector>,
    ) -> Result<Connection> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("cannot reach the master at {addr}: {what}: {e}"),
            )
        };
        let stream = tokio::time::timeout(
            connect_timeout,
            moonkv_dataplane::stream::connect(
                addr,
                tls,
                "master",
                Some(moonkv_dataplane::stream::unacked_bound(connect_timeout)),
            ),
        )
        .await
        .map_err(|_| timed_out(addr))?
        .map_err(|e| match e {
            ConnectFailure::Tcp(e) => fail("connect", &e),
            // A TLS mismatch does not get better by retrying.
            ConnectFailure::Tls(why) => Error::new(ErrorCode::ILLEGAL_CLIENT, why.to_string()),
        })?;
        // Only a plain connection from this machine takes an offer: with TLS the master offers
        // none, and a caller that asked for TLS keeps it.
        let from_here = match &stream {
            Stream::Plain(tcp) => tcp.peer_addr().is_ok_and(|a| a.ip().is_loopback()),
            _ => false,
        };
        Self::hello(
            stream,
            addr,
            client_name,
            connect_timeout,
            secret,
            from_here,
        )
        .await
    }

    /// Connects to the master's local socket `name` (as a hello answer gives it), then as
    /// [`Connection::open`]: the same hello, the same proof when the master asks for one.
    pub async fn open_local(
        name: &str,
        client_name: &str,
        connect_timeout: Duration,
        secret: Option<&moonkv_proto::auth::Secret>,
    ) -> Result<Connection> {
        let stream = tokio::time::timeout(
            connect_timeout,
            moonkv_dataplane::stream::connect_local(name),
        )
        .await
        .map_err(|_| timed_out(name))?
        .map_err(|e| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("cannot reach the master at its local socket {name}: {e}"),
            )
        })?;
        Self::hello(stream, name, client_name, connect_timeout, secret, false).await
    }

    /// The hello exchange on a fresh `stream` to `addr`; starts the reader and writer tasks.
    /// Keeps the master's local socket offer when `take_offer`.
    async fn hello(
        stream: Stream,
        addr: &str,
        client_name: &str,
        connect_timeout: Duration,
        secret: Option<&moonkv_proto::auth::Secret>,
        take_offer: bool,
    ) -> Result<Connection> {
        let is_local = matches!(stream, Stream::Local(_));
        let (mut reader, mut writer) = split(stream);

        let mut buf = Vec::with_capacity(4096);
        let mut handshake = Handshake::new(client_name, secret);
        let mut hello = handshake.first_hello();
        let ack = loop {
            let ack = hello_round(
                &mut reader,
                &mut writer,
                &mut buf,
                &hello,
                addr,
                connect_timeout,
            )
            .await?;
            match handshake.answer(ack, addr)? {
                Step::Send(next) => hello = next,
                Step::Done(ack) => break ack,
            }
        };
        tracing::debug!(%addr, server_version = %ack.server_version, "connected to master");

        let pending: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let outbox = Arc::new(Outbox {
            state: Mutex::default(),
            wake: Notify::new(),
            direct: writer.direct(),
        });
        // Responses are not bound by the master's request limit (a regex listing of a large
        // tenant can be big); the master is trusted to send frames it built itself.
        let read_limit = ack.max_frame_bytes.max(MAX_RESPONSE_BYTES);
        let writer_task = tokio::spawn(write_loop(writer, outbox.clone(), alive.clone()));
        let reader_task = tokio::spawn(read_loop(
            reader,
            addr.to_string(),
            buf,
            read_limit,
            pending.clone(),
            alive.clone(),
        ));
        let tasks = [writer_task.abort_handle(), reader_task.abort_handle()];
        let local_offer = ack.local_socket.filter(|name| {
            take_offer
                && moonkv_proto::local_socket::is_name(name, moonkv_proto::local_socket::MASTER)
        });
        Ok(Connection {
            outbox,
            pending,
            alive,
            tasks,
            max_frame_bytes: ack.max_frame_bytes,
            local_offer,
            is_local,
        })
    }

    /// Whether both tasks are still running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Queues an encoded request frame; the response arrives on the returned receiver.
    pub fn send(
        &self,
        request_id: u64,
        frame: Vec<u8>,
    ) -> Result<oneshot::Receiver<Result<RawResponse>>> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(request_id, tx);
        if !self.is_alive() || self.outbox.send(frame).is_err() {
            self.alive.store(false, Ordering::Release);
            self.pending.lock().remove(&request_id);
            return Err(Error::new(
                ErrorCode::RPC_FAIL,
                "the connection to the master is closed",
            ));
        }
        // The reader may have drained the map between the insert and the liveness check.
        if !self.is_alive() {
            fail_all(&self.pending, "the connection to the master closed");
        }
        Ok(rx)
    }

    /// Forgets a request whose caller gave up (deadline passed).
    pub fn forget(&self, request_id: u64) {
        self.pending.lock().remove(&request_id);
    }

    /// Marks the connection dead and fails every waiting request.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
        for task in &self.tasks {
            task.abort();
        }
        fail_all(&self.pending, "the connection to the master was closed");
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

fn timed_out(addr: &str) -> Error {
    Error::new(
        ErrorCode::RPC_TIMEOUT,
        format!("connecting to the master at {addr} timed out"),
    )
}

fn fail_all(pending: &Mutex<HashMap<u64, Waiter>>, why: &str) {
    let waiters: Vec<Waiter> = pending.lock().drain().map(|(_, w)| w).collect();
    for waiter in waiters {
        let _ = waiter.send(Err(Error::new(ErrorCode::RPC_FAIL, why.to_string())));
    }
}

/// Sends one hello and waits for its answer.
async fn hello_round(
    reader: &mut Reader,
    writer: &mut Writer,
    buf: &mut Vec<u8>,
    hello: &Hello,
    addr: &str,
    connect_timeout: Duration,
) -> Result<HelloAck> {
    let mut out = Vec::new();
    frame::encode_value(&mut out, FrameKind::Hello, 0, 0, hello)?;
    writer.write_all(&out).await.map_err(|e| {
        Error::new(
            ErrorCode::RPC_FAIL,
            format!("cannot send the hello to {addr}: {e}"),
        )
    })?;
    tokio::time::timeout(connect_timeout, read_hello_ack(reader, buf, addr))
        .await
        .map_err(|_| {
            Error::new(
                ErrorCode::RPC_TIMEOUT,
                format!("the master at {addr} did not answer the hello"),
            )
        })?
}

async fn read_hello_ack(reader: &mut Reader, buf: &mut Vec<u8>, addr: &str) -> Result<HelloAck> {
    loop {
        match frame::decode(buf, frame::DEFAULT_MAX_FRAME_BYTES) {
            Ok(Some((f, used))) => {
                if f.kind != FrameKind::Response || f.request_id != 0 {
                    return Err(Error::new(
                        ErrorCode::RPC_FAIL,
                        "the master answered the hello with an unexpected frame",
                    ));
                }
                let ack = frame::decode_response::<HelloAck>(&f);
                buf.drain(..used);
                return ack;
            }
            Ok(None) => {}
            Err(e) => {
                return Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!("bad hello answer from the master: {e}"),
                ))
            }
        }
        let n = read_more(reader, buf, addr).await?;
        if n == 0 {
            return Err(Error::new(
                ErrorCode::RPC_FAIL,
                "the master closed the connection during the hello",
            ));
        }
    }
}

async fn read_more(reader: &mut Reader, buf: &mut Vec<u8>, addr: &str) -> Result<usize> {
    buf.reserve(64 * 1024);
    reader.read_buf(buf).await.map_err(|e| {
        // A master that refuses this client's certificate says so on the first read.
        let why = moonkv_dataplane::stream::explain(&e, "master", addr);
        Error::new(
            ErrorCode::RPC_FAIL,
            format!("reading from the master failed: {why}"),
        )
    })
}

/// Reading half of a master connection.
type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// Writing half of a master connection: plain TCP and the local socket can also be written
/// from any thread without waiting (`try_write`), TLS only through its stream.
enum Writer {
    Plain(Direct),
    Other(Box<dyn AsyncWrite + Send + Unpin>),
}

/// A socket's writing half that any thread may write to without waiting.
#[derive(Clone)]
enum Direct {
    Tcp(Arc<tokio::net::tcp::OwnedWriteHalf>),
    Local(moonkv_dataplane::LocalStream),
}

impl Direct {
    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            Direct::Tcp(half) => half.try_write(bytes),
            Direct::Local(half) => half.try_write(bytes),
        }
    }
}

impl Writer {
    async fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        match self {
            // It waits for writing space through its `AsyncWrite` (`moonkv_dataplane::local_stream`).
            Writer::Plain(Direct::Local(stream)) => stream.write_all(bytes).await,
            Writer::Plain(Direct::Tcp(half)) => {
                while !bytes.is_empty() {
                    half.writable().await?;
                    match half.try_write(bytes) {
                        Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                        Ok(n) => bytes = &bytes[n..],
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Writer::Other(stream) => stream.write_all(bytes).await,
        }
    }

    fn direct(&self) -> Option<Direct> {
        match self {
            Writer::Plain(half) => Some(half.clone()),
            Writer::Other(_) => None,
        }
    }
}

/// Halves that tasks can own; plain TCP and Unix sockets split without a lock.
fn split(stream: Stream) -> (Reader, Writer) {
    match stream {
        Stream::Plain(tcp) => {
            let (reader, writer) = tcp.into_split();
            (
                Box::new(reader),
                Writer::Plain(Direct::Tcp(Arc::new(writer))),
            )
        }
        Stream::Local(unix) => {
            let (reader, writer) = unix.split();
            (Box::new(reader), Writer::Plain(Direct::Local(writer)))
        }
        #[allow(unreachable_patterns)]
        tls => {
            let (reader, writer) = tokio::io::split(tls);
            (Box::new(reader), Writer::Other(Box::new(writer)))
        }
    }
}

/// Frames on their way to the master, in order.
struct Outbox {
    state: Mutex<Queued>,
    /// Wakes the writer task when bytes are queued.
    wake: Notify,
    /// The socket itself, for frames written from the caller's thread (plain TCP, local
    /// socket).
    direct: Option<Direct>,
}

#[derive(Default)]
struct Queued {
    bytes: Vec<u8>,
    /// The writer task owns the order: bytes are queued or being written by it.
    busy: bool,
}

impl Outbox {
    /// Writes `frame` now if nothing is ahead of it and the socket takes it whole; queues the
    /// rest for the writer task. Never waits.
    fn send(&self, frame: Vec<u8>) -> std::io::Result<()> {
        let mut queued = self.state.lock();
        let mut rest: &[u8] = &frame;
        if !queued.busy {
            if let Some(socket) = &self.direct {
                match socket.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if rest.is_empty() {
            return Ok(());
        }
        queued.bytes.extend_from_slice(rest);
        if !queued.busy {
            queued.busy = true;
            self.wake.notify_one();
        }
        Ok(())
    }
}

async fn write_loop(mut writer: Writer, outbox: Arc<Outbox>, alive: Arc<AtomicBool>) {
    'serve: loop {
        outbox.wake.notified().await;
        loop {
            // What queued up meanwhile goes out in one write: pipelined callers share a syscall.
            let batch = {
                let mut queued = outbox.state.lock();
                if queued.bytes.is_empty() {
                    queued.busy = false;
                    break;
                }
                std::mem::take(&mut queued.bytes)
            };
            if let Err(e) = writer.write_all(&batch).await {
                tracing::warn!(error = %e, "writing to the master failed");
                break 'serve;
            }
            if !alive.load(Ordering::Acquire) {
                break 'serve;
            }
        }
    }
    alive.store(false, Ordering::Release);
}

async fn read_loop(
    mut reader: Reader,
    addr: String,
    mut buf: Vec<u8>,
    max_frame: u32,
    pending: Arc<Mutex<HashMap<u64, Waiter>>>,
    alive: Arc<AtomicBool>,
) {
    let why = loop {
        let mut used_total = 0;
        let mut broken = None;
        loop {
            match frame::decode(&buf[used_total..], max_frame) {
                Ok(Some((f, used))) => {
                    used_total += used;
                    if f.kind != FrameKind::Response {
                        broken = Some(format!("the master sent an unexpected {:?} frame", f.kind));
                        break;
                    }
                    if let Some(waiter) = pending.lock().remove(&f.request_id) {
                        let _ = waiter.send(Ok(RawResponse {
                            code: f.code,
                            body: f.body.to_vec(),
                        }));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    broken = Some(format!("malformed frame from the master: {e}"));
                    break;
                }
            }
        }
        buf.drain(..used_total);
        if let Some(why) = broken {
            break why;
        }
        if !alive.load(Ordering::Acquire) {
            break "the connection was closed".to_string();
        }
        match read_more(&mut reader, &mut buf, &addr).await {
            Ok(0) => break "the master closed the connection".to_string(),
            Ok(_) => {}
            Err(e) => break e.message.into_owned(),
        }
    };
    tracing::debug!(reason = %why, "master connection ended");
    alive.store(false, Ordering::Release);
    fail_all(&pending, &why);
}
