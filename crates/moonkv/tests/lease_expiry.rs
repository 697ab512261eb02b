//! A read whose lease expires while its transfer is stuck, with real processes: the bytes are
//! returned only if RevalidateReplicas confirms the replicas it read from are unchanged.
//!
//! The node holding the object is frozen (SIGSTOP) after the client got its replica list, so
//! the transfer outlives the 200 ms lease; the test then changes (or not) the object and thaws
//! the node. Leases run on the master's real clock here, so the waits are real but bounded.

use moonkv_client::{ErrorCode, ReplicateConfig, Store, StoreConfig};
use moonkv_testkit::admin::*;
use moonkv_testkit::payload::*;
use moonkv_testkit::{Moonkv, Proc};
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

const MIB: usize = 1 << 20;
const LEASE: Duration = Duration::from_millis(200);

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

async fn store(master: &Proc) -> Store {
    let mut config = StoreConfig::new(master.field("rpc"));
    // The transfer must outlast the frozen node, not time out.
    config.transfer_timeout = Duration::from_secs(60);
    Store::connect(config).await.expect("store connects")
}

/// Starts a get, waits until the master has answered its GetReplicaList (so the lease is
/// running), freezes the node, and lets the lease run out.
async fn stuck_get(
    s: &Store,
    admin: &str,
    node: &Proc,
    key: &str,
) -> tokio::task::JoinHandle<moonkv_client::Result<Vec<u8>>> {
    let before = metric(admin, "master_get_replica_list_requests").unwrap_or(0.0);
    node.freeze();
    let reader = s.clone();
    let key = key.to_string();
    let task = tokio::spawn(async move { reader.get(&key).await });
    wait_for(Duration::from_secs(30), "the get's replica list", || {
        (metric(admin, "master_get_replica_list_requests").unwrap_or(0.0) > before).then_some(())
    });
    tokio::time::sleep(LEASE * 3).await;
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_mid_get_returns_bytes_only_for_unchanged_replicas() {
    let m = MOONKV.master(&[
        "--default-kv-lease-ttl",
        "200ms",
        "--client-live-ttl-sec",
        "600",
    ]);
    let admin = m.field("admin");
    let a = MOONKV.node(&m.field("rpc"), "seg-a", "64MiB");
    let _b = MOONKV.node(&m.field("rpc"), "seg-b", "64MiB");
    let s = store(&m).await;
    let v1 = payload(1, 1, 4 * MIB);
    let v2 = payload(1, 2, 4 * MIB);

    // Unchanged: the read outlives its lease, revalidation confirms, the bytes come back.
    s.put("k", &v1, &on("seg-a")).await.expect("put v1");
    let revalidations = metric(&admin, "master_revalidate_replicas_requests").unwrap_or(0.0);
    let task = stuck_get(&s, &admin, &a, "k").await;
    a.thaw();
    let got = task
        .await
        .expect("join")
        .expect("unchanged replicas are confirmed");
    assert!(got == v1, "the original bytes");
    assert!(
        metric(&admin, "master_revalidate_replicas_requests").unwrap_or(0.0) > revalidations,
        "the read went through revalidation"
    );

    // Replaced: while the transfer is stuck the object is removed and written again elsewhere.
    let task = stuck_get(&s, &admin, &a, "k").await;
    s.remove("k", true).await.expect("forced remove");
    s.put("k", &v2, &on("seg-b"))
        .await
        .expect("put v2 on the other node");
    a.thaw();
    let err = task
        .await
        .expect("join")
        .expect_err("the replica read from was replaced");
    assert_eq!(err.code, ErrorCode::LEASE_EXPIRED, "{err}");
    assert!(s.get("k").await.expect("the new value") == v2);

    // Gone: removed (as eviction would) while the transfer is stuck.
    s.remove("k", true).await.expect("remove v2");
    s.put("k", &v1, &on("seg-a"))
        .await
        .expect("put again on seg-a");
    let task = stuck_get(&s, &admin, &a, "k").await;
    s.remove("k", true).await.expect("forced remove");
    a.thaw();
    let err = task
        .await
        .expect("join")
        .expect_err("the replica read from is gone");
    assert_eq!(err.code, ErrorCode::LEASE_EXPIRED, "{err}");
}
