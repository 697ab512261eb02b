//! Helpers for tests that run the real `moonkv` binary on loopback.
#![allow(dead_code)]

use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Hello, HelloAck, Request};
use moonkv_proto::{Error, PROTOCOL_MAGIC, PROTOCOL_VERSION};
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `moonkv` child process that is killed when dropped.
pub struct Proc {
    pub child: Child,
    pub ready: serde_json::Value,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Field of the ready line, e.g. `rpc`.
    pub fn addr(&self, field: &str) -> String {
        self.ready[field].as_str().unwrap_or_default().to_string()
    }
}

/// Starts `moonkv <args>` and waits for its ready line on stdout.
pub fn spawn(args: &[&str]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moonkv"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn moonkv");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read ready line");
    let ready: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad ready line {line:?}: {e}"));
    assert_eq!(ready["event"], "ready", "{line}");
    Proc { child, ready }
}

/// A blocking client that speaks docs/protocol.md with raw frames.
pub struct RawClient {
    pub stream: TcpStream,
    pub next_id: u64,
}

impl RawClient {
    pub fn connect(addr: &str) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut c = Self { stream, next_id: 1 };
        let mut out = Vec::new();
        let hello = Hello {
            magic: PROTOCOL_MAGIC.into(),
            protocol_version: PROTOCOL_VERSION,
            client_name: "test".into(),
            auth: None,
        };
        frame::encode_value(&mut out, FrameKind::Hello, 0, 0, &hello).unwrap();
        c.stream.write_all(&out).unwrap();
        let (code, body) = c.read_frame().expect("hello answer");
        assert_eq!(code, 0);
        let ack: HelloAck = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(ack.protocol_version, PROTOCOL_VERSION);
        c
    }

    /// Reads one frame: (code, body). `None` when the server closed the connection.
    pub fn read_frame(&mut self) -> Option<(i32, Vec<u8>)> {
        let mut header = [0u8; 17];
        self.stream.read_exact(&mut header).ok()?;
        let len = u32::from_be_bytes(header[0..4].try_into().unwrap()) as usize;
        let code = i32::from_be_bytes(header[13..17].try_into().unwrap());
        let mut body = vec![0; len - 13];
        self.stream.read_exact(&mut body).ok()?;
        Some((code, body))
    }

    /// Sends one request and waits for its response.
    pub fn call<T: DeserializeOwned>(&mut self, request: Request) -> Result<T, Error> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        frame::encode_request(&mut out, id, &request).unwrap();
        self.stream.write_all(&out).unwrap();
        let mut header = [0u8; 17];
        self.stream
            .read_exact(&mut header)
            .expect("response header");
        let len = u32::from_be_bytes(header[0..4].try_into().unwrap()) as usize;
        let mut buf = header.to_vec();
        buf.resize(4 + len, 0);
        self.stream
            .read_exact(&mut buf[17..])
            .expect("response body");
        let (f, _) = frame::decode(&buf, u32::MAX).unwrap().unwrap();
        assert_eq!(f.request_id, id);
        frame::decode_response(&f)
    }
}

/// A minimal HTTP/1.1 request over a fresh connection: returns (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, body, "")
}

/// Like [`http`], with extra header lines (each ending in `\r\n`).
pub fn http_with(addr: &str, method: &str, path: &str, body: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect admin");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response).to_string();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = match text.split_once("\r\n\r\n") {
        Some((head, rest))
            if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked") =>
        {
            dechunk(rest)
        }
        Some((_, rest)) => rest.to_string(),
        None => String::new(),
    };
    (status, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// Mounts a fake segment and writes one object through PutStart/PutEnd (metadata only).
pub fn put_meta(c: &mut RawClient, me: moonkv_proto::ClientId, tenant: &str, key: &str, size: u64) {
    use moonkv_proto::msg::*;
    use moonkv_proto::types::*;
    let start = PutStartRequest {
        client_id: me,
        tenant: tenant.into(),
        key: key.into(),
        size,
        config: ReplicateConfig::default(),
    };
    let replicas: Vec<ReplicaDescriptor> = c.call(Request::PutStart(start)).expect("put start");
    let ids = replicas.iter().map(|r| r.id).collect();
    let end = EndRequest {
        client_id: me,
        tenant: tenant.into(),
        key: key.into(),
        replica_type: ReplicaType::All,
        replica_ids: ids,
        checksum: None,
    };
    c.call::<()>(Request::PutEnd(end)).expect("put end");
}

/// A fake 64 MiB segment description (nothing serves its bytes).
pub fn fake_segment(n: u64) -> moonkv_proto::Segment {
    moonkv_proto::Segment {
        id: moonkv_proto::SegmentId::new(9, n),
        name: format!("seg-{n}"),
        base: 0x1000_0000,
        size: 64 << 20,
        endpoint: "127.0.0.1:1".into(),
        protocol: "tcp".into(),
        host_id: "h".into(),
    }
}
