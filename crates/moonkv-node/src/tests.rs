//! Data-plane server against real sockets on loopback, without a master.

use crate::disk::{self, DiskStore};
use crate::node::*;
use crate::segment::SegmentMemory;
use crate::server::MAX_DRAIN_BYTES;
use crate::server::*;
use moonkv_dataplane::header::{DataOp, DataStatus, RequestHeader, ResponseHeader, RESPONSE_LEN};
use moonkv_dataplane::DataConnection;
use moonkv_proto::{ErrorCode, Result, SegmentId};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);

struct Fixture {
    server: DataServer,
    segment: Arc<SegmentMemory>,
}

async fn fixture(size: u64) -> Fixture {
    let segment = Arc::new(SegmentMemory::allocate(SegmentId::new(3, 4), size).unwrap());
    let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
        [(segment.id(), segment.clone())].into(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Fixture {
        server: DataServer::spawn(listener, table).unwrap(),
        segment,
    }
}

impl Fixture {
    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }

    async fn raw(&self) -> TcpStream {
        TcpStream::connect(self.addr()).await.unwrap()
    }
}

async fn answer(stream: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut raw).await.unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

async fn send(stream: &mut TcpStream, op: DataOp, id: u64, seg: SegmentId, addr: u64, len: u64) {
    stream
        .write_all(&RequestHeader::new(op, id, seg, addr, len).encode())
        .await
        .unwrap();
}

#[tokio::test]
async fn writes_then_reads_round_trip_byte_exact() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(1 << 20).await;
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let at = f.segment.base() + 4096;
        conn.write(f.segment.id(), at, &data, &[]).await.unwrap();
        let mut back = vec![0u8; data.len()];
        conn.read(f.segment.id(), at, &mut back, &[]).await.unwrap();
        assert_eq!(back, data);
        let mut small = [0u8; 5];
        conn.read(f.segment.id(), at + 10, &mut small, &[])
            .await
            .unwrap();
        assert_eq!(small, data[10..15]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn refused_requests_get_a_status_and_the_connection_keeps_serving() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(64 << 10).await;
        let (id, base, size) = (f.segment.id(), f.segment.base(), f.segment.size());
        let unknown = SegmentId::new(99, 99);
        let mut s = f.raw().await;
        let cases = [
            (DataOp::Read, unknown, base, 8, DataStatus::UnknownSegment),
            (DataOp::Read, id, base + size - 4, 8, DataStatus::OutOfRange),
            (DataOp::Read, id, base - 1, 1, DataStatus::OutOfRange),
            (
                DataOp::Read,
                id,
                base,
                u64::MAX,
                DataStatus::AddressOverflow,
            ),
            (
                DataOp::Read,
                id,
                base + 8,
                u64::MAX / 2,
                DataStatus::OutOfRange,
            ),
        ];
        for (i, (op, seg, addr, len, expected)) in cases.into_iter().enumerate() {
            send(&mut s, op, i as u64, seg, addr, len).await;
            let r = answer(&mut s).await;
            assert_eq!(
                (r.status, r.request_id, r.length),
                (expected, i as u64, 0),
                "case {i}"
            );
        }
        // Refused writes: the payload is drained, the stream stays in step.
        for (seg, addr, expected) in [
            (unknown, base, DataStatus::UnknownSegment),
            (id, base + size - 2, DataStatus::OutOfRange),
        ] {
            send(&mut s, DataOp::Write, 50, seg, addr, 4).await;
            s.write_all(b"wxyz").await.unwrap();
            assert_eq!(answer(&mut s).await.status, expected);
        }
        // An unknown op.
        let mut raw = RequestHeader::new(DataOp::Read, 60, id, base, 1).encode();
        raw[5] = 200;
        s.write_all(&raw).await.unwrap();
        assert_eq!(answer(&mut s).await.status, DataStatus::BadOp);
        // Still serving on the same connection; nothing was written by the refused writes.
        send(&mut s, DataOp::Read, 70, id, base + size - 4, 4).await;
        let r = answer(&mut s).await;
        assert_eq!((r.status, r.length), (DataStatus::Ok, 4));
        let mut tail = [1u8; 4];
        s.read_exact(&mut tail).await.unwrap();
        assert_eq!(tail, [0; 4]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_huge_refused_write_is_answered_then_closed_without_allocating() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(64 << 10).await;
        let mut s = f.raw().await;
        send(
            &mut s,
            DataOp::Write,
            1,
            f.segment.id(),
            f.segment.base(),
            MAX_DRAIN_BYTES + 1,
        )
        .await;
        assert_eq!(answer(&mut s).await.status, DataStatus::TooLarge);
        let mut rest = Vec::new();
        assert_eq!(s.read_to_end(&mut rest).await.unwrap_or(0), 0);
        // The node keeps serving other connections.
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        conn.write(f.segment.id(), f.segment.base(), b"ok", &[])
            .await
            .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn truncated_and_garbled_headers_close_only_their_connection() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(64 << 10).await;
        let mut s = f.raw().await;
        s.write_all(
            &RequestHeader::new(DataOp::Read, 1, f.segment.id(), f.segment.base(), 1).encode()
                [..20],
        )
        .await
        .unwrap();
        drop(s);
        let mut s = f.raw().await;
        s.write_all(&[0xAB; 48]).await.unwrap();
        assert_eq!(answer(&mut s).await.status, DataStatus::BadHeader);
        let mut rest = Vec::new();
        assert_eq!(s.read_to_end(&mut rest).await.unwrap_or(0), 0);
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let mut one = [9u8; 1];
        conn.read(f.segment.id(), f.segment.base(), &mut one, &[])
            .await
            .unwrap();
        assert_eq!(one, [0]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_client_maps_refusals_to_error_codes_and_stays_usable() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(64 << 10).await;
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let mut buf = [0u8; 8];
        let e = conn
            .read(SegmentId::new(1, 1), f.segment.base(), &mut buf, &[])
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::SEGMENT_NOT_FOUND);
        let e = conn
            .write(
                f.segment.id(),
                f.segment.base() + f.segment.size(),
                b"x",
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        conn.write(f.segment.id(), f.segment.base(), b"fine", &[])
            .await
            .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn parallel_connections_on_disjoint_ranges() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(4 << 20).await;
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..8u64 {
            let (addr, id, base) = (f.addr(), f.segment.id(), f.segment.base());
            tasks.spawn(async move {
                let mut conn = DataConnection::connect(&addr, LIMIT, None).await.unwrap();
                let data = vec![lane as u8 + 1; 256 << 10];
                for round in 0..2u64 {
                    let at = base + lane * (512 << 10) + round * (256 << 10);
                    conn.write(id, at, &data, &[]).await.unwrap();
                    let mut back = vec![0u8; data.len()];
                    conn.read(id, at, &mut back, &[]).await.unwrap();
                    assert_eq!(back, data);
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn start_refuses_bad_configs_before_touching_the_network() {
    let mut config = NodeConfig::new("127.0.0.1:1", 0);
    assert_eq!(
        Node::start(config.clone()).await.err().unwrap().code,
        ErrorCode::INVALID_PARAMS
    );
    config.segment_size = 4096;
    config.segment_count = 0;
    assert_eq!(
        Node::start(config).await.err().unwrap().code,
        ErrorCode::INVALID_PARAMS
    );
}

/// A data server with a disk of `capacity` bytes in a fresh directory.
async fn disk_fixture(capacity: u64) -> (DataServer, Arc<DiskStore>, disk::tests::TempDir) {
    let dir = disk::tests::TempDir::new("dataplane");
    let (store, _) = DiskStore::open(&dir.0, capacity).unwrap();
    let store = Arc::new(store);
    let table: SegmentTable = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server =
        DataServer::spawn_with_disk(listener, table, Some(store.clone()), Default::default())
            .unwrap();
    (server, store, dir)
}

#[tokio::test]
async fn disk_files_round_trip_and_refusals_keep_the_connection_usable() {
    use moonkv_dataplane::FileMeta;
    tokio::time::timeout(LIMIT, async {
        let (server, store, _dir) = disk_fixture(100_000).await;
        let addr = server.local_addr().to_string();
        let mut conn = DataConnection::connect(&addr, LIMIT, None).await.unwrap();
        let meta = FileMeta {
            tenant: "t".into(),
            key: "k".into(),
        };
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 13) as u8).collect();
        conn.write_file(store.id(), 11, &meta, &[&data], &[])
            .await
            .unwrap();
        let mut back = vec![0u8; data.len()];
        conn.read_file(store.id(), 11, &mut back, &[])
            .await
            .unwrap();
        assert_eq!(back, data);

        let code = |r: Result<()>| r.unwrap_err().code;
        let mut wrong = vec![0u8; data.len() - 1];
        assert_eq!(
            code(conn.read_file(store.id(), 11, &mut wrong, &[]).await),
            ErrorCode::CHECKSUM_MISMATCH,
            "another size is refused, nothing sent"
        );
        assert_eq!(
            code(conn.read_file(store.id(), 12, &mut back, &[]).await),
            ErrorCode::FILE_NOT_FOUND
        );
        assert_eq!(
            code(
                conn.read_file(SegmentId::new(9, 9), 11, &mut back, &[])
                    .await
            ),
            ErrorCode::SEGMENT_NOT_FOUND
        );
        assert_eq!(
            code(conn.write_file(store.id(), 13, &meta, &[&data], &[]).await),
            ErrorCode::FILE_WRITE_FAIL,
            "over the disk budget"
        );
        assert_eq!(
            code(
                conn.write_file(SegmentId::new(9, 9), 13, &meta, &[b"x"], &[])
                    .await
            ),
            ErrorCode::SEGMENT_NOT_FOUND
        );
        assert_eq!(
            code(conn.write_file(store.id(), 0, &meta, &[b"x"], &[]).await),
            ErrorCode::FILE_WRITE_FAIL,
            "file id 0 is never valid"
        );
        // Still in step after every refusal.
        conn.read_file(store.id(), 11, &mut back, &[])
            .await
            .unwrap();
        assert_eq!(back, data);
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn stats_count_connections_and_requests() {
    tokio::time::timeout(LIMIT, async {
        let f = fixture(1 << 16).await;
        let base = f.segment.base();
        let mut first = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        first
            .write(f.segment.id(), base, b"abc", &[])
            .await
            .unwrap();
        let mut buf = [0u8; 3];
        first
            .read(f.segment.id(), base, &mut buf, &[])
            .await
            .unwrap();
        let mut second = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let stats = second.stats().await.unwrap();
        assert_eq!(stats.connections_opened, 2);
        assert_eq!(stats.connections_open, 2);
        // write, read and this STATS request
        assert_eq!(stats.requests, 3);
        let fourth = second.stats().await.unwrap();
        assert_eq!(fourth.requests, 4);
        assert_eq!(f.server.stats(), fourth);
        drop(first);
        // The first connection's task ends once the node sees it closed.
        let mut open = 2;
        for _ in 0..500 {
            open = second.stats().await.unwrap().connections_open;
            if open == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(open, 1);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_with_a_refusal_in_the_middle() {
    use moonkv_dataplane::Piece;
    tokio::time::timeout(LIMIT, async {
        let f = fixture(1 << 16).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let data: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i + 1; 1000]).collect();
        let mut pieces: Vec<Piece<'_>> = data
            .iter()
            .enumerate()
            .map(|(i, d)| Piece::Write {
                segment: id,
                address: base + 1000 * i as u64,
                data: d,
                grant: &[],
            })
            .collect();
        // Outside the segment: refused, the connection stays in step.
        pieces.insert(
            4,
            Piece::Write {
                segment: id,
                address: base + (1 << 16) - 10,
                data: &data[0],
                grant: &[],
            },
        );
        let burst = conn.burst(pieces, LIMIT).await;
        assert!(burst.broken.is_none(), "{:?}", burst.broken);
        let codes: Vec<Option<ErrorCode>> = burst
            .results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.code))
            .collect();
        let mut expected = vec![None; 9];
        expected[4] = Some(ErrorCode::INVALID_PARAMS);
        assert_eq!(codes, expected);
        let mut back: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 1000]).collect();
        let reads: Vec<Piece<'_>> = back
            .iter_mut()
            .enumerate()
            .map(|(i, b)| Piece::Read {
                segment: id,
                address: base + 1000 * i as u64,
                buf: b,
                grant: &[],
            })
            .collect();
        let burst = conn.burst(reads, LIMIT).await;
        assert!(burst.into_results(8).iter().all(|r| r.is_ok()));
        assert_eq!(back, data);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn vectored_requests_gather_writes_and_scatter_reads_beside_single_ones() {
    use moonkv_dataplane::Piece;
    tokio::time::timeout(LIMIT, async {
        let f = fixture(1 << 20).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        // Parts of unequal sizes, large and small, so answers come both through the reader's
        // buffer and straight into the sinks.
        let sizes = [100_000usize, 7, 4096, 200_000, 1];
        let parts: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + i * 31) as u8).collect())
            .collect();
        let total: usize = sizes.iter().sum();
        let small = vec![0x5au8; 300];
        let writes = vec![
            Piece::Write {
                segment: id,
                address: base + total as u64,
                data: &small,
                grant: &[],
            },
            Piece::WriteV {
                segment: id,
                address: base,
                parts: parts.iter().map(Vec::as_slice).collect(),
                grant: &[],
            },
        ];
        let burst = conn.burst(writes, LIMIT).await;
        assert!(burst.into_results(2).iter().all(|r| r.is_ok()));
        let joined: Vec<u8> = parts.concat();
        assert_eq!(
            &f.segment.read_view(base, total as u64).await.unwrap()[..],
            &joined[..]
        );

        // Read back cut differently from how it was written, around a small single read.
        let cuts = [1usize, 150_000, 3, total - 150_004];
        let mut back: Vec<Vec<u8>> = cuts.iter().map(|&n| vec![0u8; n]).collect();
        let mut small_back = vec![0u8; 300];
        let mut tail = vec![0u8; 1];
        let reads = vec![
            Piece::Read {
                segment: id,
                address: base + total as u64,
                buf: &mut small_back,
                grant: &[],
            },
            Piece::ReadV {
                segment: id,
                address: base,
                bufs: back.iter_mut().map(Vec::as_mut_slice).collect(),
                grant: &[],
            },
            Piece::ReadV {
                segment: id,
                address: base + total as u64 - 1,
                bufs: vec![&mut tail],
                grant: &[],
            },
        ];
        let burst = conn.burst(reads, LIMIT).await;
        assert!(burst.into_results(3).iter().all(|r| r.is_ok()));
        assert_eq!(small_back, small);
        assert_eq!(back.concat(), joined);
        assert_eq!(tail, [joined[total - 1]]);

        // A vectored read past the segment's end is refused as a whole and the connection
        // stays in step for the next request.
        let mut a = vec![0u8; 1000];
        let mut b = vec![0u8; 1000];
        let mut after = vec![0u8; 7];
        let reads = vec![
            Piece::ReadV {
                segment: id,
                address: base + (1 << 20) - 1500,
                bufs: vec![&mut a, &mut b],
                grant: &[],
            },
            Piece::Read {
                segment: id,
                address: base + 100_000,
                buf: &mut after,
                grant: &[],
            },
        ];
        let burst = conn.burst(reads, LIMIT).await;
        assert!(burst.broken.is_none(), "{:?}", burst.broken);
        assert_eq!(
            burst.results[0].as_ref().map_err(|e| e.code),
            Err(ErrorCode::INVALID_PARAMS)
        );
        assert!(burst.results[1].is_ok());
        assert_eq!(after, parts[1]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_node_with_an_unusable_secret_refuses_to_start_rather_than_serve_openly() {
    let short = moonkv_proto::auth::Secret::new(b"short".to_vec());
    let config = NodeConfig::new("127.0.0.1:1", 1 << 20).with_secrets(short.map(Some), Ok(None));
    assert!(config.auth_secret.is_none());
    let err = Node::start(config)
        .await
        .err()
        .expect("the node must refuse");
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("at least"), "{err}");
    let fine = NodeConfig::new("127.0.0.1:1", 1 << 20).with_secrets(Ok(None), Ok(None));
    assert!(fine.secret_error.is_none());
}
