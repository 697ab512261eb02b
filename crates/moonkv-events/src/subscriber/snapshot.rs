//! Placement snapshots: the JSON the master serves at `GET /kv_events/snapshot`, the
//! [`SnapshotSource`] seam, and [`HttpSnapshotSource`], which fetches them over plain HTTP.

use std::io::Read;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
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
    /// `Authorization` header for a master with a shared secret (the snapshot reveals keys).
    authorization: Option<String>,
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
            authorization: None,
        })
    }

    /// The same source sending `Authorization: <value>` (for a master with a shared secret:
    /// `Bearer <secret>`).
    pub fn with_authorization(mut self, value: Option<String>) -> Self {
        self.authorization = value;
        self
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
            Some(t) => format!(
                "{SNAPSHOT_PATH}?tenant_id={}",
                utf8_percent_encode(t, QUERY_VALUE)
            ),
            None => SNAPSHOT_PATH.to_owned(),
        }
    }

    /// One GET under one deadline. The admin port is reached directly, so proxy settings
    /// from the environment and redirects are ignored; fetches are rare (start-up and
    /// recovery), so each gets a fresh agent and no connection outlives it.
    fn get(&self, path: &str) -> Result<Vec<u8>, EventsError> {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .proxy(None)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .http_status_as_error(false)
            .build();
        let agent = ureq::Agent::new_with_config(config);
        let url = format!("http://{}{path}", self.host);
        let mut request = agent.get(&url).header("Accept", "application/json");
        if let Some(value) = &self.authorization {
            request = request.header("Authorization", value);
        }
        let mut response = request.call().map_err(|e| self.fetch_error(e))?;
        let status = response.status();
        if status != ureq::http::StatusCode::OK {
            // the start of the body usually says why; a failed read just leaves it out
            let mut preview = Vec::new();
            let _ = response
                .body_mut()
                .as_reader()
                .take(200)
                .read_to_end(&mut preview);
            let said = String::from_utf8_lossy(&preview);
            return Err(EventsError::Snapshot(if said.is_empty() {
                format!("server answered {status}")
            } else {
                format!("server answered {status}: {said}")
            }));
        }
        let limit = u64::try_from(self.max_body_bytes).unwrap_or(u64::MAX);
        response
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| self.fetch_error(e))
    }

    fn fetch_error(&self, e: ureq::Error) -> EventsError {
        let host = &self.host;
        EventsError::Snapshot(match e {
            ureq::Error::HostNotFound => format!("cannot resolve {host}"),
            ureq::Error::ConnectionFailed => format!("cannot connect to {host}"),
            ureq::Error::Timeout(_) => {
                format!("timed out after {:?} fetching from {host}", self.timeout)
            }
            ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                format!("timed out after {:?} fetching from {host}", self.timeout)
            }
            ureq::Error::Io(e) if is_connect_failure(&e) => {
                format!("cannot connect to {host}: {e}")
            }
            ureq::Error::Io(e) => format!("cannot read from {host}: {e}"),
            ureq::Error::BodyExceedsLimit(_) => {
                format!("response exceeds {} bytes", self.max_body_bytes)
            }
            ureq::Error::Protocol(e) => format!("malformed HTTP response from {host}: {e}"),
            e => format!("request to {host} failed: {e}"),
        })
    }
}

fn is_connect_failure(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused | K::AddrNotAvailable | K::HostUnreachable | K::NetworkUnreachable
    )
}

impl SnapshotSource for HttpSnapshotSource {
    fn fetch(&mut self, tenant_id: Option<&str>) -> Result<Snapshot, EventsError> {
        let body = self.get(&Self::request_path(tenant_id))?;
        serde_json::from_slice(&body)
            .map_err(|e| EventsError::Snapshot(format!("invalid snapshot JSON: {e}")))
    }
}

/// RFC 3986 unreserved characters stay as they are; everything else is escaped.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Instant;

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

    /// Answers one connection per raw response, in order, and hands back each request head.
    fn serve(answers: Vec<Vec<u8>>) -> (String, thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in answers {
                let Ok((mut stream, _)) = listener.accept() else {
                    break;
                };
                requests.push(read_head(&mut stream));
                let _ = stream.write_all(&answer);
                // closing the connection ends a body that has no length
            }
            requests
        });
        (addr, server)
    }

    fn read_head(stream: &mut TcpStream) -> String {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    fn message(result: Result<impl std::fmt::Debug, EventsError>) -> String {
        match result {
            Err(EventsError::Snapshot(m)) => m,
            other => panic!("expected a snapshot error, got {other:?}"),
        }
    }

    #[test]
    fn fetch_errors_are_reported_not_panics() {
        let huge = [&b"HTTP/1.1 200 OK\r\n\r\n"[..], &vec![b' '; 200_000]].concat();
        let (addr, server) = serve(vec![
            b"HTTP/1.1 200 OK\r\n\r\n{\"not\": \"a snapshot\"}".to_vec(),
            huge,
        ]);
        let mut source = HttpSnapshotSource::new(&addr)
            .expect("address")
            .with_max_body_bytes(64);
        let bad_json = message(source.fetch(None));
        assert!(bad_json.contains("invalid snapshot JSON"), "{bad_json}");
        let too_big = message(source.fetch(Some("t")));
        assert_eq!(too_big, "response exceeds 64 bytes");
        server.join().expect("server");
        // nothing listens there any more
        let refused = message(source.with_timeout(Duration::from_secs(2)).fetch(None));
        assert!(
            refused.starts_with("cannot connect to 127.0.0.1:"),
            "{refused}"
        );
    }

    #[test]
    fn requests_name_the_host_path_and_json() {
        let (addr, server) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}".to_vec()
        ]);
        let source = HttpSnapshotSource::new(&format!("http://{addr}/")).expect("address");
        assert_eq!(
            source
                .get("/kv_events/snapshot?tenant_id=a%20b")
                .expect("ok"),
            b"{}"
        );
        let requests = server.join().expect("server");
        let head = requests[0].to_ascii_lowercase();
        assert!(
            head.starts_with("get /kv_events/snapshot?tenant_id=a%20b http/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains(&format!("\r\nhost: {addr}\r\n")), "{head}");
        assert!(head.contains("\r\naccept: application/json\r\n"), "{head}");
    }

    #[test]
    fn bodies_by_length_by_chunks_and_by_close() {
        let answers: [(&[u8], &[u8]); 3] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk", b"{}"),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
                br#"{"a":1}"#,
            ),
            (b"HTTP/1.0 200 OK\r\n\r\n[1]", b"[1]"),
        ];
        let (addr, server) = serve(answers.iter().map(|(raw, _)| raw.to_vec()).collect());
        let source = HttpSnapshotSource::new(&addr).expect("address");
        for (raw, want) in answers {
            let got = source.get(SNAPSHOT_PATH);
            assert_eq!(
                got.as_deref().ok(),
                Some(want),
                "{}: {got:?}",
                String::from_utf8_lossy(raw)
            );
        }
        server.join().expect("server");
    }

    #[test]
    fn bad_answers_are_errors_that_say_what_was_wrong() {
        let answers: [(&[u8], &str); 7] = [
            (
                b"HTTP/1.1 404 Not Found\r\n\r\nnope",
                "server answered 404 Not Found: nope",
            ),
            (
                b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\n\r\n",
                "server answered 302 Found",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
                "cannot read from",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "malformed HTTP response",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab",
                "cannot read from",
            ),
            (b"garbage", "malformed HTTP response"),
            (b"SMTP 200 OK\r\n\r\n", "malformed HTTP response"),
        ];
        let (addr, server) = serve(answers.iter().map(|(raw, _)| raw.to_vec()).collect());
        let source = HttpSnapshotSource::new(&addr)
            .expect("address")
            .with_timeout(Duration::from_secs(10));
        for (raw, starts) in answers {
            let m = message(source.get(SNAPSHOT_PATH));
            assert!(
                m.starts_with(starts),
                "{}: {m}",
                String::from_utf8_lossy(raw)
            );
        }
        server.join().expect("server");
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (done, wait) = mpsc::channel::<()>();
        let server = thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            read_head(&mut stream);
            // hold the connection open, unanswered, until the client has given up
            let _ = wait.recv();
        });
        let source = HttpSnapshotSource::new(&addr)
            .expect("address")
            .with_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let m = message(source.get(SNAPSHOT_PATH));
        let waited = started.elapsed();
        let _ = done.send(());
        server.join().expect("server");
        assert!(m.starts_with("timed out after 300ms fetching from"), "{m}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
