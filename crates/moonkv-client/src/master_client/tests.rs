//! Master client against a scripted fake master on loopback.

use super::*;
use moonkv_testkit::fake_master::{fake_master, ok, Handler, Reply};
use std::sync::atomic::AtomicUsize;
use tokio::net::TcpListener;

fn config(addr: &str) -> MasterClientConfig {
    let mut c = MasterClientConfig::new(addr);
    c.rpc_timeout = Duration::from_millis(500);
    c.connect_timeout = Duration::from_millis(500);
    c.ping_interval = Duration::from_millis(50);
    c
}

fn exist(key: &str) -> KeyRequest {
    KeyRequest {
        tenant: String::new(),
        key: key.into(),
    }
}

#[tokio::test]
async fn pipelined_responses_are_matched_by_request_id() {
    // "slow" answers after "fast", so responses arrive out of order.
    let handler: Handler = Arc::new(|req| match req {
        Request::ExistKey(k) if k.key == "slow" => Reply::Ok(
            rmp_serde::to_vec(&true).unwrap(),
            Duration::from_millis(100),
        ),
        Request::ExistKey(_) => ok(&false),
        _ => Reply::Err(Error::new(ErrorCode::NOT_SUPPORTED, "no")),
    });
    let (addr, _) = fake_master(handler).await;
    let client = MasterClient::connect(config(&addr)).await.unwrap();
    let (slow, fast) = tokio::join!(
        client.exist_key(exist("slow")),
        client.exist_key(exist("fast"))
    );
    assert!(slow.unwrap());
    assert!(!fast.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_frames_larger_than_the_socket_buffer_arrive_whole_and_in_order() {
    // Every frame is far larger than what a socket takes at once, so senders overlap with the
    // writer task's queue: a frame written out of turn or split by another would not decode.
    let handler: Handler = Arc::new(|req| match req {
        Request::BatchExistKey(k) => {
            // A master slow to read: the socket fills and later frames must queue.
            std::thread::sleep(Duration::from_millis(5));
            let tag = k.keys[0].clone();
            let whole = k.keys.iter().all(|key| *key == tag);
            let answer: Vec<ItemResult<bool>> =
                k.keys.iter().map(|_| ItemResult(Ok(whole))).collect();
            Reply::Ok(rmp_serde::to_vec(&answer).unwrap(), Duration::ZERO)
        }
        _ => Reply::Err(Error::new(ErrorCode::NOT_SUPPORTED, "no")),
    });
    let (addr, _) = fake_master(handler).await;
    let mut cfg = config(&addr);
    cfg.rpc_timeout = Duration::from_secs(20);
    let client = MasterClient::connect(cfg).await.unwrap();
    let calls = (0..48).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let keys: Vec<String> = (0..50_000 + i)
                .map(|_| format!("key-of-caller-{i:02}"))
                .collect();
            let n = keys.len();
            let answer = client
                .batch_exist_key(KeysRequest {
                    tenant: String::new(),
                    keys,
                })
                .await
                .unwrap();
            assert_eq!(answer.len(), n, "caller {i}");
            assert!(answer.iter().all(|r| r.0 == Ok(true)), "caller {i}");
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn error_responses_keep_their_code() {
    let handler: Handler =
        Arc::new(|_| Reply::Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "no such key")));
    let (addr, _) = fake_master(handler).await;
    let client = MasterClient::connect(config(&addr)).await.unwrap();
    let err = client.get_replica_list(exist("k")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(err.message, "no such key");
}

#[tokio::test]
async fn a_silent_master_yields_rpc_timeout() {
    let handler: Handler = Arc::new(|_| Reply::Silent);
    let (addr, _) = fake_master(handler).await;
    let client = MasterClient::connect(config(&addr)).await.unwrap();
    let err = client.exist_key(exist("k")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::RPC_TIMEOUT);
}

#[tokio::test]
async fn a_dropped_connection_fails_in_flight_calls_and_reconnects() {
    let handler: Handler = Arc::new(|req| match req {
        Request::ExistKey(k) if k.key == "hangup" => Reply::Hangup,
        _ => ok(&true),
    });
    let (addr, accepted) = fake_master(handler).await;
    let client = MasterClient::connect(config(&addr)).await.unwrap();
    let err = client.exist_key(exist("hangup")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::RPC_FAIL);
    assert!(client.exist_key(exist("k")).await.unwrap());
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unreachable_master_is_rpc_fail() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = MasterClient::connect(config(&addr)).await.err().unwrap();
    assert_eq!(err.code, ErrorCode::RPC_FAIL);
}

#[tokio::test]
async fn need_remount_triggers_a_remount_of_every_mounted_segment() {
    let remounted = Arc::new(Mutex::new(Vec::new()));
    let seen = remounted.clone();
    let pings = Arc::new(AtomicUsize::new(0));
    let ping_count = pings.clone();
    let handler: Handler = Arc::new(move |req| match req {
        Request::MountSegment(_) => ok(&()),
        Request::Ping(_) => {
            // The second ping says the master forgot us.
            let status = if ping_count.fetch_add(1, Ordering::SeqCst) == 1 {
                ClientStatus::NeedRemount
            } else {
                ClientStatus::Ok
            };
            ok(&PingResponse {
                view_version: 0,
                client_status: status,
                master_epoch: 1,
                merges_returning: true,
            })
        }
        Request::ReMountSegment(r) => {
            seen.lock().push(r.segments.len());
            ok(&())
        }
        _ => Reply::Err(Error::new(ErrorCode::NOT_SUPPORTED, "no")),
    });
    let (addr, _) = fake_master(handler).await;
    let client = MasterClient::connect(config(&addr)).await.unwrap();
    for i in 0..2 {
        let segment = Segment {
            id: SegmentId::new(1, i),
            name: format!("s{i}").into(),
            base: 4096,
            size: 4096,
            endpoint: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            host_id: "h".into(),
        };
        client.mount(segment).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(5), async {
        while remounted.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a remount within 5 s");
    assert_eq!(remounted.lock()[0], 2);
    client.close().await;
}
