//! Placement snapshots: the JSON the master serves at `GET /kv_events/snapshot`, the
//! [`SnapshotSource`] seam, and a minimal blocking HTTP/1.1 client for it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::codec::Medium;
use crate::error::EventsError;

/// Path of the snapshot endpoint on the master's admin port.
pub const SNAPSHOT_PATH: &str = "/kv_events/snapshot";

/// The master's placement at event id `watermark_event_id`: applying it and then every
/// event with a larger id, in order, yields the current placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The master's `backend_id`.
    pub backend_id: String,
    /// The publisher's epoch (changes when the master restarts).
    pub publisher_epoch: u64,
    /// Highest event id already reflected in `objects`.
    pub watermark_event_id: u64,
    /// Every readable object in scope, with its media.
    pub objects: Vec<SnapshotObject>,
}

/// One object in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotObject {
    /// The object's tenant.
    pub tenant_id: String,
    /// The raw key.
    pub object_key: String,
    /// Media the object is readable on.
    pub media: Vec<Medium>,
}

/// Where recovery gets its snapshots; tests substitute a fake.
pub trait SnapshotSource {
    /// Fetches the placement for one tenant, or for every tenant when `tenant_id` is `None`.
    fn fetch(&mut self, tenant_id: Option<&str>) -> Result<Snapshot, EventsError>;
}

/// Fetches snapshots from a master's admin HTTP port.
#[derive(Debug, Clone)]
pub struct HttpSnapshotSource {
    host: String,
    timeout: Duration,
    max_body_bytes: usize,
}

/// Largest snapshot body accepted by default.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: usize = 1 << 30;

impl HttpSnapshotSource {
    /// A source for `admin`, given as `host:port` or `http://host:port`.
    pub fn new(admin: &str) -> Result<Self, EventsError> {
        let host = admin
            .strip_prefix("http://")
            .unwrap_or(admin)
            .trim_end_matches('/');
        if host.is_empty() || host.contains('/') || host.contains("://") {
            return Err(EventsError::Config(format!(
                "admin address must be host:port, got {admin:?}"
            )));
        }
        Ok(HttpSnapshotSource {
            host: host.to_owned(),
            timeout: Duration::from_secs(10),
            max_body_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
        })
    }

    /// The same source with a different overall timeout per fetch.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same source with a different response size limit.
    pub fn with_max_body_bytes(mut self, max: usize) -> Self {
        self.max_body_bytes = max;
        self
    }

    /// The request target for a tenant filter.
    pub fn request_path(tenant_id: Option<&str>) -> String {
        match tenant_id {
            Some(t) => format!("{SNAPSHOT_PATH}?tenant_id={}", percent_encode(t)),
            None => SNAPSHOT_PATH.to_owned(),
        }
    }

    fn get(&self, path: &str) -> Result<Vec<u8>, EventsError> {
        let deadline = Instant::now() + self.timeout;
        let err = |what: &str, e: std::io::Error| {
            EventsError::Snapshot(format!("{what} {}: {e}", self.host))
        };
        let addrs = self
            .host
            .to_socket_addrs()
            .map_err(|e| err("cannot resolve", e))?;
        let mut last_err = None;
        let mut stream = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let mut stream = match (stream, last_err) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(err("cannot connect to", e)),
            (None, None) => {
                return Err(EventsError::Snapshot(format!(
                    "{} resolves to no address",
                    self.host
                )))
            }
        };
        stream
            .set_read_timeout(Some(self.timeout))
            .map_err(|e| err("socket option for", e))?;
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| err("socket option for", e))?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
            self.host
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| err("cannot send request to", e))?;

        let mut response = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if Instant::now() > deadline {
                return Err(EventsError::Snapshot(format!(
                    "timed out reading from {}",
                    self.host
                )));
            }
            let n = stream
                .read(&mut chunk)
                .map_err(|e| err("cannot read from", e))?;
            if n == 0 {
                break;
            }
            // headers are small; allow them on top of the body limit
            if response.len() + n > self.max_body_bytes.saturating_add(64 * 1024) {
                return Err(EventsError::Snapshot(format!(
                    "response exceeds {} bytes",
                    self.max_body_bytes
                )));
            }
            response.extend_from_slice(&chunk[..n]);
        }
        parse_response(&response)
    }
}

impl SnapshotSource for HttpSnapshotSource {
    fn fetch(&mut self, tenant_id: Option<&str>) -> Result<Snapshot, EventsError> {
        let body = self.get(&Self::request_path(tenant_id))?;
        serde_json::from_slice(&body)
            .map_err(|e| EventsError::Snapshot(format!("invalid snapshot JSON: {e}")))
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits an HTTP/1.1 response, checks for status 200 and returns the (de-chunked) body.
pub(crate) fn parse_response(raw: &[u8]) -> Result<Vec<u8>, EventsError> {
    let bad = |what: &str| EventsError::Snapshot(format!("malformed HTTP response: {what}"));
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| bad("non-UTF-8 header"))?;
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .ok_or_else(|| bad("no status code"))?;
    if !status_line.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    if status != "200" {
        let preview = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(EventsError::Snapshot(format!(
            "server answered {status_line:?}: {preview}"
        )));
    }
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| bad("bad Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    if chunked {
        return dechunk(body).ok_or_else(|| bad("bad chunked encoding"));
    }
    match content_length {
        Some(n) if body.len() < n => Err(bad("body shorter than Content-Length")),
        Some(n) => Ok(body[..n].to_vec()),
        None => Ok(body.to_vec()),
    }
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_field = std::str::from_utf8(&body[..line_end]).ok()?;
        let size_hex = size_field.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if body.len() < size.checked_add(2)? {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_json_shape() {
        let json = r#"{"backend_id":"b","publisher_epoch":123,"watermark_event_id":7,
            "objects":[{"tenant_id":"t","object_key":"k","media":["cpu","disk"]}],"extra":1}"#;
        let snap: Snapshot = serde_json::from_str(json).expect("valid");
        assert_eq!(snap.watermark_event_id, 7);
        assert_eq!(snap.objects[0].media, [Medium::Cpu, Medium::Disk]);
        let back = serde_json::to_string(&snap).expect("serializable");
        assert!(back.contains(r#""media":["cpu","disk"]"#));
    }

    #[test]
    fn request_path_encodes_the_tenant() {
        assert_eq!(
            HttpSnapshotSource::request_path(None),
            "/kv_events/snapshot"
        );
        assert_eq!(
            HttpSnapshotSource::request_path(Some("a b&c/é")),
            "/kv_events/snapshot?tenant_id=a%20b%26c%2F%C3%A9"
        );
    }

    #[test]
    fn admin_address_forms() {
        assert!(HttpSnapshotSource::new("127.0.0.1:9003").is_ok());
        assert!(HttpSnapshotSource::new("http://127.0.0.1:9003/").is_ok());
        assert!(HttpSnapshotSource::new("https://x:1").is_err());
        assert!(HttpSnapshotSource::new("").is_err());
    }

    #[test]
    fn fetch_errors_are_reported_not_panics() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = std::thread::spawn(move || {
            let huge = [&b"HTTP/1.1 200 OK\r\n\r\n"[..], &vec![b' '; 200_000]].concat();
            let answers = [
                b"HTTP/1.1 200 OK\r\n\r\n{\"not\": \"a snapshot\"}".to_vec(),
                huge,
            ];
            for answer in answers {
                let Ok((mut stream, _)) = listener.accept() else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(&answer);
            }
        });
        let mut source = HttpSnapshotSource::new(&addr)
            .expect("address")
            .with_max_body_bytes(16);
        let bad_json = source.fetch(None);
        assert!(
            matches!(bad_json, Err(EventsError::Snapshot(ref m)) if m.contains("invalid snapshot JSON")),
            "{bad_json:?}"
        );
        let too_big = source.fetch(Some("t"));
        assert!(
            matches!(too_big, Err(EventsError::Snapshot(ref m)) if m.contains("exceeds")),
            "{too_big:?}"
        );
        server.join().expect("server");
        // nothing listens there any more
        let refused = source.with_timeout(Duration::from_secs(2)).fetch(None);
        assert!(matches!(refused, Err(EventsError::Snapshot(_))));
    }

    #[test]
    fn parses_content_length_chunked_and_errors() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk";
        assert_eq!(parse_response(plain).expect("ok"), b"{}");
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).expect("ok"), br#"{"a":1}"#);
        let eof = b"HTTP/1.0 200 OK\r\n\r\n[1]";
        assert_eq!(parse_response(eof).expect("ok"), b"[1]");
        for bad in [
            &b"HTTP/1.1 404 Not Found\r\n\r\nnope"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab",
            b"garbage",
            b"SMTP 200 OK\r\n\r\n",
        ] {
            assert!(
                parse_response(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
