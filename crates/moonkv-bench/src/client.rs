//! A small synchronous client of the master protocol (`docs/protocol.md`) for the benchmark:
//! blocking `std::net::TcpStream`, one call at a time per thread, typed bodies decoded in full
//! as a real client would.
//!
//! Several threads may share one [`Connection`] (one "client" with many threads): each writes
//! its request under the writer lock, then whichever waiting thread finds the reader free
//! reads replies for everyone and hands them out by request id (leader/follower), so no
//! thread ever blocks on a reply that is not its own.

use moonkv_proto::auth::{Secret, NONCE_LEN};
use moonkv_proto::frame::{self, Frame, FrameKind};
use moonkv_proto::msg::{Hello, HelloAck, HelloAuth, Op};
use moonkv_proto::{Error, ErrorCode, PROTOCOL_MAGIC, PROTOCOL_VERSION};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Largest response accepted: batch answers may exceed the master's request limit.
const MAX_RESPONSE_BYTES: u32 = 1 << 30;

fn rpc_fail(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::RPC_FAIL, message.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One response, copied out of the read buffer.
struct Reply {
    code: i32,
    body: Vec<u8>,
}

/// The read half and its buffer; owned by whichever thread is currently reading.
struct ReadSide {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadSide {
    /// Reads until at least one whole frame is buffered, then takes every whole frame.
    fn read_replies(&mut self, max_frame: u32) -> Result<Vec<(u64, Reply)>, Error> {
        loop {
            let mut replies = Vec::new();
            while let Some((frame, used)) =
                frame::decode(&self.buf[self.start..self.end], max_frame)
                    .map_err(|e| rpc_fail(format!("bad frame from the master: {e}")))?
            {
                replies.push((
                    frame.request_id,
                    Reply {
                        code: frame.code,
                        body: frame.body.to_vec(),
                    },
                ));
                self.start += used;
            }
            if !replies.is_empty() {
                return Ok(replies);
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> Result<(), Error> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let pending = self.end - self.start;
        let wanted = match self.buf.get(self.start..self.start + 4) {
            Some(len) if pending >= 4 => {
                4 + u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize
            }
            _ => 0,
        };
        if self.end == self.buf.len() || self.start + wanted > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = pending;
            if wanted > self.buf.len() || self.end == self.buf.len() {
                let grown = wanted.max(self.buf.len() * 2);
                self.buf.resize(grown, 0);
            }
        }
        let n = self
            .stream
            .read(&mut self.buf[self.end..])
            .map_err(|e| rpc_fail(format!("read from the master failed: {e}")))?;
        if n == 0 {
            return Err(rpc_fail("the master closed the connection"));
        }
        self.end += n;
        Ok(())
    }
}

/// Replies waiting for their caller, and the reader when nobody is using it.
struct Inbox {
    reader: Option<ReadSide>,
    ready: HashMap<u64, Reply>,
    /// Threads parked on the condvar (a notify is a syscall, skipped when nobody waits).
    waiting: usize,
    broken: Option<String>,
}

/// One TCP connection to a master, shareable by several threads.
pub struct Connection {
    writer: Mutex<TcpStream>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    next_id: AtomicU64,
    /// Largest response frame accepted.
    read_limit: u32,
}

thread_local! {
    static OUT: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64 * 1024));
}

impl Connection {
    /// Connects, sets TCP_NODELAY and completes the hello handshake, authenticating with the
    /// secret from `MOONKV_AUTH_SECRET(_FILE)` when the master asks for it.
    pub fn connect(addr: SocketAddr, name: &str) -> anyhow::Result<Connection> {
        let mut stream = TcpStream::connect(addr)
            .map_err(|e| anyhow::anyhow!("cannot connect to the master at {addr}: {e}"))?;
        stream.set_nodelay(true)?;
        let mut reader = ReadSide {
            stream: stream.try_clone()?,
            buf: vec![0; 256 * 1024],
            start: 0,
            end: 0,
        };
        let mut hello = Hello {
            magic: PROTOCOL_MAGIC.into(),
            protocol_version: PROTOCOL_VERSION,
            client_name: name.into(),
            auth: None,
        };
        let ack = hello_round(&mut stream, &mut reader, &hello)
            .map_err(|e| anyhow::anyhow!("the master at {addr} refused the hello: {e}"))?;
        let ack = match &ack.challenge {
            None => ack,
            Some(challenge) => {
                let secret = Secret::from_env()
                    .map_err(anyhow::Error::msg)?
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "the master at {addr} requires authentication; set MOONKV_AUTH_SECRET \
                             or MOONKV_AUTH_SECRET_FILE"
                        )
                    })?;
                let client_nonce: Vec<u8> = [super::nonce(), super::nonce()]
                    .iter()
                    .flat_map(|n| n.to_le_bytes())
                    .take(NONCE_LEN)
                    .collect();
                let proof = secret.client_proof(challenge, &client_nonce);
                hello.auth = Some(HelloAuth {
                    client_nonce: client_nonce.clone(),
                    proof,
                });
                let ack = hello_round(&mut stream, &mut reader, &hello)
                    .map_err(|e| anyhow::anyhow!("authentication with {addr} failed: {e}"))?;
                let server_proof = ack.server_proof.as_deref().unwrap_or_default();
                anyhow::ensure!(
                    secret.verify_server(challenge, &client_nonce, server_proof),
                    "the master at {addr} did not prove it holds the shared secret"
                );
                ack
            }
        };
        Ok(Connection {
            writer: Mutex::new(stream),
            inbox: Mutex::new(Inbox {
                reader: Some(reader),
                ready: HashMap::new(),
                waiting: 0,
                broken: None,
            }),
            arrived: Condvar::new(),
            next_id: AtomicU64::new(1),
            read_limit: ack.max_frame_bytes.max(MAX_RESPONSE_BYTES),
        })
    }

    /// Sends one request and waits for its response.
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        op: Op,
        request: &Req,
    ) -> Result<Resp, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        OUT.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            frame::encode_value(&mut out, FrameKind::Request, id, op as u16 as i32, request)?;
            lock(&self.writer)
                .write_all(&out)
                .map_err(|e| rpc_fail(format!("write to the master failed: {e}")))
        })?;
        let reply = self.wait_for(id)?;
        decode(id, &reply)
    }

    fn wait_for(&self, id: u64) -> Result<Reply, Error> {
        let mut inbox = lock(&self.inbox);
        loop {
            if let Some(reply) = inbox.ready.remove(&id) {
                return Ok(reply);
            }
            if let Some(broken) = &inbox.broken {
                return Err(rpc_fail(broken.clone()));
            }
            if let Some(mut reader) = inbox.reader.take() {
                drop(inbox);
                let read = reader.read_replies(self.read_limit);
                inbox = lock(&self.inbox);
                inbox.reader = Some(reader);
                match read {
                    Ok(replies) => inbox.ready.extend(replies),
                    Err(e) => inbox.broken = Some(e.message.to_string()),
                }
                if inbox.waiting > 0 {
                    self.arrived.notify_all();
                }
                continue;
            }
            inbox.waiting += 1;
            inbox = self.arrived.wait(inbox).unwrap_or_else(|e| e.into_inner());
            inbox.waiting -= 1;
        }
    }
}

/// Sends one hello and reads its answer.
fn hello_round(
    stream: &mut TcpStream,
    reader: &mut ReadSide,
    hello: &Hello,
) -> Result<HelloAck, Error> {
    let mut out = Vec::new();
    frame::encode_value(&mut out, FrameKind::Hello, 0, 0, hello)?;
    stream
        .write_all(&out)
        .map_err(|e| rpc_fail(format!("write to the master failed: {e}")))?;
    let (_, reply) = reader
        .read_replies(MAX_RESPONSE_BYTES)?
        .into_iter()
        .next()
        .ok_or_else(|| rpc_fail("no answer to the hello"))?;
    decode(0, &reply)
}

fn decode<T: DeserializeOwned>(id: u64, reply: &Reply) -> Result<T, Error> {
    frame::decode_response(&Frame {
        kind: FrameKind::Response,
        request_id: id,
        code: reply.code,
        body: &reply.body,
    })
}
