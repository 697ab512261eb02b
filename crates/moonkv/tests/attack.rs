//! Every resource attack of `trust.rs` at once, repeated for a minute against a real master and
//! node: unread scan floods, half-sent 16 MiB frames, rounds of thousands of connections to
//! the RPC port and the data plane, half-sent admin HTTP requests, a stalled data-plane reader,
//! a header-only writer and a trickling writer. Meanwhile an honest client's put/get/remove
//! keeps succeeding byte-exact, and master and node RSS stay within 50 MB of where they started.
//!
//! `MOONKV_ATTACK_SECS` sets the duration (default 60), `MOONKV_ATTACKS` picks attacks by name
//! (`scans,frames,connections,admin,stalled-reader,header-only-writer,trickle`; default all);
//! run with `--nocapture` for the figures.

use moonkv_client::store::{Store, StoreConfig};
use moonkv_dataplane::header::{DataOp, RequestHeader};
use moonkv_proto::{ReplicaDescriptor, ReplicateConfig, SegmentId};
use moonkv_testkit::cluster::runtime;
use moonkv_testkit::wire::closed_by_peer;
use moonkv_testkit::{Moonkv, Proc};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
/// Growth of either process's RSS over its starting value that fails the test.
const MAX_GROWTH_KIB: u64 = 50 * 1024;
/// Segment of the node: warmed up (every page touched) before RSS is first read.
const SEGMENT: u64 = 64 << 20;
/// Honest values.
const VALUE: usize = 64 << 10;

fn start(args: &[&str]) -> Proc {
    let mut cmd = MOONKV.command(args);
    cmd.env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE")
        .env_remove("MOONKV_GRANT_SECRET")
        .env_remove("MOONKV_GRANT_SECRET_FILE");
    Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// What the attack threads share: when to stop, and what went wrong.
#[derive(Clone)]
struct Attack {
    until: Instant,
    anomalies: Arc<Mutex<Vec<String>>>,
}

impl Attack {
    fn running(&self) -> bool {
        Instant::now() < self.until
    }

    fn anomaly(&self, what: String) {
        self.anomalies.lock().unwrap().push(what);
    }

    /// Paces a round: sleeps `pause`, or less when the attack ends first.
    fn pause(&self, pause: Duration) {
        let left = self.until.saturating_duration_since(Instant::now());
        std::thread::sleep(pause.min(left));
    }

    /// Polls every 20 ms until every stream in `held` was closed by the server, for at most
    /// `within`; names `what` as an anomaly if some stayed open.
    fn wait_closed(&self, held: &mut Vec<TcpStream>, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            held.retain_mut(|s| !closed_by_peer(s));
            if held.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.anomaly(format!("{} {what} still open after {within:?}", held.len()));
    }

    /// Runs `round` until the attack ends; returns the rounds done. `MOONKV_ATTACKS` (a
    /// comma-separated list of names) runs only the attacks it names.
    fn spawn(
        &self,
        name: &'static str,
        mut round: impl FnMut(&Attack) + Send + 'static,
    ) -> std::thread::JoinHandle<(&'static str, u64)> {
        let attack = self.clone();
        let chosen = std::env::var("MOONKV_ATTACKS")
            .map(|list| list.split(',').any(|n| n.trim() == name))
            .unwrap_or(true);
        std::thread::spawn(move || {
            let mut rounds = 0;
            while chosen && attack.running() {
                round(&attack);
                rounds += 1;
            }
            (name, rounds)
        })
    }
}

/// A data-plane request header, written to a fresh connection to `endpoint`.
fn data_request(
    endpoint: &str,
    op: DataOp,
    segment: SegmentId,
    address: u64,
    length: u64,
) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(endpoint).ok()?;
    stream
        .write_all(&RequestHeader::new(op, 1, segment, address, length).encode())
        .ok()?;
    Some(stream)
}

/// Latencies of one kind of honest operation.
#[derive(Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn summary(&mut self) -> String {
        self.0.sort();
        let at = |q: f64| {
            let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
            self.0.get(i).copied().unwrap_or_default()
        };
        format!(
            "{} ops, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.0.len(),
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3,
            at(1.0).as_secs_f64() * 1e3
        )
    }
}

#[test]
fn a_minute_of_every_attack_leaves_memory_flat_and_an_honest_client_working() {
    let secs: u64 = std::env::var("MOONKV_ATTACK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    // Short limits so the minute sees many rounds of each; the caps are the defaults.
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--rpc-io-timeout",
        "1s",
        "--admin-header-timeout",
        "1s",
        "--admin-idle-timeout",
        "2s",
    ]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "64MiB",
        "--data-io-timeout",
        "1s",
        "--data-request-floor",
        "2s",
        "--data-min-rate",
        "64MiB",
    ]);
    let data = node.field("data");
    let runtime = runtime();
    let connect = |tenant: &str| {
        let mut config = StoreConfig::new(&rpc);
        config.auth_secret = None;
        config.tenant = tenant.into();
        runtime.block_on(Store::connect(config)).unwrap()
    };
    let honest = connect("honest");
    let attacker = connect("attacker");

    // Warm-up: touch most pages of the segment (staying under the eviction watermark), so the
    // honest writes' first touches do not read as growth.
    let big = vec![3u8; 4 << 20];
    let fill = (SEGMENT * 8 / 10 / (4 << 20)) as usize;
    for i in 0..fill {
        runtime
            .block_on(honest.put(&format!("warm-{i}"), &big, &ReplicateConfig::default()))
            .unwrap();
    }
    for i in 0..fill {
        runtime
            .block_on(honest.remove(&format!("warm-{i}"), true))
            .unwrap();
    }
    // Keys long enough that one scan answer is about 0.7 MB.
    let keys: Vec<String> = (0..2000).map(|i| format!("{i:0>240}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let small = [1u8; 1024];
    let values: Vec<&[u8]> = names.iter().map(|_| &small[..]).collect();
    for result in
        runtime.block_on(attacker.batch_put_from(&names, &values, &ReplicateConfig::default()))
    {
        result.unwrap();
    }
    // The attacker's own object, whose range it trickles into.
    runtime
        .block_on(attacker.put("trickled", &vec![0u8; 8 << 20], &ReplicateConfig::default()))
        .unwrap();
    let trickled: ReplicaDescriptor = runtime
        .block_on(attacker.replicas("trickled"))
        .unwrap()
        .replicas[0]
        .clone();
    let segment = moonkv_testkit::admin::first_segment(&admin);
    let (segment_id, base) = (segment.id, segment.base);

    let started = Instant::now();
    let attack = Attack {
        until: started + Duration::from_secs(secs),
        anomalies: Arc::default(),
    };
    let (master_start, node_start) = (master.rss_kib(), node.rss_kib());
    let mut threads = Vec::new();

    // Item 4: 1,000 scans on one connection, their answers never read; a new one every 2 s.
    let scan_rpc = rpc.clone();
    threads.push(attack.spawn("scans", move |attack| {
        use moonkv_proto::frame;
        use moonkv_proto::msg::{RegexRequest, Request};
        let scan = Request::GetReplicaListByRegex(RegexRequest {
            tenant: "attacker".into(),
            regex: ".*".into(),
        });
        let mut burst = Vec::new();
        for id in 1..=1000 {
            frame::encode_request(&mut burst, id, &scan).unwrap();
        }
        // Its own hello may be refused while the churn fills the handshake places: retry.
        let Some(mut raw) = moonkv_testkit::wire::RawStream::try_after_hello(&scan_rpc) else {
            return attack.pause(Duration::from_millis(50));
        };
        raw.write(&burst);
        attack.pause(Duration::from_secs(2));
    }));
    // Item 5: eight frames announcing 16 MiB, each stopping after 1 MiB; the next eight once the
    // master has closed them.
    let frames_rpc = rpc.clone();
    threads.push(attack.spawn("frames", move |attack| {
        // A hello refused while the churn fills the handshake places is simply not held.
        let mut held: Vec<TcpStream> = (0..8)
            .filter_map(|_| {
                let mut raw = moonkv_testkit::wire::RawStream::try_after_hello(&frames_rpc)?;
                let mut frame = ((16u32 << 20) - 4).to_be_bytes().to_vec();
                frame.extend_from_slice(&[1u8; 1 << 20]);
                raw.write(&frame);
                Some(raw.stream)
            })
            .collect();
        attack.wait_closed(&mut held, Duration::from_secs(20), "half-sent frames");
    }));
    // Item 5: 2,000 connections to the RPC port and 1,000 to the data plane, opened and closed.
    let (churn_rpc, churn_data) = (rpc.clone(), data.clone());
    threads.push(attack.spawn("connections", move |attack| {
        let mut open = Vec::with_capacity(3000);
        for _ in 0..2000 {
            open.extend(TcpStream::connect(&churn_rpc).ok());
        }
        for _ in 0..1000 {
            open.extend(TcpStream::connect(&churn_data).ok());
        }
        if open.len() < 3000 {
            attack.anomaly(format!(
                "only {} of 3000 churn connections opened",
                open.len()
            ));
        }
        drop(open);
        attack.pause(Duration::from_millis(500));
    }));
    // Item 5: 1,500 admin requests whose headers never end (past the 256 cap, so most are
    // refused); the next round once the master has closed them all.
    let slow_admin = admin.clone();
    threads.push(attack.spawn("admin", move |attack| {
        let mut held: Vec<TcpStream> = (0..1500)
            .filter_map(|i| {
                let mut stream = TcpStream::connect(&slow_admin).ok()?;
                let head = format!("GET /health HTTP/1.1\r\nHost: moonkv\r\nX-Slow-{i}: ");
                stream.write_all(head.as_bytes()).ok()?;
                Some(stream)
            })
            .collect();
        attack.wait_closed(&mut held, Duration::from_secs(20), "admin");
    }));
    // Item 6: a read of the whole segment that is never consumed, held 3 s (the node's I/O
    // deadline is 1 s).
    let stalled_data = data.clone();
    threads.push(attack.spawn("stalled-reader", move |attack| {
        let stalled = data_request(&stalled_data, DataOp::Read, segment_id, base, SEGMENT);
        if stalled.is_none() {
            attack.anomaly("a stalled reader could not connect".into());
        }
        attack.pause(Duration::from_secs(3));
    }));
    // Item 6: a write header for the whole segment and no payload; the next once the node has
    // closed it.
    let header_data = data.clone();
    threads.push(attack.spawn("header-only-writer", move |attack| {
        let Some(stream) = data_request(&header_data, DataOp::Write, segment_id, base, SEGMENT)
        else {
            attack.anomaly("a header-only writer could not connect".into());
            return attack.pause(Duration::from_secs(1));
        };
        attack.wait_closed(
            &mut vec![stream],
            Duration::from_secs(20),
            "header-only-writer",
        );
        attack.pause(Duration::from_millis(500));
    }));
    // The slow trickle: a write of the attacker's own 8 MiB object, one byte every 200 ms
    // (inside the 1 s I/O deadline); the next once the node has cut it at its cap.
    let trickle_endpoint = trickled.endpoint.clone();
    let trickle_cut = Arc::new(AtomicU64::new(0));
    let cuts = trickle_cut.clone();
    threads.push(attack.spawn("trickle", move |attack| {
        let Some(mut stream) = data_request(
            &trickle_endpoint,
            DataOp::Write,
            trickled.segment_id,
            trickled.address,
            trickled.size,
        ) else {
            attack.anomaly("a trickling writer could not connect".into());
            return attack.pause(Duration::from_secs(1));
        };
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(20) {
            if closed_by_peer(&mut stream) || stream.write_all(&[9u8]).is_err() {
                cuts.fetch_add(1, Ordering::Relaxed);
                return attack.pause(Duration::from_millis(500));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        attack.anomaly("a trickling writer kept its request open for 20 s".into());
    }));

    // The honest client: put, get (byte-exact), remove, until the attack ends.
    let honest_attack = attack.clone();
    let honest_thread = std::thread::spawn(move || {
        let (mut puts, mut gets) = (Latencies::default(), Latencies::default());
        let mut failures = Vec::new();
        let mut longest_gap = Duration::ZERO;
        let mut last_success = Instant::now();
        let mut i = 0u64;
        while honest_attack.running() {
            let key = format!("honest-{i}");
            let value: Vec<u8> = (0..VALUE).map(|b| (b as u64 ^ i) as u8).collect();
            let put_began = Instant::now();
            let put = runtime.block_on(honest.put(&key, &value, &ReplicateConfig::default()));
            puts.0.push(put_began.elapsed());
            if let Err(e) = put {
                failures.push(format!("put {key}: {e}"));
                continue;
            }
            let get_began = Instant::now();
            match runtime.block_on(honest.get(&key)) {
                Ok(read) if read == value => gets.0.push(get_began.elapsed()),
                Ok(_) => failures.push(format!("get {key}: other bytes")),
                Err(e) => failures.push(format!("get {key}: {e}")),
            }
            if let Err(e) = runtime.block_on(honest.remove(&key, true)) {
                failures.push(format!("remove {key}: {e}"));
            }
            longest_gap = longest_gap.max(last_success.elapsed());
            last_success = Instant::now();
            i += 1;
        }
        (puts, gets, failures, longest_gap)
    });

    // RSS of both processes every 100 ms while the attack runs.
    let (mut master_peak, mut node_peak) = (master_start, node_start);
    let trace = std::env::var("MOONKV_ATTACK_TRACE").is_ok();
    let mut samples = 0u64;
    while attack.running() {
        let (m, n) = (master.rss_kib(), node.rss_kib());
        master_peak = master_peak.max(m);
        node_peak = node_peak.max(n);
        samples += 1;
        if trace && samples.is_multiple_of(10) {
            println!("{:>3} s: master {m} KiB, node {n} KiB", samples / 10);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut puts, mut gets, failures, longest_gap) = honest_thread.join().unwrap();
    let rounds: Vec<String> = threads
        .into_iter()
        .map(|t| {
            let (name, rounds) = t.join().unwrap();
            format!("{name}: {rounds}")
        })
        .collect();
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "attack of {secs} s: master RSS {:.1} MiB at start, {:.1} MiB peak; node RSS {:.1} MiB at \
         start, {:.1} MiB peak\nhonest put: {}\nhonest get: {}\nlongest time between two \
         honest successes: {:.1} s\nattack rounds: {}; trickles cut by the node: {}",
        mib(master_start),
        mib(master_peak),
        mib(node_start),
        mib(node_peak),
        puts.summary(),
        gets.summary(),
        longest_gap.as_secs_f64(),
        rounds.join(", "),
        trickle_cut.load(Ordering::Relaxed),
    );
    let anomalies = attack.anomalies.lock().unwrap().clone();
    assert!(anomalies.is_empty(), "the attack saw: {anomalies:#?}");
    assert!(
        failures.is_empty(),
        "honest operations failed: {failures:#?}"
    );
    assert!(
        gets.0.len() as u64 >= secs,
        "only {} honest round trips in {secs} s",
        gets.0.len()
    );
    assert!(
        std::env::var("MOONKV_ATTACKS").is_ok() || trickle_cut.load(Ordering::Relaxed) >= 1,
        "no trickling writer was cut by the node"
    );
    assert!(
        master_peak < master_start + MAX_GROWTH_KIB,
        "master RSS grew from {master_start} KiB to {master_peak} KiB"
    );
    assert!(
        node_peak < node_start + MAX_GROWTH_KIB,
        "node RSS grew from {node_start} KiB to {node_peak} KiB"
    );
}
