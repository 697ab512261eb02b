//! A blocking client of the master protocol (`docs/protocol.md`) over `std::net::TcpStream`,
//! for threads without an async runtime: `moonkv bench master` measures the master with it, and
//! tests drive real masters with it. Plain TCP only; typed bodies are decoded in full as a real
//! client would.
//!
//! Several threads may share one [`Connection`] (one "client" with many threads): each writes
//! its request under the writer lock, then whichever waiting thread finds the reader free
//! reads replies for everyone and hands them out by request id (leader/follower), so no
//! thread ever blocks on a reply that is not its own.

use super::handshake::{Handshake, Step};
use super::MAX_RESPONSE_BYTES;
use moonkv_proto::auth::Secret;
use moonkv_proto::frame::{self, Frame, FrameKind};
use moonkv_proto::msg::{Hello, HelloAck, Op, Request};
use moonkv_proto::{Error, ErrorCode};
use parking_lot::{Condvar, Mutex};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn rpc_fail(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::RPC_FAIL, message.into())
}

fn rpc_io_fail(what: impl Into<String>, cause: std::io::Error) -> Error {
    Error::caused_by(ErrorCode::RPC_FAIL, what.into(), cause)
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
            .map_err(|e| rpc_io_fail("read from the master failed", e))?;
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
    hello_ack: HelloAck,
}

thread_local! {
    static OUT: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64 * 1024));
}

impl Connection {
    /// Connects, sets TCP_NODELAY and completes the hello exchange, proving `secret` when the
    /// master asks for it. With `io_timeout`, connecting and every read or write give up after
    /// that long (the connection is then broken for all its threads); `None` waits forever.
    pub fn connect(
        addr: &str,
        client_name: &str,
        secret: Option<&Secret>,
        io_timeout: Option<Duration>,
    ) -> Result<Connection, Error> {
        let cannot =
            |e: std::io::Error| rpc_io_fail(format!("cannot connect to the master at {addr}"), e);
        let mut stream = open(addr, io_timeout).map_err(cannot)?;
        stream.set_nodelay(true).map_err(cannot)?;
        stream.set_read_timeout(io_timeout).map_err(cannot)?;
        stream.set_write_timeout(io_timeout).map_err(cannot)?;
        let mut reader = ReadSide {
            stream: stream.try_clone().map_err(cannot)?,
            buf: vec![0; 256 * 1024],
            start: 0,
            end: 0,
        };
        let mut handshake = Handshake::new(client_name, secret);
        let mut hello = handshake.first_hello();
        let hello_ack = loop {
            let ack = hello_round(&mut stream, &mut reader, &hello).map_err(|e| {
                let what = match hello.auth {
                    None => format!("the master at {addr} refused the hello"),
                    Some(_) => format!("authentication with {addr} failed"),
                };
                Error::new(e.code, format!("{what}: {}", e.message))
            })?;
            match handshake.answer(ack, addr)? {
                Step::Send(next) => hello = next,
                Step::Done(ack) => break ack,
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
            read_limit: hello_ack.max_frame_bytes.max(MAX_RESPONSE_BYTES),
            hello_ack,
        })
    }

    /// The master's answer to the hello: its protocol and software versions, its frame limit.
    pub fn hello_ack(&self) -> &HelloAck {
        &self.hello_ack
    }

    /// Sends one request and waits for its response.
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        op: Op,
        request: &Req,
    ) -> Result<Resp, Error> {
        self.round_trip(|out, id| {
            frame::encode_value(out, FrameKind::Request, id, op as u16 as i32, request)
        })
    }

    /// Sends one request of any operation, as the enum of every request, and waits for its
    /// response.
    pub fn request<Resp: DeserializeOwned>(&self, request: &Request) -> Result<Resp, Error> {
        self.round_trip(|out, id| frame::encode_request(out, id, request))
    }

    fn round_trip<Resp: DeserializeOwned>(
        &self,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> Result<(), Error>,
    ) -> Result<Resp, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        OUT.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            encode(&mut out, id)?;
            self.writer
                .lock()
                .write_all(&out)
                .map_err(|e| rpc_io_fail("write to the master failed", e))
        })?;
        let reply = self.wait_for(id)?;
        decode(id, &reply)
    }

    fn wait_for(&self, id: u64) -> Result<Reply, Error> {
        let mut inbox = self.inbox.lock();
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
                inbox = self.inbox.lock();
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
            self.arrived.wait(&mut inbox);
            inbox.waiting -= 1;
        }
    }
}

/// A TCP connection to `addr`, within `timeout` if there is one.
fn open(addr: &str, timeout: Option<Duration>) -> std::io::Result<TcpStream> {
    let Some(timeout) = timeout else {
        return TcpStream::connect(addr);
    };
    let mut last = None;
    for resolved in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&resolved, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
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
        .map_err(|e| rpc_io_fail("write to the master failed", e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_proto::msg::KeyRequest;
    use moonkv_testkit::fake_master::{fake_master, Handler, Reply};
    use std::sync::Arc;
    use std::time::Instant;

    const LIMIT: Duration = Duration::from_secs(10);

    fn exist(key: &str) -> KeyRequest {
        KeyRequest {
            tenant: String::new(),
            key: key.into(),
        }
    }

    /// Runs `body` on a thread of its own: the fake master needs the runtime's threads.
    async fn off_runtime(body: impl FnOnce() + Send + 'static) {
        tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(body))
            .await
            .expect("the test body finished in time")
            .expect("the test body did not panic");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn threads_sharing_a_connection_each_get_their_own_reply() {
        // "slow-" keys are answered late, so replies overtake each other on the wire.
        let handler: Handler = Arc::new(|req| match req {
            Request::ExistKey(k) => {
                let slow = k.key.starts_with("slow-");
                let delay = Duration::from_millis(if slow { 30 } else { 0 });
                Reply::Ok(rmp_serde::to_vec(&slow).unwrap(), delay)
            }
            _ => Reply::Silent,
        });
        let (addr, _) = fake_master(handler).await;
        off_runtime(move || {
            let conn = Connection::connect(&addr, "t", None, Some(LIMIT)).unwrap();
            assert_eq!(conn.hello_ack().server_version, "fake");
            std::thread::scope(|scope| {
                for t in 0..6 {
                    let conn = &conn;
                    scope.spawn(move || {
                        for i in 0..12 {
                            let key = if (t + i) % 2 == 0 { "slow-" } else { "fast-" };
                            let key = format!("{key}{t}-{i}");
                            let slow: bool = if i % 3 == 0 {
                                conn.request(&Request::ExistKey(exist(&key))).unwrap()
                            } else {
                                conn.call(Op::ExistKey, &exist(&key)).unwrap()
                            };
                            assert_eq!(slow, key.starts_with("slow-"), "{key}");
                        }
                    });
                }
            });
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_keep_their_code_and_a_hangup_fails_every_waiting_call() {
        let handler: Handler = Arc::new(|req| match req {
            Request::ExistKey(k) if k.key == "refused" => {
                Reply::Err(Error::new(ErrorCode::INVALID_KEY, "no such key here"))
            }
            Request::ExistKey(k) if k.key == "hangup" => Reply::Hangup,
            _ => Reply::Silent,
        });
        let (addr, _) = fake_master(handler).await;
        off_runtime(move || {
            let conn = Connection::connect(&addr, "t", None, Some(LIMIT)).unwrap();
            let e = conn
                .call::<_, bool>(Op::ExistKey, &exist("refused"))
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_KEY);
            assert!(e.message.contains("no such key here"), "{e}");
            std::thread::scope(|scope| {
                // Never answered: it waits until the hangup breaks the connection.
                let silent = scope.spawn(|| conn.call::<_, bool>(Op::ExistKey, &exist("silent")));
                let hangup = conn.call::<_, bool>(Op::ExistKey, &exist("hangup"));
                assert_eq!(hangup.unwrap_err().code, ErrorCode::RPC_FAIL);
                assert_eq!(
                    silent.join().unwrap().unwrap_err().code,
                    ErrorCode::RPC_FAIL
                );
            });
            let after = conn.call::<_, bool>(Op::ExistKey, &exist("after"));
            assert_eq!(after.unwrap_err().code, ErrorCode::RPC_FAIL, "stays broken");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_master_fails_the_call_after_the_io_timeout() {
        let handler: Handler = Arc::new(|_| Reply::Silent);
        let (addr, _) = fake_master(handler).await;
        off_runtime(move || {
            let timeout = Duration::from_millis(200);
            let conn = Connection::connect(&addr, "t", None, Some(timeout)).unwrap();
            let started = Instant::now();
            let e = conn.call::<_, bool>(Op::ExistKey, &exist("k")).unwrap_err();
            assert_eq!(e.code, ErrorCode::RPC_FAIL, "{e}");
            assert!(started.elapsed() >= timeout);
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_master_with_a_secret_admits_only_clients_that_prove_it() {
        let secret = Secret::new(b"blocking-client-secret".to_vec()).unwrap();
        let mut config = moonkv_master::server::MasterConfig::ephemeral();
        config.auth_secret = Some(secret.clone());
        let master = moonkv_master::server::start(config).await.unwrap();
        let addr = master.rpc_addr().to_string();
        off_runtime(move || {
            let conn = Connection::connect(&addr, "t", Some(&secret), Some(LIMIT)).unwrap();
            let exists: bool = conn.call(Op::ExistKey, &exist("k")).unwrap();
            assert!(!exists);

            let e = Connection::connect(&addr, "t", None, Some(LIMIT))
                .err()
                .expect("no secret, no connection");
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
            assert!(e.message.contains("MOONKV_AUTH_SECRET"), "{e}");

            let wrong = Secret::new(b"not-the-master-secret".to_vec()).unwrap();
            let e = Connection::connect(&addr, "t", Some(&wrong), Some(LIMIT))
                .err()
                .expect("a wrong secret, no connection");
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");
        })
        .await;
        master.shutdown().await;
    }
}
