//! The disk tier end to end: a real master (events on), a real node with a memory segment and a
//! disk directory, a real store, and a `moonkv-events` subscriber checking the exact events.
//!
//! Every wait is a bounded poll; nothing asserts on timing.

use moonkv_client::{ErrorCode, ReplicateConfig, Store, StoreConfig};
use moonkv_events::{Delivery, Subscriber};
use moonkv_master::server::{self, MasterConfig, MasterHandle};
use moonkv_node::{DiskConfig, Node, NodeConfig};
use moonkv_proto::ReplicaKind;
use moonkv_testkit::payload::pattern;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "moonkv-disk-tier-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    /// Replica files currently in the directory.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "mkv"))
            .collect();
        files.sort();
        files
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One event as the test compares it: (kind, key, medium).
type Seen = (String, String, String);

/// A subscriber on its own thread, recording every stored/removed event.
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    fn start(endpoint: &str) -> Recorder {
        let mut sub = Subscriber::connect(endpoint, Duration::from_millis(50)).unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                if let Ok(Delivery::Message { message, .. }) = sub.poll() {
                    let mut seen = seen2.lock().unwrap();
                    for e in message.events {
                        let kind = serde_json::to_value(e.kind).unwrap();
                        seen.push((
                            kind.as_str().unwrap_or_default().to_string(),
                            e.object_key.unwrap_or_default(),
                            e.medium.unwrap_or_default(),
                        ));
                    }
                }
            }
        });
        Recorder {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Events of `key`, in stream order.
    fn of(&self, key: &str) -> Vec<(String, String)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, k, _)| k == key)
            .map(|(kind, _, medium)| (kind.clone(), medium.clone()))
            .collect()
    }

    /// Waits until `key` has exactly `want` events (failing if it gets more or time runs out).
    async fn expect(&self, key: &str, want: &[(&str, &str)]) {
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, m)| (k.to_string(), m.to_string()))
            .collect();
        let until = Instant::now() + WAIT;
        loop {
            let got = self.of(key);
            if got == want {
                return;
            }
            assert!(
                got.len() < want.len() && got[..] == want[..got.len()],
                "events of {key}: got {got:?}, want {want:?}"
            );
            assert!(
                Instant::now() < until,
                "events of {key}: got {got:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn master(high_watermark: f64) -> MasterHandle {
    let mut config = MasterConfig::ephemeral();
    config.kv_events.enabled = true;
    config.kv_events.bind_endpoint = "tcp://127.0.0.1:0".into();
    config.kv_events.backend_id = "disk-e2e".into();
    config.engine.eviction_high_watermark_ratio = high_watermark;
    server::start(config).await.expect("master starts")
}

fn node_config(master: &MasterHandle, dir: &Path, disk_capacity: u64) -> NodeConfig {
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), 8 * MIB);
    config.ping_interval = Duration::from_millis(200);
    config.disk_poll_interval = Duration::from_millis(50);
    config.disk = Some(DiskConfig {
        dir: dir.to_path_buf(),
        capacity: disk_capacity,
    });
    config
}

async fn store(master: &MasterHandle) -> Store {
    let config = StoreConfig::new(master.rpc_addr().to_string());
    Store::connect(config).await.expect("store connects")
}

/// Puts throw-away keys until the subscriber sees one (ZMQ's slow joiner).
async fn subscribed(store: &Store, rec: &Recorder) {
    let until = Instant::now() + WAIT;
    for i in 0.. {
        let key = format!("probe-{i}");
        store
            .put(&key, b"p", &ReplicateConfig::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let seen = !rec.of(&key).is_empty();
        store.remove(&key, true).await.unwrap();
        if seen {
            return;
        }
        assert!(
            Instant::now() < until,
            "the subscriber never received an event"
        );
    }
}

async fn until<F: FnMut() -> bool>(what: &str, mut done: F) {
    let limit = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Puts `a` then `b` (3 MiB each in an 8 MiB segment, watermark 0.5): the second put pushes
/// memory over the watermark and eviction offloads `a`, the older one, to disk.
async fn offload_a(store: &Store, rec: &Recorder) -> Vec<u8> {
    let a = pattern(3 * MIB as usize, 1);
    store
        .put("a", &a, &ReplicateConfig::default())
        .await
        .unwrap();
    rec.expect("a", &[("stored", "cpu")]).await;
    store
        .put(
            "b",
            &pattern(3 * MIB as usize, 2),
            &ReplicateConfig::default(),
        )
        .await
        .unwrap();
    rec.expect("b", &[("stored", "cpu")]).await;
    rec.expect(
        "a",
        &[("stored", "cpu"), ("stored", "disk"), ("removed", "cpu")],
    )
    .await;
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_offloads_to_disk_and_reads_come_back_byte_exact() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = TempDir::new("e2e");
        let master = master(0.5).await;
        let node = Node::start(node_config(&master, &dir.0, 64 * MIB))
            .await
            .unwrap();
        let rec = Recorder::start(&master.events_endpoint().unwrap());
        let store = store(&master).await;
        subscribed(&store, &rec).await;

        let a = offload_a(&store, &rec).await;
        let list = store.replicas("a").await.unwrap();
        let kinds: Vec<ReplicaKind> = list.replicas.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, vec![ReplicaKind::LocalDisk]);
        assert_eq!(list.replicas[0].segment_id, node.disk().unwrap().id);
        assert_eq!(dir.files().len(), 1, "one replica file");
        let stats = master.engine().stats();
        assert_eq!(stats.offloads_completed, 1);
        assert_eq!(stats.disk_allocated_bytes, 3 * MIB + 4096);

        let back = store.get("a").await.unwrap();
        assert!(back == a, "disk read is byte-exact");
        let mut buf = vec![0u8; a.len() + 3];
        assert_eq!(store.get_into("a", &mut buf).await.unwrap(), a.len());
        assert!(buf[..a.len()] == a[..]);
        assert!(store.exists("a").await.unwrap());

        store.remove("a", true).await.unwrap();
        rec.expect(
            "a",
            &[
                ("stored", "cpu"),
                ("stored", "disk"),
                ("removed", "cpu"),
                ("removed", "disk"),
            ],
        )
        .await;
        until("the file to be deleted", || dir.files().is_empty()).await;
        assert_eq!(master.engine().stats().disk_allocated_bytes, 0);
        assert_eq!(
            store.get("a").await.unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        rec.expect("b", &[("stored", "cpu")]).await;

        drop(rec);
        node.shutdown().await;
        master.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_disk_files_give_clean_errors_never_wrong_bytes() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = TempDir::new("bad");
        let master = master(0.5).await;
        let node = Node::start(node_config(&master, &dir.0, 64 * MIB))
            .await
            .unwrap();
        let rec = Recorder::start(&master.events_endpoint().unwrap());
        let store = store(&master).await;
        subscribed(&store, &rec).await;
        let a = offload_a(&store, &rec).await;
        let file = dir.files().remove(0);
        let good = std::fs::read(&file).unwrap();
        assert_eq!(store.get("a").await.unwrap(), a);

        let mut flipped = good.clone();
        let at = flipped.len() - 1000;
        flipped[at] ^= 0x01;
        std::fs::write(&file, &flipped).unwrap();
        let err = store.get("a").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::CHECKSUM_MISMATCH, "{err}");

        std::fs::write(&file, &good[..good.len() / 2]).unwrap();
        let err = store.get("a").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::CHECKSUM_MISMATCH, "truncated: {err}");

        std::fs::remove_file(&file).unwrap();
        let err = store.get("a").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::FILE_NOT_FOUND, "{err}");

        std::fs::write(&file, &good).unwrap();
        assert_eq!(
            store.get("a").await.unwrap(),
            a,
            "a restored file reads again"
        );
        drop(rec);
        node.shutdown().await;
        master.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_write_through_and_eviction_falls_back_to_dropping() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = TempDir::new("full");
        let master = master(0.5).await;
        let node = Node::start(node_config(&master, &dir.0, 2 * MIB))
            .await
            .unwrap();
        let rec = Recorder::start(&master.events_endpoint().unwrap());
        let store = store(&master).await;
        subscribed(&store, &rec).await;

        let with_disk = ReplicateConfig {
            with_disk_replica: true,
            ..Default::default()
        };
        let err = store
            .put("big", &pattern(2 * MIB as usize, 3), &with_disk)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NO_AVAILABLE_HANDLE, "{err}");
        let small = pattern(1000, 4);
        store.put("small", &small, &with_disk).await.unwrap();
        rec.expect("small", &[("stored", "cpu"), ("stored", "disk")])
            .await;

        store
            .put(
                "a",
                &pattern(3 * MIB as usize, 1),
                &ReplicateConfig::default(),
            )
            .await
            .unwrap();
        store
            .put(
                "b",
                &pattern(3 * MIB as usize, 2),
                &ReplicateConfig::default(),
            )
            .await
            .unwrap();
        rec.expect("a", &[("stored", "cpu"), ("removed", "cpu")])
            .await;
        assert_eq!(
            store.get("a").await.unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        assert_eq!(store.get("small").await.unwrap(), small);
        assert_eq!(dir.files().len(), 1);
        drop(rec);
        node.shutdown().await;
        master.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_the_same_directory_gets_its_disk_replicas_back() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = TempDir::new("restart");
        let master = master(0.9).await;
        let node = Node::start(node_config(&master, &dir.0, 64 * MIB))
            .await
            .unwrap();
        let rec = Recorder::start(&master.events_endpoint().unwrap());
        let store = store(&master).await;
        subscribed(&store, &rec).await;
        let with_disk = ReplicateConfig {
            with_disk_replica: true,
            ..Default::default()
        };
        let keep = pattern(100_000, 5);
        store.put("keep", &keep, &with_disk).await.unwrap();
        store
            .put("gone", &pattern(100, 6), &with_disk)
            .await
            .unwrap();
        rec.expect("gone", &[("stored", "cpu"), ("stored", "disk")])
            .await;
        let disk_id = node.disk().unwrap().id;
        node.crash().await;
        // While the node is away its objects are removed or kept; the master decides.
        store.remove("gone", true).await.unwrap();

        let node = Node::start(node_config(&master, &dir.0, 64 * MIB))
            .await
            .unwrap();
        assert_eq!(
            node.disk().unwrap().id,
            disk_id,
            "same directory, same disk"
        );
        // The old mount is taken over: its copy is retracted, then the file found in the
        // directory is announced again. (The crashed node's memory copy goes when its client
        // expires, which this test does not wait for.)
        let disk_events = || -> Vec<String> {
            rec.of("keep")
                .into_iter()
                .filter(|(_, medium)| medium == "disk")
                .map(|(kind, _)| kind)
                .collect()
        };
        until("the disk copy to come back", || disk_events().len() >= 3).await;
        assert_eq!(disk_events(), vec!["stored", "removed", "stored"]);
        assert_eq!(store.get("keep").await.unwrap(), keep);
        until("the removed object's file to be deleted", || {
            dir.files().len() == 1
        })
        .await;
        assert_eq!(
            store.get("gone").await.unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        drop(rec);
        node.shutdown().await;
        master.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_unwritable_disk_directory_stops_the_node_with_its_name() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let master = master(0.9).await;
        let missing = std::env::temp_dir().join("moonkv-disk-tier-not-there");
        let err = Node::start(node_config(&master, &missing, MIB))
            .await
            .err()
            .expect("a missing directory is refused");
        assert!(err.message.contains("moonkv-disk-tier-not-there"), "{err}");
        let err = Node::start(node_config(&master, Path::new("/proc"), MIB))
            .await
            .err()
            .expect("an unwritable directory is refused");
        assert!(
            err.message.contains("/proc") && err.message.contains("not writable"),
            "{err}"
        );
        assert!(master.engine().segments().is_empty(), "nothing was mounted");
        master.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
