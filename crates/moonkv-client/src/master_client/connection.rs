//! One multiplexed TCP (optionally TLS) connection to the master: a writer task, a reader task
//! and the map of requests waiting for their response.

use super::handshake::{Handshake, Step};
use super::MAX_RESPONSE_BYTES;
use moonkv_dataplane::stream::{ConnectFailure, Stream, TlsConnector};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Hello, HelloAck};
use moonkv_proto::{Error, ErrorCode, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// A response as it came off the wire: status code and MessagePack body.
pub(crate) struct RawResponse {
    pub code: i32,
    pub body: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<RawResponse>>;

/// A live connection. Dropping the last handle stops its tasks.
pub(crate) struct Connection {
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, Waiter>>>,
    alive: Arc<AtomicBool>,
    tasks: [tokio::task::AbortHandle; 2],
    /// Largest frame the server accepts.
    pub max_frame_bytes: u32,
}

impl Connection {
    /// Connects, performs the hello exchange and starts the reader and writer tasks.
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
            moonkv_dataplane::stream::connect(addr, tls, "master"),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorCode::RPC_TIMEOUT,
                format!("connecting to the master at {addr} timed out"),
            )
        })?
        .map_err(|e| match e {
            ConnectFailure::Tcp(e) => fail("connect", &e),
            // A TLS mismatch does not get better by retrying.
            ConnectFailure::Tls(why) => Error::new(ErrorCode::ILLEGAL_CLIENT, why.to_string()),
        })?;
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
        let (outgoing, queue) = mpsc::unbounded_channel();
        // Responses are not bound by the master's request limit (a regex listing of a large
        // tenant can be big); the master is trusted to send frames it built itself.
        let read_limit = ack.max_frame_bytes.max(MAX_RESPONSE_BYTES);
        let writer_task = tokio::spawn(write_loop(writer, queue, alive.clone()));
        let reader_task = tokio::spawn(read_loop(
            reader,
            addr.to_string(),
            buf,
            read_limit,
            pending.clone(),
            alive.clone(),
        ));
        let tasks = [writer_task.abort_handle(), reader_task.abort_handle()];
        Ok(Connection {
            outgoing,
            pending,
            alive,
            tasks,
            max_frame_bytes: ack.max_frame_bytes,
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
        lock(&self.pending).insert(request_id, tx);
        if !self.is_alive() || self.outgoing.send(frame).is_err() {
            lock(&self.pending).remove(&request_id);
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
        lock(&self.pending).remove(&request_id);
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fail_all(pending: &Mutex<HashMap<u64, Waiter>>, why: &str) {
    let waiters: Vec<Waiter> = lock(pending).drain().map(|(_, w)| w).collect();
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
/// Writing half of a master connection.
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Halves that tasks can own; plain TCP splits without a lock.
fn split(stream: Stream) -> (Reader, Writer) {
    match stream {
        Stream::Plain(tcp) => {
            let (reader, writer) = tcp.into_split();
            (Box::new(reader), Box::new(writer))
        }
        #[allow(unreachable_patterns)]
        tls => {
            let (reader, writer) = tokio::io::split(tls);
            (Box::new(reader), Box::new(writer))
        }
    }
}

async fn write_loop(
    mut writer: Writer,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    alive: Arc<AtomicBool>,
) {
    while let Some(mut batch) = queue.recv().await {
        // Coalesce whatever else is already queued into one write: pipelined callers then share
        // a syscall.
        while batch.len() < 256 * 1024 {
            match queue.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if let Err(e) = writer.write_all(&batch).await {
            tracing::warn!(error = %e, "writing to the master failed");
            break;
        }
        if !alive.load(Ordering::Acquire) {
            break;
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
                    if let Some(waiter) = lock(&pending).remove(&f.request_id) {
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
