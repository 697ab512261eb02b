//! Pipelined bursts against a real node data-plane server (in this process, on loopback) that
//! requires the handshake and a grant on every request: a request whose grant is refused in the
//! middle of a burst fails alone, its bytes never land, and the connection stays in step.
//!
//! Each range is its own replica (grants name it), so the node's claims see one first write per
//! replica, as with grants from a master.

use moonkv_dataplane::{DataConnection, Piece};
use moonkv_node::segment::SegmentMemory;
use moonkv_node::server::{Access, DataServer, SegmentTable};
use moonkv_proto::auth::Secret;
use moonkv_proto::grant::{unix_now_ms, Grant, READ, WRITE};
use moonkv_proto::{ErrorCode, SegmentId};
use moonkv_testkit::payload::pattern;
use std::sync::Arc;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);
const STEP: Duration = Duration::from_secs(10);

fn secret() -> Secret {
    Secret::new(b"burst-test-shared-secret-bytes".to_vec()).unwrap()
}

struct Granting {
    server: DataServer,
    segment: Arc<SegmentMemory>,
}

impl Granting {
    async fn start() -> Granting {
        let segment = Arc::new(SegmentMemory::allocate(SegmentId::new(7, 9), 4 << 20).unwrap());
        let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
            [(segment.id(), segment.clone())].into(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let access = Access {
            secret: Some(secret()),
            grant_key: Some(secret()),
            tls: None,
            claims: Default::default(),
            deadlines: Default::default(),
            max_connections: None,
            refuse_same_host: false,
            same_host_other_users: false,
            no_local_socket: false,
            master_addr: None,
        };
        let server = DataServer::spawn_with_disk(listener, table, None, access).unwrap();
        Granting { server, segment }
    }

    /// A grant of `rights` over `[base + offset, base + offset + len)` for `replica`.
    fn grant(&self, rights: u8, offset: u64, len: u64, replica: u64) -> Vec<u8> {
        let now = unix_now_ms();
        Grant::new(
            rights,
            now + 60_000,
            self.segment.base() + offset,
            len,
            "alice",
        )
        .for_replica(replica, now)
        .seal(&secret(), self.segment.id())
    }

    /// The segment's own bytes at `[base + offset, base + offset + len)`.
    async fn stored(&self, offset: u64, len: usize) -> Vec<u8> {
        let view = self
            .segment
            .read_view(self.segment.base() + offset, len as u64)
            .await
            .unwrap();
        view.to_vec()
    }
}

/// Offsets and lengths of the ranges a burst touches: small and large, so the refused one
/// sits between requests that share the socket buffer and ones that bypass it.
const RANGES: [(u64, usize); 5] = [
    (0, 4096),
    (4096, 300_000),
    (400_000, 65_536),
    (500_000, 1),
    (600_000, 1 << 20),
];
/// The range whose write is refused.
const REFUSED: usize = 2;

/// The grant of range `i` (replica `i + 1`) with `rights`.
fn range_grant(node: &Granting, i: usize, rights: u8) -> Vec<u8> {
    let (offset, len) = RANGES[i];
    node.grant(rights, offset, len as u64, i as u64 + 1)
}

fn expect_refused(result: &moonkv_proto::Result<()>, what: &str) {
    let e = result.as_ref().expect_err(what);
    assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{what}: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_in_a_burst_fails_alone_and_the_connection_keeps_working() {
    tokio::time::timeout(LIMIT, async {
        let node = Granting::start().await;
        let (id, base) = (node.segment.id(), node.segment.base());
        let addr = node.server.local_addr().to_string();
        let mut conn = DataConnection::connect(&addr, LIMIT, Some(&secret()))
            .await
            .unwrap();
        let data: Vec<Vec<u8>> = RANGES
            .iter()
            .enumerate()
            .map(|(i, &(_, len))| pattern(len, i as u8 + 1))
            .collect();
        let grants: Vec<Vec<u8>> = (0..RANGES.len())
            .map(|i| range_grant(&node, i, READ | WRITE))
            .collect();

        // Writes: the middle one carries a read-only grant for its range.
        let read_only = range_grant(&node, REFUSED, READ);
        let pieces: Vec<Piece<'_>> = RANGES
            .iter()
            .enumerate()
            .map(|(i, &(offset, _))| Piece::Write {
                segment: id,
                address: base + offset,
                data: &data[i],
                grant: if i == REFUSED { &read_only } else { &grants[i] },
            })
            .collect();
        let burst = conn.burst(pieces, STEP).await;
        assert!(burst.broken.is_none(), "{:?}", burst.broken);
        assert_eq!(burst.results.len(), RANGES.len());
        for (i, result) in burst.results.iter().enumerate() {
            if i == REFUSED {
                expect_refused(result, "a write without the right");
            } else {
                assert!(result.is_ok(), "write {i}: {result:?}");
            }
        }
        // The refused write's payload was read off the socket and dropped, never stored.
        let (offset, len) = RANGES[REFUSED];
        assert!(node.stored(offset, len).await.iter().all(|&b| b == 0));

        // Reads on the same connection: every range, plus one whose grant was tampered with,
        // in the middle. The range whose write was refused was never written by its replica,
        // so reading it is refused too.
        let mut back: Vec<Vec<u8>> = RANGES.iter().map(|&(_, len)| vec![0xeeu8; len]).collect();
        let mut forged = range_grant(&node, 0, READ);
        forged[1] ^= WRITE;
        let mut stolen = vec![0xeeu8; RANGES[0].1];
        let mut pieces: Vec<Piece<'_>> = back
            .iter_mut()
            .enumerate()
            .map(|(i, buf)| Piece::Read {
                segment: id,
                address: base + RANGES[i].0,
                buf,
                grant: &grants[i],
            })
            .collect();
        let forged_at = 1;
        pieces.insert(
            forged_at,
            Piece::Read {
                segment: id,
                address: base,
                buf: &mut stolen,
                grant: &forged,
            },
        );
        let burst = conn.burst(pieces, STEP).await;
        assert!(burst.broken.is_none(), "{:?}", burst.broken);
        assert_eq!(burst.results.len(), RANGES.len() + 1);
        expect_refused(&burst.results[forged_at], "a read with a forged grant");
        expect_refused(
            &burst.results[REFUSED + 1],
            "a read of a range never written",
        );
        for (n, result) in burst.results.iter().enumerate() {
            if n != forged_at && n != REFUSED + 1 {
                assert!(result.is_ok(), "read {n}: {result:?}");
            }
        }
        assert!(
            stolen.iter().all(|&b| b == 0xee),
            "a refused read got bytes"
        );
        for (i, got) in back.iter().enumerate() {
            if i == REFUSED {
                assert!(got.iter().all(|&b| b == 0xee), "a refused read got bytes");
            } else {
                assert!(*got == data[i], "range {i} came back different");
            }
        }

        // Still in step: the refused range written properly, single requests and another burst
        // on the same connection.
        conn.write(id, base + offset, &data[REFUSED], &grants[REFUSED])
            .await
            .unwrap();
        let mut one = vec![0u8; len];
        conn.read(id, base + offset, &mut one, &grants[REFUSED])
            .await
            .unwrap();
        assert!(one == data[REFUSED]);
        let mut tail = vec![0u8; RANGES[3].1];
        let mut head = vec![0u8; RANGES[0].1];
        let burst = conn
            .burst(
                vec![
                    Piece::Read {
                        segment: id,
                        address: base + RANGES[3].0,
                        buf: &mut tail,
                        grant: &grants[3],
                    },
                    Piece::Read {
                        segment: id,
                        address: base,
                        buf: &mut head,
                        grant: &grants[0],
                    },
                ],
                STEP,
            )
            .await;
        assert!(burst.broken.is_none(), "{burst:?}");
        assert!(burst.results.iter().all(Result::is_ok), "{burst:?}");
        assert_eq!(tail, data[3]);
        assert!(head == data[0]);
        node.server.stop().await;
    })
    .await
    .expect("test exceeded its time limit");
}
