//! The data plane with a shared secret everywhere, end to end with the real binaries on
//! loopback: the node's handshake, capability grants that keep one tenant out of another's
//! ranges, and secrets kept out of logs and metrics.

use moonkv_client::store::{Store, StoreConfig};
use moonkv_dataplane::header::{DataOp, DataStatus, RequestHeader, ResponseHeader};
use moonkv_dataplane::DataConnection;
use moonkv_proto::auth::Secret;
use moonkv_proto::grant::{unix_now_ms, Grant, READ};
use moonkv_proto::{ErrorCode, ReplicaDescriptor, ReplicateConfig};
use moonkv_testkit::cluster::runtime;
use moonkv_testkit::wire::closed_by_peer;
use moonkv_testkit::{http_get, output_of, Moonkv, Proc};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

const SECRET: &str = "security-test-shared-secret-0123";
const LIMIT: Duration = Duration::from_secs(10);

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// A long-running `moonkv` with debug logs (the secret must not show in them) and no secret
/// from this test's own environment.
fn start(args: &[&str]) -> Proc {
    let mut cmd = MOONKV.command(args);
    cmd.env("RUST_LOG", "debug")
        .env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE");
    Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("moonkv-sec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn secret_file(&self) -> PathBuf {
        let path = self.0.join("secret");
        std::fs::write(&path, format!("{SECRET}\n")).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A master and a separate node process, both with the secret from a file.
fn cluster(dir: &TempDir) -> (Proc, Proc) {
    cluster_with(dir, &[])
}

/// [`cluster`], with `extra` flags for both processes.
fn cluster_with(dir: &TempDir, extra: &[&str]) -> (Proc, Proc) {
    let secret = dir.secret_file();
    let secret = secret.to_str().unwrap();
    let mut args = vec![
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
        secret,
    ];
    args.extend_from_slice(extra);
    let master = start(&args);
    let rpc = master.field("rpc");
    let mut args = vec![
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "32MiB",
        "--auth-secret-file",
        secret,
    ];
    args.extend_from_slice(extra);
    let node = start(&args);
    (master, node)
}

fn cli(master: &str, secret: Option<&str>, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut cmd = MOONKV.client(master, args);
    cmd.env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE");
    if let Some(s) = secret {
        cmd.env("MOONKV_AUTH_SECRET", s);
    }
    output_of(cmd, stdin)
}

fn secret() -> Secret {
    Secret::new(SECRET.as_bytes().to_vec()).unwrap()
}

async fn store(master: &str, tenant: &str) -> Store {
    let mut config = StoreConfig::new(master);
    config.tenant = tenant.into();
    config.auth_secret = Some(secret());
    Store::connect(config).await.unwrap()
}

fn payload(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i * 31 + seed) as u8).collect()
}

/// The single replica of `key`, with the read grant the master handed to `store`'s tenant.
async fn replica(store: &Store, key: &str) -> ReplicaDescriptor {
    let mut found = store.list(&format!("^{key}$")).await.unwrap();
    assert_eq!(found.len(), 1);
    let replica = found.remove(0).replicas.remove(0);
    assert!(replica.grant.is_some(), "a secured master hands out grants");
    replica
}

#[test]
fn cli_put_get_work_with_a_secret_everywhere_and_fail_clearly_without() {
    let dir = TempDir::new("cli");
    let (master, _node) = cluster(&dir);
    let rpc = master.field("rpc");
    let value = payload(1, 3 << 20);
    let put = cli(&rpc, Some(SECRET), &["put", "doc", "-"], &value);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = cli(&rpc, Some(SECRET), &["get", "doc"], b"");
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(get.stdout == value, "bytes differ");

    let denied = cli(&rpc, None, &["get", "doc"], b"");
    assert!(!denied.status.success());
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(err.contains("MOONKV_AUTH_SECRET"), "{err}");
}

#[test]
fn tenants_cannot_reach_each_others_ranges_on_the_data_plane() {
    let dir = TempDir::new("tenants");
    let (mut master, mut node) = cluster(&dir);
    let rpc = master.field("rpc");
    let endpoint = node.field("data");
    runtime().block_on(async {
        let alice = store(&rpc, "alice").await;
        let bob = store(&rpc, "bob").await;
        let (a_value, b_value) = (payload(2, 100_000), payload(3, 100_000));
        alice
            .put("a", &a_value, &ReplicateConfig::default())
            .await
            .unwrap();
        bob.put("b", &b_value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(alice.get("a").await.unwrap(), a_value);
        let a = replica(&alice, "a").await;
        let b = replica(&bob, "b").await;
        assert_eq!(*a.endpoint, *endpoint);

        // An authenticated caller (it knows the cluster secret) still needs a grant that
        // covers the range it asks for.
        let mut conn = DataConnection::connect(&endpoint, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let mut buf = vec![0u8; a.size as usize];
        conn.read(
            a.segment_id,
            a.address,
            &mut buf,
            a.grant.as_deref().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(buf, a_value, "alice's own grant reads alice's bytes");

        let b_grant = b.grant.clone().unwrap();
        let mut stretched = a.grant.clone().unwrap();
        stretched[18..26].copy_from_slice(&(a.size * 4).to_be_bytes());
        let mut rewritten = b_grant.clone();
        rewritten[10..18].copy_from_slice(&a.address.to_be_bytes());
        let expired = Grant::new(READ, unix_now_ms() - 60_000, a.address, a.size, "alice")
            .seal(&secret(), a.segment_id);
        let attempts: [(&str, &[u8]); 5] = [
            ("no grant", &[]),
            ("bob's grant for alice's range", &b_grant),
            ("bob's grant rewritten to alice's address", &rewritten),
            ("alice's grant stretched", &stretched),
            ("an expired grant", &expired),
        ];
        for (what, grant) in attempts {
            let e = conn
                .read(a.segment_id, a.address, &mut buf, grant)
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{what}: {e}");
            assert!(e.to_string().contains("grant"), "{what}: {e}");
        }
        // Writing over alice's bytes with bob's grant, or with alice's read grant, is refused.
        for grant in [&b_grant, a.grant.as_ref().unwrap()] {
            let e = conn
                .write(a.segment_id, a.address, &b_value, grant)
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");
        }
        // The node kept serving, and alice's object is intact.
        assert_eq!(alice.get("a").await.unwrap(), a_value);
        assert_eq!(bob.get("b").await.unwrap(), b_value);
    });

    // The secret shows in no log and not in /metrics.
    let metrics = http_get(&master.field("admin"), "/metrics").expect("metrics");
    assert!(metrics.contains("master_"), "{metrics}");
    assert!(!metrics.contains(SECRET));
    let node_log = node.stop_and_read_log();
    assert!(
        node_log.contains("data-plane request refused"),
        "refusals are logged at debug"
    );
    assert!(!node_log.contains(SECRET), "secret leaked into node logs");
    assert!(!master.stop_and_read_log().contains(SECRET));
}

#[test]
fn with_a_separate_grant_secret_clients_cannot_mint_grants() {
    const GRANT_SECRET: &str = "grant-secret-held-by-master-and-nodes";
    let dir = TempDir::new("grant-secret");
    let grant_file = dir.0.join("grant-secret");
    std::fs::write(&grant_file, GRANT_SECRET).unwrap();
    let (mut master, mut node) =
        cluster_with(&dir, &["--grant-secret-file", grant_file.to_str().unwrap()]);
    let endpoint = node.field("data");
    runtime().block_on(async {
        let alice = store(&master.field("rpc"), "alice").await;
        let value = payload(6, 70_000);
        alice
            .put("a", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(alice.get("a").await.unwrap(), value);
        let a = replica(&alice, "a").await;

        // A client holds the cluster secret, so it can authenticate and seal tokens with it,
        // but those are not grants.
        let minted = Grant::new(READ, unix_now_ms() + 60_000, a.address, a.size, "alice")
            .seal(&secret(), a.segment_id);
        let mut conn = DataConnection::connect(&endpoint, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let mut buf = vec![0u8; a.size as usize];
        let e = conn
            .read(a.segment_id, a.address, &mut buf, &minted)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");
        conn.read(
            a.segment_id,
            a.address,
            &mut buf,
            a.grant.as_deref().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(buf, value);
    });
    let metrics = http_get(&master.field("admin"), "/metrics").expect("metrics");
    assert!(!metrics.contains(GRANT_SECRET) && !metrics.contains(SECRET));
    for log in [node.stop_and_read_log(), master.stop_and_read_log()] {
        assert!(!log.contains(GRANT_SECRET) && !log.contains(SECRET));
    }
}

#[test]
fn data_plane_connections_without_the_proof_are_refused() {
    let dir = TempDir::new("raw");
    let (master, node) = cluster(&dir);
    let endpoint = node.field("data");
    runtime().block_on(async {
        let alice = store(&master.field("rpc"), "alice").await;
        let value = payload(4, 5000);
        alice
            .put("a", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        let a = replica(&alice, "a").await;

        // A raw request, even carrying a valid grant, without the handshake.
        let mut raw = std::net::TcpStream::connect(&endpoint).unwrap();
        raw.set_read_timeout(Some(LIMIT)).unwrap();
        let grant = a.grant.clone().unwrap();
        let mut header = RequestHeader::new(DataOp::Read, 77, a.segment_id, a.address, a.size);
        header.grant_len = grant.len() as u16;
        let mut request = header.encode().to_vec();
        request.extend_from_slice(&grant);
        raw.write_all(&request).unwrap();
        let mut answer = [0u8; 24];
        raw.read_exact(&mut answer).unwrap();
        let answer = ResponseHeader::decode(&answer).unwrap();
        assert_eq!(answer.status, DataStatus::Unauthenticated);
        assert_eq!(answer.request_id, 77);
        let mut rest = Vec::new();
        assert_eq!(raw.read_to_end(&mut rest).unwrap_or(0), 0, "closed");

        // The library without a secret: a clear error naming the variable.
        let mut conn = DataConnection::connect(&endpoint, LIMIT, None)
            .await
            .unwrap();
        let mut buf = vec![0u8; a.size as usize];
        let e = conn
            .read(a.segment_id, a.address, &mut buf, &grant)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
        assert!(e.to_string().contains("MOONKV_AUTH_SECRET"), "{e}");

        // The node still serves authenticated callers.
        assert_eq!(alice.get("a").await.unwrap(), value);
    });
}

#[test]
fn up_with_a_secret_shares_it_with_its_node() {
    let dir = TempDir::new("up");
    let secret = dir.secret_file();
    let up = start(&[
        "up",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--kv-events-bind-endpoint",
        "tcp://127.0.0.1:0",
        "--segment-size",
        "32MiB",
        "--auth-secret-file",
        secret.to_str().unwrap(),
    ]);
    let rpc = up.field("rpc");
    let value = payload(5, 200_000);
    let put = cli(&rpc, Some(SECRET), &["put", "k", "-"], &value);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = cli(&rpc, Some(SECRET), &["get", "k"], b"");
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(get.stdout == value, "bytes differ");

    // The embedded node requires the handshake too.
    let mut raw = std::net::TcpStream::connect(up.field("data")).unwrap();
    raw.set_read_timeout(Some(LIMIT)).unwrap();
    let header = RequestHeader::new(DataOp::Read, 5, moonkv_proto::SegmentId::new(1, 1), 0, 1);
    raw.write_all(&header.encode()).unwrap();
    let mut answer = [0u8; 24];
    raw.read_exact(&mut answer).unwrap();
    assert_eq!(
        ResponseHeader::decode(&answer).unwrap().status,
        DataStatus::Unauthenticated
    );
}

/// A connection that sends the first hello and never the proof the challenge asks for.
fn hello_without_proof(rpc: &str) -> std::net::TcpStream {
    let mut stream = std::net::TcpStream::connect(rpc).unwrap();
    stream
        .write_all(&moonkv_testkit::wire::hello_frame(0, "half"))
        .unwrap();
    stream
}

/// The value of the metric line starting with `name` (labels included) in `/metrics`.
fn metric(admin: &str, name: &str) -> f64 {
    let text = http_get(admin, "/metrics").expect("/metrics answers");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn silent_and_half_handshaken_connections_close_at_the_deadline_and_never_lock_clients_out() {
    let dir = TempDir::new("handshake");
    let secret = dir.secret_file();
    let secret = secret.to_str().unwrap();
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--auth-secret-file",
        secret,
        "--max-connections",
        "100",
        "--handshake-timeout",
        "5s",
        "--max-handshaking-connections",
        "300",
        "--max-handshaking-per-source",
        "300",
    ]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let _node = start(&[
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "32MiB",
        "--auth-secret-file",
        secret,
    ]);
    // 400 sockets against 300 handshake places and 100 client slots: 200 that never send a
    // byte, 200 that send the hello and never the proof.
    let opened = std::time::Instant::now();
    let mut attack: Vec<std::net::TcpStream> = Vec::new();
    for _ in 0..200 {
        attack.push(std::net::TcpStream::connect(&rpc).unwrap());
    }
    for _ in 0..200 {
        attack.push(hello_without_proof(&rpc));
    }
    // An honest client connects and works while they are held.
    let value = payload(7, 64 << 10);
    runtime().block_on(async {
        let store = store(&rpc, "default").await;
        store
            .put("honest", &value, &ReplicateConfig::default())
            .await
            .expect("an honest put during the flood");
        assert_eq!(store.get("honest").await.unwrap(), value);
    });
    let worked_after = opened.elapsed();
    let held = attack
        .iter_mut()
        .map(closed_by_peer)
        .filter(|closed| !closed)
        .count();
    assert!(
        held >= 250,
        "the client must work while the flood is held: {held} of 400 open after {worked_after:?}"
    );
    // 100 are closed at once (evicted, or refused in a fast flood); the rest at the deadline.
    let until = opened + Duration::from_secs(15);
    while attack.iter_mut().any(|s| !closed_by_peer(s)) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let closed_after = opened.elapsed();
    let still_open = attack
        .iter_mut()
        .map(closed_by_peer)
        .filter(|closed| !closed)
        .count();
    assert_eq!(still_open, 0, "open after {closed_after:?}");
    assert!(
        closed_after >= Duration::from_millis(4900),
        "closed before the deadline: {closed_after:?}"
    );
    let deadline = metric(
        &admin,
        "master_rpc_handshake_closed_total{reason=\"deadline\"}",
    );
    let evicted = metric(
        &admin,
        "master_rpc_handshake_closed_total{reason=\"evicted\"}",
    );
    // A newcomer over the cap evicts an older pending connection, or, when every place is held
    // by connections younger than 200 ms (a fast flood), is closed itself.
    let refused = metric(
        &admin,
        "master_rpc_handshake_closed_total{reason=\"refused\"}",
    );
    assert!(
        evicted + refused >= 100.0 && deadline >= 250.0,
        "evicted {evicted}, refused {refused}, closed at the deadline {deadline}"
    );
    assert_eq!(
        metric(&admin, "master_rpc_connections{state=\"handshake\"}"),
        0.0
    );
    // And the honest client still works after.
    runtime().block_on(async {
        let store = store(&rpc, "default").await;
        assert_eq!(store.get("honest").await.unwrap(), value);
    });
}

#[test]
fn with_every_client_slot_taken_a_hello_is_refused_with_an_answer_naming_the_cap() {
    let master = start(&[
        "master",
        "--rpc-port",
        "0",
        "--metrics-port",
        "0",
        "--max-connections",
        "2",
    ]);
    let rpc = master.field("rpc");
    let _a = moonkv_testkit::wire::RawStream::after_hello(&rpc);
    let _b = moonkv_testkit::wire::RawStream::after_hello(&rpc);
    let mut third = moonkv_testkit::wire::RawStream::connect(&rpc);
    third.write(&moonkv_testkit::wire::hello_frame(5, "third"));
    let answer = third.read_frame().expect("the hello is answered");
    assert_eq!(answer.request_id, 5);
    assert_eq!(answer.code, ErrorCode::RPC_FAIL.as_i32());
    let text = String::from_utf8_lossy(&answer.body).to_string();
    assert!(text.contains("max_connections (2)"), "{text}");
    assert!(third.read_frame().is_none(), "then the connection closes");
}

#[test]
fn a_standalone_client_with_the_secret_finds_the_master_through_the_node_and_works() {
    let dir = TempDir::new("standalone");
    let (master, node) = cluster(&dir);
    let rpc = master.field("rpc");
    let data = node.field("data");
    runtime().block_on(async {
        // STATS names no range, so it takes no grant; the handshake is what admits it.
        let mut conn = DataConnection::connect(&data, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let stats = conn.stats().await.unwrap();
        assert_eq!(stats.master.as_deref(), Some(rpc.as_str()));

        // Without the secret the node still says nothing.
        let mut open = DataConnection::connect(&data, LIMIT, None).await.unwrap();
        let e = open.stats().await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");

        // A standalone store: the node names the master, and the store works through it.
        let mut config = StoreConfig::new("unused:1");
        config.auth_secret = Some(secret());
        let store = Store::connect_via_node(&data, config).await.unwrap();
        let value = payload(4, 300_000);
        store
            .put("standalone", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(store.get("standalone").await.unwrap(), value);
    });
}

#[test]
fn stat_without_the_secret_fails_naming_it_instead_of_guessing_an_admin_port() {
    let dir = TempDir::new("stat");
    let (master, node) = cluster(&dir);
    let rpc = master.field("rpc");
    let out = cli(&rpc, None, &["stat"], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stat without the secret must fail");
    assert!(stderr.contains("MOONKV_AUTH_SECRET"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing printed from a guessed admin port"
    );
    let out = cli(&rpc, Some(SECRET), &["stat"], b"");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The node answers STATS to the authenticated command (it takes no grant).
    assert!(
        stdout.contains(&format!("node {}:", node.field("data"))),
        "{stdout}"
    );
}
