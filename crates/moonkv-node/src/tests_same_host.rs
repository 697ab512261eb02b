//! Same-host copies against the real data-plane server on loopback: the attach check, the
//! copies under bursts, and every refusal keeping the connection in step.

use crate::segment::SegmentMemory;
use crate::server::*;
use moonkv_dataplane::header::{
    AttachRequest, DataOp, DataStatus, LocalPlan, RequestHeader, ResponseHeader, RESPONSE_LEN,
};
use moonkv_dataplane::same_host::monotonic_now_ns;
use moonkv_dataplane::{DataConnection, Piece};
use moonkv_proto::grant::{Grant, READ, WRITE};
use moonkv_proto::{ErrorCode, SegmentId};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);

struct Fixture {
    server: DataServer,
    segment: Arc<SegmentMemory>,
}

async fn fixture(access: Access) -> Fixture {
    let segment = Arc::new(SegmentMemory::allocate(SegmentId::new(5, 6), 1 << 20).unwrap());
    let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
        [(segment.id(), segment.clone())].into(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Fixture {
        server: DataServer::spawn_with_disk(listener, table, None, access).unwrap(),
        segment,
    }
}

impl Fixture {
    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }
}

async fn answer<S: AsyncReadExt + Unpin>(stream: &mut S) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut raw).await.unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

/// Sends an ATTACH naming `pid`, with a probe that really lies in this process.
async fn attach_raw<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    stream: &mut S,
    pid: u32,
) -> DataStatus {
    let probe: Box<[u8; 16]> = Box::new(rand::random());
    let request = AttachRequest {
        pid,
        probe_address: probe.as_ptr() as u64,
        probe: *probe,
    };
    stream.write_all(&request.header(1).encode()).await.unwrap();
    let status = answer(stream).await.status;
    drop(probe);
    status
}

/// Sends a same-host request whose plan lists `ranges` with `deadline_ns`.
async fn local_raw(
    stream: &mut TcpStream,
    op: DataOp,
    id: u64,
    (segment, address, length): (SegmentId, u64, u64),
    deadline_ns: u64,
    ranges: Vec<(u64, u64)>,
) -> ResponseHeader {
    let mut bytes = RequestHeader::new(op, id, segment, address, length)
        .encode()
        .to_vec();
    LocalPlan {
        deadline_ns,
        ranges,
        flags: 0,
    }
    .encode_into(&mut bytes);
    stream.write_all(&bytes).await.unwrap();
    answer(stream).await
}

fn soon() -> u64 {
    monotonic_now_ns() + 5_000_000_000
}

#[tokio::test]
async fn attached_bursts_copy_straight_between_the_segment_and_the_callers_buffers() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(Access::default()).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        assert!(
            conn.attach(LIMIT).await.unwrap(),
            "a loopback caller is attached"
        );
        let whole: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (first, second) = whole.split_at(100_000);
        let single = vec![9u8; 5000];
        let pieces = vec![
            Piece::WriteV {
                segment: id,
                address: base,
                parts: vec![first, second],
                grant: &[],
            },
            // Outside the segment: refused, the rest of the burst goes on.
            Piece::Write {
                segment: id,
                address: base + (1 << 20) - 10,
                data: &single,
                grant: &[],
            },
            Piece::Write {
                segment: id,
                address: base + 400_000,
                data: &single,
                grant: &[],
            },
        ];
        let results = conn.burst(pieces, LIMIT).await.into_results(3);
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert_eq!(
            results[1].as_ref().unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        let (mut a, mut b, mut c) = (vec![0u8; 7], vec![0u8; 299_993], vec![0u8; 5000]);
        let pieces = vec![
            Piece::ReadV {
                segment: id,
                address: base,
                bufs: vec![&mut a, &mut b],
                grant: &[],
            },
            Piece::Read {
                segment: id,
                address: base + 400_000,
                buf: &mut c,
                grant: &[],
            },
        ];
        let results = conn.burst(pieces, LIMIT).await.into_results(2);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!([a, b].concat(), whole);
        assert_eq!(c, single);
        // Four of the five requests were served as same-host copies.
        assert_eq!(f.server.stats().same_host_requests, 4);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_node_with_same_host_copies_off_declines_and_the_socket_carries_the_bytes() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(Access {
            refuse_same_host: true,
            ..Access::default()
        })
        .await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        assert!(!conn.attach(LIMIT).await.unwrap());
        let data = vec![3u8; 10_000];
        let pieces = vec![Piece::Write {
            segment: id,
            address: base,
            data: &data,
            grant: &[],
        }];
        assert!(conn.burst(pieces, LIMIT).await.into_results(1)[0].is_ok());
        let mut back = vec![0u8; 10_000];
        conn.read(id, base, &mut back, &[]).await.unwrap();
        assert_eq!(back, data);
        assert_eq!(f.server.stats().same_host_requests, 0);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn same_host_requests_are_refused_unless_attached_in_time_and_well_formed() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(Access::default()).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        f.segment.copy_in(base, &[0xAB; 64]).await.unwrap();
        let mut stream = TcpStream::connect(f.addr()).await.unwrap();
        let mut sink = vec![0u8; 64];
        let at = sink.as_mut_ptr() as u64;

        // Not attached yet: refused, nothing copied, the connection in step.
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            2,
            (id, base, 64),
            soon(),
            vec![(at, 64)],
        )
        .await;
        assert_eq!((a.request_id, a.status), (2, DataStatus::LocalRefused));

        // Naming another process is declined: it does not hold this connection.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(
            attach_raw(&mut stream, child.id()).await,
            DataStatus::LocalRefused
        );
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            3,
            (id, base, 64),
            soon(),
            vec![(at, 64)],
        )
        .await;
        assert_eq!(a.status, DataStatus::LocalRefused);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(sink.iter().all(|b| *b == 0), "nothing was copied");

        // One ATTACH per connection: even a truthful second one is refused.
        assert_eq!(
            attach_raw(&mut stream, std::process::id()).await,
            DataStatus::LocalRefused
        );
        let mut stream = TcpStream::connect(f.addr()).await.unwrap();
        assert_eq!(
            attach_raw(&mut stream, std::process::id()).await,
            DataStatus::Ok
        );
        assert_eq!(
            attach_raw(&mut stream, std::process::id()).await,
            DataStatus::LocalRefused,
            "a second ATTACH on an attached connection is refused too"
        );
        let refused = f.server.metrics().encode();
        assert!(
            refused.contains("node_refused_attaches_total 3"),
            "three refused ATTACHes counted"
        );
        // A deadline already passed: refused before any byte moves.
        let past = monotonic_now_ns() - 1;
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            4,
            (id, base, 64),
            past,
            vec![(at, 64)],
        )
        .await;
        assert_eq!(a.status, DataStatus::LocalRefused);
        assert!(
            sink.iter().all(|b| *b == 0),
            "an expired read copied nothing"
        );
        // Ranges that do not add up to the length, and a range outside the segment.
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            5,
            (id, base, 64),
            soon(),
            vec![(at, 63)],
        )
        .await;
        assert_eq!(a.status, DataStatus::OutOfRange);
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            6,
            (id, base + (1 << 20), 64),
            soon(),
            vec![(at, 64)],
        )
        .await;
        assert_eq!(a.status, DataStatus::OutOfRange);
        // Caller memory that is not mapped: refused, the segment untouched.
        let a = local_raw(
            &mut stream,
            DataOp::WriteLocal,
            7,
            (id, base, 64),
            soon(),
            vec![(16, 64)],
        )
        .await;
        assert_eq!(a.status, DataStatus::LocalRefused);
        // Then a good one, on the same connection.
        let a = local_raw(
            &mut stream,
            DataOp::ReadLocal,
            8,
            (id, base, 64),
            soon(),
            vec![(at, 32), (at + 32, 32)],
        )
        .await;
        assert_eq!((a.request_id, a.status, a.length), (8, DataStatus::Ok, 0));
        assert!(sink.iter().all(|b| *b == 0xAB));

        // A plan listing more ranges than allowed cannot be skipped: BAD_HEADER, closed.
        let mut bytes = RequestHeader::new(DataOp::ReadLocal, 9, id, base, 1)
            .encode()
            .to_vec();
        bytes.extend_from_slice(&soon().to_be_bytes());
        bytes.extend_from_slice(&5000u32.to_be_bytes());
        bytes.extend_from_slice(&0u32.to_be_bytes());
        stream.write_all(&bytes).await.unwrap();
        assert_eq!(answer(&mut stream).await.status, DataStatus::BadHeader);
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the node closed the connection");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn same_host_requests_need_the_same_grants_as_socket_ones() {
    tokio::time::timeout(LIMIT, async {
        let key =
            moonkv_proto::auth::Secret::new(b"a-grant-key-of-32-bytes-for-test".to_vec()).unwrap();
        let f = fixture(Access {
            grant_key: Some(key.clone()),
            ..Access::default()
        })
        .await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let later = moonkv_proto::grant::unix_now_ms() + 60_000;
        let ro = Grant::new(READ, later, base, 4096, "alice").seal(&key, id);
        let rw = Grant::new(READ | WRITE, later, base, 4096, "alice").seal(&key, id);
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        assert!(conn.attach(LIMIT).await.unwrap());
        let data = vec![5u8; 4096];
        let write = |grant| {
            vec![Piece::Write {
                segment: id,
                address: base,
                data: &data,
                grant,
            }]
        };
        let refused = conn.burst(write(&ro), LIMIT).await.into_results(1);
        assert_eq!(
            refused[0].as_ref().unwrap_err().code,
            ErrorCode::ILLEGAL_CLIENT
        );
        let mut back = vec![1u8; 4096];
        f.segment.copy_out(base, &mut back).await.unwrap();
        assert!(
            back.iter().all(|b| *b == 0),
            "the refused write changed nothing"
        );
        assert!(conn.burst(write(&rw), LIMIT).await.into_results(1)[0].is_ok());
        // Beyond the granted range: refused; inside it: copied.
        let mut out = vec![0u8; 4096];
        let beyond = vec![Piece::Read {
            segment: id,
            address: base + 8,
            buf: &mut out,
            grant: &ro,
        }];
        let results = conn.burst(beyond, LIMIT).await.into_results(1);
        assert_eq!(
            results[0].as_ref().unwrap_err().code,
            ErrorCode::ILLEGAL_CLIENT
        );
        let inside = vec![Piece::Read {
            segment: id,
            address: base,
            buf: &mut out,
            grant: &ro,
        }];
        assert!(conn.burst(inside, LIMIT).await.into_results(1)[0].is_ok());
        assert_eq!(out, data);
    })
    .await
    .unwrap();
}

#[test]
fn a_process_of_another_user_is_not_attached() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: starting a process as another user needs root");
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .uid(65534)
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let refused = crate::same_host::same_user(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    match refused {
        Err(crate::same_host::AttachError::OtherUser {
            uid: 65534,
            node: 0,
            ..
        }) => {}
        other => panic!("a process of uid 65534 was not refused: {other:?}"),
    }
    let me = rustix::process::Pid::from_raw(std::process::id() as i32).unwrap();
    assert!(crate::same_host::same_user(me).is_ok());
}

#[tokio::test]
async fn a_connection_that_does_not_finish_its_handshake_is_closed_at_the_deadline() {
    let mut access = Access {
        secret: Some(
            moonkv_proto::auth::Secret::new(b"a-data-plane-secret-0123".to_vec()).unwrap(),
        ),
        ..Access::default()
    };
    access.deadlines.handshake = std::time::Duration::from_millis(300);
    let f = fixture(access).await;
    let opened = std::time::Instant::now();
    // One silent, one that sends the hello and never the proof, one dripping the hello.
    let mut silent = TcpStream::connect(f.addr()).await.unwrap();
    let mut half = TcpStream::connect(f.addr()).await.unwrap();
    let hello = moonkv_dataplane::handshake::hello(&[1u8; moonkv_proto::auth::NONCE_LEN]);
    half.write_all(&hello).await.unwrap();
    let mut drip = TcpStream::connect(f.addr()).await.unwrap();
    drip.write_all(&hello[..4]).await.unwrap();
    for stream in [&mut silent, &mut half, &mut drip] {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "closed within the test's limit");
    }
    let closed_after = opened.elapsed();
    assert!(
        closed_after >= std::time::Duration::from_millis(250)
            && closed_after < std::time::Duration::from_secs(5),
        "closed at the 300 ms deadline, not before nor long after: {closed_after:?}"
    );
    let text = f.server.metrics().encode();
    assert!(text.contains("node_handshake_timeouts_total 3"), "{text}");
}

/// The name of the local socket the node at `addr` gives in its STATS answer.
async fn local_socket_of(addr: &str) -> Option<String> {
    let mut conn = DataConnection::connect(addr, LIMIT, None).await.unwrap();
    conn.stats().await.unwrap().local_socket
}

/// A raw connection to the local socket `name` (`@` and an abstract name).
async fn local_raw_stream(name: &str) -> tokio::net::UnixStream {
    let abstract_name = name.strip_prefix('@').unwrap();
    tokio::net::UnixStream::connect(format!("\0{abstract_name}"))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_local_socket_attaches_the_process_the_kernel_names_and_serves_same_host_copies() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(Access::default()).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let name = local_socket_of(&f.addr()).await.expect("a local socket");
        assert!(name.starts_with("@moonkv-node-"), "{name}");
        assert_eq!(name.len(), "@moonkv-node-".len() + 32, "{name}");
        assert!(moonkv_dataplane::stream::is_local_name(&name), "{name}");
        let mut conn = DataConnection::connect_local(&f.addr(), &name, LIMIT, None)
            .await
            .unwrap();
        assert!(conn.is_local());
        assert!(conn.attach(LIMIT).await.unwrap(), "the caller is attached");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let pieces = vec![Piece::Write {
            segment: id,
            address: base,
            data: &data,
            grant: &[],
        }];
        assert!(conn.burst(pieces, LIMIT).await.into_results(1)[0].is_ok());
        let mut back = vec![0u8; data.len()];
        let pieces = vec![Piece::Read {
            segment: id,
            address: base,
            buf: &mut back,
            grant: &[],
        }];
        assert!(conn.burst(pieces, LIMIT).await.into_results(1)[0].is_ok());
        assert_eq!(back, data);
        assert_eq!(f.server.stats().same_host_requests, 2);

        // A local connection that is not attached (as where the kernel refuses the node this
        // process's memory) carries the bytes over the socket itself, long payloads too.
        let mut plain = DataConnection::connect_local(&f.addr(), &name, LIMIT, None)
            .await
            .unwrap();
        let long: Vec<u8> = (0..900_000u32).map(|i| (i % 241) as u8).collect();
        plain.write(id, base + 4096, &long, &[]).await.unwrap();
        let mut back_long = vec![0u8; long.len()];
        plain
            .read(id, base + 4096, &mut back_long, &[])
            .await
            .unwrap();
        assert_eq!(back_long, long);
        assert_eq!(
            f.server.stats().same_host_requests,
            2,
            "not as same-host copies"
        );
        drop(plain);

        // The process id an ATTACH names is not what the node goes by over the local socket:
        // naming pid 1 still attaches this process, whose memory holds the probe...
        let mut raw = local_raw_stream(&name).await;
        assert_eq!(attach_raw(&mut raw, 1).await, DataStatus::Ok);
        // ...and a probe this process does not hold is refused, the connection kept in step.
        let mut raw = local_raw_stream(&name).await;
        let request = AttachRequest {
            pid: std::process::id(),
            probe_address: 4096,
            probe: [7; 16],
        };
        raw.write_all(&request.header(1).encode()).await.unwrap();
        assert_eq!(answer(&mut raw).await.status, DataStatus::LocalRefused);
        let stats = RequestHeader::new(DataOp::Stats, 2, SegmentId::new(0, 0), 0, 0);
        raw.write_all(&stats.encode()).await.unwrap();
        assert_eq!(answer(&mut raw).await.status, DataStatus::Ok);

        // The socket goes away with the node.
        drop(raw);
        drop(conn);
        f.server.stop().await;
        let gone = moonkv_dataplane::stream::connect_local(&name).await;
        assert_eq!(
            gone.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_node_offers_no_local_socket_with_same_host_copies_off_and_keeps_its_secret_on_it() {
    tokio::time::timeout(LIMIT, async {
        let off = fixture(Access {
            refuse_same_host: true,
            ..Access::default()
        })
        .await;
        assert_eq!(local_socket_of(&off.addr()).await, None);
        // Without the local socket, same-host copies still attach over TCP.
        let tcp_only = fixture(Access {
            no_local_socket: true,
            ..Access::default()
        })
        .await;
        assert_eq!(local_socket_of(&tcp_only.addr()).await, None);
        let mut conn = DataConnection::connect(&tcp_only.addr(), LIMIT, None)
            .await
            .unwrap();
        assert!(conn.attach(LIMIT).await.unwrap());
        assert!(
            moonkv_dataplane::stream::connect_local("not-a-name")
                .await
                .is_err(),
            "a name without `@` is refused"
        );

        let secret = moonkv_proto::auth::Secret::new(b"a-data-plane-secret-0123".to_vec()).unwrap();
        let f = fixture(Access {
            secret: Some(secret.clone()),
            ..Access::default()
        })
        .await;
        let mut tcp = DataConnection::connect(&f.addr(), LIMIT, Some(&secret))
            .await
            .unwrap();
        let name = tcp.stats().await.unwrap().local_socket.unwrap();
        // Without the handshake, a request on the local socket is refused as over TCP.
        let mut raw = local_raw_stream(&name).await;
        let stats = RequestHeader::new(DataOp::Stats, 9, SegmentId::new(0, 0), 0, 0);
        raw.write_all(&stats.encode()).await.unwrap();
        let refused = answer(&mut raw).await;
        assert_eq!(refused.status, DataStatus::Unauthenticated);
        // With it, the local connection attaches.
        let mut conn = DataConnection::connect_local(&f.addr(), &name, LIMIT, Some(&secret))
            .await
            .unwrap();
        assert!(conn.attach(LIMIT).await.unwrap());
        assert_eq!(conn.stats().await.unwrap().local_socket, Some(name));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pool_goes_through_the_local_socket_and_learns_a_restarted_nodes_new_one() {
    tokio::time::timeout(LIMIT, async {
        let first = fixture(Access::default()).await;
        let addr = first.addr();
        let pool = moonkv_dataplane::ConnectionPool::new(2, LIMIT, None).with_same_host(true);
        let (conn, reused) = pool.checkout(&addr).await.unwrap();
        assert!(!reused && conn.is_local(), "the first connection is local");
        pool.checkin(conn);
        let (conn, reused) = pool.checkout(&addr).await.unwrap();
        assert!(reused && conn.is_local());
        pool.checkin(conn);
        let stats = pool.stats();
        assert_eq!((stats.opened, stats.local, stats.attached), (1, 1, 1));
        assert!(pool.same_host(&addr));
        // STATS over TCP, then the local connection.
        assert_eq!(first.server.stats().connections_opened, 2);
        assert_eq!(first.server.stats().local_connections_opened, 1);
        let metrics = first.server.metrics().encode();
        assert!(
            metrics.contains("node_data_local_connections_opened_total 1"),
            "{metrics}"
        );
        let old_name = local_socket_of(&addr).await.unwrap();

        // The node restarts on the same port with a new local socket: the old name is
        // refused, the pool asks again over TCP and goes local.
        pool.forget(&addr);
        first.server.stop().await;
        let segment = Arc::new(SegmentMemory::allocate(SegmentId::new(5, 6), 1 << 20).unwrap());
        let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
            [(segment.id(), segment.clone())].into(),
        ));
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        let second = DataServer::spawn_with_disk(listener, table, None, Access::default()).unwrap();
        let (conn, reused) = pool.checkout(&addr).await.unwrap();
        assert!(!reused && conn.is_local());
        pool.checkin(conn);
        assert_eq!((pool.stats().opened, pool.stats().local), (2, 2));
        let new_name = local_socket_of(&addr).await.unwrap();
        assert_ne!(new_name, old_name);

        // A node that offers none is reached over TCP, and attached there.
        let off = fixture(Access {
            refuse_same_host: true,
            ..Access::default()
        })
        .await;
        let (conn, _) = pool.checkout(&off.addr()).await.unwrap();
        assert!(!conn.is_local());
        pool.checkin(conn);
        assert!(!pool.same_host(&off.addr()));
        second.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_local_socket_keeps_the_connection_cap_and_the_opening_deadline() {
    let mut access = Access {
        max_connections: Some(2),
        ..Access::default()
    };
    access.deadlines.handshake = Duration::from_millis(300);
    let f = fixture(access).await;
    let name = local_socket_of(&f.addr()).await.unwrap();
    let opened = std::time::Instant::now();
    let mut held = vec![local_raw_stream(&name).await, local_raw_stream(&name).await];
    // The node counts a connection once it accepted it; a third is closed at accept, which a
    // read shows as the end of the stream.
    let mut refused = false;
    for _ in 0..50 {
        let mut extra = local_raw_stream(&name).await;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(100), extra.read(&mut byte)).await;
        if matches!(read, Ok(Ok(0))) {
            refused = true;
            break;
        }
    }
    assert!(refused, "a third connection was kept open");
    // The two that never sent a byte are closed at the opening deadline.
    for stream in &mut held {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "closed within the test's limit");
    }
    let closed_after = opened.elapsed();
    assert!(
        closed_after >= Duration::from_millis(250) && closed_after < Duration::from_secs(5),
        "closed at the 300 ms deadline: {closed_after:?}"
    );
    let text = f.server.metrics().encode();
    assert!(text.contains("node_handshake_timeouts_total 2"), "{text}");
    assert!(text.contains("node_refused_connections_total 1"), "{text}");
    // Once they are gone the node takes local connections again.
    let mut conn = DataConnection::connect_local(&f.addr(), &name, LIMIT, None)
        .await
        .unwrap();
    assert!(conn.attach(LIMIT).await.unwrap());
}
