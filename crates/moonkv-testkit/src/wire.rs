//! The master protocol from a test: the blocking client of `moonkv-client` with a few
//! conveniences, fake segments, and raw frames for tests that break the protocol on purpose.

use moonkv_client::master_client::handshake::{Handshake, Step};
use moonkv_proto::frame::{self, Frame, FrameKind};
use moonkv_proto::msg::{EndRequest, HelloAck, PutStartRequest, Request};
use moonkv_proto::types::{ReplicaDescriptor, ReplicaType, ReplicateConfig};
use moonkv_proto::{ClientId, Segment, SegmentId, PROTOCOL_VERSION};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub use moonkv_client::master_client::blocking::Connection;

/// Bound of a test's connect and of each read and write: a master that stops answering fails
/// the test instead of hanging it.
const IO_WITHIN: Duration = Duration::from_secs(30);

/// A connection to a master without authentication, checked to speak this protocol version;
/// panics if the master refuses it.
pub fn connect(addr: &str) -> Connection {
    let c = Connection::connect(addr, "test", None, Some(IO_WITHIN))
        .unwrap_or_else(|e| panic!("connect to the master at {addr}: {e}"));
    assert_eq!(c.hello_ack().protocol_version, PROTOCOL_VERSION);
    c
}

/// Writes one object's metadata through PutStart/PutEnd (no bytes move; the segment may be a
/// [`fake_segment`]).
pub fn put_meta(c: &Connection, me: ClientId, tenant: &str, key: &str, size: u64) {
    let start = PutStartRequest {
        client_id: me,
        tenant: tenant.into(),
        key: key.into(),
        size,
        config: ReplicateConfig::default(),
    };
    let replicas: Vec<ReplicaDescriptor> = c
        .request(&Request::PutStart(start))
        .unwrap_or_else(|e| panic!("put start of {key}: {e}"));
    let end = EndRequest {
        client_id: me,
        tenant: tenant.into(),
        key: key.into(),
        replica_type: ReplicaType::All,
        replica_ids: replicas.iter().map(|r| r.id).collect(),
        checksum: None,
    };
    c.request::<()>(&Request::PutEnd(end))
        .unwrap_or_else(|e| panic!("put end of {key}: {e}"));
}

/// A 64 MiB segment description named `seg-<n>` that nothing serves.
pub fn fake_segment(n: u64) -> Segment {
    Segment {
        id: SegmentId::new(9, n),
        name: format!("seg-{n}").into(),
        base: 0x1000_0000,
        size: 64 << 20,
        endpoint: "127.0.0.1:1".into(),
        protocol: "tcp".into(),
        host_id: "h".into(),
    }
}

/// The bytes of a first hello (no credential) with `request_id`, as a client named `name` sends
/// it.
pub fn hello_frame(request_id: u64, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode_value(
        &mut out,
        FrameKind::Hello,
        request_id,
        0,
        &Handshake::new(name, None).first_hello(),
    )
    .expect("encode a hello");
    out
}

/// Whether the peer closed `stream`: a read gives the end of the stream or an error, after
/// whatever answer came first. Does not wait; reads only what already arrived.
pub fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let _ = stream.set_nonblocking(true);
    let mut scratch = [0u8; 4096];
    loop {
        match stream.read(&mut scratch) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// One frame as it came off the wire.
#[derive(Debug)]
pub struct RawFrame {
    /// Request, response or hello.
    pub kind: FrameKind,
    /// The id it answers (or carries).
    pub request_id: u64,
    /// 0 or an error code.
    pub code: i32,
    /// MessagePack body.
    pub body: Vec<u8>,
}

/// A plain socket to a master for sending what a well-behaved client never would; frames are
/// read one at a time, in arrival order.
pub struct RawStream {
    /// The socket, for writing arbitrary bytes.
    pub stream: TcpStream,
}

impl RawStream {
    /// Connects without a hello.
    pub fn connect(addr: &str) -> RawStream {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream
            .set_read_timeout(Some(IO_WITHIN))
            .expect("set a read timeout");
        stream.set_nodelay(true).expect("set TCP_NODELAY");
        RawStream { stream }
    }

    /// [`RawStream::after_hello`], or `None` when the master closed the connection before
    /// answering (a flood filled its handshake places) or the connect failed.
    pub fn try_after_hello(addr: &str) -> Option<RawStream> {
        let stream = TcpStream::connect(addr).ok()?;
        stream.set_read_timeout(Some(IO_WITHIN)).ok()?;
        stream.set_nodelay(true).ok()?;
        let mut raw = RawStream { stream };
        let mut handshake = Handshake::new("test", None);
        let mut out = Vec::new();
        frame::encode_value(&mut out, FrameKind::Hello, 0, 0, &handshake.first_hello()).ok()?;
        raw.stream.write_all(&out).ok()?;
        let answer = raw.read_frame()?;
        let ack: HelloAck = decode(&answer).ok()?;
        match handshake.answer(ack, addr) {
            Ok(Step::Done(_)) => Some(raw),
            _ => None,
        }
    }

    /// Connects and completes the hello with an open master, as every client does.
    pub fn after_hello(addr: &str) -> RawStream {
        let mut raw = RawStream::connect(addr);
        let mut handshake = Handshake::new("test", None);
        let mut out = Vec::new();
        frame::encode_value(&mut out, FrameKind::Hello, 0, 0, &handshake.first_hello())
            .expect("encode the hello");
        raw.write(&out);
        let answer = raw.read_frame().expect("an answer to the hello");
        let ack: HelloAck = decode(&answer).expect("the hello is accepted");
        match handshake.answer(ack, addr) {
            Ok(Step::Done(ack)) => assert_eq!(ack.protocol_version, PROTOCOL_VERSION),
            other => panic!("the master at {addr} did not accept an open hello: {other:?}"),
        }
        raw
    }

    /// Writes `bytes` as they are.
    pub fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to the master");
    }

    /// The next frame; `None` once the master closed the connection (or stayed silent past the
    /// read timeout).
    pub fn read_frame(&mut self) -> Option<RawFrame> {
        let mut buf = vec![0u8; frame::HEADER_LEN];
        self.stream.read_exact(&mut buf).ok()?;
        let len = u32::from_be_bytes(buf[0..4].try_into().ok()?) as usize;
        assert!(
            4 + len >= frame::HEADER_LEN,
            "the master sent a frame of {len} bytes, shorter than its header"
        );
        buf.resize(4 + len, 0);
        self.stream.read_exact(&mut buf[frame::HEADER_LEN..]).ok()?;
        let (f, _) = frame::decode(&buf, u32::MAX).ok()??;
        Some(RawFrame {
            kind: f.kind,
            request_id: f.request_id,
            code: f.code,
            body: f.body.to_vec(),
        })
    }
}

/// The typed body of a response frame, or the error it carries.
pub fn decode<T: serde::de::DeserializeOwned>(f: &RawFrame) -> Result<T, moonkv_proto::Error> {
    frame::decode_response(&Frame {
        kind: f.kind,
        request_id: f.request_id,
        code: f.code,
        body: &f.body,
    })
}
