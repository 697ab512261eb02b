//! Same-host copies (`docs/data-plane.md`) against real `moonkv master` and `moonkv node`
//! processes on loopback: a store beside a node process has its bytes copied straight between
//! the node's segment and its own memory, byte-exact; a node started with `--no-same-host`, or
//! a store with them off, moves them over the socket; and a caller cannot make a node copy into
//! or out of any process but itself.

use moonkv_client::store::{Store, StoreConfig};
use moonkv_dataplane::header::{
    AttachRequest, DataOp, DataStatus, LocalPlan, RequestHeader, ResponseHeader, RESPONSE_LEN,
};
use moonkv_dataplane::same_host::monotonic_now_ns;
use moonkv_dataplane::DataConnection;
use moonkv_proto::ReplicateConfig;
use moonkv_testkit::admin::first_segment;
use moonkv_testkit::Moonkv;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const LIMIT: Duration = Duration::from_secs(10);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn same_host_requests(data: &str) -> u64 {
    let mut conn = DataConnection::connect(data, LIMIT, None).await.unwrap();
    conn.stats().await.unwrap().same_host_requests
}

/// Puts and reads back single objects (one byte to several chunks) and a batch; checks the
/// bytes.
async fn exercise(store: &Store, prefix: &str) {
    for (i, size) in [1usize, 4096, 128 << 10, (3 << 20) + 17]
        .into_iter()
        .enumerate()
    {
        let key = format!("{prefix}-{i}");
        let value = pattern(size, i as u8);
        store
            .put(&key, &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(store.get(&key).await.unwrap(), value, "{key}");
    }
    let keys: Vec<String> = (0..32).map(|i| format!("{prefix}-batch-{i}")).collect();
    let values: Vec<Vec<u8>> = (0..32).map(|i| pattern(64 << 10, i as u8)).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let put = store
        .batch_put_from(&key_refs, &value_refs, &ReplicateConfig::default())
        .await;
    assert!(put.iter().all(|r| r.is_ok()), "{put:?}");
    let got = store.batch_get(&key_refs).await;
    for (i, result) in got.into_iter().enumerate() {
        assert_eq!(result.unwrap(), values[i], "{}", keys[i]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_beside_a_node_process_moves_its_bytes_by_same_host_copies() {
    let m = MOONKV.master(&[]);
    let n = MOONKV.node(&m.field("rpc"), "seg-same-host", "64MiB");
    let data = n.field("data");

    let store = Store::connect(StoreConfig::new(m.field("rpc")))
        .await
        .unwrap();
    exercise(&store, "local").await;
    let stats = store.data_plane_stats();
    assert!(stats.opened >= 1, "{stats:?}");
    assert_eq!(
        stats.attached, stats.opened,
        "every connection attached: {stats:?}"
    );
    let copied = same_host_requests(&data).await;
    assert!(copied >= 10, "the node served {copied} same-host requests");

    // The same work with same-host copies off goes over the socket, with the same bytes.
    let mut config = StoreConfig::new(m.field("rpc"));
    config.same_host = false;
    let socket = Store::connect(config).await.unwrap();
    exercise(&socket, "socket").await;
    assert_eq!(socket.data_plane_stats().attached, 0);
    assert_eq!(same_host_requests(&data).await, copied);
    // Each store reads what the other wrote.
    assert_eq!(
        store.get("socket-3").await.unwrap(),
        pattern((3 << 20) + 17, 3)
    );
    assert_eq!(
        socket.get("local-3").await.unwrap(),
        pattern((3 << 20) + 17, 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_with_no_same_host_declines_and_serves_over_the_socket() {
    let m = MOONKV.master(&[]);
    let cmd = MOONKV.node_command(
        &m.field("rpc"),
        "seg-no-same-host",
        "32MiB",
        &["--no-same-host"],
    );
    let n = moonkv_testkit::Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    let store = Store::connect(StoreConfig::new(m.field("rpc")))
        .await
        .unwrap();
    exercise(&store, "declined").await;
    let stats = store.data_plane_stats();
    assert!(stats.opened >= 1 && stats.attached == 0, "{stats:?}");
    assert_eq!(same_host_requests(&n.field("data")).await, 0);
}

fn answer(stream: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut raw).unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

fn attach(stream: &mut TcpStream, pid: u32, id: u64) -> DataStatus {
    let probe: Box<[u8; 16]> = Box::new(*b"same-host-probe!");
    let request = AttachRequest {
        pid,
        probe_address: probe.as_ptr() as u64,
        probe: *probe,
    };
    stream.write_all(&request.header(id).encode()).unwrap();
    let status = answer(stream).status;
    drop(probe);
    status
}

fn read_local(
    stream: &mut TcpStream,
    id: u64,
    at: (moonkv_proto::SegmentId, u64),
    into: &mut [u8],
) -> DataStatus {
    let mut bytes = RequestHeader::new(DataOp::ReadLocal, id, at.0, at.1, into.len() as u64)
        .encode()
        .to_vec();
    LocalPlan {
        deadline_ns: monotonic_now_ns() + 5_000_000_000,
        ranges: vec![(into.as_mut_ptr() as u64, into.len() as u64)],
        flags: 0,
    }
    .encode_into(&mut bytes);
    stream.write_all(&bytes).unwrap();
    let a = answer(stream);
    assert_eq!(a.request_id, id);
    a.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_cannot_make_a_node_process_copy_into_any_process_but_itself() {
    let m = MOONKV.master(&[]);
    let n = MOONKV.node(&m.field("rpc"), "seg-attach", "16MiB");
    let store = Store::connect(StoreConfig::new(m.field("rpc")))
        .await
        .unwrap();
    let value = pattern(4096, 7);
    store
        .put("target", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    let segment = first_segment(&m.field("admin"));
    let address = store.replicas("target").await.unwrap().replicas[0].address;
    let data = n.field("data");
    let bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let bystander_pid = bystander.id();
    let node_pid = n.pid();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&data).unwrap();
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        let mut sink = vec![0u8; 4096];
        // Not attached: refused.
        assert_eq!(
            read_local(&mut stream, 1, (segment.id, address), &mut sink),
            DataStatus::LocalRefused
        );
        // Processes that do not hold this connection: another process, the node itself, init,
        // and ids that are no process at all.
        for (i, pid) in [bystander_pid, node_pid, 1, 0, u32::MAX]
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                attach(&mut stream, pid, 10 + i as u64),
                DataStatus::LocalRefused,
                "pid {pid}"
            );
            assert_eq!(
                read_local(&mut stream, 20 + i as u64, (segment.id, address), &mut sink),
                DataStatus::LocalRefused
            );
        }
        assert!(sink.iter().all(|b| *b == 0), "nothing was copied anywhere");
        // One ATTACH per connection: after the refusals, even the truth is refused here.
        assert_eq!(
            attach(&mut stream, std::process::id(), 29),
            DataStatus::LocalRefused
        );
        // This process, on a connection of its own: attached, and the bytes arrive.
        let mut stream = TcpStream::connect(&data).unwrap();
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        assert_eq!(attach(&mut stream, std::process::id(), 30), DataStatus::Ok);
        assert_eq!(
            read_local(&mut stream, 31, (segment.id, address), &mut sink),
            DataStatus::Ok
        );
        sink
    })
    .await
    .map(|sink| assert_eq!(sink, value))
    .unwrap();
    let mut bystander = bystander;
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    // The node keeps serving everyone.
    assert_eq!(store.get("target").await.unwrap(), value);
}

/// Memory a caller gives up (a dropped future, `timeout`, `select!`) is never written or read
/// by the node afterwards: the node stalls at the start of every same-host step (fault point
/// `node::local_step_stall`), the caller's call times out long before, the memory is reused at
/// once, and not one byte of it changes; a cancelled put never commits what the caller wrote
/// into its buffer afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_of_a_cancelled_same_host_call_is_never_touched_after_the_call_is_dropped() {
    let m = MOONKV.master(&[]);
    let stall = Duration::from_millis(400);
    let _n = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-lent",
        "256MiB",
        &format!(
            "{}=sleep({})",
            moonkv_node::failpoints::LOCAL_STEP_STALL,
            stall.as_millis()
        ),
    );
    let store = Store::connect(StoreConfig::new(m.field("rpc")))
        .await
        .unwrap();
    // Calls of 8 MiB and more: copy requests spread over the node's connections.
    cancel_calls(&store, "lent", 8 << 20, 8 << 20, stall).await;
}

/// As above for a standalone store, whose node takes its puts and gets whole (PUT_LOCAL,
/// GET_LOCAL): objects of 3 MiB (two of them in one batch get) and of 16 MiB, cut in pieces
/// shared with the node's copy helper, the caller looked at once per 4 MiB copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_of_a_cancelled_call_through_the_node_is_never_touched_after_the_call_is_dropped() {
    let m = MOONKV.master(&[]);
    let stall = Duration::from_millis(400);
    let n = MOONKV.node_with_failpoints(
        &m.field("rpc"),
        "seg-lent-whole",
        "256MiB",
        &format!(
            "{}=sleep({})",
            moonkv_node::failpoints::LOCAL_STEP_STALL,
            stall.as_millis()
        ),
    );
    let store = Store::connect_via_node(&n.field("data"), StoreConfig::new("unused"))
        .await
        .unwrap();
    cancel_calls(&store, "lent", 3 << 20, 16 << 20, stall).await;
    cancel_calls(&store, "lent-large", 16 << 20, 16 << 20, stall).await;
}

/// Gives up gets of `size`-byte objects (`lent`) and puts of `size` and `put_size` bytes after 50 ms,
/// while the node stalls `stall` before every copy step, and checks that none of the memory
/// changes afterwards and that no put commits what was written after it.
async fn cancel_calls(store: &Store, lent: &str, size: usize, put_size: usize, stall: Duration) {
    let value = pattern(size, 7);
    store
        .put(lent, &value, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(
        store.data_plane_stats().attached,
        store.data_plane_stats().opened
    );
    // Long enough for a node that did not let go to finish its stalled step.
    let settle = stall * 3;
    let give_up = Duration::from_millis(50);

    for round in 0..3 {
        // get_into: the buffer is reused for other data the moment the call is given up.
        let mut buf = vec![0u8; size];
        let cancelled = tokio::time::timeout(give_up, store.get_into(lent, &mut buf)).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the call was not cancelled"
        );
        buf.fill(0xAA);
        tokio::time::sleep(settle).await;
        assert!(
            buf.iter().all(|b| *b == 0xAA),
            "round {round}: the node wrote into memory its caller had given up"
        );

        // batch_get_into, two objects' buffers.
        let mut a = vec![0u8; size];
        let mut b = vec![0u8; size];
        {
            let mut targets: Vec<&mut [u8]> = vec![&mut a, &mut b];
            let cancelled =
                tokio::time::timeout(give_up, store.batch_get_into(&[lent, lent], &mut targets))
                    .await;
            assert!(cancelled.is_err());
        }
        a.fill(0xAB);
        b.fill(0xAC);
        tokio::time::sleep(settle).await;
        assert!(a.iter().all(|x| *x == 0xAB) && b.iter().all(|x| *x == 0xAC));

        // put: what the caller writes into its buffer after giving up is never committed.
        for (n, len) in [size, put_size].into_iter().enumerate() {
            let key = format!("{lent}-cancelled-{round}-{n}");
            let mut source = pattern(len, 9);
            let cancelled = tokio::time::timeout(
                give_up,
                store.put(&key, &source, &ReplicateConfig::default()),
            )
            .await;
            assert!(cancelled.is_err());
            source.fill(0xBB);
            tokio::time::sleep(settle).await;
            if let Ok(got) = store.get(&key).await {
                assert!(
                    !got.contains(&0xBB),
                    "a cancelled put committed bytes written after it was dropped"
                );
            }
        }
    }
    // The object itself is intact and readable once the node is left alone.
    assert_eq!(store.get(lent).await.unwrap(), value);
}
