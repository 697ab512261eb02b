//! Caller lanes against a real master and node (in a runtime of their own, on loopback): calls
//! run on the calling thread give the same answers as the store's own runtime, the pool holds
//! its cap, and a lane whose master went away reconnects on its next call instead of failing it.

use moonkv_client::store::CallerLanes;
use moonkv_client::{ErrorExt, ReplicateConfig, Store};
use moonkv_master::server::{self, MasterConfig};
use moonkv_testkit::cluster::{runtime, Cluster};
use moonkv_testkit::payload::pattern;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Put, read back two ways, check, remove: on a lane when one is free, else on `rt`.
fn exercise(
    rt: &tokio::runtime::Runtime,
    store: &Store,
    lanes: &CallerLanes,
    key: &str,
    size: usize,
) -> bool {
    let value = pattern(size, size as u8);
    let work = |store: Store| {
        let value = value.clone();
        async move {
            store
                .put(key, &value, &ReplicateConfig::default())
                .await
                .unwrap();
            assert!(store.exists(key).await.unwrap());
            let mut buf = vec![0u8; size];
            assert_eq!(store.get_into(key, &mut buf).await.unwrap(), size);
            assert!(buf == value, "{key}: other bytes came back");
            assert!(store.get(key).await.unwrap() == value);
            store.remove(key, true).await.unwrap();
            assert!(store.get(key).await.unwrap_err().is_not_found());
        }
    };
    match lanes.checkout() {
        Some(lane) => {
            lane.block_on(work(lane.store()));
            true
        }
        None => {
            rt.block_on(work(store.clone()));
            false
        }
    }
}

#[test]
fn calls_on_caller_lanes_match_the_store_and_the_pool_holds_its_cap() {
    let rt = runtime();
    let cluster = rt.block_on(Cluster::start(1, 64 * MIB));
    let store = rt.block_on(cluster.store());
    let lanes =
        CallerLanes::new(&store, 2, Duration::from_micros(200)).expect("lanes for a plain address");
    let on_lanes = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (rt, store, lanes, on_lanes) = (&rt, &store, &lanes, &on_lanes);
            scope.spawn(move || {
                for i in 0..40 {
                    // Small objects in one request, large ones cut into chunks.
                    let size = if i % 4 == 0 {
                        3 * MIB as usize + 17
                    } else {
                        4096 + i
                    };
                    if exercise(rt, store, lanes, &format!("t{t}-{i}"), size) {
                        on_lanes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert!(on_lanes.into_inner() > 0, "no call ran on a lane");
    assert!(
        lanes.open_lanes() <= 2,
        "{} lanes for a cap of 2",
        lanes.open_lanes()
    );

    // With both lanes checked out, a third caller is told to use the store's runtime.
    let first = lanes.checkout().unwrap();
    let second = lanes.checkout().unwrap();
    assert!(lanes.checkout().is_none());
    drop((first, second));
    assert!(lanes.checkout().is_some());

    // Closed: no lane is handed out, calls fall back.
    lanes.close();
    assert!(lanes.checkout().is_none());
    assert!(!exercise(&rt, &store, &lanes, "after-close", 100));
    rt.block_on(cluster.shutdown());
}

#[test]
fn a_lane_whose_master_restarted_reconnects_on_its_next_call() {
    let rt = runtime();
    let mut cluster = rt.block_on(Cluster::start(1, 16 * MIB));
    let store = rt.block_on(cluster.store());
    let lanes = CallerLanes::new(&store, 1, Duration::from_micros(200)).unwrap();
    assert!(exercise(&rt, &store, &lanes, "before", 1000));

    // The master goes away while the lane is idle; a new one takes its address.
    let old = cluster.master.take().unwrap();
    let addr = old.rpc_addr();
    rt.block_on(old.shutdown());
    let mut config = MasterConfig::ephemeral();
    config.rpc_addr = addr;
    cluster.master = Some(
        rt.block_on(server::start(config))
            .expect("master restarts on its port"),
    );

    // The lane's first call reads the closed connection before writing to it and reconnects.
    let lane = lanes.checkout().unwrap();
    let store_on_lane = lane.store();
    let found = lane.block_on(async move { store_on_lane.exists("anything").await });
    assert_eq!(found.map_err(|e| e.to_string()), Ok(false));
    drop(lane);
    rt.block_on(cluster.shutdown());
}
