//! The batch data path against real processes: one `moonkv master` and three `moonkv node`s on
//! loopback, driven by the `moonkv_client::Store` library.
//!
//! A batch answers per key (a bad key never fails its neighbours; a node dying mid-batch fails
//! only keys it held), moves the bytes of all keys over a bounded pool of connections per node,
//! and never leaves a torn object: every object read back is compared byte for byte.

use moonkv_client::{ErrorCode, ReplicateConfig, Store, StoreConfig};
use moonkv_node::failpoints::WRITE_MID_PAYLOAD;
use moonkv_testkit::admin::*;
use moonkv_testkit::payload::{payload, Rng};
use moonkv_testkit::{Moonkv, Proc};
use std::collections::BTreeMap;
use std::time::Duration;

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// Generous bound for anything the master does on its own schedule (TTL expiry, sweeps).
const SETTLE: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

async fn store(master: &Proc, adjust: impl FnOnce(&mut StoreConfig)) -> Store {
    let mut config = StoreConfig::new(master.field("rpc"));
    config.transfer_timeout = Duration::from_secs(30);
    adjust(&mut config);
    Store::connect(config).await.expect("store connects")
}

fn preferring(segments: &[&str]) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: segments.iter().map(|s| s.to_string()).collect(),
        ..ReplicateConfig::default()
    }
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

fn slices(values: &[Vec<u8>]) -> Vec<&[u8]> {
    values.iter().map(Vec::as_slice).collect()
}

/// Space the master charges an object of `size` bytes (its 64-byte allocation granularity).
fn aligned(size: usize) -> u64 {
    (size as u64).div_ceil(64) * 64
}

/// Used bytes of one segment as the master reports them.
fn used(admin: &str, segment: &str) -> u64 {
    segments(admin)
        .expect("segments detail")
        .into_iter()
        .find(|(n, _)| n == segment)
        .map(|(_, u)| u)
        .expect("segment mounted")
}

fn code<T: std::fmt::Debug>(result: &moonkv_client::Result<T>) -> ErrorCode {
    result.as_ref().expect_err("an error").code
}

/// Blocks in the node that dies: its segment is cut into this many holes of [`HOLE`] bytes.
const HOLES: usize = 300;
const HOLE: usize = 2048;

/// Leaves `segment` (exactly `2 * HOLES * HOLE` bytes) with `HOLES` free holes of `HOLE` bytes
/// and no larger free extent: fills it with `HOLE`-byte objects, then removes every other one
/// by address. An object larger than `HOLE` then never fits there, and `HOLES` objects of at
/// most `HOLE` bytes all do, whatever order the master places a batch in.
async fn cut_into_holes(s: &Store, admin: &str, segment: &str) {
    let keys: Vec<String> = (0..2 * HOLES).map(|i| format!("fill-{i:04}")).collect();
    let filler = vec![0xa5u8; HOLE];
    // One put each, so each filler is exactly one WRITE request at the node (a batch would
    // merge the neighbours into fewer requests, and the failpoint counts requests).
    for key in &keys {
        s.put(key, &filler, &preferring(&[segment])).await.unwrap();
    }
    assert_eq!(used(admin, segment), (2 * HOLES * HOLE) as u64);
    let mut placed = s.list("^fill-").await.unwrap();
    assert_eq!(placed.len(), keys.len());
    assert!(placed
        .iter()
        .all(|o| *o.replicas[0].segment_name == *segment));
    placed.sort_by_key(|o| o.replicas[0].address);
    let every_other: Vec<&str> = placed.iter().step_by(2).map(|o| o.key.as_str()).collect();
    let removed = s.batch_remove(&every_other, true).await;
    assert!(removed.iter().all(Result::is_ok), "{removed:?}");
    wait_for(SETTLE, "the removed fillers' space to come back", || {
        (used(admin, segment) == (HOLES * HOLE) as u64).then_some(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_batch_moves_its_keys_and_tears_no_object() {
    let m = MOONKV.master(&["--client-live-ttl-sec", "2"]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    // seg-k serves the 2 * HOLES writes of the fillers, then ends itself half-way into its
    // (HOLES / 2 + 1)-th write of the batch.
    let mut k = MOONKV.node_with_failpoints(
        &rpc,
        "seg-k",
        &(2 * HOLES * HOLE).to_string(),
        &format!("{WRITE_MID_PAYLOAD}={}*off->return", 2 * HOLES + HOLES / 2),
    );
    // seg-a fills up part way through the batch; seg-b takes the rest.
    let _a = MOONKV.node(&rpc, "seg-a", "1MiB");
    let _b = MOONKV.node(&rpc, "seg-b", "16MiB");
    // Every write a WRITE request at the node, as the failpoint counts them.
    let s = store(&m, |c| c.hand_puts_to_node = false).await;
    cut_into_holes(&s, &admin, "seg-k").await;

    // Every key tries seg-k first: the 300 keys of at most HOLE bytes land there (one per
    // hole), the 700 larger ones cannot and go to seg-a, then seg-b.
    let n = 1000;
    let on_k = |i: usize| i % 10 < 3;
    let mut rng = Rng(0xba7c);
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i:04}")).collect();
    let values: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let size = if on_k(i) {
                HOLE - rng.below(64) as usize
            } else {
                HOLE + 1 + rng.below(4096) as usize
            };
            payload(i as u32, 1, size)
        })
        .collect();
    let results = s
        .batch_put_from(
            &strs(&keys),
            &slices(&values),
            &preferring(&["seg-k", "seg-a", "seg-b"]),
        )
        .await;
    k.expect_failpoint_exit(WRITE_MID_PAYLOAD, SETTLE);
    assert_eq!(results.len(), n);

    // Every key is acknowledged: a key whose write into seg-k broke off was revoked, seg-k was
    // reported, and the key placed again on a surviving node within the same call. At most the
    // HOLES / 2 writes seg-k finished were committed there.
    for (i, result) in results.iter().enumerate() {
        if let Err(e) = result {
            panic!("{} failed: {e}", keys[i]);
        }
    }

    // The master lists every key, each where it was committed.
    let mut on_segment: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for object in s.list("^key-").await.unwrap() {
        let i: usize = object.key["key-".len()..].parse().unwrap();
        assert_eq!(object.size, values[i].len() as u64);
        let segment: &str = &object.replicas[0].segment_name;
        assert!(
            on_k(i) || segment != "seg-k",
            "{} is on {segment}",
            object.key
        );
        on_segment.entry(segment.to_string()).or_default().push(i);
    }
    let committed_on_k = on_segment.remove("seg-k").unwrap_or_default();
    let on_a = on_segment.remove("seg-a").unwrap_or_default();
    let on_b = on_segment.remove("seg-b").unwrap_or_default();
    assert!(on_segment.is_empty(), "{on_segment:?}");
    assert!(
        committed_on_k.len() <= HOLES / 2,
        "{} committed on seg-k",
        committed_on_k.len()
    );
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "not spread over three nodes"
    );
    assert_eq!(
        on_a.len() + on_b.len() + committed_on_k.len(),
        n,
        "a key is not listed"
    );
    let moved = on_a.iter().chain(&on_b).filter(|&&i| on_k(i)).count();
    assert_eq!(moved + committed_on_k.len(), HOLES);
    eprintln!(
        "{moved} keys placed again after seg-k died; {} committed there before",
        committed_on_k.len()
    );

    // One batch read of every key: the living ones byte-exact, those on seg-k never wrong.
    let mut bufs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let mut targets: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    let got = s.batch_get_into(&strs(&keys), &mut targets).await;
    for i in 0..n {
        match (&got[i], committed_on_k.contains(&i)) {
            (Ok(size), false) => {
                assert_eq!(*size, values[i].len());
                assert!(bufs[i] == values[i], "{} came back torn", keys[i]);
            }
            (Err(e), true) => assert!(
                matches!(
                    e.code,
                    ErrorCode::TRANSFER_FAIL | ErrorCode::OBJECT_NOT_FOUND
                ),
                "{}: {e}",
                keys[i]
            ),
            (other, _) => panic!("{}: {other:?}", keys[i]),
        }
    }

    // After seg-k's TTL: only the keys on the living nodes are left, with exactly their bytes.
    let bytes = |keys: &[usize]| keys.iter().map(|&i| aligned(values[i].len())).sum::<u64>();
    let mut kept: Vec<usize> = on_a.iter().chain(&on_b).copied().collect();
    kept.sort_unstable();
    wait_for_master_state(
        &admin,
        SETTLE,
        &[("seg-a", bytes(&on_a)), ("seg-b", bytes(&on_b))],
        kept.len() as u64,
    );
    let expected: Vec<String> = kept.iter().map(|&i| keys[i].clone()).collect();
    assert_eq!(all_keys(&admin).unwrap(), expected);
    let lost: Vec<&str> = committed_on_k.iter().map(|&i| keys[i].as_str()).collect();
    let exists = s.batch_exists(&lost).await;
    assert!(exists.iter().all(|e| matches!(e, Ok(false))), "{exists:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_answers_every_key_precisely() {
    let m = MOONKV.master(&[]);
    let admin = m.field("admin");
    let rpc = m.field("rpc");
    let _nodes: Vec<Proc> = ["seg-1", "seg-2", "seg-3"]
        .iter()
        .map(|name| MOONKV.node(&rpc, name, "16MiB"))
        .collect();
    let s = store(&m, |_| {}).await;
    // The too-large key's failed allocation asks for an eviction round; pinned objects cannot
    // be taken by it before they are read back.
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::default()
    };

    let huge = vec![7u8; 16 * MIB + 4096];
    let values = [
        payload(1, 1, 10_000),
        huge.clone(),
        payload(2, 1, 300_000),
        payload(3, 1, 5_000),
        payload(4, 1, 64),
        payload(3, 2, 7_000),
        Vec::new(),
        payload(5, 1, 1),
    ];
    let keys = [
        "mix-0",
        "mix-huge",
        "mix-1",
        "mix-dup",
        "",
        "mix-dup",
        "mix-empty",
        "mix-2",
    ];
    let put = s.batch_put_from(&keys, &slices(&values), &pinned).await;
    assert_eq!(put.len(), keys.len());
    for i in [0, 2, 3, 7] {
        assert!(put[i].is_ok(), "{}: {:?}", keys[i], put[i]);
    }
    assert_eq!(
        code(&put[1]),
        ErrorCode::NO_AVAILABLE_HANDLE,
        "{:?}",
        put[1]
    );
    assert_eq!(code(&put[4]), ErrorCode::INVALID_KEY, "{:?}", put[4]);
    // Within one batch the first occurrence of a key wins.
    assert_eq!(
        code(&put[5]),
        ErrorCode::OBJECT_ALREADY_EXISTS,
        "{:?}",
        put[5]
    );
    assert_eq!(code(&put[6]), ErrorCode::INVALID_PARAMS, "{:?}", put[6]);

    let stored = [0usize, 2, 3, 7];
    let charged: u64 = stored.iter().map(|&i| aligned(values[i].len())).sum();
    assert_eq!(
        all_keys(&admin).unwrap(),
        ["mix-0", "mix-1", "mix-2", "mix-dup"]
    );
    assert_eq!(
        metric(&admin, "master_allocated_bytes"),
        Some(charged as f64)
    );
    assert!(s.get("mix-dup").await.unwrap() == values[3]);

    // Reads: each buffer and key is judged on its own.
    let mut exact0 = vec![0u8; values[0].len()];
    let mut unused = vec![0u8; 16];
    let mut unused2 = vec![0u8; 16];
    let mut unused3 = vec![0u8; 16];
    let mut dup = vec![0u8; values[3].len()];
    let mut too_small = vec![0u8; values[2].len() - 1];
    let mut roomy = vec![0xeeu8; values[7].len() + 100];
    let mut bufs: Vec<&mut [u8]> = vec![
        &mut exact0,
        &mut unused,
        &mut unused2,
        &mut unused3,
        &mut dup,
        &mut too_small,
        &mut roomy,
    ];
    let read_keys = [
        "mix-0",
        "mix-missing",
        "",
        "mix-huge",
        "mix-dup",
        "mix-1",
        "mix-2",
    ];
    let got = s.batch_get_into(&read_keys, &mut bufs).await;
    assert_eq!(got[0].as_ref().ok(), Some(&values[0].len()));
    assert_eq!(code(&got[1]), ErrorCode::OBJECT_NOT_FOUND, "{:?}", got[1]);
    assert_eq!(code(&got[2]), ErrorCode::INVALID_KEY, "{:?}", got[2]);
    assert_eq!(code(&got[3]), ErrorCode::OBJECT_NOT_FOUND, "{:?}", got[3]);
    assert_eq!(got[4].as_ref().ok(), Some(&values[3].len()));
    assert_eq!(code(&got[5]), ErrorCode::INVALID_PARAMS, "{:?}", got[5]);
    assert_eq!(got[6].as_ref().ok(), Some(&values[7].len()));
    drop(bufs);
    assert!(exact0 == values[0]);
    assert!(dup == values[3]);
    assert!(
        too_small.iter().all(|&b| b == 0),
        "a refused read wrote bytes"
    );
    assert!(roomy[..1] == values[7][..]);
    assert!(
        roomy[1..].iter().all(|&b| b == 0xee),
        "bytes past the object"
    );

    let exists = s
        .batch_exists(&["mix-0", "mix-huge", "mix-dup", "mix-missing"])
        .await;
    let exists: Vec<bool> = exists.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(exists, [true, false, true, false]);

    // A second batch: an existing key refuses a put but takes an upsert; the too-large key and
    // a length mismatch fail alone.
    let again = s
        .batch_put_from(
            &["mix-0", "mix-3"],
            &[values[5].as_slice(), values[4].as_slice()],
            &pinned,
        )
        .await;
    assert_eq!(code(&again[0]), ErrorCode::OBJECT_ALREADY_EXISTS);
    assert!(again[1].is_ok(), "{:?}", again[1]);
    let replaced = payload(1, 2, 12_345);
    let upserted = s
        .batch_upsert_from(
            &["mix-0", "mix-huge", "mix-4"],
            &[replaced.as_slice(), huge.as_slice(), b"four".as_slice()],
            &pinned,
        )
        .await;
    assert!(upserted[0].is_ok(), "{:?}", upserted[0]);
    assert_eq!(code(&upserted[1]), ErrorCode::NO_AVAILABLE_HANDLE);
    assert!(upserted[2].is_ok(), "{:?}", upserted[2]);
    assert!(s.get("mix-0").await.unwrap() == replaced);
    assert_eq!(s.get("mix-4").await.unwrap(), b"four");
    let mismatched = s
        .batch_put_from(&["mix-5", "mix-6"], &[b"x"], &pinned)
        .await;
    assert!(mismatched
        .iter()
        .all(|r| code(r) == ErrorCode::INVALID_PARAMS));
    assert_eq!(
        all_keys(&admin).unwrap(),
        ["mix-0", "mix-1", "mix-2", "mix-3", "mix-4", "mix-dup"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_cap_holds_under_64_concurrent_batches() {
    let m = MOONKV.master(&[]);
    let rpc = m.field("rpc");
    let nodes: Vec<Proc> = ["seg-1", "seg-2", "seg-3"]
        .iter()
        .map(|name| MOONKV.node(&rpc, name, "64MiB"))
        .collect();
    let cap = 2;
    let s = store(&m, |c| c.connections_per_node = cap).await;
    let (tasks, per_task) = (64u32, 32u32);

    let mut running = Vec::new();
    for t in 0..tasks {
        let s = s.clone();
        running.push(tokio::spawn(async move {
            let mut rng = Rng(u64::from(t));
            let keys: Vec<String> = (0..per_task).map(|i| format!("t{t:02}-{i:02}")).collect();
            let values: Vec<Vec<u8>> = (0..per_task)
                .map(|i| payload(t * per_task + i, 1, 1 + rng.below(16 << 10) as usize))
                .collect();
            let put = s
                .batch_put_from(&strs(&keys), &slices(&values), &ReplicateConfig::default())
                .await;
            for (key, result) in keys.iter().zip(&put) {
                assert!(result.is_ok(), "put {key}: {result:?}");
            }
            let mut bufs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
            let mut targets: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
            let got = s.batch_get_into(&strs(&keys), &mut targets).await;
            for (i, result) in got.iter().enumerate() {
                assert_eq!(result.as_ref().ok(), Some(&values[i].len()), "{}", keys[i]);
                assert!(bufs[i] == values[i], "{} came back different", keys[i]);
            }
        }));
    }
    for task in running {
        task.await.expect("a batch task panicked");
    }

    let stats = s.data_plane_stats();
    let most = (nodes.len() * cap) as u64;
    assert!(stats.opened <= most, "{stats:?}");
    assert!(stats.open <= most, "{stats:?}");
    // With 64 batches at once over six connections, the cap must really have been reached.
    assert!(stats.waited > 0, "{stats:?}");
    let listed = s.list("^t").await.unwrap();
    assert_eq!(listed.len(), (tasks * per_task) as usize);
    let mut used_segments: Vec<&str> = listed
        .iter()
        .map(|o| &*o.replicas[0].segment_name)
        .collect();
    used_segments.sort_unstable();
    used_segments.dedup();
    assert_eq!(used_segments, ["seg-1", "seg-2", "seg-3"]);
}

/// `whole` cut at `cuts` (offsets, ascending): the parts of a multi-buffer object.
fn cut<'a>(whole: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&whole.len())) {
        parts.push(&whole[from..to]);
        from = to;
    }
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_buffer_objects_round_trip_through_differently_split_buffers() {
    let m = MOONKV.master(&[]);
    let rpc = m.field("rpc");
    let _nodes: Vec<Proc> = ["seg-1", "seg-2", "seg-3"]
        .iter()
        .map(|name| MOONKV.node(&rpc, name, "64MiB"))
        .collect();
    // Small requests, so parts and buffers straddle request boundaries.
    let s = store(&m, |c| c.chunk_size = 64 << 10).await;
    let cfg = ReplicateConfig::default();

    // One object from four parts, one of them empty.
    let zero = payload(10, 1, 200_000);
    s.put_parts("mb-0", &cut(&zero, &[1, 70_001, 70_001]), &cfg)
        .await
        .unwrap();
    assert!(s.get("mb-0").await.unwrap() == zero);

    let objects = [
        payload(11, 1, 3_000),
        payload(12, 1, 150_000),
        payload(13, 1, 1_000_000),
        payload(14, 1, 9_999),
    ];
    let splits: [&[usize]; 4] = [&[], &[65_536], &[1, 2, 100_000, 500_000], &[4_000, 8_000]];
    let keys = ["mb-1", "mb-2", "mb-3", "mb-4"];
    let parts: Vec<Vec<&[u8]>> = objects
        .iter()
        .zip(splits)
        .map(|(o, at)| cut(o, at))
        .collect();
    let put = s.batch_put_parts(&keys, &parts, &cfg).await;
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    for (key, object) in keys.iter().zip(&objects) {
        assert!(&s.get(key).await.unwrap() == object, "{key}");
    }

    // An upsert replaces mb-2 from a different split; a put of an existing key is refused.
    let replaced = payload(12, 2, 150_000);
    let upserted = s
        .batch_upsert_parts(&["mb-2"], &[cut(&replaced, &[10, 20, 149_990])], &cfg)
        .await;
    assert!(upserted[0].is_ok(), "{upserted:?}");
    let refused = s
        .batch_put_parts(&["mb-1"], &[cut(&objects[0], &[1])], &cfg)
        .await;
    assert_eq!(code(&refused[0]), ErrorCode::OBJECT_ALREADY_EXISTS);

    // Reads into buffers split differently from the writes; buffers past an object's end stay
    // untouched, and an object larger than its buffers fails alone.
    const UNTOUCHED: u8 = 0xee;
    let layouts: [(&str, &[usize]); 6] = [
        ("mb-0", &[100_000, 50_000, 60_000]),
        ("mb-1", &[3_000]),
        ("mb-2", &[1, 1, 149_998 + 10, 500]),
        ("mb-3", &[999_999]),
        ("mb-4", &[0, 9_999, 7]),
        ("mb-missing", &[10]),
    ];
    let expected: [Option<&[u8]>; 6] = [
        Some(&zero),
        Some(&objects[0]),
        Some(&replaced),
        None,
        Some(&objects[3]),
        None,
    ];
    let mut buffers: Vec<Vec<Vec<u8>>> = layouts
        .iter()
        .map(|(_, sizes)| sizes.iter().map(|&n| vec![UNTOUCHED; n]).collect())
        .collect();
    let mut targets: Vec<Vec<&mut [u8]>> = buffers
        .iter_mut()
        .map(|bufs| bufs.iter_mut().map(Vec::as_mut_slice).collect())
        .collect();
    let read_keys: Vec<&str> = layouts.iter().map(|(k, _)| *k).collect();
    let got = s.batch_get_into_parts(&read_keys, &mut targets).await;
    drop(targets);
    for (i, (key, _)) in layouts.iter().enumerate() {
        let Some(object) = expected[i] else { continue };
        assert_eq!(got[i].as_ref().ok(), Some(&object.len()), "{key}");
        let filled: Vec<u8> = buffers[i].concat();
        assert!(
            filled[..object.len()] == object[..],
            "{key} came back different"
        );
        assert!(
            filled[object.len()..].iter().all(|&b| b == UNTOUCHED),
            "{key}: bytes past the object's end were written"
        );
    }
    assert_eq!(code(&got[3]), ErrorCode::INVALID_PARAMS, "{:?}", got[3]);
    assert!(
        buffers[3].concat().iter().all(|&b| b == UNTOUCHED),
        "a refused read wrote bytes"
    );
    assert_eq!(code(&got[5]), ErrorCode::OBJECT_NOT_FOUND, "{:?}", got[5]);

    // The single-buffer batch read agrees with the multi-buffer one.
    let mut whole: Vec<Vec<u8>> = [&zero[..], &objects[0], &replaced, &objects[2]]
        .iter()
        .map(|o| vec![0u8; o.len()])
        .collect();
    let mut targets: Vec<&mut [u8]> = whole.iter_mut().map(Vec::as_mut_slice).collect();
    let got = s
        .batch_get_into(&["mb-0", "mb-1", "mb-2", "mb-3"], &mut targets)
        .await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    assert!(whole[0] == zero && whole[1] == objects[0]);
    assert!(whole[2] == replaced && whole[3] == objects[2]);
}

/// Socket reads of up to two requests' worth of bytes go as one request when nothing else of
/// the process moves bytes, and split otherwise: both ways, every byte lands where its
/// buffers say, alone and with three other readers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_reads_whole_or_split_fill_every_buffer() {
    let m = MOONKV.master(&[]);
    let rpc = m.field("rpc");
    let _node = MOONKV.node(&rpc, "seg-w", "64MiB");
    let s = store(&m, |c| {
        c.same_host = false;
        c.chunk_size = 512 << 10;
    })
    .await;
    let cfg = ReplicateConfig::default();
    let sizes = [700 << 10, 1 << 20, (1 << 20) + 1, 3 << 20];
    let objects: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| payload(40 + i as u32, 1, n))
        .collect();
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("whole-{i}")).collect();
    for (key, object) in keys.iter().zip(&objects) {
        s.put(key, object, &cfg).await.unwrap();
    }
    let read = |s: Store, key: String, object: Vec<u8>| async move {
        // Three buffers that cut the object off its request boundaries, and a spare one.
        let n = object.len();
        let cuts = [n / 3 + 7, n / 3, n - (n / 3 + 7) - n / 3];
        let mut bufs: Vec<Vec<u8>> = cuts.iter().map(|&c| vec![0u8; c]).collect();
        bufs.push(vec![0xee; 16]);
        let mut parts = vec![bufs.iter_mut().map(|b| &mut b[..]).collect::<Vec<_>>()];
        let got = s.batch_get_into_parts(&[&key], &mut parts).await;
        assert_eq!(*got[0].as_ref().unwrap(), n, "{key}");
        let joined: Vec<u8> = bufs[..3].concat();
        assert!(joined == object, "{key}: other bytes");
        assert!(
            bufs[3].iter().all(|&b| b == 0xee),
            "{key}: spare buffer written"
        );
    };
    for (key, object) in keys.iter().zip(&objects) {
        read(s.clone(), key.clone(), object.clone()).await;
    }
    for _ in 0..3 {
        let readers: Vec<_> = keys
            .iter()
            .zip(&objects)
            .map(|(key, object)| tokio::spawn(read(s.clone(), key.clone(), object.clone())))
            .collect();
        for r in readers {
            r.await.unwrap();
        }
    }
}
