//! Writers stopped at named fault points (`moonkv_node::failpoints`), with real processes on
//! loopback: a `moonkv put` process that ends itself right after PutStart, and a node that ends
//! itself with a disk replica synced under its temporary name but not yet renamed.
//!
//! What each test checks afterwards is what `docs/operations.md` and `docs/disk-tier.md`
//! promise: nothing of the interrupted write is ever readable, its space comes back on the
//! documented schedule, no half-finished file is adopted, and the key can be written again.

use moonkv_client::{ErrorCode, Store, StoreConfig};
use moonkv_node::failpoints::{AFTER_PUT_START, DISK_BEFORE_RENAME, EXIT_CODE};
use moonkv_testkit::admin::*;
use moonkv_testkit::payload::payload;
use moonkv_testkit::{output_of, Moonkv, Proc};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// Generous bound for anything the master does on its own schedule (TTL expiry, sweeps).
const SETTLE: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

async fn store(master: &Proc) -> Store {
    let mut config = StoreConfig::new(master.field("rpc"));
    config.transfer_timeout = Duration::from_secs(30);
    Store::connect(config).await.expect("store connects")
}

/// Used bytes of one segment as the master reports them.
fn used(admin: &str, segment: &str) -> u64 {
    segments(admin)
        .expect("segments detail")
        .into_iter()
        .find(|(n, _)| n == segment)
        .map(|(_, u)| u)
        .expect("segment mounted")
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_process_killed_after_put_start_leaves_nothing_readable_and_is_reclaimed() {
    let release = Duration::from_secs(2);
    let m = MOONKV.master(&[
        "--put-start-discard-timeout-sec",
        "1",
        "--put-start-release-timeout-sec",
        "2",
    ]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    let _n = MOONKV.node(&rpc, "seg-w", "64MiB");
    let value = payload(5, 1, 4 * MIB);

    let mut put = MOONKV.client(&rpc, &["put", "orphan", "-"]);
    put.env("FAILPOINTS", format!("{AFTER_PUT_START}=return"));
    let started = Instant::now();
    let out = output_of(put, &value);
    assert_eq!(out.status.code(), Some(EXIT_CODE), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!("failpoint {AFTER_PUT_START}: exiting")),
        "{}",
        stderr_of(&out)
    );

    // The master allocated the write and nobody will ever finish it.
    let s = store(&m).await;
    let err = s.get("orphan").await.expect_err("never committed");
    assert!(
        matches!(
            err.code,
            ErrorCode::REPLICA_IS_NOT_READY | ErrorCode::OBJECT_NOT_FOUND
        ),
        "{err}"
    );
    let held = used(&admin, "seg-w") >= value.len() as u64
        && metric(&admin, "master_key_count") == Some(1.0);
    // Only once the release timeout has passed may the sweep have taken it already.
    if err.code == ErrorCode::OBJECT_NOT_FOUND || !held {
        assert!(started.elapsed() >= release, "{err}; held: {held}");
    }
    assert!(
        all_keys(&admin).unwrap().is_empty(),
        "listed while unfinished"
    );

    wait_for_master_state(&admin, SETTLE, &[("seg-w", 0)], 0);
    // PutStart came after `started`, and the sweep may not reclaim a write younger than the
    // release timeout.
    assert!(
        started.elapsed() >= release,
        "reclaimed after {:?}, before the release timeout",
        started.elapsed()
    );
    assert!(metric(&admin, "master_stalled_writes_reclaimed").unwrap_or(0.0) >= 1.0);
    let err = s.get("orphan").await.expect_err("reclaimed");
    assert_eq!(err.code, ErrorCode::OBJECT_NOT_FOUND, "{err}");

    // The key is free again, for the same command without the fault.
    let out = output_of(MOONKV.client(&rpc, &["put", "orphan", "-"]), &value);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(s.get("orphan").await.unwrap() == value);
    assert_eq!(all_keys(&admin).unwrap(), ["orphan"]);
}

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "moonkv-writer-faults-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temporary path")
    }

    /// Names in the directory ending in `suffix`, sorted.
    fn ending_in(&self, suffix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(suffix))
            .collect();
        names.sort();
        names
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_before_renaming_a_disk_replica_adopts_nothing_after_a_restart() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "2"]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    let dir = TempDir::new("rename");
    let disk = ["--disk-dir", dir.arg(), "--disk-capacity", "64MiB"];
    let mut cmd = MOONKV.node_command(&rpc, "seg-d", "64MiB", &disk);
    cmd.env("FAILPOINTS", format!("{DISK_BEFORE_RENAME}=return"));
    let mut node = Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    let value = payload(6, 1, MIB);

    let out = output_of(
        MOONKV.client(&rpc, &["put", "--disk", "on-disk", "-"]),
        &value,
    );
    node.expect_failpoint_exit(DISK_BEFORE_RENAME, SETTLE);
    assert!(
        !out.status.success(),
        "the put cannot have been acknowledged"
    );
    assert!(
        stderr_of(&out).contains("TRANSFER_FAIL"),
        "{}",
        stderr_of(&out)
    );
    // The node died with the replica synced under its temporary name and nothing else.
    assert_eq!(dir.ending_in(".mkv.tmp").len(), 1, "{:?}", dir.path());
    assert!(dir.ending_in(".mkv").is_empty(), "{:?}", dir.path());
    drop(node);

    // The dead node's memory segment leaves with its client; its disk is detached.
    wait_for(SETTLE, "the dead node's segment to be unmounted", || {
        (metric(&admin, "master_total_capacity_bytes")? == 0.0).then_some(())
    });
    let restarted = Proc::start(MOONKV.node_command(&rpc, "seg-d", "64MiB", &disk))
        .unwrap_or_else(|e| panic!("{e}"));
    // Restarted on the same directory: the temporary file is removed, not adopted.
    assert!(dir.ending_in(".mkv.tmp").is_empty(), "{:?}", dir.path());
    assert!(dir.ending_in(".mkv").is_empty(), "{:?}", dir.path());
    wait_for(
        SETTLE,
        "the disk to be mounted again, holding nothing",
        || {
            let capacity = metric(&admin, "master_total_file_capacity_bytes")?;
            let allocated = metric(&admin, "master_allocated_file_size_bytes")?;
            (capacity == (64 * MIB) as f64 && allocated == 0.0).then_some(())
        },
    );
    let s = store(&m).await;
    let err = s
        .get("on-disk")
        .await
        .expect_err("the write never finished");
    assert_eq!(err.code, ErrorCode::OBJECT_NOT_FOUND, "{err}");
    assert!(all_keys(&admin).unwrap().is_empty());

    // A fresh write-through put of the same key works and leaves exactly one file.
    let out = output_of(
        MOONKV.client(&rpc, &["put", "--disk", "on-disk", "-"]),
        &value,
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(s.get("on-disk").await.unwrap() == value);
    let kinds: Vec<_> = s
        .replicas("on-disk")
        .await
        .unwrap()
        .replicas
        .iter()
        .map(|r| r.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            moonkv_proto::ReplicaKind::Memory,
            moonkv_proto::ReplicaKind::LocalDisk
        ]
    );
    assert_eq!(dir.ending_in(".mkv").len(), 1, "{:?}", dir.path());
    assert!(dir.ending_in(".mkv.tmp").is_empty());
    assert_eq!(
        metric(&admin, "master_allocated_file_size_bytes"),
        Some((value.len() + 4096) as f64)
    );
    drop(restarted);
}
