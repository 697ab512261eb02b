//! The disk tier under pressure, as an operator runs it: a real master (events on) and a real
//! node with a 16 MiB memory segment and a disk directory with room, 4 parallel `moonkv put`
//! writers. Every put succeeds, nothing is dropped while the disk has room, every object reads
//! back byte-exact, and a subscriber that saw only the event stream holds exactly the master's
//! placement. Also: a second node on the same disk directory, and a budget above the
//! filesystem's free space, are refused at start with the numbers and the holder named.
//!
//! Every wait is a bounded poll; nothing asserts on timing.

use moonkv_client::{Store, StoreConfig};
use moonkv_events::{Delivery, IndexSync, Snapshot, Subscriber};
use moonkv_testkit::admin::metric;
use moonkv_testkit::events::{placement_of_index, placement_of_snapshot, Placement, BACKEND};
use moonkv_testkit::payload::payload;
use moonkv_testkit::{http, output_of, Moonkv, Proc};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const WAIT: Duration = Duration::from_secs(120);

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path =
            std::env::temp_dir().join(format!("moonkv-disk-pressure-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn master(extra: &[&str]) -> Proc {
    let mut args = vec![
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--enable-kv-events",
        "true",
        "--kv-events-bind-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-events-backend-id",
        BACKEND,
    ];
    args.extend_from_slice(extra);
    MOONKV.start(&args)
}

/// A node on `dir`, or the text of why it did not start (its stderr included).
fn node(master: &Proc, name: &str, dir: &Path, capacity: &str) -> Result<Proc, String> {
    let dir = dir.to_str().unwrap();
    Proc::start(MOONKV.node_command(
        &master.field("rpc"),
        name,
        "16MiB",
        &["--disk-dir", dir, "--disk-capacity", capacity],
    ))
    .map_err(|e| e.to_string())
}

/// A subscriber on its own thread whose index is built from the event stream alone (no
/// snapshot): what it holds is what the events said.
struct Follower {
    placement: Arc<Mutex<(Placement, Option<u64>)>>,
    /// (kind, key, medium) of every event, in stream order.
    events: Arc<Mutex<Vec<(String, String, String)>>>,
    stop: Arc<AtomicBool>,
    gaps: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Follower {
    fn start(endpoint: &str) -> Follower {
        let mut sub = Subscriber::connect(endpoint, Duration::from_millis(50))
            .unwrap()
            .with_index(IndexSync::new(None, None));
        let placement: Arc<Mutex<(Placement, Option<u64>)>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let gaps = Arc::new(AtomicU64::new(0));
        let events: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
        let (p, s, g, ev) = (
            placement.clone(),
            stop.clone(),
            gaps.clone(),
            events.clone(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(Delivery::Message { message, .. }) = sub.poll() {
                    let mut ev = ev.lock().unwrap();
                    for e in message.events {
                        let kind = serde_json::to_value(e.kind).unwrap();
                        ev.push((
                            kind.as_str().unwrap_or_default().to_string(),
                            e.object_key.unwrap_or_default(),
                            e.medium.unwrap_or_default(),
                        ));
                    }
                }
                let counters = sub.counters();
                g.store(counters.gaps + counters.missed_sequences, Ordering::Relaxed);
                let index = placement_of_index(sub.index().unwrap());
                *p.lock().unwrap() = (index, counters.last_sequence);
            }
        });
        Follower {
            placement,
            events,
            stop,
            gaps,
            thread: Some(thread),
        }
    }

    fn placement(&self) -> (Placement, Option<u64>) {
        self.placement.lock().unwrap().clone()
    }

    /// Keys with a `removed` event for `medium`, in stream order.
    fn removed(&self, medium: &str) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(kind, key, m)| kind == "removed" && m == medium && !key.starts_with("probe-"))
            .map(|(_, key, _)| key.clone())
            .collect()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let limit = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn snapshot(admin: &str) -> Snapshot {
    let (code, body) = http(admin, "GET", "/kv_events/snapshot", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn last_sequence(admin: &str) -> u64 {
    let (code, body) = http(admin, "GET", "/kv_events/status", "");
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    status["last_sequence"].as_u64().unwrap_or(0)
}

fn counter(admin: &str, name: &str) -> f64 {
    metric(admin, name).unwrap_or_else(|| panic!("metric {name} missing"))
}

/// Puts a probe until the follower saw it (ZMQ's slow joiner), then removes it.
async fn subscribed(store: &Store, follower: &Follower) {
    let limit = Instant::now() + WAIT;
    for i in 0.. {
        let key = format!("probe-{i}");
        store.put(&key, b"p", &Default::default()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let seen = follower.placement().0.iter().any(|(_, k, _)| *k == key);
        store.remove(&key, true).await.unwrap();
        if seen {
            return;
        }
        assert!(Instant::now() < limit, "the subscriber never saw an event");
    }
}

/// `moonkv put key -` for every (key, bytes), spread over `writers` parallel threads; returns
/// the failures (key and stderr).
fn put_all(rpc: &str, objects: &[(String, Vec<u8>)], writers: usize) -> Vec<(String, String)> {
    let failures: Mutex<Vec<(String, String)>> = Mutex::default();
    std::thread::scope(|scope| {
        for w in 0..writers {
            let failures = &failures;
            scope.spawn(move || {
                for (key, bytes) in objects.iter().skip(w).step_by(writers) {
                    let out = output_of(MOONKV.client(rpc, &["put", key, "-"]), bytes);
                    if !out.status.success() {
                        let err = String::from_utf8_lossy(&out.stderr).into_owned();
                        failures.lock().unwrap().push((key.clone(), err));
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_writers_over_a_small_segment_lose_nothing_while_the_disk_has_room() {
    let dir = TempDir::new("run");
    let master = master(&[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = node(&master, "n0", &dir.0, "256MiB").unwrap_or_else(|e| panic!("{e}"));
    let follower = Follower::start(&master.field("kv_events"));
    let mut config = StoreConfig::new(rpc.clone());
    config.transfer_timeout = Duration::from_secs(30);
    let store = Store::connect(config).await.unwrap();
    subscribed(&store, &follower).await;

    // 60 × 1 MiB (almost four times the segment), then 200 small objects.
    let mut objects: Vec<(String, Vec<u8>)> = (0..60u32)
        .map(|i| (format!("big-{i}"), payload(i, 1, 1 << 20)))
        .collect();
    objects.extend((0..200u32).map(|i| (format!("small-{i}"), payload(1000 + i, 1, 24 * 1024))));
    let failures = put_all(&rpc, &objects, 4);
    assert!(failures.is_empty(), "puts failed: {failures:?}");

    until("the offload backlog to drain", || {
        (counter(&admin, "master_offloads_pending") == 0.0).then_some(())
    });
    assert_eq!(counter(&admin, "master_dropped_objects"), 0.0);
    assert_eq!(counter(&admin, "master_put_space_wait_timeouts"), 0.0);
    let offloaded = counter(&admin, "master_offloads_completed");
    assert!(
        offloaded >= 40.0,
        "most big objects went to disk: {offloaded}"
    );
    assert!(counter(&admin, "master_offloaded_bytes") >= 40.0 * (1 << 20) as f64);
    let disk_used = counter(&admin, "master_allocated_file_size_bytes");
    assert!(disk_used < (256u64 << 20) as f64, "the disk had room");

    // The stream alone says what the master holds.
    let master_view = converged(&admin, &follower);
    assert_eq!(follower.gaps.load(Ordering::Relaxed), 0);
    assert_eq!(master_view.len(), objects.len(), "every object is there");
    let on_disk = master_view
        .iter()
        .filter(|(_, _, media)| media.iter().any(|m| m == "disk"))
        .count();
    assert!(on_disk >= 40, "{on_disk} objects on disk");

    for (key, bytes) in &objects {
        let back = store
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(back == *bytes, "{key} reads back byte-exact");
    }
}

#[test]
fn a_second_node_on_a_locked_disk_directory_fails_naming_the_holder() {
    let dir = TempDir::new("lock");
    let master = master(&[]);
    let first = node(&master, "n0", &dir.0, "16MiB").unwrap_or_else(|e| panic!("{e}"));
    let err = match node(&master, "n1", &dir.0, "16MiB") {
        Ok(_) => panic!("a second node started on {}", dir.arg()),
        Err(e) => e,
    };
    assert!(err.contains("in use by another node"), "{err}");
    assert!(
        err.contains(&format!("pid {}", first.pid())),
        "names the holder: {err}"
    );
    assert!(
        err.contains(&first.field("data")),
        "names its endpoint: {err}"
    );
    // Once the holder is gone, the directory is free again.
    drop(first);
    let again = node(&master, "n2", &dir.0, "16MiB");
    assert!(again.is_ok(), "{:?}", again.err());
}

#[test]
fn a_disk_budget_above_the_free_space_is_refused_naming_both_numbers() {
    let dir = TempDir::new("capacity");
    let master = master(&[]);
    let err = match node(&master, "n0", &dir.0, "9000TB") {
        Ok(_) => panic!("a 9000 TB budget was accepted"),
        Err(e) => e,
    };
    assert!(err.contains("exceeds the space available"), "{err}");
    let tb = 9000u64 * 1_000_000_000_000;
    let tib = 9000u64 << 40;
    assert!(
        err.contains(&tb.to_string()) || err.contains(&tib.to_string()),
        "names the budget: {err}"
    );
    assert!(
        err.contains("free on the filesystem"),
        "names the free space: {err}"
    );
}

/// Waits until the follower holds exactly the master's placement (and nothing is in flight).
fn converged(admin: &str, follower: &Follower) -> Placement {
    until("the follower to match the master", || {
        let want = last_sequence(admin);
        let (index, seen) = follower.placement();
        let snap = placement_of_snapshot(&snapshot(admin));
        (seen == Some(want) && index == snap && snap == placement_of_snapshot(&snapshot(admin)))
            .then_some(snap)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_evicts_its_least_recently_used_replicas_with_removed_disk_events() {
    let dir = TempDir::new("disk-lru");
    let master = master(&[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    // Room for 7 files of 1 MiB; the disk evicts above 95 % down to 85 %.
    let _node = node(&master, "n0", &dir.0, "7200KiB").unwrap_or_else(|e| panic!("{e}"));
    let follower = Follower::start(&master.field("kv_events"));
    let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
    subscribed(&store, &follower).await;
    let objects: Vec<(String, Vec<u8>)> = (0..12u32)
        .map(|i| (format!("k{i}"), payload(i, 1, 1 << 20)))
        .collect();
    for (i, (key, bytes)) in objects.iter().enumerate() {
        let out = output_of(MOONKV.client(&rpc, &["put", "--disk", key, "-"]), bytes);
        assert!(
            out.status.success(),
            "{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if i == 4 {
            // k0 is read after k1..k4 were written: it is not the least recently used.
            assert!(store.get("k0").await.unwrap() == objects[0].1);
        }
    }
    let view = converged(&admin, &follower);
    let evicted = follower.removed("disk");
    assert!(!evicted.is_empty(), "the disk evicted");
    assert!(
        !evicted.contains(&"k0".to_string()),
        "k0 was used recently: {evicted:?}"
    );
    assert_eq!(evicted[0], "k1", "least recently used first: {evicted:?}");
    assert!(follower.removed("cpu").is_empty(), "memory copies stay");
    assert!(counter(&admin, "master_disk_evicted_objects") >= evicted.len() as f64);
    assert_eq!(counter(&admin, "master_dropped_objects"), 0.0);
    let disk_used = counter(&admin, "master_allocated_file_size_bytes");
    assert!(disk_used <= (7200u64 << 10) as f64);
    assert_eq!(
        mkv_files(&dir.0) as f64,
        disk_used / ((1 << 20) + 4096) as f64
    );
    for (key, bytes) in &objects {
        let media = view
            .iter()
            .find(|(_, k, _)| k == key)
            .map(|(_, _, m)| m.clone())
            .unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(
            media.contains(&"disk".to_string()),
            !evicted.contains(key),
            "{key}: {media:?}"
        );
        assert!(store.get(key).await.unwrap() == *bytes, "{key} byte-exact");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_object_read_twice_is_promoted_to_memory_without_a_torn_read() {
    let dir = TempDir::new("promote");
    let master = master(&[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = node(&master, "n0", &dir.0, "256MiB").unwrap_or_else(|e| panic!("{e}"));
    let follower = Follower::start(&master.field("kv_events"));
    let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
    subscribed(&store, &follower).await;
    let objects: Vec<(String, Vec<u8>)> = (0..20u32)
        .map(|i| (format!("p{i}"), payload(i, 7, 1 << 20)))
        .collect();
    for (key, bytes) in &objects {
        store.put(key, bytes, &Default::default()).await.unwrap();
    }
    until("the offloads to land", || {
        (counter(&admin, "master_offloads_pending") == 0.0
            && counter(&admin, "master_offloads_completed") > 0.0)
            .then_some(())
    });
    let view = converged(&admin, &follower);
    let (key, bytes) = objects
        .iter()
        .find(|(k, _)| view.iter().any(|(_, vk, m)| vk == k && *m == ["disk"]))
        .expect("an object lives on disk only");
    // Where offload left memory between its watermarks depends on timing; a promotion is
    // admitted only below the offload watermark, so make room: the other objects go.
    for (other, _) in objects.iter().filter(|(k, _)| k != key) {
        store.remove(other, true).await.unwrap();
    }
    // Reads while the promotion runs are served from disk, then from memory: always whole.
    let limit = Instant::now() + WAIT;
    let mut reads = 0;
    loop {
        let back = store.get(key).await.unwrap();
        assert!(back == *bytes, "{key} read {reads} is byte-exact");
        reads += 1;
        let media = placement_of_snapshot(&snapshot(&admin))
            .into_iter()
            .find(|(_, k, _)| k == key)
            .map(|(_, _, m)| m);
        if media.as_ref().is_some_and(|m| *m == ["cpu", "disk"]) {
            break;
        }
        if Instant::now() >= limit {
            let (_, body) = http(&admin, "GET", "/metrics", "");
            let promotion: Vec<&str> = body
                .lines()
                .filter(|l| l.starts_with("master_promotion") || l.starts_with("master_mem"))
                .collect();
            panic!("{key} was never promoted after {reads} reads: {media:?}\n{promotion:#?}");
        }
    }
    assert!(reads >= 2, "promoted on the second read at the earliest");
    let back = store.get(key).await.unwrap();
    assert!(back == *bytes, "{key} from memory is byte-exact");
    let list = store.replicas(key).await.unwrap();
    assert!(list
        .replicas
        .iter()
        .any(|r| r.kind == moonkv_proto::ReplicaKind::Memory));
    // The promotion's event reaches the follower after the snapshot shows it: wait for the
    // follower to catch up with the master's last sequence first.
    converged(&admin, &follower);
    let kinds: Vec<(String, String)> = follower
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, k, _)| k == key)
        .map(|(kind, _, m)| (kind.clone(), m.clone()))
        .collect();
    let want: Vec<(String, String)> = [
        ("stored", "cpu"),
        ("stored", "disk"),
        ("removed", "cpu"),
        ("stored", "cpu"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(kinds, want, "events of {key}");
    assert_eq!(counter(&admin, "master_promotion_completed"), 1.0);
    assert_eq!(
        counter(&admin, "master_promotion_completed_bytes"),
        (1 << 20) as f64
    );
    assert!(counter(&admin, "master_promotion_rejected_frequency") >= 1.0);
    assert_eq!(counter(&admin, "master_promotion_in_flight"), 0.0);
    converged(&admin, &follower);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_disk_read_fails_on_a_bad_last_byte_and_the_connection_stays_usable() {
    let dir = TempDir::new("stream");
    // Everything above 10 % of memory goes to disk, and reads never promote it back.
    let master = master(&[
        "--promotion-on-hit",
        "false",
        "--offload-high-watermark-ratio",
        "0.1",
        "--offload-low-watermark-ratio",
        "0",
    ]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = node(&master, "n0", &dir.0, "64MiB").unwrap_or_else(|e| panic!("{e}"));
    let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
    // Several steps of the node's stream (1 MiB each) plus a partial one.
    let big = payload(1, 1, 3 * (1 << 20) + 12345);
    let small = payload(2, 1, 70_000);
    store
        .put("small", &small, &Default::default())
        .await
        .unwrap();
    store.put("big", &big, &Default::default()).await.unwrap();
    until("both objects to be on disk only", || {
        (counter(&admin, "master_offloads_completed") == 2.0
            && counter(&admin, "master_offloads_pending") == 0.0)
            .then_some(())
    });
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "mkv"))
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    let big_file = files.pop().unwrap();
    let mut bytes = std::fs::read(&big_file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&big_file, &bytes).unwrap();
    let err = store
        .get("big")
        .await
        .expect_err("a corrupt last byte fails the read");
    assert_eq!(
        err.code,
        moonkv_client::ErrorCode::CHECKSUM_MISMATCH,
        "{err}"
    );
    let back = store.get("small").await.unwrap();
    assert!(back == small, "the next read is whole");
    bytes[last] ^= 0x80;
    std::fs::write(&big_file, &bytes).unwrap();
    let back = store.get("big").await.unwrap();
    assert!(back == big, "a restored file streams whole");
}

/// Peak resident set of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_large_disk_object_needs_no_node_memory_of_its_size() {
    let dir = TempDir::new("rss");
    let master = master(&[
        "--promotion-on-hit",
        "false",
        "--offload-high-watermark-ratio",
        "0.1",
        "--offload-low-watermark-ratio",
        "0",
    ]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let node = Proc::start(MOONKV.node_command(
        &rpc,
        "n0",
        "64MiB",
        &["--disk-dir", dir.arg(), "--disk-capacity", "128MiB"],
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let mut config = StoreConfig::new(rpc.clone());
    config.transfer_timeout = Duration::from_secs(60);
    let store = Store::connect(config).await.unwrap();
    let big = payload(9, 1, 48 << 20);
    store.put("big", &big, &Default::default()).await.unwrap();
    until("the object to be on disk only", || {
        (counter(&admin, "master_offloads_completed") == 1.0
            && counter(&admin, "master_offloads_pending") == 0.0)
            .then_some(())
    });
    let before = peak_rss_kib(node.pid());
    for _ in 0..2 {
        let back = store.get("big").await.unwrap();
        assert!(back == big, "byte-exact");
    }
    let grown = peak_rss_kib(node.pid()).saturating_sub(before);
    assert!(
        grown < 16 << 10,
        "reading a 48 MiB disk object grew the node's peak RSS by {grown} KiB"
    );
}

fn mkv_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "mkv"))
        .count()
}

#[test]
fn a_removal_is_answered_once_its_file_is_gone_so_a_master_restart_cannot_bring_it_back() {
    let dir = TempDir::new("removal");
    let [rpc_port, admin_port, events_port] = moonkv_testkit::free_ports::<3>();
    let args = [
        "master".to_string(),
        "--rpc-port".into(),
        rpc_port.to_string(),
        "--metrics-port".into(),
        admin_port.to_string(),
        "--enable-kv-events".into(),
        "true".into(),
        "--kv-events-bind-endpoint".into(),
        format!("tcp://127.0.0.1:{events_port}"),
        "--kv-events-backend-id".into(),
        BACKEND.into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = MOONKV.start(&args);
    let (rpc, admin) = (first.field("rpc"), first.field("admin"));
    let _node = node(&first, "n0", &dir.0, "64MiB").unwrap_or_else(|e| panic!("{e}"));
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let out = output_of(
            MOONKV.client(&rpc, &["put", "--disk", key, "-"]),
            &payload(i as u32, 1, 4096),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(mkv_files(&dir.0), keys.len());
    // Each removal answers only once the node has deleted the file: no wait needed to see it.
    for (i, key) in keys.iter().take(6).enumerate() {
        let out = output_of(MOONKV.client(&rpc, &["rm", key]), b"");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            mkv_files(&dir.0),
            keys.len() - i - 1,
            "the file of {key} is gone when rm returns"
        );
    }
    // The master dies at once; a fresh one knows nothing and takes the files back.
    drop(first);
    let _second = MOONKV.master_again(&args[1..]);
    until("the node to mount its disk on the new master", || {
        metric(&admin, "master_total_file_capacity_bytes").filter(|c| *c > 0.0)
    });
    let listed = until("the disk objects to be re-admitted", || {
        let keys = moonkv_testkit::admin::all_keys(&admin)?;
        (keys.len() >= 6).then_some(keys)
    });
    let mut listed = listed;
    listed.sort();
    let mut want: Vec<String> = keys[6..].to_vec();
    want.sort();
    assert_eq!(listed, want, "removed objects stay removed");
}
