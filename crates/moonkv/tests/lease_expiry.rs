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

/// A get the node takes whole (GET_WHOLE) whose node stalls, after its master answered, past
/// the lease: the bytes come back only if the master confirms the replica read is unchanged;
/// replaced while the node stalled, the key is answered `LEASE_EXPIRED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_in_a_whole_get_returns_bytes_only_for_unchanged_replicas() {
    let m = MOONKV.master(&[
        "--default-kv-lease-ttl",
        "200ms",
        "--client-live-ttl-sec",
        "600",
    ]);
    let admin = m.field("admin");
    let stall = format!(
        "{}=sleep({})",
        moonkv_node::failpoints::GET_WHOLE_LISTED,
        (LEASE * 3).as_millis()
    );
    let _a = MOONKV.node_with_failpoints(&m.field("rpc"), "seg-a", "64MiB", &stall);
    let _b = MOONKV.node(&m.field("rpc"), "seg-b", "64MiB");
    let mut config = StoreConfig::new(m.field("rpc"));
    config.same_host = false;
    let s = Store::connect(config).await.expect("store connects");
    let size = 100_000;
    let (v1, v2) = (payload(2, 1, size), payload(2, 2, size));
    // Two puts on seg-a show the store its node; its gets then go whole there.
    s.put("warm", b"w", &on("seg-a")).await.unwrap();
    s.put("k", &v1, &on("seg-a")).await.unwrap();
    let whole_gets = || metric(&admin, "master_batch_get_replica_list_requests").unwrap_or(0.0);
    let revalidations = || metric(&admin, "master_revalidate_replicas_requests").unwrap_or(0.0);

    // Unchanged: confirmed, the bytes come back.
    let (gets, checks) = (whole_gets(), revalidations());
    assert!(s.get("k").await.expect("unchanged replica") == v1);
    assert!(whole_gets() > gets, "the get went whole to the node");
    assert!(
        revalidations() > checks,
        "the read went through revalidation"
    );

    // Replaced while the node stalls: removed, and written again on both nodes' free space.
    let reader = s.clone();
    let gets = whole_gets();
    let task = tokio::spawn(async move { reader.get("k").await });
    wait_for(Duration::from_secs(30), "the node's replica list", || {
        (whole_gets() > gets).then_some(())
    });
    s.remove("k", true).await.expect("forced remove");
    s.put("k", &v2, &on("seg-b")).await.expect("put v2");
    s.put("other", &v2, &on("seg-a"))
        .await
        .expect("put over the freed range");
    let err = task
        .await
        .expect("join")
        .expect_err("the replica read from was replaced");
    assert_eq!(err.code, ErrorCode::LEASE_EXPIRED, "{err}");
    assert!(s.get("k").await.expect("the new value") == v2);
}
