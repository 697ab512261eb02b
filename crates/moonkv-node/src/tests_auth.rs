//! The authenticated data plane (handshake and grants) against real sockets on loopback.

use crate::disk::{self, DiskStore};
use crate::segment::SegmentMemory;
use crate::server::*;
use moonkv_dataplane::handshake::{self, Answer, Mode, ANSWER_LEN, PROOF_LEN};
use moonkv_dataplane::header::{DataOp, DataStatus, RequestHeader, ResponseHeader, RESPONSE_LEN};
use moonkv_dataplane::{DataConnection, FileMeta};
use moonkv_proto::auth::{Secret, NONCE_LEN};
use moonkv_proto::grant::{unix_now_ms, Grant, FILE, READ, WRITE};
use moonkv_proto::{ErrorCode, Result, SegmentId};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);

fn secret() -> Secret {
    Secret::new(b"data-plane-test-shared-secret".to_vec()).unwrap()
}

fn other_secret() -> Secret {
    Secret::new(b"some-other-secret-of-length".to_vec()).unwrap()
}

struct Secured {
    server: DataServer,
    segment: Arc<SegmentMemory>,
    disk: Arc<DiskStore>,
    _dir: disk::tests::TempDir,
}

async fn secured(node_secret: Option<Secret>) -> Secured {
    let segment = Arc::new(SegmentMemory::allocate(SegmentId::new(5, 6), 1 << 20).unwrap());
    let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
        [(segment.id(), segment.clone())].into(),
    ));
    let dir = disk::tests::TempDir::new("dataplane-auth");
    let (disk, _) = DiskStore::open(&dir.0, 1 << 20).unwrap();
    let disk = Arc::new(disk);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let access = crate::server::Access {
        grant_key: node_secret.clone(),
        secret: node_secret,
        tls: None,
        claims: Default::default(),
        deadlines: Default::default(),
        max_connections: None,
        refuse_same_host: false,
        same_host_other_users: false,
        no_local_socket: false,
        master_addr: None,
    };
    let server = DataServer::spawn_with_disk(listener, table, Some(disk.clone()), access).unwrap();
    Secured {
        server,
        segment,
        disk,
        _dir: dir,
    }
}

impl Secured {
    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }

    async fn connect(&self) -> DataConnection {
        DataConnection::connect(&self.addr(), LIMIT, Some(&secret()))
            .await
            .unwrap()
    }

    /// A grant over `[base + offset, base + offset + size)` of the segment.
    fn grant(&self, rights: u8, offset: u64, size: u64, expires_ms: u64) -> Vec<u8> {
        Grant::new(
            rights,
            expires_ms,
            self.segment.base() + offset,
            size,
            "alice",
        )
        .seal(&secret(), self.segment.id())
    }
}

fn later() -> u64 {
    unix_now_ms() + 60_000
}

fn refused(r: Result<()>) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");
    e.to_string()
}

#[tokio::test]
async fn requests_need_a_grant_covering_them_and_refusals_keep_the_connection() {
    tokio::time::timeout(LIMIT, async {
        let f = secured(Some(secret())).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = f.connect().await;
        let rw = f.grant(READ | WRITE, 0, 4096, later());
        let data = vec![7u8; 4096];
        conn.write(id, base, &data, &rw).await.unwrap();
        let mut back = vec![0u8; 4096];
        conn.read(id, base + 100, &mut back[..100], &rw)
            .await
            .unwrap();
        assert_eq!(back[..100], data[..100]);

        let ro = f.grant(READ, 0, 4096, later());
        let mut forged = ro.clone();
        forged[1] = READ | WRITE;
        let mut moved = ro.clone();
        moved[10..18].copy_from_slice(&(base + 4096).to_be_bytes());
        let elsewhere =
            Grant::new(READ, later(), base, 4096, "alice").seal(&secret(), SegmentId::new(1, 1));
        let foreign = Grant::new(READ, later(), base, 4096, "alice").seal(&other_secret(), id);
        let expired = f.grant(READ, 0, 4096, unix_now_ms() - 10_000);
        let cases: [(&str, &[u8], u64, usize); 7] = [
            ("no grant", &[], base, 1),
            ("beyond the granted range", &ro, base + 4000, 200),
            ("forged rights", &forged, base, 1),
            ("altered range", &moved, base + 4096, 1),
            ("grant for another segment", &elsewhere, base, 1),
            ("grant under another secret", &foreign, base, 1),
            ("expired grant", &expired, base, 1),
        ];
        for (what, grant, at, len) in cases {
            let mut buf = vec![0u8; len];
            let message = refused(conn.read(id, at, &mut buf, grant).await);
            assert!(message.contains("grant"), "{what}: {message}");
        }
        // A write under a read-only grant is refused; its payload is consumed.
        refused(conn.write(id, base, &[1u8; 4096], &ro).await);
        conn.read(id, base, &mut back, &ro).await.unwrap();
        assert_eq!(back, data, "the refused write changed nothing");
        let text = f.server.metrics().encode();
        let refused_grants: u64 = text
            .lines()
            .filter(|l| l.starts_with("node_refused_grants_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum();
        assert_eq!(refused_grants, 8, "{text}");
        assert!(text.contains("node_refused_grants_total{reason=\"missing\"} 1\n"));
        assert!(text.contains("node_data_request_failures_total{op=\"read\"} 0\n"));
        assert!(text.contains("node_data_bytes_total{op=\"write\"} 4096\n"));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn disk_files_need_a_file_grant_for_that_file() {
    tokio::time::timeout(LIMIT, async {
        let f = secured(Some(secret())).await;
        let mut conn = f.connect().await;
        let disk = f.disk.id();
        let meta = FileMeta {
            tenant: "alice".into(),
            key: "k".into(),
        };
        let data = vec![9u8; 5000];
        let file = |rights: u8, id: u64, size: u64| {
            Grant::new(rights | FILE, later(), id, size, "alice").seal(&secret(), disk)
        };
        let rw = file(READ | WRITE, 11, 5000);
        refused(conn.write_file(disk, 12, &meta, &[&data], &rw).await);
        refused(
            conn.write_file(disk, 11, &meta, &[&data[..4000]], &rw)
                .await,
        );
        let range = Grant::new(READ | WRITE, later(), 11, 5000, "alice").seal(&secret(), disk);
        refused(conn.write_file(disk, 11, &meta, &[&data], &range).await);
        conn.write_file(disk, 11, &meta, &[&data], &rw)
            .await
            .unwrap();
        let mut back = vec![0u8; 5000];
        refused(conn.read_file(disk, 11, &mut back, &[]).await);
        conn.read_file(disk, 11, &mut back, &file(READ, 11, 5000))
            .await
            .unwrap();
        assert_eq!(back, data);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn callers_without_the_right_secret_are_refused() {
    tokio::time::timeout(LIMIT, async {
        let f = secured(Some(secret())).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let grant = f.grant(READ | WRITE, 0, 4096, later());

        // No secret: the first request is refused with advice, and the connection closed.
        let mut open = DataConnection::connect(&f.addr(), LIMIT, None)
            .await
            .unwrap();
        let message = refused(open.write(id, base, &[1u8; 1000], &grant).await);
        assert!(message.contains("MOONKV_AUTH_SECRET"), "{message}");

        // Another secret: the node's proof does not check out.
        let wrong = DataConnection::connect(&f.addr(), LIMIT, Some(&other_secret())).await;
        let e = wrong.err().unwrap();
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
        assert!(e.to_string().contains("could not prove"), "{e}");

        // A raw caller with a wrong proof gets UNAUTHENTICATED, then the connection closes.
        let mut raw = TcpStream::connect(f.addr()).await.unwrap();
        raw.write_all(&handshake::hello(&[3; NONCE_LEN]))
            .await
            .unwrap();
        let mut answer = [0u8; ANSWER_LEN];
        raw.read_exact(&mut answer).await.unwrap();
        let answer = Answer::decode(&answer).unwrap();
        assert_eq!(answer.mode, Mode::ProofRequired);
        assert!(secret().verify_server(&answer.challenge, &[3; NONCE_LEN], &answer.server_proof));
        raw.write_all(&[0u8; PROOF_LEN]).await.unwrap();
        let header = RequestHeader::new(DataOp::Read, 5, id, base, 16);
        raw.write_all(&header.encode()).await.unwrap();
        assert_closed_after(&mut raw, DataStatus::Unauthenticated, 0).await;

        // A raw request without any handshake: refused by its id, then closed.
        let mut raw = TcpStream::connect(f.addr()).await.unwrap();
        raw.write_all(&RequestHeader::new(DataOp::Read, 9, id, base, 16).encode())
            .await
            .unwrap();
        assert_closed_after(&mut raw, DataStatus::Unauthenticated, 9).await;

        // The node still serves authenticated callers.
        let mut conn = f.connect().await;
        conn.write(id, base, b"still here", &grant).await.unwrap();
        // Refused by the node: the request without a handshake (twice) and the wrong proof.
        // The caller that could not verify the node left on its own.
        let text = f.server.metrics().encode();
        assert!(
            text.contains("\nnode_refused_handshakes_total 3\n"),
            "{text}"
        );
    })
    .await
    .unwrap();
}

async fn assert_closed_after(raw: &mut TcpStream, status: DataStatus, request_id: u64) {
    let mut bytes = [0u8; RESPONSE_LEN];
    raw.read_exact(&mut bytes).await.unwrap();
    let answer = ResponseHeader::decode(&bytes).unwrap();
    assert_eq!((answer.status, answer.request_id), (status, request_id));
    let mut rest = Vec::new();
    raw.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "nothing after the refusal");
}

#[tokio::test]
async fn a_caller_with_a_secret_uses_an_open_node_as_before() {
    tokio::time::timeout(LIMIT, async {
        let f = secured(None).await;
        let (id, base) = (f.segment.id(), f.segment.base());
        let mut conn = f.connect().await;
        conn.write(id, base, b"open", &[]).await.unwrap();
        let mut back = [0u8; 4];
        conn.read(id, base, &mut back, &[]).await.unwrap();
        assert_eq!(&back, b"open");
        // Grants are ignored by a node without a secret.
        let grant = f.grant(READ, 0, 1, later());
        conn.read(id, base, &mut back, &grant).await.unwrap();
    })
    .await
    .unwrap();
}
