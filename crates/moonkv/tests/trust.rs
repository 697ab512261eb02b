//! The trust model against real `moonkv master` and `moonkv node` processes with a shared
//! (client) secret and a separate grant (node) secret, on loopback:
//! - a grant dies with its replica: tenant A's write and read grants, kept after A's object was
//!   removed, neither overwrite nor read the bytes of tenant B's object placed in the same range;
//! - a client credential can neither mount a segment (posing as a node) nor unmount a node's;
//! - no connection exhausts a process: unread answers, half-sent frames and HTTP requests,
//!   connection floods, stalled and trickling data-plane callers (`attack.rs` runs them all at
//!   once for a minute).

use moonkv_client::store::{Store, StoreConfig};
use moonkv_dataplane::DataConnection;
use moonkv_proto::auth::Secret;
use moonkv_proto::msg::{EndRequest, MountSegmentRequest, PutStartRequest, UnmountSegmentRequest};
use moonkv_proto::{ClientId, ErrorCode, ReplicaDescriptor, ReplicaType, ReplicateConfig};
use moonkv_proto::{SegmentId, Uuid};
use moonkv_testkit::cluster::runtime;
use moonkv_testkit::wire::closed_by_peer;
use moonkv_testkit::{http_with, Moonkv, Proc};
use std::path::PathBuf;
use std::time::Duration;

const SECRET: &str = "stale-grant-test-shared-secret-01";
const GRANT_SECRET: &str = "stale-grant-test-grant-secret-001";
const LIMIT: Duration = Duration::from_secs(10);
const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const SIZE: usize = 64 << 10;

fn secret() -> Secret {
    Secret::new(SECRET.as_bytes().to_vec()).unwrap()
}

fn start(args: &[&str]) -> Proc {
    let mut cmd = MOONKV.command(args);
    cmd.env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE")
        .env_remove("MOONKV_GRANT_SECRET")
        .env_remove("MOONKV_GRANT_SECRET_FILE");
    Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
}

struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("moonkv-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        std::fs::write(dir.join("grant"), GRANT_SECRET).unwrap();
        Files(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn store(master: &str, tenant: &str) -> Store {
    let mut config = StoreConfig::new(master);
    config.tenant = tenant.into();
    config.auth_secret = Some(secret());
    Store::connect(config).await.unwrap()
}

/// PutStart, the bytes, PutEnd by hand, keeping the write grant the master issued.
async fn put_keeping_grant(store: &Store, key: &str, value: &[u8]) -> ReplicaDescriptor {
    let master = store.master();
    let replicas = master
        .put_start(PutStartRequest {
            client_id: master.client_id(),
            tenant: store.tenant().into(),
            key: key.into(),
            size: value.len() as u64,
            config: ReplicateConfig::default(),
        })
        .await
        .unwrap();
    let replica = replicas[0].clone();
    let grant = replica
        .grant
        .clone()
        .expect("a secured master hands out grants");
    let mut conn = DataConnection::connect(&replica.endpoint, LIMIT, Some(&secret()))
        .await
        .unwrap();
    conn.write(replica.segment_id, replica.address, value, &grant)
        .await
        .unwrap();
    master
        .put_end(EndRequest {
            client_id: master.client_id(),
            tenant: store.tenant().into(),
            key: key.into(),
            replica_type: ReplicaType::All,
            replica_ids: vec![replica.id],
            checksum: None,
        })
        .await
        .unwrap();
    replica
}

/// A master and one node, both with the shared secret and the grant (node) secret.
fn secured_cluster(files: &Files) -> (Proc, Proc) {
    let (secret_file, grant_file) = (files.path("secret"), files.path("grant"));
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
        &secret_file,
        "--grant-secret-file",
        &grant_file,
    ]);
    let rpc = master.field("rpc");
    let node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "8MiB",
        "--auth-secret-file",
        &secret_file,
        "--grant-secret-file",
        &grant_file,
    ]);
    (master, node)
}

async fn read_grant(store: &Store, key: &str) -> ReplicaDescriptor {
    let list = store.replicas(key).await.unwrap();
    list.replicas[0].clone()
}

#[test]
fn grants_of_a_removed_replica_are_worthless_on_the_next_tenants_object() {
    let files = Files::new();
    let (master, _node) = secured_cluster(&files);
    let rpc = master.field("rpc");
    let runtime = runtime();
    runtime.block_on(async {
        let alice = store(&rpc, "alice").await;
        let bob = store(&rpc, "bob").await;
        let alice_bytes = vec![0xA1; SIZE];
        let written = put_keeping_grant(&alice, "a", &alice_bytes).await;
        let read = read_grant(&alice, "a").await;
        assert_eq!(alice.get("a").await.unwrap(), alice_bytes);
        alice.remove("a", true).await.unwrap();

        let bob_bytes = vec![0xB2; SIZE];
        bob.put("b", &bob_bytes, &ReplicateConfig::default())
            .await
            .unwrap();
        let bobs = read_grant(&bob, "b").await;
        assert_eq!(
            (bobs.segment_id, bobs.address),
            (written.segment_id, written.address),
            "the master reuses the freed range (otherwise this test shows nothing)"
        );

        let mut conn = DataConnection::connect(&written.endpoint, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let stale_write = conn
            .write(
                written.segment_id,
                written.address,
                &vec![0xEE; SIZE],
                written.grant.as_deref().unwrap(),
            )
            .await
            .expect_err("a removed replica's write grant must not write");
        assert_eq!(stale_write.code, ErrorCode::ILLEGAL_CLIENT, "{stale_write}");
        assert_eq!(
            bob.get("b").await.unwrap(),
            bob_bytes,
            "bob reads his own bytes"
        );

        for grant in [&read.grant, &written.grant] {
            let mut out = vec![0u8; SIZE];
            let stale_read = conn
                .read(
                    written.segment_id,
                    written.address,
                    &mut out,
                    grant.as_deref().unwrap(),
                )
                .await
                .expect_err("a removed replica's grant must not read");
            assert_eq!(stale_read.code, ErrorCode::ILLEGAL_CLIENT, "{stale_read}");
            assert!(
                out.iter().all(|b| *b == 0),
                "no byte of bob's object leaked"
            );
        }
        // The connection stayed usable for honest requests.
        let mut out = vec![0u8; SIZE];
        conn.read(
            bobs.segment_id,
            bobs.address,
            &mut out,
            bobs.grant.as_deref().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(out, bob_bytes);
    });
}

#[test]
fn a_client_credential_can_neither_pose_as_a_node_nor_unmount_one() {
    let files = Files::new();
    let (master, _node) = secured_cluster(&files);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let bearer = format!("Bearer {SECRET}");
    let segments_detail = || {
        let (status, body) = http_with(
            &admin,
            "GET",
            "/get_segments_detail",
            "",
            &[("Authorization", &bearer)],
        );
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let detail = segments_detail();
    let victim = &detail["segments"][0];
    let parse = |field: &str| Uuid::parse(victim[field].as_str().unwrap()).unwrap();
    let (segment_id, owner) = (SegmentId(parse("segment_id")), ClientId(parse("client_id")));
    let runtime = runtime();
    runtime.block_on(async {
        let mallory = store(&rpc, "mallory").await;
        let master_client = mallory.master();
        let fake = moonkv_proto::Segment {
            id: SegmentId::new(66, 66),
            name: "mallory-segment".into(),
            base: 0x1000_0000,
            size: 64 << 20,
            endpoint: "127.0.0.1:9".into(),
            protocol: "tcp".into(),
            host_id: "mallory".into(),
        };
        let mount = master_client
            .mount_segment(MountSegmentRequest {
                segment: fake,
                client_id: master_client.client_id(),
                keeps_catalog: false,
            })
            .await
            .expect_err("a client may not mount a segment");
        assert_eq!(mount.code, ErrorCode::ILLEGAL_CLIENT, "{mount}");
        let unmount = master_client
            .unmount_segment(UnmountSegmentRequest {
                segment_id,
                client_id: owner,
            })
            .await
            .expect_err("a client may not unmount a node's segment, even naming its owner");
        assert_eq!(unmount.code, ErrorCode::ILLEGAL_CLIENT, "{unmount}");

        // The node's segment is still the only one, and it still serves puts and gets.
        let detail = segments_detail();
        let segments = detail["segments"].as_array().unwrap();
        assert_eq!(segments.len(), 1, "{detail}");
        assert_eq!(segments[0]["segment_id"], victim["segment_id"]);
        let value = vec![7u8; 4096];
        mallory
            .put("still-works", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(mallory.get("still-works").await.unwrap(), value);
    });
}

#[test]
fn unread_scan_answers_do_not_grow_master_memory() {
    use moonkv_proto::frame;
    use moonkv_proto::msg::{RegexRequest, Request};
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    let _node = start(&["node", "--master", &rpc, "--segment-size", "64MiB"]);
    let runtime = runtime();
    let honest = runtime.block_on(async {
        let mut config = StoreConfig::new(&rpc);
        config.auth_secret = None;
        Store::connect(config).await.unwrap()
    });
    // Enough long keys that one scan answer is about 0.7 MB.
    let keys: Vec<String> = (0..2000).map(|i| format!("{i:0>240}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let value = [1u8; 1024];
    let values: Vec<&[u8]> = names.iter().map(|_| &value[..]).collect();
    for result in
        runtime.block_on(honest.batch_put_from(&names, &values, &ReplicateConfig::default()))
    {
        result.unwrap();
    }
    let before = master.rss_kib();

    // 1,000 scans sent at once, their answers never read.
    let mut attacker = moonkv_testkit::wire::RawStream::after_hello(&rpc);
    let mut burst = Vec::new();
    let scan = Request::GetReplicaListByRegex(RegexRequest {
        tenant: String::new(),
        regex: ".*".into(),
    });
    for id in 1..=1000 {
        frame::encode_request(&mut burst, id, &scan).unwrap();
    }
    attacker.write(&burst);

    // Meanwhile an honest client keeps working, and the master's memory stays put.
    let mut peak = before;
    for round in 0..200 {
        let key = format!("honest-{round}");
        runtime
            .block_on(honest.put(&key, &value, &ReplicateConfig::default()))
            .unwrap();
        assert_eq!(runtime.block_on(honest.get(&key)).unwrap(), value);
        peak = peak.max(master.rss_kib());
    }
    assert!(
        peak < before + 50 * 1024,
        "master RSS grew from {before} KiB to {peak} KiB with unread scan answers"
    );
    // Back-pressure, not loss: every scan is answered once the attacker reads.
    for _ in 0..1000 {
        let answer = attacker.read_frame().expect("every scan is answered");
        assert_eq!(answer.code, 0, "scan failed");
    }
}

#[test]
fn a_caller_that_stalls_mid_request_loses_its_range_lock_within_the_io_deadline() {
    use moonkv_dataplane::header::{DataOp, RequestHeader};
    use std::io::Write;
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "8MiB",
        "--data-io-timeout",
        "1s",
    ]);
    let segment = moonkv_testkit::admin::first_segment(&admin);
    let (id, base, size) = (segment.id, segment.base, segment.size);
    // A write of the whole segment whose payload never comes: it holds the range lock.
    let mut stalled = std::net::TcpStream::connect(&segment.endpoint).unwrap();
    stalled
        .write_all(&RequestHeader::new(DataOp::Write, 1, id, base, size).encode())
        .unwrap();
    stalled.write_all(&[0u8; 100]).unwrap();
    // The honest put below must come after the node took the stalled write's lock (otherwise
    // the stalled bytes could land after it): wait until a read of the range is held up.
    let held = (0..500).any(|_| {
        use std::io::Read;
        let mut probe = std::net::TcpStream::connect(&segment.endpoint).unwrap();
        probe
            .write_all(&RequestHeader::new(DataOp::Read, 1, id, base, 1).encode())
            .unwrap();
        probe
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        probe.read(&mut [0u8; 64]).is_err()
    });
    assert!(held, "the stalled write never held its range");

    let runtime = runtime();
    runtime.block_on(async {
        let mut config = StoreConfig::new(&rpc);
        config.auth_secret = None;
        config.transfer_timeout = Duration::from_secs(5);
        let honest = Store::connect(config).await.unwrap();
        let value = vec![5u8; 64 << 10];
        // Without the deadline this put waits on the stalled writer's lock until its own
        // deadline and fails; with it, the node drops the stalled connection after 1 s.
        honest
            .put("after-the-stall", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(honest.get("after-the-stall").await.unwrap(), value);
    });
    drop(stalled);
}

#[test]
fn half_sent_frames_are_dropped_after_the_io_timeout_and_connections_are_capped() {
    use std::io::Read;
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--rpc-io-timeout",
        "500ms",
        "--max-connections",
        "6",
    ]);
    let rpc = master.field("rpc");
    let before = master.rss_kib();
    // Frames that announce 16 MiB and stop after 1 MiB: their buffers must not stay forever.
    let mut half_sent: Vec<_> = (0..4)
        .map(|_| {
            let mut raw = moonkv_testkit::wire::RawStream::after_hello(&rpc);
            let mut frame = ((16u32 << 20) - 4).to_be_bytes().to_vec();
            frame.extend_from_slice(&[1u8; 1 << 20]);
            raw.write(&frame);
            raw
        })
        .collect();
    for raw in &mut half_sent {
        raw.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut byte = [0u8; 64];
        // The master closes the connection (an error frame may come first).
        let mut closed = false;
        for _ in 0..4 {
            match raw.stream.read(&mut byte) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Ok(0) | Err(_) => {
                    closed = true;
                    break;
                }
                Ok(_) => continue,
            }
        }
        assert!(closed, "a half-sent frame kept its connection open");
    }
    drop(half_sent);
    assert!(master.rss_kib() < before + 64 * 1024);

    // At most six connections: the seventh's hello is refused with an answer naming the cap,
    // and a slot frees when one closes.
    let held: Vec<_> = (0..6)
        .map(|_| moonkv_testkit::wire::RawStream::after_hello(&rpc))
        .collect();
    let mut extra = moonkv_testkit::wire::RawStream::connect(&rpc);
    extra.write(&moonkv_testkit::wire::hello_frame(0, "extra"));
    let answer = extra.read_frame().expect("the hello is answered");
    assert_eq!(answer.code, ErrorCode::RPC_FAIL.as_i32());
    assert!(
        extra.read_frame().is_none(),
        "a connection past max_connections is closed"
    );
    drop(held);
    let mut retried = None;
    for _ in 0..100 {
        let answer =
            std::panic::catch_unwind(|| moonkv_testkit::wire::RawStream::after_hello(&rpc));
        if let Ok(raw) = answer {
            retried = Some(raw);
            break;
        }
    }
    assert!(retried.is_some(), "a freed slot takes a new connection");
}

#[test]
fn a_node_caps_its_data_plane_connections() {
    use std::io::Read;
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    let node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "8MiB",
        "--data-max-connections",
        "3",
    ]);
    let endpoint = node.field("data");
    let held: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(&endpoint).unwrap())
        .collect();
    // The node counts a connection once it accepted it; the fourth is closed at accept, which
    // a read shows as the end of the stream.
    let mut refused = false;
    for _ in 0..50 {
        let mut extra = std::net::TcpStream::connect(&endpoint).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut byte = [0u8; 1];
        if matches!(extra.read(&mut byte), Ok(0)) {
            refused = true;
            break;
        }
    }
    assert!(refused, "a fourth data-plane connection was kept open");
    drop(held);
    let runtime = runtime();
    runtime.block_on(async {
        let mut config = StoreConfig::new(&rpc);
        config.auth_secret = None;
        let store = Store::connect(config).await.unwrap();
        let value = vec![9u8; 4096];
        // Once the held connections are gone, the node takes new ones again.
        let mut stored = false;
        for _ in 0..50 {
            if store
                .put("after-the-cap", &value, &ReplicateConfig::default())
                .await
                .is_ok()
            {
                stored = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(stored);
        assert_eq!(store.get("after-the-cap").await.unwrap(), value);
    });
}

#[test]
fn a_node_whose_segment_is_unmounted_behind_its_back_mounts_it_again() {
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = start(&["node", "--master", &rpc, "--segment-size", "8MiB"]);
    let segments = || -> serde_json::Value {
        let (status, body) = moonkv_testkit::http(&admin, "GET", "/get_segments_detail", "");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let detail = segments();
    let victim = detail["segments"][0].clone();
    let parse = |field: &str| Uuid::parse(victim[field].as_str().unwrap()).unwrap();
    // An open master: anyone naming the owner may unmount (with a node secret only nodes may).
    let conn = moonkv_testkit::wire::connect(&rpc);
    conn.request::<()>(&moonkv_proto::msg::Request::UnmountSegment(
        UnmountSegmentRequest {
            segment_id: SegmentId(parse("segment_id")),
            client_id: ClientId(parse("client_id")),
        },
    ))
    .unwrap();
    // The node's next heartbeats notice and mount it again.
    moonkv_testkit::wait_for(Duration::from_secs(20), "the segment to come back", || {
        let now = segments();
        (now["segments"].as_array().map(Vec::len) == Some(1)
            && now["segments"][0]["segment_id"] == victim["segment_id"])
            .then_some(())
    });
}

#[test]
fn half_sent_admin_requests_are_closed_after_the_header_and_idle_timeouts() {
    use std::io::Write;
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--admin-header-timeout",
        "1s",
        "--admin-idle-timeout",
        "2s",
    ]);
    let admin = master.field("admin");
    // Requests whose headers never end, and requests whose body stops after a few bytes.
    let mut held: Vec<std::net::TcpStream> = (0..500)
        .map(|i| {
            let mut stream = std::net::TcpStream::connect(&admin).unwrap();
            let head = format!("GET /health HTTP/1.1\r\nHost: moonkv\r\nX-Slow-{i}: ");
            stream.write_all(head.as_bytes()).unwrap();
            stream
        })
        .collect();
    held.extend((0..20).map(|_| {
        let mut stream = std::net::TcpStream::connect(&admin).unwrap();
        let head = "PUT /api/v1/tenant_quotas?tenant_id=t HTTP/1.1\r\nHost: moonkv\r\n\
                    Content-Length: 1000\r\n\r\n{\"requested";
        stream.write_all(head.as_bytes()).unwrap();
        stream
    }));
    // Meanwhile an honest request is answered: at once if a connection slot is free, else as
    // soon as the header timeout frees one (520 held connections exceed the cap of 256, and
    // the ones over it are refused at accept, like an honest one arriving while they hold).
    moonkv_testkit::wait_for(
        Duration::from_secs(10),
        "an honest request to be answered while half-sent ones are held",
        || moonkv_testkit::http_get(&admin, "/health"),
    );
    // Every held connection is closed by the master, none by the test.
    moonkv_testkit::wait_for(
        Duration::from_secs(30),
        "the master to close every half-sent request",
        || {
            held.retain_mut(|stream| !closed_by_peer(stream));
            held.is_empty().then_some(())
        },
    );
    let (status, _) = moonkv_testkit::http(&admin, "GET", "/health", "");
    assert_eq!(status, 200);
}

#[test]
fn the_admin_port_caps_its_connections_and_health_answers_through_a_flood() {
    use std::io::{Read, Write};
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--admin-max-connections",
        "64",
    ]);
    let admin = master.field("admin");
    // 2,000 connections that hold their slot without finishing a request: silent ones and
    // ones that sent half a request head.
    let mut flood: Vec<std::net::TcpStream> = Vec::with_capacity(2000);
    for i in 0..2000 {
        let mut s = std::net::TcpStream::connect(&admin).unwrap();
        if i % 2 == 1 {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        }
        flood.push(s);
    }
    // Liveness, role and metrics still answer, each within a second.
    for path in ["/health", "/role", "/metrics"].iter().cycle().take(21) {
        let asked = std::time::Instant::now();
        let (status, _) = moonkv_testkit::http(&admin, "GET", path, "");
        assert_eq!(status, 200, "{path}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{path} took {:?} during the flood",
            asked.elapsed()
        );
    }
    // The cap holds: of the flood, at most the cap's worth is still open.
    let open = moonkv_testkit::wait_for(Duration::from_secs(10), "the evicted to close", || {
        let open = flood
            .iter_mut()
            .map(closed_by_peer)
            .filter(|closed| !closed)
            .count();
        (open <= 64).then_some(open)
    });
    assert!(open <= 64, "{open} flood connections open past a cap of 64");
    // A connection that sent nothing yet is the oldest idle one: it gives way, and reads the
    // end of the stream.
    let mut early = std::net::TcpStream::connect(&admin).unwrap();
    early
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _newer: Vec<_> = (0..64)
        .map(|_| std::net::TcpStream::connect(&admin).unwrap())
        .collect();
    let mut byte = [0u8; 1];
    assert!(
        matches!(early.read(&mut byte), Ok(0) | Err(_)),
        "the oldest idle connection was evicted"
    );
}

#[test]
fn a_caller_that_trickles_its_payload_loses_its_range_lock_at_the_request_cap() {
    use moonkv_dataplane::header::{DataOp, RequestHeader};
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "8MiB",
        "--data-io-timeout",
        "1s",
        "--data-request-floor",
        "2s",
        "--data-min-rate",
        "1GiB",
    ]);
    let segment = moonkv_testkit::admin::first_segment(&admin);
    let (id, base, size) = (segment.id, segment.base, segment.size);
    // A write of the whole segment whose payload comes one byte every 200 ms: well inside the
    // 1 s I/O deadline each time, so only the request's cap can end it.
    let mut trickler = std::net::TcpStream::connect(&segment.endpoint).unwrap();
    trickler
        .write_all(&RequestHeader::new(DataOp::Write, 1, id, base, size).encode())
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let mut stream = trickler.try_clone().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            for _ in 0..150 {
                if stop.load(Ordering::Relaxed) || stream.write_all(&[7u8]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let runtime = runtime();
    runtime.block_on(async {
        let mut config = StoreConfig::new(&rpc);
        config.auth_secret = None;
        config.transfer_timeout = Duration::from_secs(10);
        let honest = Store::connect(config).await.unwrap();
        let value = vec![5u8; 64 << 10];
        // Without the cap this put waits on the trickler's lock until its own deadline and
        // fails; with it, the node drops the trickler 2 s into its payload.
        honest
            .put("after-the-trickle", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(honest.get("after-the-trickle").await.unwrap(), value);
    });
    // The node, not the test, ended the trickler's connection.
    let closed = closed_by_peer(&mut trickler);
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
    assert!(closed, "the trickling writer's connection is still open");
}

#[test]
fn a_put_that_fails_on_a_stalled_range_leaves_its_key_free_at_once() {
    use moonkv_dataplane::header::{DataOp, RequestHeader};
    use std::io::Write;
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    // 40 MiB: any 32 MiB object overlaps any other one.
    let _node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "40MiB",
        "--no-same-host",
    ]);
    let cfg = ReplicateConfig::default();
    runtime().block_on(async {
        let mut config = StoreConfig::new(rpc.clone());
        config.transfer_timeout = Duration::from_secs(1);
        let store = Store::connect(config).await.unwrap();
        let big = vec![0x5au8; 32 << 20];
        store.put("old", &big, &cfg).await.unwrap();
        let old = store
            .list("^old$")
            .await
            .unwrap()
            .remove(0)
            .replicas
            .remove(0);
        // A reader that asks for the whole object and never reads the answer: the node blocks
        // on its full socket while it holds the range.
        let mut stalled = std::net::TcpStream::connect(&*old.endpoint).unwrap();
        stalled
            .write_all(
                &RequestHeader::new(DataOp::Read, 1, old.segment_id, old.address, old.size)
                    .encode(),
            )
            .unwrap();
        store.remove("old", true).await.unwrap();
        // The range goes to the next put, whose write waits behind the stalled reader.
        let failed = store.put("k", &big, &cfg).await;
        assert!(
            failed.is_err(),
            "the write behind the stalled reader timed out"
        );
        // The key is free as soon as the error returned, and the space the late write might
        // still land in is not handed out: a new put goes elsewhere and succeeds.
        let again = std::time::Instant::now();
        store
            .put("k", &[1u8; 4096], &cfg)
            .await
            .expect("the key is free again");
        assert!(
            again.elapsed() < Duration::from_secs(1),
            "{:?}",
            again.elapsed()
        );
        assert_eq!(store.get("k").await.unwrap(), vec![1u8; 4096]);
        drop(stalled);
    });
}

#[test]
fn a_put_cancelled_mid_transfer_leaves_its_key_free() {
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    // The node stalls for 2 s with half the payload read: the caller gives up meanwhile.
    let mut cmd = MOONKV.command(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "64MiB",
        "--no-same-host",
    ]);
    cmd.env(
        "FAILPOINTS",
        format!(
            "{}=1*sleep(2000)",
            moonkv_node::failpoints::WRITE_MID_PAYLOAD
        ),
    );
    let _node = Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    let cfg = ReplicateConfig::default();
    runtime().block_on(async {
        let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
        let value = vec![0x77u8; 8 << 20];
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), store.put("c", &value, &cfg)).await;
        assert!(
            cancelled.is_err(),
            "the put was cancelled by the caller's timeout"
        );
        // The dropped call revokes in the background: the key is free within moments (3 s
        // allows for a loaded machine), long before the master's discard timeout (30 s).
        let until = std::time::Instant::now() + Duration::from_secs(3);
        loop {
            match store.put("c", &[5u8; 4096], &cfg).await {
                Ok(()) => break,
                Err(e) => assert!(
                    std::time::Instant::now() < until,
                    "the key stayed taken after a cancelled put: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.get("c").await.unwrap(), vec![5u8; 4096]);
    });
}

#[test]
fn a_batch_put_cancelled_mid_transfer_leaves_its_keys_free() {
    let master = start(&["master", "--rpc-port", "0", "--metrics-port", "0"]);
    let rpc = master.field("rpc");
    // The node stalls for 2 s with half the payload read: the caller gives up meanwhile.
    let mut cmd = MOONKV.command(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "64MiB",
        "--no-same-host",
    ]);
    cmd.env(
        "FAILPOINTS",
        format!(
            "{}=1*sleep(2000)",
            moonkv_node::failpoints::WRITE_MID_PAYLOAD
        ),
    );
    let _node = Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    let cfg = ReplicateConfig::default();
    runtime().block_on(async {
        let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
        let value = vec![0x77u8; 8 << 20];
        // Every key the batch started is free again.
        let keys = ["b0", "b1", "b2", "b3"];
        let values: Vec<&[u8]> = vec![value.as_slice(); keys.len()];
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            store.batch_put_from(&keys, &values, &cfg),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "the batch was cancelled by the caller's timeout"
        );
        let until = std::time::Instant::now() + Duration::from_secs(3);
        loop {
            let small: Vec<&[u8]> = vec![&[6u8; 4096][..]; keys.len()];
            let results = store.batch_put_from(&keys, &small, &cfg).await;
            if results.iter().all(Result::is_ok) {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "keys stayed taken after a cancelled batch: {results:?}"
            );
            // Keys already put again answer OBJECT_ALREADY_EXISTS next round: remove them.
            for (k, r) in keys.iter().zip(&results) {
                if r.is_ok() {
                    store.remove(k, true).await.unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for k in keys {
            assert_eq!(store.get(k).await.unwrap(), vec![6u8; 4096], "{k}");
        }
        for k in keys {
            assert_eq!(store.get(k).await.unwrap(), vec![6u8; 4096], "{k}");
        }
    });
}
