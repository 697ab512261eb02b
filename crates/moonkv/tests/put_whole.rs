//! Puts handed whole to the node a store's writes land on (PUT_WHOLE over the socket, PUT_LOCAL
//! on the same host; `docs/data-plane.md`, *Puts through the node*), by a store that was only
//! given the master's address: the usual client of `moonkv up`. Real master and nodes on
//! 127.0.0.1; the caller is this process.

use moonkv_client::{Store, StoreConfig};
use moonkv_dataplane::header::{
    DataOp, DataStatus, GotWhole, RequestHeader, ResponseHeader, RESPONSE_LEN,
};
use moonkv_master::server::{self, MasterConfig, MasterHandle};
use moonkv_node::{Node, NodeConfig, NodeHandle};
use moonkv_proto::msg::BatchPutStartRequest;
use moonkv_proto::{ClientId, ErrorCode, ItemResult, ReplicateConfig};
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

/// A store that knows only the master; `same_host` as `MOONKV_SAME_HOST` would set it.
async fn store(master: &MasterHandle, same_host: bool) -> Store {
    let mut config = StoreConfig::new(master.rpc_addr().to_string());
    config.same_host = same_host;
    Store::connect(config).await.expect("store connects")
}

/// The value of counter `name` on the master's `/metrics`.
async fn counter(master: &MasterHandle, name: &str) -> u64 {
    let mut s = TcpStream::connect(master.admin_addr()).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect()
}

const PUT_STARTS: &str = "master_put_start_requests_total";
const BATCH_STARTS: &str = "master_batch_put_start_requests_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_hands_its_puts_whole_to_its_one_node_and_keeps_every_answer() {
    for (in_process, same_host) in [(true, false), (false, false), (true, true)] {
        let case = format!("in_process={in_process} same_host={same_host}");
        let m = master().await;
        let n = node(&m, in_process).await;
        assert!(n.data_plane_stats().put_whole);
        let store = store(&m, same_host).await;
        let cfg = ReplicateConfig::default();
        // The first put goes the usual way and shows where writes land.
        store.put("warm", b"w", &cfg).await.unwrap();
        assert_eq!(counter(&m, PUT_STARTS).await, 1, "{case}");
        let batch_starts = counter(&m, BATCH_STARTS).await;

        let one = pattern(1, 300_001);
        store.put_from("one", &one, &cfg).await.unwrap();
        assert_eq!(store.get("one").await.unwrap(), one, "{case}");
        // First writer wins, as on the usual path.
        let again = store.put("one", b"other", &cfg).await.unwrap_err();
        assert_eq!(
            again.code,
            ErrorCode::OBJECT_ALREADY_EXISTS,
            "{case}: {again}"
        );
        store.upsert("one", b"short", &cfg).await.unwrap();
        assert_eq!(store.get("one").await.unwrap(), b"short", "{case}");

        // A batch at odd offsets of one buffer, with a key that exists already.
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
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code, ErrorCode::OBJECT_ALREADY_EXISTS, "{case}");
            } else {
                r.as_ref().unwrap();
                assert_eq!(
                    store.get(refs[i]).await.unwrap(),
                    values[i],
                    "{case} key {i}"
                );
            }
        }
        let results = store.batch_upsert_from(&refs, &values, &cfg).await;
        assert!(results.iter().all(Result::is_ok), "{case}: {results:?}");
        assert_eq!(store.get("one").await.unwrap(), values[4], "{case}");

        // None of that took the three-step path: the node started every write itself.
        assert_eq!(counter(&m, PUT_STARTS).await, 1, "{case}");
        assert!(
            counter(&m, BATCH_STARTS).await >= batch_starts + 3,
            "{case}"
        );

        // A batch of 3 MiB goes the usual way over the socket (one batch start, the caller's),
        // and as one request on the same host (one batch start, the node's); never as one
        // start per group of keys, and the master sees no single start.
        let chunky = pattern(5, 24 * 128 * 1024);
        let parts: Vec<&[u8]> = chunky.chunks(128 * 1024).collect();
        let names: Vec<String> = (0..24).map(|i| format!("g{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let before = counter(&m, BATCH_STARTS).await;
        let results = store.batch_put_from(&refs, &parts, &cfg).await;
        assert!(results.iter().all(Result::is_ok), "{case}: {results:?}");
        let starts = counter(&m, BATCH_STARTS).await - before;
        assert_eq!(starts, 1, "{case}");
        for (name, part) in refs.iter().zip(&parts) {
            assert!(store.get(name).await.unwrap() == *part, "{case} {name}");
        }
        assert_eq!(counter(&m, PUT_STARTS).await, 1, "{case}");

        // A put too large for one connection goes the usual way over the socket, and the
        // store keeps handing its small puts to the node.
        let large = pattern(4, (2 * MIB + 3) as usize);
        store.put_from("large", &large, &cfg).await.unwrap();
        assert!(store.get("large").await.unwrap() == large, "{case}");
        let usual = if same_host { 1 } else { 2 };
        assert_eq!(counter(&m, PUT_STARTS).await, usual, "{case}");
        store.put("after", b"a", &cfg).await.unwrap();
        assert_eq!(counter(&m, PUT_STARTS).await, usual, "{case}");
        assert_eq!(store.get("after").await.unwrap(), b"a", "{case}");
        n.shutdown().await;
        m.shutdown().await;
    }
}

/// With two nodes the master places about half the keys on the other one: those come back
/// and are written the usual way, and the store soon stops handing puts to one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_nodes_every_key_lands_and_the_store_stops_handing_puts_over() {
    let m = master().await;
    let (a, b) = (node(&m, true).await, node(&m, false).await);
    let store = store(&m, false).await;
    let cfg = ReplicateConfig::default();
    let n = 200;
    for i in 0..n {
        store
            .put(&format!("k{i}"), &pattern(i as u8, 4096 + i), &cfg)
            .await
            .unwrap();
    }
    let mut on = std::collections::BTreeSet::new();
    for i in 0..n {
        let key = format!("k{i}");
        assert_eq!(store.get(&key).await.unwrap(), pattern(i as u8, 4096 + i));
        for r in store.replicas(&key).await.unwrap().replicas {
            on.insert(r.endpoint);
        }
    }
    assert_eq!(on.len(), 2, "keys on both nodes: {on:?}");
    // Handed over until the share left behind was judged, then never again.
    let handed = counter(&m, BATCH_STARTS).await;
    assert!(handed > 0, "the store tried the node first");
    assert!(handed <= 64, "{handed} puts handed to one node of two");
    assert!(counter(&m, PUT_STARTS).await >= (n as u64) - handed);
    a.shutdown().await;
    b.shutdown().await;
    m.shutdown().await;
}

/// A node killed while a store hands it puts: the store goes back to the usual path and
/// places its next puts on the node that is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_node_is_gone_writes_the_usual_way_again() {
    let m = master().await;
    let a = node(&m, false).await;
    let store = store(&m, false).await;
    let cfg = ReplicateConfig::default();
    for i in 0..4 {
        store.put(&format!("a{i}"), b"x", &cfg).await.unwrap();
    }
    assert!(counter(&m, BATCH_STARTS).await >= 2, "handed to node a");
    let b = node(&m, false).await;
    let b_endpoint = b.endpoint().to_string();
    a.shutdown().await;
    // Bounded: the master learns that a's segment is gone when it unmounts.
    let mut written = false;
    for attempt in 0..50 {
        match store.put(&format!("b{attempt}"), b"y", &cfg).await {
            Ok(()) => {
                let on = store.replicas(&format!("b{attempt}")).await.unwrap();
                assert!(on.replicas.iter().all(|r| *r.endpoint == *b_endpoint));
                written = true;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(written, "no put succeeded after the node went away");
    for i in 0..4 {
        store.put(&format!("c{i}"), b"z", &cfg).await.unwrap();
        assert_eq!(store.get(&format!("c{i}")).await.unwrap(), b"z");
    }
    b.shutdown().await;
    m.shutdown().await;
}

fn put_whole(id: u64, body: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut bytes = RequestHeader::new(
        DataOp::PutWhole,
        id,
        moonkv_proto::SegmentId::new(0, 0),
        0,
        payload.len() as u64,
    )
    .encode()
    .to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(payload);
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

async fn answer(stream: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut raw).await.unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

async fn items(stream: &mut TcpStream, length: u64) -> Vec<ItemResult<()>> {
    let mut raw = vec![0u8; length as usize];
    stream.read_exact(&mut raw).await.unwrap();
    rmp_serde::from_slice(&raw).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_broken_whole_puts_are_refused_and_place_nothing() {
    let m = master().await;
    let n = node(&m, true).await;
    let value = pattern(5, 4096);
    let mut s = TcpStream::connect(n.endpoint()).await.unwrap();
    // A body that is not a request, sizes that do not add up to the length, no key, more
    // sizes than keys: each refused after its payload was read, on the same connection.
    let bad = [
        b"\xc1 not msgpack".to_vec(),
        body(&["x"], &[4000]),
        body(&[], &[]),
        body(&["x"], &[2048, 2048]),
    ];
    for (i, b) in bad.iter().enumerate() {
        let id = 10 + i as u64;
        s.write_all(&put_whole(id, b, &value)).await.unwrap();
        let a = answer(&mut s).await;
        assert_eq!(
            (a.request_id, a.status),
            (id, DataStatus::OutOfRange),
            "case {i}"
        );
    }
    // Then a good one, two keys, on the same connection.
    let two = [value.clone(), pattern(6, 100)].concat();
    s.write_all(&put_whole(20, &body(&["x", "y"], &[4096, 100]), &two))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    assert_eq!((a.request_id, a.status), (20, DataStatus::Ok));
    let got = items(&mut s, a.length).await;
    assert!(got.iter().all(|i| i.0.is_ok()), "{got:?}");
    // A key that exists is answered as the master answers it, its bytes read and dropped;
    // the request's other key is written.
    s.write_all(&put_whole(21, &body(&["x", "z"], &[4096, 100]), &two))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    let got = items(&mut s, a.length).await;
    assert_eq!(
        got[0].0.as_ref().unwrap_err().code,
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert!(got[1].0.is_ok());

    // A put whose connection breaks mid-payload: half the bytes, then the caller is gone.
    let cut = put_whole(30, &body(&["cut"], &[8192]), &pattern(7, 8192));
    s.write_all(&cut[..cut.len() - 4096]).await.unwrap();
    drop(s);

    let store = store(&m, false).await;
    assert_eq!(store.get("x").await.unwrap(), value);
    assert_eq!(store.get("y").await.unwrap(), pattern(6, 100));
    assert_eq!(store.get("z").await.unwrap(), pattern(6, 100));
    // The broken put was revoked by the node: the key is free, never half written. Bounded,
    // while the node notices the close.
    let mut freed = false;
    for _ in 0..100 {
        match store
            .put("cut", b"whole", &ReplicateConfig::default())
            .await
        {
            Ok(()) => {
                freed = true;
                break;
            }
            Err(e) => {
                assert_ne!(e.code, ErrorCode::OBJECT_NOT_FOUND);
                assert!(store.get("cut").await.is_err(), "half a value is readable");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(freed, "the broken put's key stayed taken");
    assert_eq!(store.get("cut").await.unwrap(), b"whole");
    n.shutdown().await;
    m.shutdown().await;
}

/// A payload read with a receive low-water mark (`docs/data-plane.md`, *Waking for whole
/// chunks*): a large key, then a key whose bytes are read and dropped (it exists already), the
/// last of whose bytes come after a pause. The answer comes at once, not after the node's
/// 30-second no-progress deadline (a mark left from the large key, above the bytes still to
/// come, would hold the read until then), and the connection serves its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_key_after_a_large_one_is_read_without_waiting_for_bytes_not_coming() {
    let m = master().await;
    let n = node(&m, true).await;
    let store = store(&m, false).await;
    store
        .put("lw-b", b"already here", &ReplicateConfig::default())
        .await
        .unwrap();
    let (a, b) = (pattern(11, 700_001), pattern(12, 200_000));
    let payload = [a.clone(), b].concat();
    let request = put_whole(40, &body(&["lw-a", "lw-b"], &[700_001, 200_000]), &payload);
    let mut s = TcpStream::connect(n.endpoint()).await.unwrap();
    s.set_nodelay(true).unwrap();
    let exchange = async {
        // All but the last 50,000 bytes, in pieces; then, once the node has read what came,
        // the rest.
        let (now, later) = request.split_at(request.len() - 50_000);
        for piece in now.chunks(64_000) {
            s.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(later).await.unwrap();
        let first = answer(&mut s).await;
        let got = items(&mut s, first.length).await;
        // The next request on the same connection: a small put, whose header the node must
        // read with the default mark.
        let small = pattern(14, 100);
        s.write_all(&put_whole(41, &body(&["lw-d"], &[100]), &small))
            .await
            .unwrap();
        let second = answer(&mut s).await;
        let got2 = items(&mut s, second.length).await;
        (first, got, second, got2)
    };
    let (first, got, second, got2) = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the node held a read for bytes that were not coming");
    assert_eq!((first.request_id, first.status), (40, DataStatus::Ok));
    assert!(got[0].0.is_ok(), "{got:?}");
    assert_eq!(
        got[1].0.as_ref().unwrap_err().code,
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert_eq!((second.request_id, second.status), (41, DataStatus::Ok));
    assert!(got2[0].0.is_ok(), "{got2:?}");
    assert_eq!(store.get("lw-a").await.unwrap(), a);
    assert_eq!(store.get("lw-b").await.unwrap(), b"already here");
    assert_eq!(store.get("lw-d").await.unwrap(), pattern(14, 100));
    n.shutdown().await;
    m.shutdown().await;
}

/// Polls `call` at most `polls` times; `None` when it was dropped unfinished (what a caller's
/// timeout does, at a point chosen by wake-ups rather than by the timer's resolution).
async fn cut_after<F: std::future::Future>(polls: u32, call: F) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let mut seen = 0;
    std::future::poll_fn(|cx| {
        seen += 1;
        if seen > polls {
            return std::task::Poll::Ready(None);
        }
        call.as_mut().poll(cx).map(Some)
    })
    .await
}

/// A caller that gives up on its puts mid-call (the future dropped while the bytes are on their
/// way, or while the node ends the write): readers see one writer's whole value or none, never
/// a mix, and the key takes a new write afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_dropped_mid_call_leave_whole_values_or_none() {
    let m = master().await;
    let n = node(&m, true).await;
    let store = store(&m, false).await;
    let cfg = ReplicateConfig::default();
    store.put("warm", b"w", &cfg).await.unwrap();
    let values = [pattern(1, MIB as usize), pattern(2, MIB as usize)];
    for polls in 1..=40u32 {
        let value = &values[(polls % 2) as usize];
        // How many polls a call needs depends on the machine's scheduling, so some of these may
        // finish uncut; `faults.rs` holds the cut that cannot miss (the node stalled mid-payload).
        let _ = cut_after(polls, store.upsert("c", value, &cfg)).await;
        match store.get("c").await {
            Ok(got) => assert!(
                got == values[0] || got == values[1],
                "a mix after {polls} polls"
            ),
            Err(e) => assert!(
                matches!(
                    e.code,
                    ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
                ),
                "{e}"
            ),
        }
    }
    // Bounded: a write cut after its start is revoked once the node sees the connection go.
    let mut written = false;
    for _ in 0..100 {
        if store.upsert("c", b"last", &cfg).await.is_ok() {
            written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(written, "the key never took a new write");
    assert_eq!(store.get("c").await.unwrap(), b"last");
    n.shutdown().await;
    m.shutdown().await;
}

const LISTS: &str = "master_get_replica_list_requests_total";
const BATCH_LISTS: &str = "master_batch_get_replica_list_requests_total";

/// A store that takes the usual path for everything, to compare answers with.
async fn usual_store(master: &MasterHandle) -> Store {
    let mut config = StoreConfig::new(master.rpc_addr().to_string());
    config.same_host = false;
    config.hand_puts_to_node = false;
    Store::connect(config).await.expect("store connects")
}

/// Gets, once the store hands its puts to its node, go whole to that node (GET_WHOLE over the
/// socket, GET_LOCAL on the same host): the same bytes and errors as the usual path, and no
/// replica list asked by the store itself (but for `get` on the same host, which must learn
/// the size first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_gets_whole_from_its_node_with_the_answers_of_the_usual_path() {
    for (in_process, same_host) in [(true, false), (false, false), (true, true)] {
        let case = format!("in_process={in_process} same_host={same_host}");
        let m = master().await;
        let n = node(&m, in_process).await;
        assert!(n.data_plane_stats().get_whole, "{case}");
        let store = store(&m, same_host).await;
        let usual = usual_store(&m).await;
        let cfg = ReplicateConfig::default();
        store.put("warm", b"w", &cfg).await.unwrap();
        store.put("warm2", b"w", &cfg).await.unwrap();
        let sizes = [1usize, 4096, 300_001, MIB as usize];
        let values: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, s)| pattern(i as u8, *s))
            .collect();
        for (i, v) in values.iter().enumerate() {
            store.put(&format!("v{i}"), v, &cfg).await.unwrap();
        }
        let large = pattern(9, (2 * MIB + 3) as usize);
        store.put("large", &large, &cfg).await.unwrap();

        let lists = counter(&m, LISTS).await;
        let batch_lists = counter(&m, BATCH_LISTS).await;
        for (i, v) in values.iter().enumerate() {
            let key = format!("v{i}");
            assert!(store.get(&key).await.unwrap() == *v, "{case} get {key}");
            let mut exact = vec![0u8; v.len()];
            assert_eq!(store.get_into(&key, &mut exact).await.unwrap(), v.len());
            assert!(exact == *v, "{case} get_into {key}");
            let mut roomy = vec![7u8; v.len() + 100];
            assert_eq!(store.get_into(&key, &mut roomy).await.unwrap(), v.len());
            assert!(roomy[..v.len()] == v[..], "{case} roomy get_into {key}");
        }
        // The 2 MiB object is larger than a get hands over: the node sends its list back.
        assert!(store.get("large").await.unwrap() == large, "{case}");
        let gets = if same_host {
            values.len() as u64 + 1
        } else {
            0
        };
        assert_eq!(
            counter(&m, LISTS).await,
            lists + gets,
            "{case}: the store asked for lists"
        );
        assert!(counter(&m, BATCH_LISTS).await > batch_lists, "{case}");

        // Errors as on the usual path.
        for key in ["missing", "v2"] {
            let mut small = vec![0u8; 10];
            let whole = store.get_into(key, &mut small).await.unwrap_err();
            let other = usual.get_into(key, &mut small).await.unwrap_err();
            assert_eq!(whole.code, other.code, "{case} {key}: {whole} / {other}");
        }
        let e = store.get("missing").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND, "{case}: {e}");

        // A batch into the caller's buffers, with a missing key and a buffer too small.
        let keys = ["v0", "v1", "missing", "v2", "v1"];
        let lens = [1usize, 4096, 5, 300_001, 100];
        let mut whole_bufs: Vec<Vec<u8>> = lens.iter().map(|l| vec![0u8; *l]).collect();
        let mut usual_bufs = whole_bufs.clone();
        let mut refs: Vec<&mut [u8]> = whole_bufs.iter_mut().map(|b| &mut b[..]).collect();
        let got = store.batch_get_into(&keys, &mut refs).await;
        let mut refs: Vec<&mut [u8]> = usual_bufs.iter_mut().map(|b| &mut b[..]).collect();
        let want = usual.batch_get_into(&keys, &mut refs).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            match (g, w) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{case} key {i}"),
                (Err(a), Err(b)) => assert_eq!(a.code, b.code, "{case} key {i}: {a} / {b}"),
                _ => panic!("{case} key {i}: {g:?} against {w:?}"),
            }
        }
        assert_eq!(whole_bufs, usual_bufs, "{case}");

        // A batch into new buffers, with a missing key and one larger than a whole get.
        let keys = ["v0", "v1", "missing", "v2", "large", "v1"];
        let got = store.batch_get(&keys).await;
        let want = usual.batch_get(&keys).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            match (g, w) {
                (Ok(a), Ok(b)) => assert!(a == b, "{case} key {i}"),
                (Err(a), Err(b)) => assert_eq!(a.code, b.code, "{case} key {i}: {a} / {b}"),
                _ => panic!("{case} key {i}: {:?} against {:?}", g.is_ok(), w.is_ok()),
            }
        }
        n.shutdown().await;
        m.shutdown().await;
    }
}

/// Two nodes: a store's gets go to the node its puts went to, and keys on the other node come
/// back with their lists, read from that node without asking the master again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_another_node_are_read_with_the_list_the_node_sent() {
    let m = master().await;
    let (a, b) = (node(&m, true).await, node(&m, false).await);
    let on = |n: &NodeHandle| ReplicateConfig {
        preferred_segments: vec![n.segments()[0].name.to_string()],
        ..ReplicateConfig::default()
    };
    let store = store(&m, false).await;
    for i in 0..3 {
        store.put(&format!("a{i}"), b"on a", &on(&a)).await.unwrap();
    }
    let values: Vec<Vec<u8>> = (0..4).map(|i| pattern(i, 10_000 + i as usize)).collect();
    for (i, v) in values.iter().enumerate() {
        store.put(&format!("b{i}"), v, &on(&b)).await.unwrap();
        let r = store.replicas(&format!("b{i}")).await.unwrap();
        assert_eq!(&*r.replicas[0].endpoint, b.endpoint());
    }
    let lists = counter(&m, LISTS).await;
    for (i, v) in values.iter().enumerate() {
        assert_eq!(store.get(&format!("b{i}")).await.unwrap(), *v);
    }
    assert_eq!(store.get("a0").await.unwrap(), b"on a");
    assert_eq!(counter(&m, LISTS).await, lists, "the store asked for lists");
    a.shutdown().await;
    b.shutdown().await;
    m.shutdown().await;
}

fn get_whole(id: u64, body: &[u8], capacity: u64) -> Vec<u8> {
    let mut bytes = RequestHeader::new(
        DataOp::GetWhole,
        id,
        moonkv_proto::SegmentId::new(0, 0),
        0,
        capacity,
    )
    .encode()
    .to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Malformed GET_WHOLE requests are refused with the connection still in step; a good one is
/// answered with one item per key, then the bytes of the keys read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_whole_gets_are_refused_and_good_ones_answered_key_by_key() {
    let m = master().await;
    let n = node(&m, true).await;
    let store = store(&m, false).await;
    let cfg = ReplicateConfig::default();
    let (x, y) = (pattern(1, 5000), pattern(2, 300));
    store.put("x", &x, &cfg).await.unwrap();
    store.put("y", &y, &cfg).await.unwrap();
    let req = |keys: &[&str], caps: &[u64]| rmp_serde::to_vec(&("", keys, caps)).unwrap();
    let mut s = TcpStream::connect(n.endpoint()).await.unwrap();
    // Not a request, capacities that do not add up, no key, more capacities than keys, a
    // zero... each refused on the same connection.
    let bad: [(Vec<u8>, u64); 4] = [
        (b"\xc1 not msgpack".to_vec(), 10),
        (req(&["x"], &[10]), 11),
        (req(&[], &[]), 0),
        (req(&["x"], &[5, 5]), 10),
    ];
    for (i, (b, cap)) in bad.iter().enumerate() {
        let id = 10 + i as u64;
        s.write_all(&get_whole(id, b, *cap)).await.unwrap();
        let a = answer(&mut s).await;
        assert_eq!(
            (a.request_id, a.status, a.length),
            (id, DataStatus::OutOfRange, 0),
            "case {i}"
        );
    }
    s.write_all(&get_whole(19, &req(&["x"], &[65 << 20]), 65 << 20))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    assert_eq!((a.request_id, a.status), (19, DataStatus::TooLarge));
    // Then a good one: x read, a missing key, y larger than its capacity (its list instead).
    s.write_all(&get_whole(
        20,
        &req(&["x", "nope", "y"], &[6000, 10, 299]),
        6309,
    ))
    .await
    .unwrap();
    let a = answer(&mut s).await;
    assert_eq!((a.request_id, a.status), (20, DataStatus::Ok));
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let len = u32::from_be_bytes(len) as u64;
    let mut raw = vec![0u8; len as usize];
    s.read_exact(&mut raw).await.unwrap();
    let got: Vec<ItemResult<GotWhole>> = rmp_serde::from_slice(&raw).unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].0.as_ref().unwrap(), &GotWhole::Bytes(5000));
    assert_eq!(
        got[1].0.as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    match got[2].0.as_ref().unwrap() {
        GotWhole::Elsewhere(list) => assert_eq!(list.replicas[0].size, 300),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.length, 4 + len + 5000);
    let mut bytes = vec![0u8; 5000];
    s.read_exact(&mut bytes).await.unwrap();
    assert_eq!(bytes, x);
    // Still in step: another request on the same connection.
    s.write_all(&get_whole(21, &req(&["y"], &[300]), 300))
        .await
        .unwrap();
    let a = answer(&mut s).await;
    assert_eq!((a.request_id, a.status), (21, DataStatus::Ok));
    n.shutdown().await;
    m.shutdown().await;
}

/// A caller that gives up on its gets mid-call: the store's next gets still read the right
/// bytes (a connection left mid-answer is never reused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_dropped_mid_call_leave_the_store_reading_right() {
    let m = master().await;
    let n = node(&m, true).await;
    let store = store(&m, false).await;
    let cfg = ReplicateConfig::default();
    store.put("warm", b"w", &cfg).await.unwrap();
    let values = [pattern(1, MIB as usize), pattern(2, 200_000)];
    store.put("a", &values[0], &cfg).await.unwrap();
    store.put("b", &values[1], &cfg).await.unwrap();
    let mut buf = vec![0u8; MIB as usize];
    for polls in 1..=40u32 {
        let key = ["a", "b"][(polls % 2) as usize];
        let _ = cut_after(polls, store.get_into(key, &mut buf)).await;
        for (key, value) in [("a", &values[0]), ("b", &values[1])] {
            let n = store.get_into(key, &mut buf).await.unwrap();
            assert!(
                buf[..n] == value[..],
                "{key} after a get cut at {polls} polls"
            );
        }
    }
    n.shutdown().await;
    m.shutdown().await;
}
