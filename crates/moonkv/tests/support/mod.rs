//! Real `moonkv master` and `moonkv node` processes for fault and soak tests: spawning on
//! loopback, signals (freeze, thaw, kill), admin-port probes, bounded polling, RSS samples and
//! self-checking payloads.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to print its ready line on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A `moonkv` child process, SIGKILLed when dropped.
pub struct Proc {
    child: Child,
    /// The ready line's fields.
    pub ready: serde_json::Value,
    log_path: std::path::PathBuf,
}

/// Numbers the log files of the processes this test binary starts.
static LOGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for Proc {
    fn drop(&mut self) {
        // A frozen process must be thawed to die promptly on every platform.
        let _ = signal(self.pid(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log_path);
    }
}

impl Proc {
    /// Starts `moonkv <args>` and waits for its ready line; `Err` if it exits first.
    pub fn start(args: &[String]) -> Result<Proc, String> {
        // stderr goes to a file, so a process that fails to start can say why.
        let log_path = std::env::temp_dir().join(format!(
            "moonkv-test-{}-{}.log",
            std::process::id(),
            LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_moonkv"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn moonkv: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(READY_WITHIN) {
            Ok(line) if !line.trim().is_empty() => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let _ = std::fs::remove_file(&log_path);
                return Err(format!(
                    "moonkv {args:?} did not become ready ({other:?}): {}",
                    log.trim()
                ));
            }
        };
        let ready: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("bad ready line {line:?}: {e}"))?;
        Ok(Proc {
            child,
            ready,
            log_path,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the ready line, e.g. `rpc`, `admin`, `data`.
    pub fn field(&self, name: &str) -> String {
        self.ready[name].as_str().unwrap_or_default().to_string()
    }

    /// SIGSTOP: the process stops answering but keeps its sockets open.
    pub fn freeze(&self) {
        signal(self.pid(), "STOP").expect("SIGSTOP");
    }

    /// SIGCONT after [`Proc::freeze`].
    pub fn thaw(&self) {
        signal(self.pid(), "CONT").expect("SIGCONT");
    }

    /// SIGKILL and reap.
    pub fn kill(self) {
        drop(self);
    }

    /// Resident set size in KiB (`VmRSS` of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS line")
    }
}

/// Sends `SIG<name>` to `pid` with kill(1).
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -s {name} {pid} failed"))
    }
}

/// A loopback port that was free a moment ago (for processes restarted on the same port).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// `moonkv master` with ephemeral ports (unless `extra` names them) plus `extra` flags.
pub fn master(extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec!["master".into()];
    if !extra.contains(&"--rpc-port") {
        args.extend(["--rpc-port".into(), "0".into()]);
    }
    if !extra.contains(&"--metrics-port") {
        args.extend(["--metrics-port".into(), "0".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::start(&args).expect("master starts")
}

/// Restarts a master on fixed ports, retrying while the old ports are still being released.
pub fn master_again(extra: &[&str]) -> Proc {
    let args: Vec<String> = std::iter::once("master".to_string())
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Proc::start(&args) {
            Ok(p) => return p,
            Err(e) if Instant::now() < deadline => {
                eprintln!("master restart: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// `moonkv node` with one segment of `segment_size` named `name`, data plane on loopback.
pub fn node(master_rpc: &str, name: &str, segment_size: &str) -> Proc {
    let args: Vec<String> = [
        "node",
        "--master",
        master_rpc,
        "--segment-size",
        segment_size,
        "--segment-name",
        name,
        "--data-bind",
        "127.0.0.1:0",
        "--host-id",
        name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::start(&args).expect("node starts")
}

/// A minimal HTTP GET on the admin port: the body, or `None` if the server did not answer.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some(dechunk(body));
    }
    Some(body.to_string())
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

/// One unlabelled gauge or counter from `/metrics`.
pub fn metric(admin: &str, name: &str) -> Option<f64> {
    let text = http_get(admin, "/metrics")?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name || n == format!("{name}_total")).then(|| v.trim().parse().ok())?
    })
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

/// Self-checking object bytes: every byte depends on (key id, version, offset), and objects of
/// 16 bytes or more start with `key id u32 · version u64 · length u32` (big-endian), so a torn
/// object (bytes of two versions) or a stale one (another version) is detected on read.
pub fn payload(key_id: u32, version: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let seed = (u64::from(key_id) << 40) ^ version.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut word = 0u64;
    while out.len() < len {
        out.extend_from_slice(&splitmix(seed ^ word).to_le_bytes());
        word += 1;
    }
    out.truncate(len);
    if len >= 16 {
        out[0..4].copy_from_slice(&key_id.to_be_bytes());
        out[4..12].copy_from_slice(&version.to_be_bytes());
        out[12..16].copy_from_slice(&(len as u32).to_be_bytes());
    }
    out
}

/// Reads the (key id, version, length) header of a payload of 16 bytes or more.
pub fn payload_header(bytes: &[u8]) -> Option<(u32, u64, u32)> {
    if bytes.len() < 16 {
        return None;
    }
    let key = u32::from_be_bytes(bytes[0..4].try_into().ok()?);
    let version = u64::from_be_bytes(bytes[4..12].try_into().ok()?);
    let len = u32::from_be_bytes(bytes[12..16].try_into().ok()?);
    Some((key, version, len))
}

/// splitmix64: a fast, well-mixed hash of one word.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A tiny deterministic generator for test choices (no extra dependency).
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
