//! End-to-end: real master, real nodes, real stores on loopback.

use moonkv_client::{ErrorCode, ErrorExt, ReplicateConfig};
use moonkv_master::server::MasterConfig;
use moonkv_testkit::admin::metric_in;
use moonkv_testkit::cluster::{bounded, Cluster};
use moonkv_testkit::payload::pattern;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

async fn round_trip(sizes: &[usize], local_copy: bool) {
    let largest = *sizes.iter().max().unwrap() as u64;
    let cluster = Cluster::start(1, (largest * 2).max(64 * MIB)).await;
    let store = cluster
        .store_with(|c| c.local_segments = local_copy.then(|| cluster.local.clone()))
        .await;
    for (i, &size) in sizes.iter().enumerate() {
        let key = format!("obj-{size}");
        let value = pattern(size, i as u8 + 1);
        store
            .put(&key, &value, &one())
            .await
            .unwrap_or_else(|e| panic!("put {size}: {e}"));
        let back = store
            .get(&key)
            .await
            .unwrap_or_else(|e| panic!("get {size}: {e}"));
        assert!(back == value, "{size} bytes came back different");
        let mut buf = vec![0u8; size + 7];
        assert_eq!(store.get_into(&key, &mut buf).await.unwrap(), size);
        assert!(buf[..size] == value[..]);
        store.remove(&key, true).await.unwrap();
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trips_over_the_network() {
    bounded(round_trip(
        &[1, 4096, MIB as usize, 64 * MIB as usize],
        false,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trips_through_the_in_process_copy() {
    bounded(round_trip(&[1, 4096, 3 * MIB as usize], true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_round_trips_256_mib() {
    bounded(round_trip(&[256 * MIB as usize], false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_keys_are_told_apart_from_errors() {
    bounded(async {
        let cluster = Cluster::start(1, 16 * MIB).await;
        let store = cluster.store().await;
        let err = store.get("nope").await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(!store.exists("nope").await.unwrap());
        assert_eq!(
            store.get("").await.unwrap_err().code,
            ErrorCode::INVALID_KEY
        );
        assert_eq!(
            store.put("k", b"", &one()).await.unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        store.put("small", b"abc", &one()).await.unwrap();
        let mut tiny = [0u8; 2];
        assert_eq!(
            store.get_into("small", &mut tiny).await.unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_survives_a_dead_node() {
    bounded(async {
        let mut cluster = Cluster::start(2, 32 * MIB).await;
        let store = cluster.store().await;
        let value = pattern(3 * MIB as usize + 5, 9);
        let config = ReplicateConfig {
            replica_num: 2,
            ..one()
        };
        store.put("twice", &value, &config).await.unwrap();
        assert_eq!(store.replicas("twice").await.unwrap().replicas.len(), 2);
        // A crash (no unmount): the master still lists both replicas, so the read must fail
        // over from the dead one.
        cluster.take_node(0).crash().await;
        for _ in 0..3 {
            assert!(store.get("twice").await.unwrap() == value);
        }
        // A clean shutdown of the other node unmounts it: the object is gone, not torn.
        cluster.take_node(1).shutdown().await;
        let err = store.get("twice").await.unwrap_err();
        assert!(
            matches!(
                err.code,
                ErrorCode::OBJECT_NOT_FOUND
                    | ErrorCode::TRANSFER_FAIL
                    | ErrorCode::REPLICA_IS_NOT_READY
            ),
            "{err}"
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_of_one_key_have_one_winner_and_no_torn_object() {
    bounded(async {
        let cluster = Cluster::start(2, 64 * MIB).await;
        let store = cluster.store().await;
        let values: Vec<Vec<u8>> = (0..6).map(|i| pattern(2 * MIB as usize, 10 + i)).collect();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, value) in values.iter().cloned().enumerate() {
            let store = store.clone();
            tasks.spawn(async move {
                (
                    i,
                    store
                        .put("contended", &value, &ReplicateConfig::default())
                        .await,
                )
            });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (i, result) = joined.unwrap();
            match result {
                Ok(()) => winners.push(i),
                Err(e) => assert_eq!(e.code, ErrorCode::OBJECT_ALREADY_EXISTS, "{e}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one put wins");
        let stored = store.get("contended").await.unwrap();
        assert!(
            stored == values[winners[0]],
            "the stored object is the winner's, whole"
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_forms_give_one_result_per_key() {
    bounded(async {
        let cluster = Cluster::start(1, 64 * MIB).await;
        let store = cluster.store().await;
        store.put("b-existing", b"old", &one()).await.unwrap();
        let values: Vec<Vec<u8>> = (0..4)
            .map(|i| pattern(100_000 * (i + 1), i as u8))
            .collect();
        let keys = ["b-0", "b-1", "", "b-existing", "b-3"];
        let slices: Vec<&[u8]> = vec![&values[0], &values[1], &values[2], &values[2], &values[3]];
        let put = store.batch_put_from(&keys, &slices, &one()).await;
        assert!(
            put[0].is_ok() && put[1].is_ok() && put[4].is_ok(),
            "{put:?}"
        );
        assert_eq!(put[2].as_ref().unwrap_err().code, ErrorCode::INVALID_KEY);
        assert_eq!(
            put[3].as_ref().unwrap_err().code,
            ErrorCode::OBJECT_ALREADY_EXISTS
        );

        let exists = store.batch_exists(&["b-0", "b-missing", "b-3"]).await;
        let exists: Vec<bool> = exists.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(exists, vec![true, false, true]);

        let mut big = vec![0u8; 400_000];
        let mut small = vec![0u8; 10];
        let mut other = vec![0u8; 400_000];
        let mut bufs: Vec<&mut [u8]> = vec![&mut big, &mut small, &mut other];
        let got = store
            .batch_get_into(&["b-3", "b-0", "b-missing"], &mut bufs)
            .await;
        assert_eq!(*got[0].as_ref().unwrap(), values[3].len());
        assert!(big[..values[3].len()] == values[3][..]);
        assert_eq!(got[1].as_ref().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        assert!(got[2].as_ref().unwrap_err().is_not_found());

        let all = store.batch_get(&["b-1", "b-existing", "b-missing"]).await;
        assert!(all[0].as_ref().unwrap() == &values[1]);
        assert_eq!(all[1].as_ref().unwrap(), b"old");
        assert!(all[2].as_ref().unwrap_err().is_not_found());

        let removed = store.batch_remove(&["b-0", "b-missing"], true).await;
        assert!(removed[0].is_ok());
        assert!(removed[1].is_err());
        assert!(!store.exists("b-0").await.unwrap());
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transfer_is_revoked_and_leaves_nothing_readable() {
    bounded(async {
        let mut cluster = Cluster::start(1, 16 * MIB).await;
        let store = cluster
            .store_with(|c| c.connect_timeout = Duration::from_millis(500))
            .await;
        // The node dies without unmounting: the master still allocates on it.
        cluster.take_node(0).crash().await;
        let err = store
            .put("doomed", &pattern(MIB as usize, 1), &one())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
        assert!(!store.exists("doomed").await.unwrap());
        assert!(store.get("doomed").await.unwrap_err().is_not_found());
        // The put reported the node: the master places nothing more on it until it heartbeats
        // (it never will). A batch now finds no room at all; every key fails alone, nothing is
        // committed.
        let segments = cluster.master.as_ref().unwrap().engine().segments();
        assert!(segments.iter().all(|s| s.suspect), "{segments:?}");
        let keys = ["d-1", "d-2"];
        let results = store
            .batch_put_from(&keys, &[b"one".as_slice(), b"two".as_slice()], &one())
            .await;
        assert!(
            results
                .iter()
                .all(|r| r.as_ref().unwrap_err().code == ErrorCode::NO_AVAILABLE_HANDLE),
            "{results:?}"
        );
        assert_eq!(
            store
                .batch_exists(&keys)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect::<Vec<_>>(),
            [false, false]
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_remove_regex_and_tenants() {
    bounded(async {
        let cluster = Cluster::start(1, 16 * MIB).await;
        let store = cluster.store().await;
        store.put("u", b"first", &one()).await.unwrap();
        assert_eq!(
            store.put("u", b"second", &one()).await.unwrap_err().code,
            ErrorCode::OBJECT_ALREADY_EXISTS
        );
        store.upsert("u", b"second value", &one()).await.unwrap();
        assert_eq!(store.get("u").await.unwrap(), b"second value");

        let other = store.with_tenant("team-b").unwrap();
        assert!(other.get("u").await.unwrap_err().is_not_found());
        other.put("u", b"b's own", &one()).await.unwrap();
        assert_eq!(store.get("u").await.unwrap(), b"second value");
        assert!(store.with_tenant("_hidden").is_err());

        for k in ["layer/1", "layer/2", "other"] {
            store.put(k, k.as_bytes(), &one()).await.unwrap();
        }
        let listed: Vec<String> = store
            .list("^layer/")
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(listed, ["layer/1", "layer/2"]);
        assert_eq!(store.remove_by_regex("^layer/", true).await.unwrap(), 2);
        store.remove("other", true).await.unwrap();
        assert!(store
            .remove("other", true)
            .await
            .unwrap_err()
            .is_not_found());
        assert_eq!(store.remove_all(true).await.unwrap(), 1);
        assert_eq!(other.get("u").await.unwrap(), b"b's own");
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_revalidated_instead_of_failing() {
    bounded(async {
        let mut config = MasterConfig::ephemeral();
        config.engine.default_kv_lease_ttl_ms = 1;
        let cluster = Cluster::start_with(config, 1, 64 * MIB).await;
        // Over the network (not the in-process copy), 16 MiB takes well over the 1 ms lease,
        // so every read outlives it; the replicas are unchanged, so revalidation confirms.
        let store = cluster.store_with(|_| {}).await;
        let value = pattern(16 * MIB as usize, 3);
        store.put("leased", &value, &one()).await.unwrap();
        assert!(store.get("leased").await.unwrap() == value);
        let got = store.batch_get(&["leased"]).await;
        assert!(got[0].as_ref().unwrap() == &value);
        let metrics = cluster.admin_get("/metrics").await;
        let asked = metric_in(&metrics, "master_revalidate_replicas_requests_total");
        assert_eq!(asked, Some(2.0), "one revalidation per read");
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_shutdown_unmounts_its_segments() {
    bounded(async {
        let mut cluster = Cluster::start(2, 8 * MIB).await;
        let engine = cluster.master.as_ref().unwrap().engine().clone();
        assert_eq!(engine.segments().len(), 2);
        let node = cluster.take_node(0);
        let gone = node.segments()[0].id;
        node.shutdown().await;
        let left: Vec<_> = engine
            .segments()
            .into_iter()
            .map(|s| s.segment.id)
            .collect();
        assert_eq!(left.len(), 1);
        assert!(!left.contains(&gone));
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_gets_the_segments_back_by_remount() {
    bounded(async {
        let mut cluster = Cluster::start(1, 8 * MIB).await;
        let old = cluster.master.take().unwrap();
        let rpc = old.rpc_addr();
        old.shutdown().await;
        let mut config = MasterConfig::ephemeral();
        config.rpc_addr = rpc;
        let fresh = moonkv_master::server::start(config)
            .await
            .expect("master restarts on the same port");
        let engine = fresh.engine().clone();
        cluster.master = Some(fresh);
        // The node's heartbeat reconnects, hears NEED_REMOUNT and remounts.
        while engine.segments().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let store = cluster.store().await;
        store.put("after-restart", b"hello", &one()).await.unwrap();
        assert_eq!(store.get("after-restart").await.unwrap(), b"hello");
        cluster.shutdown().await;
    })
    .await;
}
