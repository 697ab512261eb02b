//! The admin HTTP port from a test: one request helper over ureq, readers of the endpoints the
//! tests check (metrics, segments, keys, the event snapshot) and bounded polling.

use crate::KitError;
use std::time::{Duration, Instant};

/// Bound of one HTTP exchange, so a frozen server reads as "no answer" while tests poll.
const HTTP_WITHIN: Duration = Duration::from_secs(10);
/// Largest body read (event snapshots of the bigger tests stay far below).
const MAX_BODY_BYTES: u64 = 64 << 20;

/// `method path` with a JSON `body` and extra `headers` on a fresh connection to `addr`:
/// the status and the body, or why no answer came.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), KitError> {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(HTTP_WITHIN))
        .proxy(None)
        .http_status_as_error(false)
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut builder = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("Content-Type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(body.to_string())
        .map_err(|e| KitError::http(format!("{method} {path}"))(e.into()))?;
    let mut response = agent
        .run(request)
        .map_err(KitError::http(format!("{method} http://{addr}{path}")))?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY_BYTES)
        .read_to_string()
        .map_err(KitError::http(format!(
            "{method} http://{addr}{path}: reading the body"
        )))?;
    Ok((status, text))
}

/// `method path` with a JSON `body`: (status, body). Panics if the server does not answer.
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, body, &[])
}

/// Like [`http`], with extra headers.
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    request(addr, method, path, body, headers).unwrap_or_else(|e| panic!("{e}"))
}

/// `GET path`: the body of a 200 answer, `None` for any other answer or none at all (for
/// polling a server that may be frozen or gone).
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    match request(addr, "GET", path, "", &[]) {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// The value of one unlabelled sample, `name` or `name_total`, in Prometheus text.
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name || n == format!("{name}_total")).then(|| v.trim().parse().ok())?
    })
}

/// One unlabelled gauge or counter from `/metrics`.
pub fn metric(admin: &str, name: &str) -> Option<f64> {
    metric_in(&http_get(admin, "/metrics")?, name)
}

/// `/get_segments_detail`: (segment name, used bytes) of every mounted segment, sorted.
pub fn segments(admin: &str) -> Option<Vec<(String, u64)>> {
    let body = http_get(admin, "/get_segments_detail")?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut out: Vec<(String, u64)> = json["segments"]
        .as_array()?
        .iter()
        .map(|s| {
            (
                s["segment_name"].as_str().unwrap_or_default().to_string(),
                s["allocator_used_bytes"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    out.sort();
    Some(out)
}

/// Where the first mounted segment lives, from `/get_segments_detail`: what a test needs to
/// send raw data-plane requests to it.
#[derive(Clone, Debug)]
pub struct SegmentLocation {
    pub id: moonkv_proto::SegmentId,
    /// Absolute address of its first byte.
    pub base: u64,
    pub size: u64,
    /// The node's data-plane endpoint.
    pub endpoint: String,
}

/// The first mounted segment's location; panics (naming the body) when there is none.
pub fn first_segment(admin: &str) -> SegmentLocation {
    let (status, body) = http(admin, "GET", "/get_segments_detail", "");
    assert_eq!(status, 200, "{body}");
    let detail: serde_json::Value = serde_json::from_str(&body).unwrap();
    let segment = &detail["segments"][0];
    let text = |field: &str| {
        segment[field]
            .as_str()
            .unwrap_or_else(|| panic!("segment {field} missing: {body}"))
            .to_string()
    };
    SegmentLocation {
        id: moonkv_proto::SegmentId(moonkv_proto::Uuid::parse(&text("segment_id")).unwrap()),
        base: u64::from_str_radix(text("base_address").trim_start_matches("0x"), 16).unwrap(),
        size: segment["size_bytes"].as_u64().unwrap(),
        endpoint: text("te_endpoint"),
    }
}
/// `/get_all_keys` of the default tenant (readable objects), sorted.
pub fn all_keys(admin: &str) -> Option<Vec<String>> {
    let body = http_get(admin, "/get_all_keys")?;
    let mut keys: Vec<String> = body.lines().map(str::to_string).collect();
    keys.sort();
    Some(keys)
}

/// Object keys of `/kv_events/snapshot` (the placement subscribers rebuild from), sorted.
pub fn snapshot_keys(admin: &str) -> Option<Vec<String>> {
    let body = http_get(admin, "/kv_events/snapshot")?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut keys: Vec<String> = json["objects"]
        .as_array()?
        .iter()
        .map(|o| o["object_key"].as_str().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    Some(keys)
}

/// Polls `probe` every 50 ms until it returns `Some`, or panics after `within` saying `what`.
pub fn wait_for<T>(within: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The master's view settles: the segments mounted (name, used bytes), the key count and the
/// allocated bytes all equal what the test expects.
pub fn wait_for_master_state(
    admin: &str,
    within: Duration,
    segments_expected: &[(&str, u64)],
    keys_expected: u64,
) {
    let want: Vec<(String, u64)> = segments_expected
        .iter()
        .map(|(n, u)| (n.to_string(), *u))
        .collect();
    let allocated: u64 = want.iter().map(|(_, u)| u).sum();
    let deadline = Instant::now() + within;
    loop {
        let seen = (
            segments(admin),
            metric(admin, "master_key_count"),
            metric(admin, "master_allocated_bytes"),
        );
        if seen.0.as_ref() == Some(&want)
            && seen.1 == Some(keys_expected as f64)
            && seen.2 == Some(allocated as f64)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "master state did not settle: want segments {want:?}, {keys_expected} keys, \
             {allocated} bytes allocated; last seen {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A server that answers one request with `answer` and returns what it was sent.
    fn serve_once(answer: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut chunk = [0u8; 1024];
            while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                let n = stream.read(&mut chunk).unwrap();
                assert!(n > 0, "the client closed before its request ended");
                seen.extend_from_slice(&chunk[..n]);
            }
            stream.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&seen).into_owned()
        });
        (addr, server)
    }

    #[test]
    fn status_and_body_come_back_with_either_framing() {
        let (addr, server) =
            serve_once("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        assert_eq!(http(&addr, "GET", "/health", ""), (200, "hello".into()));
        let sent = server.join().unwrap();
        assert!(sent.starts_with("GET /health HTTP/1.1\r\n"), "{sent}");

        let (addr, server) = serve_once(
            "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nno \r\n4\r\nsuch\r\n0\r\n\r\n",
        );
        let headers = [("Authorization", "Bearer token")];
        assert_eq!(
            http_with(&addr, "DELETE", "/x?y=1", "", &headers),
            (404, "no such".into())
        );
        let sent = server.join().unwrap().to_ascii_lowercase();
        assert!(sent.starts_with("delete /x?y=1 http/1.1\r\n"), "{sent}");
        assert!(sent.contains("authorization: bearer token\r\n"), "{sent}");
    }

    #[test]
    fn http_get_is_none_unless_the_answer_is_a_200() {
        let (addr, server) = serve_once("HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(http_get(&addr, "/metrics"), None);
        server.join().unwrap();
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        assert_eq!(http_get(&addr, "/metrics"), None);
        assert!(request(&addr, "GET", "/metrics", "", &[]).is_err());
    }

    #[test]
    fn metrics_are_read_by_name_or_with_the_counter_suffix() {
        let text = "# HELP master_key_count keys\nmaster_key_count 3\n\
                    master_puts_total 7\nsegment_bytes{segment=\"a\"} 9\n";
        assert_eq!(metric_in(text, "master_key_count"), Some(3.0));
        assert_eq!(metric_in(text, "master_puts"), Some(7.0));
        assert_eq!(metric_in(text, "master_puts_total"), Some(7.0));
        assert_eq!(
            metric_in(text, "segment_bytes"),
            None,
            "labelled samples differ"
        );
        assert_eq!(metric_in(text, "missing"), None);
    }
}
