//! Puts and gets taken whole by the node (PUT_LOCAL and GET_LOCAL, `docs/data-plane.md`,
//! *Puts through the node*, *Gets through the node*): a standalone store hands its node keys,
//! sizes and memory; the node asks the master (start and end, or the replica lists), copies,
//! and answers, through a call when the master runs in its process (`moonkv up`) or through
//! its own connection otherwise. Real master and nodes on 127.0.0.1; the caller is this
//! process.

use moonkv_client::{Store, StoreConfig};
use moonkv_dataplane::header::{
    AttachRequest, DataOp, DataStatus, LocalPlan, RequestHeader, ResponseHeader,
    MAX_PUT_LOCAL_BODY, RESPONSE_LEN,
};
use moonkv_dataplane::same_host::monotonic_now_ns;
use moonkv_master::server::{self, MasterConfig, MasterHandle};
use moonkv_node::{Node, NodeConfig, NodeHandle};
use moonkv_proto::msg::BatchPutStartRequest;
use moonkv_proto::{ClientId, ErrorCode, ReplicateConfig};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1 << 20;

async fn master() -> MasterHandle {
    server::start(MasterConfig::ephemeral())
        .await
        .expect("master starts")
}

/// A node of `master`; `in_process`: reaching it by calls, as in `moonkv up`.
async fn node(master: &MasterHandle, in_process: bool) -> NodeHandle {
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), 64 * MIB);
    config.huge_pages = false;
    if in_process {
        config.in_process_master = Some(master.in_process());
    }
    Node::start(config).await.expect("node starts")
}

/// A standalone store whose calls go through node `n`.
async fn via_node(n: &NodeHandle) -> Store {
    Store::connect_via_node(n.endpoint(), StoreConfig::new("unused"))
        .await
        .unwrap()
}

/// The whole HTTP answer of the master's admin endpoint to `GET path`.
async fn admin_get(master: &MasterHandle, path: &str) -> String {
    let mut s = TcpStream::connect(master.admin_addr()).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text
}

/// The value of counter `name` on the master's `/metrics`.
async fn counter(master: &MasterHandle, name: &str) -> u64 {
    admin_get(master, "/metrics")
        .await
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_through_the_node_keep_every_byte_and_every_answer_of_the_usual_path() {
    for in_process in [true, false] {
        let m = master().await;
        let n = node(&m, in_process).await;
        let store = via_node(&n).await;
        let cfg = ReplicateConfig::default();
        // The first call attaches the pool's connection; every later one goes through the node.
        store.put("warm", b"w", &cfg).await.unwrap();
        let starts = counter(&m, "master_put_start_requests_total").await;
        let batch_starts = counter(&m, "master_batch_put_start_requests_total").await;

        let one = pattern(1, (3 * MIB + 77) as usize);
        store.put_from("one", &one, &cfg).await.unwrap();
        assert_eq!(
            store.get("one").await.unwrap(),
            one,
            "in_process={in_process}"
        );
        // First writer wins, with the usual code.
        let again = store.put("one", b"other", &cfg).await.unwrap_err();
        assert_eq!(again.code, ErrorCode::OBJECT_ALREADY_EXISTS, "{again}");
        // A replacement, longer and then shorter.
        let two = pattern(2, (5 * MIB) as usize);
        store.upsert("one", &two, &cfg).await.unwrap();
        assert_eq!(store.get("one").await.unwrap(), two);
        store.upsert("one", b"short", &cfg).await.unwrap();
        assert_eq!(store.get("one").await.unwrap(), b"short");
        // An object the node copies on two threads, in pieces, one of them short.
        let large = pattern(4, (20 * MIB + 4097) as usize);
        store.put_from("large", &large, &cfg).await.unwrap();
        assert!(store.get("large").await.unwrap() == large);
        store.remove("large", true).await.unwrap();

        // A batch from one buffer at odd offsets, with a key that exists already.
        let big = pattern(3, 40_000 * 9);
        let values: Vec<&[u8]> = (0..9)
            .map(|i| &big[i * 40_000..(i + 1) * 40_000 - i])
            .collect();
        let mut keys: Vec<String> = (0..9).map(|i| format!("b{i}")).collect();
        keys[4] = "one".into();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let results = store.batch_put_from(&refs, &values, &cfg).await;
        for (i, r) in results.iter().enumerate() {
            if i == 4 {
                assert_eq!(
                    r.as_ref().unwrap_err().code,
                    ErrorCode::OBJECT_ALREADY_EXISTS
                );
            } else {
                r.as_ref().unwrap();
                assert_eq!(store.get(refs[i]).await.unwrap(), values[i], "key {i}");
            }
        }
        // A batch of 2 MiB or more to fresh keys, copied with streaming stores: odd lengths at
        // odd offsets of one buffer, so every copy has an unaligned head and a short tail.
        let wide = pattern(5, 24 * (128 << 10));
        let streamed: Vec<&[u8]> = (0..24)
            .map(|i| &wide[i * (128 << 10) + i..(i + 1) * (128 << 10) - 3 * i])
            .collect();
        assert!(streamed.iter().map(|v| v.len()).sum::<usize>() >= 2 << 20);
        let names: Vec<String> = (0..24).map(|i| format!("s{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let results = store.batch_put_from(&name_refs, &streamed, &cfg).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for (name, v) in name_refs.iter().zip(&streamed) {
            assert!(
                store.get(name).await.unwrap() == *v,
                "{name} in_process={in_process}"
            );
        }

        // The batch form of the replacement writes them all.
        let results = store.batch_upsert_from(&refs, &values, &cfg).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(store.get("one").await.unwrap(), values[4]);

        // None of that took the three-step path.
        assert_eq!(
            counter(&m, "master_put_start_requests_total").await,
            starts,
            "in_process={in_process}"
        );
        assert!(counter(&m, "master_batch_put_start_requests_total").await >= batch_starts + 3);
        n.shutdown().await;
        m.shutdown().await;
    }
}

/// Batches of keys the node copies on two threads (its request thread and its copy helper):
/// four writers replace the same keys, two of them in the opposite order, while readers read
/// them back. Every call ends, and every value read is one writer's whole value, never a mix
/// of two writers' pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_copied_on_two_threads_end_and_keep_whole_values() {
    let m = master().await;
    // Room for every writer's replacements while readers hold the values they read.
    let mut config = NodeConfig::new(m.rpc_addr().to_string(), 512 * MIB);
    config.huge_pages = false;
    config.in_process_master = Some(m.in_process());
    let n = Node::start(config).await.expect("node starts");
    let store = via_node(&n).await;
    let cfg = ReplicateConfig::default();
    // Sizes that are copied whole (4 KiB, 200 KiB) and in pieces (600 KiB, 3 MiB).
    const SIZES: [usize; 6] = [4096, 200 << 10, 600 << 10, 600 << 10, 3 << 20, 200 << 10];
    let sizes = SIZES;
    let keys: Vec<String> = (0..sizes.len()).map(|k| format!("c{k}")).collect();
    let value = |writer: usize, key: usize| pattern((writer * 16 + key) as u8, SIZES[key]);
    let work = async {
        let mut tasks = Vec::new();
        for writer in 0..4usize {
            let (store, cfg, keys) = (store.clone(), cfg.clone(), keys.clone());
            tasks.push(tokio::spawn(async move {
                let mut order: Vec<usize> = (0..sizes.len()).collect();
                if writer % 2 == 1 {
                    order.reverse();
                }
                let values: Vec<Vec<u8>> = order.iter().map(|k| value(writer, *k)).collect();
                let refs: Vec<&str> = order.iter().map(|k| keys[*k].as_str()).collect();
                let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                let mut written = 0;
                for _ in 0..15 {
                    let results = store.batch_upsert_from(&refs, &slices, &cfg).await;
                    written += results.iter().filter(|r| r.is_ok()).count();
                }
                written
            }));
        }
        for reader in 0..2usize {
            let (store, keys) = (store.clone(), keys.clone());
            tasks.push(tokio::spawn(async move {
                let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|s| vec![0u8; *s]).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let mut read = 0;
                for _ in 0..15 {
                    let mut views: Vec<&mut [u8]> =
                        bufs.iter_mut().map(Vec::as_mut_slice).collect();
                    let results = store.batch_get_into(&refs, &mut views).await;
                    for (k, r) in results.iter().enumerate() {
                        if let Ok(len) = r {
                            assert_eq!(*len, sizes[k]);
                            assert!(
                                (0..4).any(|w| views[k][..] == value(w, k)[..]),
                                "reader {reader}: key {k} is no writer's whole value"
                            );
                            read += 1;
                        }
                    }
                }
                read
            }));
        }
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap());
        }
        done
    };
    let done = tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .expect("every batch ends");
    assert!(
        done[..4].iter().sum::<usize>() > 0,
        "no write succeeded: {done:?}"
    );
    // Once the writers are done, each key holds one writer's whole value, or none when the
    // last replacement started was not the one ended (the master's rule for racing upserts).
    for (k, key) in keys.iter().enumerate() {
        match store.get(key).await {
            Ok(got) => assert!((0..4).any(|w| got == value(w, k)), "key {k}"),
            Err(e) => assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND, "key {k}: {e}"),
        }
    }
    n.shutdown().await;
    m.shutdown().await;
}

/// A node that copies nothing to or from this process (`refuse_same_host`): the store's puts
/// and gets are not taken as same-host requests; once the store knows its node, its gets go
/// whole over the socket (GET_WHOLE) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_node_takes_no_same_host_copies_gets_over_the_socket() {
    let m = master().await;
    let mut config = NodeConfig::new(m.rpc_addr().to_string(), 16 * MIB);
    config.huge_pages = false;
    config.refuse_same_host = true;
    let n = Node::start(config).await.unwrap();
    assert!(!n.data_plane_stats().put_local);
    assert!(!n.data_plane_stats().get_local);
    assert!(n.data_plane_stats().get_whole);
    let store = via_node(&n).await;
    let value = pattern(9, 100_000);
    store
        .put("k", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(store.get("k").await.unwrap(), value);
    let mut buf = vec![0u8; value.len()];
    assert_eq!(store.get_into("k", &mut buf).await.unwrap(), value.len());
    assert_eq!(buf, value);
    assert_eq!(counter(&m, "master_put_start_requests_total").await, 1);
    assert_eq!(
        counter(&m, "master_get_replica_list_requests_total").await,
        0
    );
    assert_eq!(
        counter(&m, "master_batch_get_replica_list_requests_total").await,
        2
    );
    n.shutdown().await;
    m.shutdown().await;
}

async fn answer(stream: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut raw).await.unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

/// Sends `request` (id 1) on a connection not attached yet, checks that it is refused and the
/// connection stays in step, then attaches the connection. The probe must outlive its use.
async fn refused_then_attach(s: &mut TcpStream, request: &[u8]) -> Box<[u8; 16]> {
    s.write_all(request).await.unwrap();
    let a = answer(s).await;
    assert_eq!((a.request_id, a.status), (1, DataStatus::LocalRefused));
    let probe: Box<[u8; 16]> = Box::new(rand::random());
    let attach = AttachRequest {
        pid: std::process::id(),
        probe_address: probe.as_ptr() as u64,
        probe: *probe,
    };
    s.write_all(&attach.header(2).encode()).await.unwrap();
    assert_eq!(answer(s).await.status, DataStatus::Ok);
    probe
}

/// Sends `count` malformed requests (`request(id, i)`, ids from 10) one after the other on the
/// same connection, and checks that each is refused with `OUT_OF_RANGE`.
async fn each_out_of_range(
    s: &mut TcpStream,
    request: impl Fn(u64, usize) -> Vec<u8>,
    count: usize,
) {
    for i in 0..count {
        let id = 10 + i as u64;
        s.write_all(&request(id, i)).await.unwrap();
        let a = answer(s).await;
        assert_eq!(a.request_id, id);
        assert_eq!(a.status, DataStatus::OutOfRange, "case {i}");
    }
}

/// A PUT_LOCAL of `length` bytes whose plan lists `ranges` and whose body is `body`.
fn put_local(id: u64, length: u64, ranges: Vec<(u64, u64)>, body: &[u8]) -> Vec<u8> {
    let mut bytes = RequestHeader::new(
        DataOp::PutLocal,
        id,
        moonkv_proto::SegmentId::new(0, 0),
        0,
        length,
    )
    .encode()
    .to_vec();
    LocalPlan {
        deadline_ns: monotonic_now_ns() + 5_000_000_000,
        ranges,
        flags: 0,
    }
    .encode_into(&mut bytes);
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn body(keys: &[&str], sizes: &[u64]) -> Vec<u8> {
    let request = BatchPutStartRequest {
        client_id: ClientId::random(),
        tenant: String::new(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        sizes: sizes.to_vec(),
        config: ReplicateConfig::default(),
    };
    rmp_serde::to_vec_named(&(false, &request)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_unattached_puts_are_refused_and_place_nothing() {
    let m = master().await;
    let n = node(&m, true).await;
    assert!(n.data_plane_stats().put_local);
    let value = pattern(5, 4096);
    let range = vec![(value.as_ptr() as u64, 4096)];
    let mut s = TcpStream::connect(n.endpoint()).await.unwrap();

    let unattached = put_local(1, 4096, range.clone(), &body(&["x"], &[4096]));
    let probe = refused_then_attach(&mut s, &unattached).await;
    // A body that is not a request, sizes that do not add up to the length, no key, and more
    // sizes than keys: refused one after the other on the same connection.
    let bad = [
        b"\xc1 not msgpack".to_vec(),
        body(&["x"], &[4000]),
        body(&[], &[]),
        body(&["x"], &[2048, 2048]),
    ];
    each_out_of_range(
        &mut s,
        |id, i| put_local(id, 4096, range.clone(), &bad[i]),
        bad.len(),
    )
    .await;
    // Then a good one on the same connection.
    s.write_all(&put_local(20, 4096, range.clone(), &body(&["x"], &[4096])))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    assert_eq!(a.status, DataStatus::Ok);
    let mut items = vec![0u8; a.length as usize];
    s.read_exact(&mut items).await.unwrap();
    let items: Vec<moonkv_proto::ItemResult<()>> = rmp_serde::from_slice(&items).unwrap();
    assert!(items[0].0.is_ok(), "{:?}", items[0].0);
    drop(probe);

    // A body longer than the limit cannot be skipped: answered, then the connection closes.
    let mut head = RequestHeader::new(
        DataOp::PutLocal,
        30,
        moonkv_proto::SegmentId::new(0, 0),
        0,
        4096,
    )
    .encode()
    .to_vec();
    LocalPlan {
        deadline_ns: monotonic_now_ns() + 5_000_000_000,
        ranges: range,
        flags: 0,
    }
    .encode_into(&mut head);
    head.extend_from_slice(&(MAX_PUT_LOCAL_BODY + 1).to_be_bytes());
    s.write_all(&head).await.unwrap();
    assert_eq!(answer(&mut s).await.status, DataStatus::BadHeader);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");

    // Only the good put placed anything, and the node still serves.
    let store = via_node(&n).await;
    assert_eq!(store.get("x").await.unwrap(), value);
    n.shutdown().await;
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_through_the_node_return_every_byte_and_every_answer_of_the_usual_path() {
    for in_process in [true, false] {
        let m = master().await;
        let n = node(&m, in_process).await;
        assert!(n.data_plane_stats().get_local);
        let store = via_node(&n).await;
        let cfg = ReplicateConfig::default();
        let values: Vec<Vec<u8>> = [1usize, 4099, 128 << 10, (3 << 20) + 5]
            .iter()
            .enumerate()
            .map(|(i, len)| pattern(i as u8, *len))
            .collect();
        let keys: Vec<String> = (0..values.len()).map(|i| format!("g{i}")).collect();
        for (k, v) in keys.iter().zip(&values) {
            store.put(k, v, &cfg).await.unwrap();
        }
        // The first get attaches its connection; count from there.
        let mut warm = [0u8; 1];
        store.get_into("g0", &mut warm).await.unwrap();
        let singles = counter(&m, "master_get_replica_list_requests_total").await;
        let batches = counter(&m, "master_batch_get_replica_list_requests_total").await;

        // Single gets into buffers larger than the object: the size, and the bytes at the start.
        for (k, v) in keys.iter().zip(&values) {
            let mut buf = vec![0xEEu8; v.len() + 100];
            assert_eq!(store.get_into(k, &mut buf).await.unwrap(), v.len());
            assert_eq!(&buf[..v.len()], &v[..], "{k} in_process={in_process}");
            assert!(buf[v.len()..].iter().all(|b| *b == 0xEE));
        }
        // A missing key: the usual code and a message naming it.
        let mut buf = vec![0u8; 64];
        let missing = store.get_into("nope", &mut buf).await.unwrap_err();
        assert_eq!(missing.code, ErrorCode::OBJECT_NOT_FOUND, "{missing}");
        assert!(missing.message.contains("nope"), "{missing}");
        // None of those asked for a single replica list.
        assert_eq!(
            counter(&m, "master_get_replica_list_requests_total").await,
            singles,
            "in_process={in_process}"
        );

        // A batch into one buffer at odd offsets, with a missing key and a buffer too small.
        let mut big = vec![0u8; 5 << 20];
        let mut names: Vec<&str> = keys.iter().map(String::as_str).collect();
        names.push("nope");
        names.push("g2");
        let mut lens: Vec<usize> = values.iter().map(Vec::len).collect();
        lens.push(10);
        lens.push(1000);
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        let mut rest = &mut big[3..];
        for len in &lens {
            let (this, after) = rest.split_at_mut(*len);
            bufs.push(this);
            rest = &mut after[7..];
        }
        let results = store.batch_get_into(&names, &mut bufs).await;
        for (i, v) in values.iter().enumerate() {
            assert_eq!(*results[i].as_ref().unwrap(), v.len(), "key {i}");
            assert_eq!(&bufs[i][..], &v[..], "key {i}");
        }
        assert_eq!(
            results[4].as_ref().unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        // Too small for the node: read the usual way, which answers as it always did.
        assert_eq!(
            results[5].as_ref().unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        // The node's question plus the usual path's for the one key it left.
        assert_eq!(
            counter(&m, "master_batch_get_replica_list_requests_total").await,
            batches + keys.len() as u64 + 1 + 2,
            "in_process={in_process}"
        );
        n.shutdown().await;
        m.shutdown().await;
    }
}

/// A GET_LOCAL of `length` bytes whose plan lists `ranges` and whose body is `body`.
fn get_local(id: u64, length: u64, ranges: Vec<(u64, u64)>, body: &[u8]) -> Vec<u8> {
    let mut bytes = put_local(id, length, ranges, body);
    bytes[5] = DataOp::GetLocal as u8;
    bytes
}

fn get_body(keys: &[&str], capacities: &[u64]) -> Vec<u8> {
    rmp_serde::to_vec(&("", keys, capacities)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_unattached_gets_are_refused_and_write_nothing() {
    let m = master().await;
    let n = node(&m, true).await;
    let store = via_node(&n).await;
    let value = pattern(6, 4096);
    store
        .put("x", &value, &ReplicateConfig::default())
        .await
        .unwrap();
    let mut target = vec![0u8; 4096];
    let range = vec![(target.as_mut_ptr() as u64, 4096)];
    let mut s = TcpStream::connect(n.endpoint()).await.unwrap();

    let unattached = get_local(1, 4096, range.clone(), &get_body(&["x"], &[4096]));
    let probe = refused_then_attach(&mut s, &unattached).await;
    // Not a request, capacities that do not add up to the length, no key, more capacities
    // than keys: refused one after the other on the same connection.
    let bad = [
        b"\xc1 not msgpack".to_vec(),
        get_body(&["x"], &[4000]),
        get_body(&[], &[]),
        get_body(&["x"], &[2048, 2048]),
    ];
    each_out_of_range(
        &mut s,
        |id, i| get_local(id, 4096, range.clone(), &bad[i]),
        bad.len(),
    )
    .await;
    assert!(target.iter().all(|b| *b == 0), "nothing written so far");

    // A good one on the same connection: the size, and the bytes.
    s.write_all(&get_local(
        19,
        4096,
        range.clone(),
        &get_body(&["x"], &[4096]),
    ))
    .await
    .unwrap();
    let a = answer(&mut s).await;
    assert_eq!(a.status, DataStatus::Ok);
    let mut items = vec![0u8; a.length as usize];
    s.read_exact(&mut items).await.unwrap();
    let items: Vec<moonkv_proto::ItemResult<u64>> = rmp_serde::from_slice(&items).unwrap();
    assert_eq!(items[0].0, Ok(4096));
    assert_eq!(target, value);

    // A buffer smaller than the object: left to the caller, nothing written.
    let small = vec![(target.as_mut_ptr() as u64, 100)];
    target.fill(0);
    s.write_all(&get_local(20, 100, small, &get_body(&["x"], &[100])))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    assert_eq!(a.status, DataStatus::Ok);
    let mut items = vec![0u8; a.length as usize];
    s.read_exact(&mut items).await.unwrap();
    let items: Vec<moonkv_proto::ItemResult<u64>> = rmp_serde::from_slice(&items).unwrap();
    assert_eq!(
        items[0].0.as_ref().unwrap_err().code,
        ErrorCode::NOT_SUPPORTED
    );
    assert!(target.iter().all(|b| *b == 0), "nothing written");
    drop(probe);
    n.shutdown().await;
    m.shutdown().await;
}

/// The master in this process answers the node's calls as values (nothing encoded), gives
/// each request back, and answers single Starts and scans as frames; an answer taken as
/// another type than its operation's is an internal error, never a wrong value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_in_process_answers_values_and_gives_requests_back() {
    use moonkv_proto::local::Answer;
    use moonkv_proto::msg::{
        BatchEndRequest, EndItem, KeysRequest, PutStartRequest, RegexRequest, Request,
    };
    use moonkv_proto::{GetReplicaListResponse, ItemResult, ReplicaDescriptor, ReplicaType};
    let m = master().await;
    let _n = node(&m, true).await;
    let master = m.in_process();
    let client_id = ClientId::random();
    let keys = vec!["value-a".to_string(), "value-b".to_string()];

    let start = Request::BatchPutStart(BatchPutStartRequest {
        client_id,
        tenant: String::new(),
        keys: keys.clone(),
        sizes: vec![4096, 8192],
        config: ReplicateConfig::default(),
    });
    let (back, answer) = master.answer(start.clone()).await;
    assert_eq!(back, start, "the request comes back as sent");
    assert!(matches!(answer, Answer::Value(Ok(_))), "{answer:?}");
    let started: Vec<ItemResult<Vec<ReplicaDescriptor>>> = answer.take().unwrap();
    let ids: Vec<_> = started
        .into_iter()
        .map(|item| {
            item.0
                .expect("started")
                .iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(ids.iter().all(|ids| ids.len() == 1), "{ids:?}");

    let end = Request::BatchPutEnd(BatchEndRequest {
        client_id,
        tenant: String::new(),
        replica_type: ReplicaType::All,
        items: keys
            .iter()
            .zip(&ids)
            .map(|(key, ids)| EndItem {
                key: key.clone(),
                replica_ids: ids.clone().into(),
                checksum: None,
            })
            .collect(),
    });
    let (_, answer) = master.answer(end).await;
    let ended: Vec<ItemResult<()>> = answer.take().unwrap();
    assert!(ended.iter().all(|item| item.0.is_ok()), "{ended:?}");

    let lists = Request::BatchGetReplicaList(KeysRequest {
        tenant: String::new(),
        keys: vec![keys[1].clone(), "never-put".into(), keys[0].clone()],
    });
    let (back, answer) = master.answer(lists.clone()).await;
    assert_eq!(back, lists);
    let lists: Vec<ItemResult<GetReplicaListResponse>> = answer.take().unwrap();
    assert_eq!(lists.len(), 3);
    let read = |i: usize| lists[i].0.as_ref().expect("readable").replicas.clone();
    assert_eq!(read(0).iter().map(|r| r.id).collect::<Vec<_>>(), ids[1]);
    assert_eq!(read(0)[0].size, 8192);
    assert_eq!(read(2).iter().map(|r| r.id).collect::<Vec<_>>(), ids[0]);
    assert_eq!(
        lists[1].0.as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );

    // Taken as another type: an internal error naming the type, not a value.
    let (_, answer) = master
        .answer(Request::BatchGetReplicaList(KeysRequest {
            tenant: String::new(),
            keys: keys.clone(),
        }))
        .await;
    let e = answer.take::<Vec<ItemResult<bool>>>().unwrap_err();
    assert_eq!(e.code, ErrorCode::INTERNAL_ERROR, "{e}");

    // A single Start (it may be held for space) comes as a frame, and decodes.
    let single = Request::PutStart(PutStartRequest {
        client_id,
        tenant: String::new(),
        key: "value-c".into(),
        size: 4096,
        config: ReplicateConfig::default(),
    });
    let (back, answer) = master.answer(single.clone()).await;
    assert_eq!(back, single);
    assert!(matches!(answer, Answer::Frame(_)), "{answer:?}");
    let replicas: Vec<ReplicaDescriptor> = answer.take().unwrap();
    assert_eq!(replicas.len(), 1);

    // A scan is not answered in process.
    let (_, answer) = master
        .answer(Request::GetReplicaListByRegex(RegexRequest {
            tenant: String::new(),
            regex: "value-.*".into(),
        }))
        .await;
    let e = answer
        .take::<Vec<(String, Vec<ReplicaDescriptor>)>>()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NOT_SUPPORTED, "{e}");
}

/// The master's `/kv_events/status`.
async fn events_status(master: &MasterHandle) -> serde_json::Value {
    let text = admin_get(master, "/kv_events/status").await;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap()
}

/// The master's `/kv_events/status` once every event it published was sent, or after about
/// two seconds.
async fn events_settled(master: &MasterHandle) -> serde_json::Value {
    let mut status = events_status(master).await;
    for _ in 0..200 {
        if status["queue_len"] == 0 && status["published_events"] == status["last_event_id"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = events_status(master).await;
    }
    status
}

/// A node answers a put it took whole before the End's events (one per key) are sent, and no
/// event is left behind: the master in the node's process leaves them to the node, which sends
/// them once the answer is out; a master over a connection sends them itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_of_puts_taken_whole_all_leave_after_their_answers() {
    for in_process in [true, false] {
        let mut config = MasterConfig::ephemeral();
        config.kv_events.enabled = true;
        config.kv_events.bind_endpoint = "tcp://127.0.0.1:0".into();
        config.kv_events.backend_id = "through-node".into();
        let m = server::start(config).await.expect("master starts");
        let n = node(&m, in_process).await;
        let store = via_node(&n).await;
        let cfg = ReplicateConfig::default();
        store.put("warm", b"w", &cfg).await.unwrap();
        let value = pattern(6, 24 * 4096);
        let values: Vec<&[u8]> = value.chunks(4096).collect();
        for round in 0..4 {
            let keys: Vec<String> = (0..24).map(|i| format!("e{round}-{i}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let results = store.batch_put_from(&refs, &values, &cfg).await;
            assert!(results.iter().all(Result::is_ok), "{results:?}");
            let status = events_settled(&m).await;
            // The warm key and every key of every batch so far, all sent.
            assert_eq!(status["last_event_id"], 1 + 24 * (round + 1), "{status}");
            assert_eq!(
                status["published_events"], status["last_event_id"],
                "{status}"
            );
            assert_eq!(status["queue_len"], 0, "{status}");
        }
        // A caller that gives up mid-put (a timeout drops its future), then puts again: the
        // node ends or revokes what it was given, and whatever it ended is sent too.
        let cancelled: Vec<String> = (0..24).map(|i| format!("c-{i}")).collect();
        let refs: Vec<&str> = cancelled.iter().map(String::as_str).collect();
        let put = store.batch_put_from(&refs, &values, &cfg);
        let _ = tokio::time::timeout(Duration::from_micros(200), put).await;
        let after: Vec<String> = (0..24).map(|i| format!("a-{i}")).collect();
        let refs: Vec<&str> = after.iter().map(String::as_str).collect();
        let results = store.batch_put_from(&refs, &values, &cfg).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let status = events_settled(&m).await;
        let last = status["last_event_id"].as_u64().unwrap();
        assert!((1 + 24 * 5..=1 + 24 * 6).contains(&last), "{status}");
        assert_eq!(status["published_events"], last, "{status}");
        assert_eq!(status["queue_len"], 0, "{status}");
        n.shutdown().await;
        m.shutdown().await;
    }
}
