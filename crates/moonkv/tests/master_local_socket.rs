//! The master's local socket, end to end with the real binary: callers on the master's machine
//! reconnect there (and learn a restarted master's new name), callers that must stay on TCP
//! do, and the socket admits nothing the RPC port would not: the same hello, the same secret,
//! the same handshake deadline.

use moonkv_client::master_client::{MasterClient, MasterClientConfig};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{HelloAck, KeyRequest};
use moonkv_proto::{local_socket, ErrorCode};
use moonkv_testkit::wire::hello_frame;
use moonkv_testkit::{http, Moonkv};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
/// Bound of every wait in these tests.
const LIMIT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn client_config(rpc: &str, secret: Option<&str>) -> MasterClientConfig {
    let mut config = MasterClientConfig::new(rpc);
    config.auth_secret =
        secret.map(|s| moonkv_proto::auth::Secret::new(s.as_bytes().to_vec()).expect("a secret"));
    config.tls = None;
    config
}

fn exist(key: &str) -> KeyRequest {
    KeyRequest {
        tenant: String::new(),
        key: key.into(),
    }
}

/// A counter of the master's `/metrics` (0 when absent).
fn metric(admin: &str, name: &str) -> f64 {
    let (status, body) = http(admin, "GET", "/metrics", "");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A raw connection to the local socket `name` (`@…`).
fn connect_local(name: &str) -> UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let abstract_name = name.strip_prefix('@').expect("a local socket name");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
        .expect("an abstract address");
    let stream = UnixStream::connect_addr(&addr).unwrap_or_else(|e| panic!("{name}: {e}"));
    stream.set_read_timeout(Some(LIMIT)).expect("read timeout");
    stream
}

/// The next frame on `stream` (kind, code, body); `None` once the master closed it.
fn read_frame(stream: &mut UnixStream) -> Option<(FrameKind, i32, Vec<u8>)> {
    let mut buf = vec![0u8; frame::HEADER_LEN];
    stream.read_exact(&mut buf).ok()?;
    let len = u32::from_be_bytes(buf[0..4].try_into().ok()?) as usize;
    buf.resize(4 + len, 0);
    stream.read_exact(&mut buf[frame::HEADER_LEN..]).ok()?;
    let (f, _) = frame::decode(&buf, u32::MAX).ok()??;
    Some((f.kind, f.code, f.body.to_vec()))
}

/// The master's answer to a first hello sent on `stream`.
fn hello(stream: &mut UnixStream) -> HelloAck {
    stream
        .write_all(&hello_frame(0, "test"))
        .expect("send a hello");
    let (kind, code, body) = read_frame(stream).expect("an answer to the hello");
    assert_eq!((kind, code), (FrameKind::Response, 0));
    rmp_serde::from_slice(&body).expect("a hello answer")
}

/// The local socket the master at `rpc` names in its hello answer over TCP.
fn offered_name(rpc: &str) -> Option<String> {
    let mut raw = moonkv_testkit::wire::RawStream::connect(rpc);
    raw.write(&hello_frame(0, "test"));
    let answer = raw.read_frame().expect("an answer to the hello");
    let ack: HelloAck = moonkv_testkit::wire::decode(&answer).expect("a hello answer");
    ack.local_socket
}

#[test]
fn callers_on_the_masters_machine_reconnect_to_its_local_socket_and_learn_a_restarted_ones() {
    let master = MOONKV.master(&[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let name = offered_name(&rpc).expect("a plain master offers a local socket");
    assert!(local_socket::is_name(&name, local_socket::MASTER), "{name}");
    let before = metric(&admin, "master_rpc_local_connections_opened_total");

    let rt = runtime();
    rt.block_on(async {
        // A caller that reached the master on loopback moves to the local socket.
        let client = MasterClient::connect(client_config(&rpc, None))
            .await
            .expect("connect");
        assert!(client.over_local_socket().await);
        assert!(!client.exist_key(exist("nothing")).await.expect("exist"));
        // One told to stay on TCP (a caller standing for one on another host) does.
        let mut tcp_only = client_config(&rpc, None);
        tcp_only.local_socket = false;
        let tcp = MasterClient::connect(tcp_only).await.expect("connect");
        assert!(!tcp.over_local_socket().await);
        assert!(!tcp.exist_key(exist("nothing")).await.expect("exist"));
        client.close().await;
        tcp.close().await;
    });
    assert_eq!(
        metric(&admin, "master_rpc_local_connections_opened_total") - before,
        1.0
    );

    // A master restarted on the same port has a new local socket; the old name is refused,
    // and a caller learns the new one over TCP.
    let port = rpc.rsplit_once(':').expect("host:port").1.to_string();
    let client = rt.block_on(async {
        let client = MasterClient::connect(client_config(&rpc, None))
            .await
            .expect("connect");
        assert!(client.over_local_socket().await);
        client
    });
    master.kill();
    let refused = {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(&name.as_bytes()[1..]).unwrap();
        UnixStream::connect_addr(&addr).expect_err("the socket went with its master")
    };
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let again = MOONKV.master_again(&["--rpc-port", &port, "--metrics-port", "0"]);
    let renamed = offered_name(&rpc).expect("a local socket");
    assert_ne!(renamed, name);
    rt.block_on(async {
        let deadline = Instant::now() + LIMIT;
        // The first call after the restart may meet the dead connection; later ones reconnect.
        loop {
            match client.exist_key(exist("nothing")).await {
                Ok(found) => {
                    assert!(!found);
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    assert!(
                        matches!(e.code, ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT),
                        "{e}"
                    );
                }
                Err(e) => panic!("no reconnect to the restarted master: {e}"),
            }
        }
        assert!(client.over_local_socket().await);
        client.close().await;
    });
    assert_eq!(
        metric(
            &again.field("admin"),
            "master_rpc_local_connections_opened_total"
        ),
        1.0
    );
}

#[test]
fn a_master_offers_no_local_socket_when_told_not_to() {
    let master = MOONKV.master(&["--rpc-local-socket", "false"]);
    let rpc = master.field("rpc");
    assert_eq!(offered_name(&rpc), None);
    runtime().block_on(async {
        let client = MasterClient::connect(client_config(&rpc, None))
            .await
            .expect("connect");
        assert!(!client.over_local_socket().await);
        assert!(!client.exist_key(exist("nothing")).await.expect("exist"));
        client.close().await;
    });
    assert_eq!(
        metric(
            &master.field("admin"),
            "master_rpc_local_connections_opened_total"
        ),
        0.0
    );
}

#[test]
fn the_local_socket_asks_for_the_same_hello_secret_and_deadline_as_the_rpc_port() {
    const SECRET: &str = "local-socket-secret-0123456789";
    let master = MOONKV.master(&["--handshake-timeout", "300"]);
    let open_name = offered_name(&master.field("rpc")).expect("a local socket");
    // A request before any hello: refused, and the connection closed.
    let mut raw = connect_local(&open_name);
    let mut request = Vec::new();
    frame::encode_value(
        &mut request,
        FrameKind::Request,
        1,
        moonkv_proto::msg::Op::ExistKey as u16 as i32,
        &exist("k"),
    )
    .unwrap();
    raw.write_all(&request).unwrap();
    let refusal = read_frame(&mut raw);
    assert!(
        matches!(&refusal, Some((FrameKind::Response, code, _)) if *code != 0),
        "{refusal:?}"
    );
    assert!(read_frame(&mut raw).is_none(), "closed after the refusal");
    // A connection that never says hello is closed at the handshake deadline.
    let mut silent = connect_local(&open_name);
    let started = Instant::now();
    let mut byte = [0u8; 1];
    assert_eq!(silent.read(&mut byte).expect("closed, not timed out"), 0);
    assert!(started.elapsed() < LIMIT);
    // The hello works and says which socket it is.
    let mut greeted = connect_local(&open_name);
    let ack = hello(&mut greeted);
    assert_eq!(ack.local_socket.as_deref(), Some(open_name.as_str()));
    drop(master);

    // With a secret, the local socket challenges like the port does.
    let dir = std::env::temp_dir().join(format!("moonkv-local-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, SECRET).unwrap();
    let secured = MOONKV.master(&["--auth-secret-file", path.to_str().unwrap()]);
    let rpc = secured.field("rpc");
    let name = offered_name(&rpc).expect("a local socket");
    let mut raw = connect_local(&name);
    let ack = hello(&mut raw);
    assert!(ack.challenge.is_some(), "a challenge, as over TCP");
    raw.write_all(&request).unwrap();
    let refusal = read_frame(&mut raw);
    assert!(
        matches!(&refusal, Some((FrameKind::Response, code, _)) if *code != 0),
        "{refusal:?}"
    );
    runtime().block_on(async {
        // The right secret: over the local socket.
        let client = MasterClient::connect(client_config(&rpc, Some(SECRET)))
            .await
            .expect("connect with the secret");
        assert!(client.over_local_socket().await);
        assert!(!client.exist_key(exist("nothing")).await.expect("exist"));
        client.close().await;
        // A wrong one: refused, on either path.
        let wrong = MasterClient::connect(client_config(&rpc, Some("not-the-secret-at-all")))
            .await
            .err()
            .expect("refused");
        assert_eq!(wrong.code, ErrorCode::ILLEGAL_CLIENT, "{wrong}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}
