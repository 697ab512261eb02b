//! Faults with real processes: `moonkv master` and `moonkv node` on loopback, stopped at named
//! fault points (`moonkv_node::failpoints`: a node ends itself mid-payload, or stalls there),
//! killed (SIGKILL), frozen (SIGSTOP) and restarted while the `moonkv_client::Store` library
//! works against them.
//!
//! What every test checks afterwards: no torn or stale object is readable, the master's
//! metadata (`/get_all_keys`, `/kv_events/snapshot`, `master_key_count`) matches what the test
//! believes, and the dead party's space is reclaimed (`/get_segments_detail`,
//! `master_allocated_bytes`). Waits are bounded polls; the only timing assertions are upper
//! bounds on client deadlines.

use moonkv_client::{ErrorCode, ReplicateConfig, Store, StoreConfig};
use moonkv_events::subscriber::{Delivery, SequenceVerdict, Subscriber};
use moonkv_node::failpoints::{READ_MID_PAYLOAD, WRITE_MID_PAYLOAD};
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::ClientId;
use moonkv_testkit::admin::*;
use moonkv_testkit::payload::*;
use moonkv_testkit::wire::{self, Connection};
use moonkv_testkit::{free_ports, Moonkv, Proc};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// Generous bound for anything the master does on its own schedule (TTL expiry, sweeps).
const SETTLE: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;
/// Bytes per data-plane request of the test stores: fault points count requests, so an object of
/// `n * CHUNK` bytes is exactly `n` of them.
const CHUNK: usize = 512 << 10;
/// Bytes per request once a node is known to copy straight to and from this process (its first
/// connection attached for same-host copies): every transfer after the first to that node.
const SAME_HOST_REQUEST: usize = if moonkv_dataplane::same_host::SAME_HOST_CHUNK > CHUNK {
    moonkv_dataplane::same_host::SAME_HOST_CHUNK
} else {
    CHUNK
};

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

async fn store(master: &Proc, adjust: impl FnOnce(&mut StoreConfig)) -> Store {
    let mut config = StoreConfig::new(master.field("rpc"));
    config.transfer_timeout = Duration::from_secs(30);
    config.chunk_size = CHUNK;
    adjust(&mut config);
    Store::connect(config).await.expect("store connects")
}

/// The segment name a key's first replica lives in.
async fn segment_of(store: &Store, key: &str) -> String {
    let list = store.replicas(key).await.expect("replica list");
    list.replicas[0].segment_name.to_string()
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

async fn expect_gone(store: &Store, key: &str) {
    let err = store.get(key).await.expect_err("object must be gone");
    assert_eq!(err.code, ErrorCode::OBJECT_NOT_FOUND, "{key}: {err}");
}

/// Not readable now (gone, or a write still in flight), and gone once the master settles.
async fn expect_unreadable_then_gone(store: &Store, key: &str) {
    let err = store.get(key).await.expect_err("nothing readable");
    assert!(
        matches!(
            err.code,
            ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
        ),
        "{key}: {err}"
    );
    let deadline = Instant::now() + SETTLE;
    loop {
        match store.get(key).await {
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => return,
            Err(e) if e.code == ErrorCode::REPLICA_IS_NOT_READY => {}
            other => panic!("{key}: {:?}", other.map(|v| v.len())),
        }
        assert!(Instant::now() < deadline, "{key} never went away");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_mid_put_fails_over_and_the_abandoned_write_is_reclaimed() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "2"]);
    let admin = m.field("admin");
    let old = payload(2, 1, 4 * MIB);
    let victim = payload(3, 1, 32 * MIB);
    // The node ends itself half-way into a write request in the middle of the victim put. The
    // old object is the node's first transfer (CHUNK-sized requests); the victim comes after
    // the node attached this process's connections (same-host requests).
    let before_victim = old.len() / CHUNK;
    let mid_victim = victim.len() / SAME_HOST_REQUEST / 2;
    let mut a = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-a",
        "512MiB",
        &format!(
            "{WRITE_MID_PAYLOAD}={}*off->return",
            before_victim + mid_victim
        ),
    );
    let _b = MOONKV.node(&m.field("rpc"), "seg-b", "64MiB");
    let s = store(&m, |_| {}).await;

    let survivor = payload(1, 1, MIB);
    s.put("survivor", &survivor, &on("seg-b")).await.unwrap();
    s.put("old-on-a", &old, &on("seg-a")).await.unwrap();
    assert_eq!(segment_of(&s, "survivor").await, "seg-b");
    assert_eq!(segment_of(&s, "old-on-a").await, "seg-a");
    let survivor_bytes = used(&admin, "seg-b");

    let writer = s.clone();
    let sent = victim.clone();
    let put = tokio::spawn(async move { writer.put("victim", &sent, &on("seg-a")).await });
    a.expect_failpoint_exit(WRITE_MID_PAYLOAD, SETTLE);
    // The dead node refuses the reconnection: the write into it is revoked and placed again,
    // on the node that is left, within the same call.
    put.await
        .unwrap()
        .expect("the put fails over to the other node");
    assert_eq!(segment_of(&s, "victim").await, "seg-b");
    assert_eq!(s.get("victim").await.unwrap(), victim);
    let kept_bytes = used(&admin, "seg-b");
    assert!(kept_bytes >= survivor_bytes + victim.len() as u64);
    // The committed object on the dead node errors cleanly (or is already gone), never Ok.
    let err = s.get("old-on-a").await.expect_err("its node is dead");
    assert!(
        matches!(
            err.code,
            ErrorCode::TRANSFER_FAIL | ErrorCode::RPC_FAIL | ErrorCode::OBJECT_NOT_FOUND
        ),
        "{err}"
    );

    // After the client TTL the node's segment, its objects and their space are gone.
    wait_for_master_state(&admin, SETTLE, &[("seg-b", kept_bytes)], 2);
    expect_gone(&s, "old-on-a").await;
    assert_eq!(s.get("survivor").await.unwrap(), survivor);
    assert_eq!(s.get("victim").await.unwrap(), victim);
    assert_eq!(all_keys(&admin).unwrap(), ["survivor", "victim"]);
    assert_eq!(snapshot_keys(&admin).unwrap(), ["survivor", "victim"]);
    assert_eq!(
        metric(&admin, "master_total_capacity_bytes"),
        Some((64 * MIB) as f64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_mid_get_fails_over_or_errors_and_never_returns_wrong_bytes() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "2"]);
    let admin = m.field("admin");
    let two = payload(1, 1, 32 * MIB);
    // Reads come after the put attached this process's connections: same-host requests.
    let requests = two.len() / SAME_HOST_REQUEST;
    // seg-x ends itself in its first read answer, after the header and half of the bytes went
    // out; seg-y serves two whole reads (the failover and one more), then ends itself in the
    // first answer of a third.
    let mut x = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-x",
        "256MiB",
        &format!("{READ_MID_PAYLOAD}=return"),
    );
    let mut y = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-y",
        "256MiB",
        &format!("{READ_MID_PAYLOAD}={}*off->return", 2 * requests),
    );
    let s = store(&m, |_| {}).await;

    // Two replicas: the node serving the first one dies mid-read; the read fails over.
    let both = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["seg-x".into(), "seg-y".into()],
        ..ReplicateConfig::default()
    };
    s.put("two", &two, &both).await.unwrap();
    assert_eq!(segment_of(&s, "two").await, "seg-x");
    let got = s
        .get("two")
        .await
        .expect("the second replica serves the read");
    assert!(got == two, "failover returned wrong bytes");
    x.expect_failpoint_exit(READ_MID_PAYLOAD, SETTLE);

    // After the TTL the dead replica is dropped and the object lives on in one replica.
    wait_for(SETTLE, "the dead node's segment to be unmounted", || {
        let segs = segments(&admin)?;
        (segs.len() == 1 && segs[0].0 == "seg-y").then_some(())
    });
    let list = s.replicas("two").await.unwrap();
    assert_eq!(list.replicas.len(), 1);
    assert_eq!(&*list.replicas[0].segment_name, "seg-y");
    assert_eq!(s.get("two").await.unwrap(), two);

    // One replica left, and its node dies mid-read: a clean error, no partial bytes.
    let _fresh = MOONKV.node(&m.field("rpc"), "seg-z", "64MiB");
    let err = s.get("two").await.expect_err("no replica is left");
    assert!(
        matches!(err.code, ErrorCode::TRANSFER_FAIL | ErrorCode::RPC_FAIL),
        "{err}"
    );
    y.expect_failpoint_exit(READ_MID_PAYLOAD, SETTLE);

    wait_for_master_state(&admin, SETTLE, &[("seg-z", 0)], 0);
    expect_gone(&s, "two").await;
    assert!(all_keys(&admin).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_restart_clients_reconnect_nodes_remount_and_subscribers_see_the_restart() {
    let [rpc, http, events] = free_ports();
    let flags = [
        "--rpc-port".to_string(),
        rpc.to_string(),
        "--metrics-port".into(),
        http.to_string(),
        "--client-live-ttl-sec".into(),
        "3".into(),
        "--enable-kv-events".into(),
        "true".into(),
        "--kv-events-bind-endpoint".into(),
        format!("tcp://127.0.0.1:{events}"),
        "--kv-events-backend-id".into(),
        "faults".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let m = MOONKV.master(&flags);
    let admin = m.field("admin");
    let _n = MOONKV.node(&m.field("rpc"), "seg-n", "64MiB");
    let s = store(&m, |c| c.rpc_timeout = Duration::from_secs(3)).await;
    let mut sub = Subscriber::connect(
        &format!("tcp://127.0.0.1:{events}"),
        Duration::from_millis(100),
    )
    .unwrap();

    // Enough messages that the restarted publisher's sequence is certainly behind.
    let mut n = 0;
    while sub.counters().last_sequence.unwrap_or(0) < 30 {
        assert!(
            n < 2000,
            "the subscriber never joined: {:?}",
            sub.counters()
        );
        s.put(&format!("before-{n}"), b"x", &ReplicateConfig::default())
            .await
            .unwrap();
        n += 1;
        while !matches!(sub.poll().unwrap(), Delivery::Idle) {}
    }

    m.kill();
    let err = s.get("before-0").await.expect_err("the master is down");
    assert!(
        matches!(err.code, ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT),
        "{err}"
    );

    let m = MOONKV.master_again(&flags);
    assert_eq!(m.field("admin"), admin);
    // The node's heartbeat gets NEED_REMOUNT, re-registers its segment by itself and
    // announces the replicas it holds, which the new master adopts (tests/readopt.rs).
    wait_for(SETTLE, "the node to remount and re-announce", || {
        (all_keys(&admin)?.len() == n).then_some(())
    });
    // The same Store reconnects on its next call and reads what was written before.
    assert_eq!(s.get("before-0").await.unwrap(), b"x");
    let value = payload(7, 1, MIB);
    s.put("after", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(s.get("after").await.unwrap(), value);
    let mut keys = all_keys(&admin).unwrap();
    keys.sort();
    let mut snapshot = snapshot_keys(&admin).unwrap();
    snapshot.sort();
    assert_eq!(keys.len(), n + 1);
    assert_eq!(snapshot, keys);

    // The subscriber sees the sequence move backwards: a restart, not a gap.
    let mut verdict = None;
    for i in 0..200 {
        s.put(&format!("probe-{i}"), b"p", &ReplicateConfig::default())
            .await
            .unwrap();
        if let Delivery::Message { verdict: v, .. } = sub.poll().unwrap() {
            verdict = Some(v);
            break;
        }
    }
    assert!(
        matches!(verdict, Some(SequenceVerdict::Restart { .. })),
        "{verdict:?} {:?}",
        sub.counters()
    );
    drop(m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_node_or_master_makes_operations_fail_within_their_deadline() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "60"]);
    let admin = m.field("admin");
    let n = MOONKV.node(&m.field("rpc"), "seg-f", "256MiB");
    let rpc_timeout = Duration::from_secs(1);
    let transfer_timeout = Duration::from_secs(1);
    let s = store(&m, |c| {
        c.rpc_timeout = rpc_timeout;
        c.connect_timeout = Duration::from_secs(1);
        c.transfer_timeout = transfer_timeout;
    })
    .await;
    let small = payload(1, 1, 4 * MIB);
    s.put("small", &small, &ReplicateConfig::default())
        .await
        .unwrap();
    let kept = used(&admin, "seg-f");
    // Two master calls and one chunk deadline per attempt, plus slack for a loaded machine.
    let bound = rpc_timeout * 2 + transfer_timeout * 2 + Duration::from_secs(10);

    n.freeze();
    let started = Instant::now();
    let err = s.get("small").await.expect_err("the node is frozen");
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    assert!(
        started.elapsed() < bound,
        "get took {:?}",
        started.elapsed()
    );

    for (key, size) in [("put-small", 4 * MIB), ("put-big", 64 * MIB)] {
        let started = Instant::now();
        let err = s
            .put(key, &payload(2, 1, size), &ReplicateConfig::default())
            .await
            .expect_err("the node is frozen");
        assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
        assert!(
            started.elapsed() < bound,
            "put took {:?}",
            started.elapsed()
        );
        // The revoke waits until the frozen node can no longer apply the write.
        let err = s.get(key).await.expect_err("nothing readable");
        assert!(
            matches!(
                err.code,
                ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
            ),
            "{err}"
        );
    }

    m.freeze();
    let started = Instant::now();
    let err = s.exists("small").await.expect_err("the master is frozen");
    assert_eq!(err.code, ErrorCode::RPC_TIMEOUT, "{err}");
    assert!(started.elapsed() < rpc_timeout + Duration::from_secs(10));
    m.thaw();
    n.thaw();

    // Thawed: the committed object reads back intact; the timed-out puts left nothing.
    assert_eq!(s.get("small").await.unwrap(), small);
    expect_unreadable_then_gone(&s, "put-small").await;
    expect_unreadable_then_gone(&s, "put-big").await;
    wait_for_master_state(&admin, SETTLE, &[("seg-f", kept)], 1);
    assert_eq!(all_keys(&admin).unwrap(), ["small"]);
    s.put("after-thaw", &small, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(s.get("after-thaw").await.unwrap(), small);
}

/// A write whose deadline passed on a stalled node must not land on the next object given its
/// space: the revoke waits until the node has let go of the abandoned connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_write_never_lands_on_a_newer_object() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "60"]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    // Two requests per object. The hasty writer sends both on one connection, so when the node
    // stalls in the first, the second waits in the socket; the patient writer uses two
    // connections, so its second request can land while the stalled one holds only the first
    // range.
    let size = 512 << 10;
    let hasty = store(&m, |c| {
        c.transfer_timeout = Duration::from_secs(1);
        c.chunk_size = size / 2;
        c.transfer_connections = 1;
    })
    .await;
    let patient = store(&m, |c| {
        c.chunk_size = size / 2;
        c.transfer_connections = 2;
    })
    .await;
    let mut nodes = Vec::new();
    for round in 0..3u64 {
        let name = format!("seg-t{round}");
        // The first write request this node reads (the hasty one) stalls half-way for three
        // times the hasty deadline; nothing else does.
        nodes.push(MOONKV.node_with_failpoints(
            &rpc,
            &name,
            "64MiB",
            &format!("{WRITE_MID_PAYLOAD}=1*sleep(3000)->off"),
        ));
        let old = payload(1, round, size);
        let err = hasty
            .put(&format!("old-{round}"), &old, &on(&name))
            .await
            .expect_err("the node is stalled");
        assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
        // The next writer is allocated while the node is still stalled in the old write, with
        // the rest of the old bytes waiting in its socket.
        let new = payload(2, round, size);
        patient
            .put(&format!("new-{round}"), &new, &on(&name))
            .await
            .expect("the patient put succeeds");
        let got = patient.get(&format!("new-{round}")).await.unwrap();
        assert!(
            got == new,
            "round {round}: the new object holds {:?}",
            payload_header(&got)
        );
        expect_unreadable_then_gone(&patient, &format!("old-{round}")).await;
        let got = patient.get(&format!("new-{round}")).await.unwrap();
        assert!(
            got == new,
            "round {round}: after the stalled write ended the new object holds {:?}",
            payload_header(&got)
        );
    }
    let keys: Vec<String> = (0..3).map(|r| format!("new-{r}")).collect();
    assert_eq!(all_keys(&admin).unwrap(), keys);
    let each = size as u64;
    wait_for_master_state(
        &admin,
        SETTLE,
        &[("seg-t0", each), ("seg-t1", each), ("seg-t2", each)],
        3,
    );
}

/// A caller that gives up on a put it handed whole to the node (PUT_WHOLE) while the node is
/// stalled between the halves of the payload: readers see the old value, the new one, whole, or
/// nothing (an upsert's replaced value goes at its start); once the node wakes, the cut value
/// lands whole or the key is free for a new write, never torn. (That the node revokes a write
/// whose bytes never all arrived is `put_whole.rs`, on the raw protocol.) Every write the node
/// reads stalls there for `STALL`, so a call cut after `CUT` cannot have been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_put_given_up_mid_call_lands_whole_or_frees_its_key() {
    const STALL: u64 = 800;
    const CUT: Duration = Duration::from_millis(200);
    let m = MOONKV.master(&[]);
    let admin = m.field("admin");
    let _n = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-w",
        "64MiB",
        &format!("{WRITE_MID_PAYLOAD}=sleep({STALL})"),
    );
    let store = store(&m, |c| c.same_host = false).await;
    let cfg = ReplicateConfig::default();
    let size = 256 << 10;
    // The first put goes the usual way and shows the store its node; the second is handed over.
    store.put("warm", b"w", &cfg).await.unwrap();
    let old = payload(1, 0, size);
    store.put("k", &old, &cfg).await.unwrap();
    // Batch starts come from the node; the store itself sends single starts.
    let count = |name: &str| metric(&admin, name).unwrap_or(0.0);
    let handed = || {
        count("master_batch_put_start_requests_total")
            + count("master_batch_upsert_start_requests_total")
    };
    assert!(handed() >= 1.0, "the second put was not handed to the node");

    for (round, key) in ["k", "fresh"].into_iter().enumerate() {
        let before = handed();
        let new = payload(2, round as u64, size);
        let cut = tokio::time::timeout(CUT, store.upsert(key, &new, &cfg)).await;
        assert!(cut.is_err(), "{key}: the stalled put was answered");
        // Most likely while the node is still stalled in the cut write; on a loaded machine
        // perhaps after it landed.
        match store.get(key).await {
            Ok(got) => assert!(
                got == new || (key == "k" && got == old),
                "{key}: {:?}",
                payload_header(&got)
            ),
            Err(e) => assert!(
                matches!(
                    e.code,
                    ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
                ),
                "{key}: {e}"
            ),
        }
        // The node got the cut request (bounded: a loaded machine may be slow to show it).
        let until = Instant::now() + Duration::from_secs(10);
        while handed() <= before {
            assert!(
                Instant::now() < until,
                "{key}: the cut put was not handed to the node"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Once the node wakes, the cut write either lands whole (its bytes were all in the
        // socket before the cut) or is revoked, freeing the key for a new first write (a put,
        // not an upsert, which would preempt the cut write). Either well before the master
        // would discard the write on its own (30 s).
        let last = payload(3, round as u64, size);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match store.put(key, &last, &cfg).await {
                Ok(()) => {
                    let got = store.get(key).await.unwrap();
                    assert!(got == last, "{key}: {:?}", payload_header(&got));
                    break;
                }
                Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => {
                    if let Ok(got) = store.get(key).await {
                        assert!(got == new, "{key}: {:?}", payload_header(&got));
                        break;
                    }
                }
                Err(e) => assert!(Instant::now() < until, "{key}: {e}"),
            }
            assert!(Instant::now() < until, "{key} is still being written");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(all_keys(&admin).unwrap(), ["fresh", "k", "warm"]);
    assert_eq!(count("master_upsert_start_requests_total"), 0.0);
}

fn raw_put_start(c: &Connection, me: ClientId, key: &str, size: u64) {
    let start = PutStartRequest {
        client_id: me,
        tenant: String::new(),
        key: key.into(),
        size,
        config: ReplicateConfig::default(),
    };
    let replicas: Vec<ReplicaDescriptor> = c.request(&Request::PutStart(start)).expect("put start");
    assert_eq!(replicas[0].status, ReplicaStatus::Processing);
}

fn raw_get(c: &Connection, key: &str) -> Result<GetReplicaListResponse, ErrorCode> {
    c.request(&Request::GetReplicaList(KeyRequest {
        tenant: String::new(),
        key: key.into(),
    }))
    .map_err(|e| e.code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_writes_die_with_their_expired_client_or_node() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "2"]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");

    // A raw client owns a segment (nothing serves its bytes), starts a write into it, and
    // then stops pinging.
    let owner = wire::connect(&rpc);
    let me = ClientId::new(77, 1);
    let mut segment = wire::fake_segment(1);
    segment.name = "seg-raw".into();
    owner
        .request::<()>(&Request::MountSegment(MountSegmentRequest {
            segment,
            client_id: me,
            keeps_catalog: false,
        }))
        .unwrap();
    raw_put_start(&owner, me, "owner-in-flight", 4096);

    // Another raw writer starts a write into a real node's segment, then the node dies.
    let n = MOONKV.node(&rpc, "seg-dies", "64MiB");
    let writer = wire::connect(&rpc);
    let writer_id = ClientId::new(78, 1);
    let start = PutStartRequest {
        client_id: writer_id,
        tenant: String::new(),
        key: "node-in-flight".into(),
        size: (8 * MIB) as u64,
        config: on("seg-dies"),
    };
    let got: Vec<ReplicaDescriptor> = writer.request(&Request::PutStart(start)).unwrap();
    assert_eq!(&*got[0].segment_name, "seg-dies");
    assert_eq!(
        raw_get(&writer, "node-in-flight").unwrap_err(),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    assert_eq!(metric(&admin, "master_key_count"), Some(2.0));
    n.kill();

    // After the TTL: both clients expired, their segments unmounted, the writes gone.
    wait_for_master_state(&admin, SETTLE, &[], 0);
    for key in ["owner-in-flight", "node-in-flight"] {
        assert_eq!(
            raw_get(&writer, key).unwrap_err(),
            ErrorCode::OBJECT_NOT_FOUND
        );
    }
    assert_eq!(metric(&admin, "master_total_capacity_bytes"), Some(0.0));
    // A late End from the expired writer changes nothing.
    let late = EndRequest {
        client_id: writer_id,
        tenant: String::new(),
        key: "node-in-flight".into(),
        replica_type: ReplicaType::All,
        replica_ids: got.iter().map(|r| r.id).collect(),
        checksum: None,
    };
    assert!(writer.request::<()>(&Request::PutEnd(late)).is_err());

    // The key is free again for a new node and a new writer.
    let _n2 = MOONKV.node(&rpc, "seg-new", "64MiB");
    let s = store(&m, |_| {}).await;
    let value = payload(9, 2, 8 * MIB);
    s.put("node-in-flight", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(s.get("node-in-flight").await.unwrap(), value);
    assert_eq!(all_keys(&admin).unwrap(), ["node-in-flight"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_is_reclaimed_after_the_release_timeout() {
    let m = MOONKV.master(&[
        "--put-start-discard-timeout-sec",
        "1",
        "--put-start-release-timeout-sec",
        "2",
    ]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    let _n = MOONKV.node(&rpc, "seg-s", "64MiB");

    // A writer that never pings (writers need not) starts a write and disappears.
    let writer = wire::connect(&rpc);
    raw_put_start(&writer, ClientId::new(79, 1), "abandoned", (4 * MIB) as u64);
    assert!(used(&admin, "seg-s") >= (4 * MIB) as u64);
    drop(writer);

    wait_for_master_state(&admin, SETTLE, &[("seg-s", 0)], 0);
    assert!(metric(&admin, "master_stalled_writes_reclaimed").unwrap_or(0.0) >= 1.0);
    let s = store(&m, |_| {}).await;
    expect_gone(&s, "abandoned").await;
    let value = payload(4, 1, 4 * MIB);
    s.put("abandoned", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(s.get("abandoned").await.unwrap(), value);
}
