//! Store logic against a scripted master and a real data-plane server: lease revalidation and
//! revoke-with-ids, the cases a real master cannot be steered into on demand.

use super::*;
use moonkv_node::segment::SegmentMemory;
use moonkv_node::server::{DataServer, SegmentTable};
use moonkv_proto::SegmentId;
use moonkv_testkit::fake_master::{fake_master, ok, Handler, Reply};
use parking_lot::Mutex;

const LIMIT: Duration = Duration::from_secs(10);

/// A data-plane server over one segment holding `content` at its base.
async fn serving(content: &[u8]) -> (DataServer, ReplicaDescriptor) {
    let memory = Arc::new(SegmentMemory::allocate(SegmentId::new(7, 7), 1 << 20).unwrap());
    memory
        .write_view(memory.base(), content.len() as u64)
        .await
        .unwrap()
        .copy_from_slice(content);
    let descriptor = descriptor(ReplicaId(41), memory.base(), content.len() as u64, "");
    let table: SegmentTable = Arc::new(parking_lot::RwLock::new([(memory.id(), memory)].into()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = DataServer::spawn(listener, table).unwrap();
    let endpoint = server.local_addr().to_string();
    (
        server,
        ReplicaDescriptor {
            endpoint: endpoint.into(),
            ..descriptor
        },
    )
}

fn descriptor(id: ReplicaId, address: u64, size: u64, endpoint: &str) -> ReplicaDescriptor {
    ReplicaDescriptor {
        id,
        kind: ReplicaKind::Memory,
        status: ReplicaStatus::Complete,
        size,
        segment_id: SegmentId::new(7, 7),
        segment_name: "seg".into(),
        endpoint: endpoint.into(),
        address,
        grant: None,
    }
}

async fn store(master: &str) -> Store {
    let mut config = StoreConfig::new(master);
    config.connect_timeout = Duration::from_millis(500);
    Store::connect(config).await.unwrap()
}

/// A master whose lease is already over when the list arrives, answering revalidation with
/// `verdict`.
fn expired_lease_master(
    replica: ReplicaDescriptor,
    verdict: Result<()>,
    asked: Arc<Mutex<Vec<ReplicaId>>>,
) -> Handler {
    let list = GetReplicaListResponse {
        replicas: vec![replica],
        lease_ttl_ms: 0,
        object_checksum: None,
    };
    Arc::new(move |req| match req {
        Request::GetReplicaList(_) => ok(&list),
        Request::BatchGetReplicaList(_) => ok(&vec![ItemResult(Ok(list.clone()))]),
        Request::RevalidateReplicas(r) => {
            asked
                .lock()
                .extend(r.items.iter().flat_map(|i| i.replica_ids.clone()));
            ok(&vec![ItemResult(verdict.clone())])
        }
        _ => Reply::Err(Error::new(ErrorCode::NOT_SUPPORTED, "not scripted")),
    })
}

#[tokio::test]
async fn a_replaced_replica_after_lease_expiry_is_lease_expired_not_data() {
    tokio::time::timeout(LIMIT, async {
        let (_server, replica) = serving(b"stale bytes").await;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let gone = Err(Error::new(
            ErrorCode::INVALID_REPLICA,
            "replica 41 was replaced",
        ));
        let (addr, _) = fake_master(expired_lease_master(replica, gone, asked.clone())).await;
        let store = store(&addr).await;
        let err = store.get("k").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::LEASE_EXPIRED, "{err}");
        let mut buf = [0u8; 64];
        assert_eq!(
            store.get_into("k", &mut buf).await.unwrap_err().code,
            ErrorCode::LEASE_EXPIRED
        );
        let batch = store.batch_get(&["k"]).await;
        assert_eq!(
            batch[0].as_ref().unwrap_err().code,
            ErrorCode::LEASE_EXPIRED
        );
        assert_eq!(asked.lock().as_slice(), &[ReplicaId(41); 3]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_confirmed_replica_after_lease_expiry_returns_the_bytes() {
    tokio::time::timeout(LIMIT, async {
        let (_server, replica) = serving(b"fresh bytes").await;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (addr, _) = fake_master(expired_lease_master(replica, Ok(()), asked)).await;
        assert_eq!(store(&addr).await.get("k").await.unwrap(), b"fresh bytes");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failed_write_is_revoked_with_exactly_the_start_ids() {
    tokio::time::timeout(LIMIT, async {
        // Nothing listens on this endpoint.
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = dead.local_addr().unwrap().to_string();
        drop(dead);
        let replicas = vec![
            descriptor(ReplicaId(5), 4096, 3, &endpoint),
            descriptor(ReplicaId(6), 8192, 3, &endpoint),
        ];
        let revoked = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(0));
        let reported = Arc::new(Mutex::new(Vec::new()));
        let (r, e, u) = (revoked.clone(), ended.clone(), reported.clone());
        let handler: Handler = Arc::new(move |req| match req {
            Request::PutStart(_) => ok(&replicas),
            Request::PutRevoke(rv) => {
                r.lock().push(rv.replica_ids);
                ok(&())
            }
            Request::ReportUnreachable(report) => {
                u.lock().push(report.endpoints);
                ok(&1u32)
            }
            Request::PutEnd(_) => {
                *e.lock() += 1;
                ok(&())
            }
            _ => Reply::Err(Error::new(ErrorCode::NOT_SUPPORTED, "not scripted")),
        });
        let (addr, _) = fake_master(handler).await;
        let err = store(&addr)
            .await
            .put("k", b"abc", &ReplicateConfig::default())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
        // This master places the write on the dead node every time: each of the three
        // placements is revoked with exactly its ids, and the node reported before each retry.
        assert_eq!(
            *revoked.lock(),
            vec![vec![ReplicaId(5), ReplicaId(6)]; failover::MAX_ATTEMPTS as usize]
        );
        assert_eq!(
            *reported.lock(),
            vec![vec![endpoint.clone()]; failover::MAX_ATTEMPTS as usize - 1]
        );
        assert_eq!(*ended.lock(), 0);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_call_cancelled_during_a_long_same_host_copy_lets_its_store_poll_again() {
    // What a caller's `asyncio.wait_for` / `timeout` does: the call is dropped mid-copy.
    let store = Store::lazy(StoreConfig::new("127.0.0.1:1")).unwrap();
    let transfer = store.transfer.clone();
    let mut call = Box::pin(async move {
        let _copying = transfer.quiet_wait();
        std::future::pending::<()>().await
    });
    let polled = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))
    })
    .await;
    assert!(polled.is_pending());
    assert!(store.waits_quietly(), "the long copy is under way");
    assert!(
        tokio::time::timeout(Duration::from_millis(5), &mut call)
            .await
            .is_err(),
        "the caller gives up"
    );
    drop(call);
    assert!(
        !store.waits_quietly(),
        "a dropped call leaves no quiet wait behind: the next calls poll again"
    );
}
