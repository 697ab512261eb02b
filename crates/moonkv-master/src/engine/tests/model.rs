//! Whole-engine properties: the operation table maps onto engine methods, the engine is shareable
//! across threads, and random operation sequences keep events, snapshot and space accounting
//! consistent.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Generates a dispatcher exactly as the RPC server does; it only has to compile.
macro_rules! dispatcher {
    ($($code:literal => $name:ident($req:ty) -> $resp:ty, $method:ident;)*) => {
        #[allow(dead_code)]
        fn dispatch(engine: &Engine, request: Request) {
            match request {
                $(Request::$name(r) => {
                    let _: Result<$resp> = engine.$method(&r);
                })*
            }
        }
    };
}
moonkv_proto::for_each_op!(dispatcher);

#[test]
fn engine_is_send_and_sync() {
    fn assert_shareable<T: Send + Sync>() {}
    assert_shareable::<Engine>();
}

#[test]
fn concurrent_clients_do_not_interfere() {
    let h = Harness::new();
    std::thread::scope(|s| {
        for t in 0..4 {
            let h = &h;
            s.spawn(move || {
                let tenant = format!("t{t}");
                for i in 0..200 {
                    let key = format!("k{i}");
                    h.put_in(&tenant, &key, 256);
                    assert!(h.engine.get_replica_list(&h.key_req(&tenant, &key)).is_ok());
                    let keys = KeysRequest {
                        tenant: tenant.clone(),
                        keys: vec![key.clone(), "nope".into()],
                    };
                    assert_eq!(h.engine.batch_exist_key(&keys).unwrap().len(), 2);
                    if i % 3 == 0 {
                        h.engine
                            .remove(&RemoveRequest {
                                tenant: tenant.clone(),
                                key,
                                force: true,
                            })
                            .unwrap();
                    }
                }
            });
        }
        s.spawn(|| {
            for _ in 0..50 {
                h.engine.tick();
                h.engine.placement_snapshot(None);
            }
        });
    });
    assert_eq!(h.engine.stats().key_count, 4 * 133);
    assert_eq!(h.engine.stats().allocated_bytes, 4 * 133 * 256);
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u16, u8),
    Start(u8, u16),
    End(u8),
    Revoke(u8),
    Upsert(u8, u16),
    UpsertEnd(u8),
    Remove(u8, bool),
    RemoveAll(bool),
    Get(u8),
    Advance(u16),
    Evict,
    Sweep,
    Remount,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..6;
    let size = 1u16..40_000;
    prop_oneof![
        (key.clone(), size.clone(), 1u8..3).prop_map(|(k, s, r)| Op::Put(k, s, r)),
        (key.clone(), size.clone()).prop_map(|(k, s)| Op::Start(k, s)),
        key.clone().prop_map(Op::End),
        key.clone().prop_map(Op::Revoke),
        (key.clone(), size).prop_map(|(k, s)| Op::Upsert(k, s)),
        key.clone().prop_map(Op::UpsertEnd),
        (key.clone(), any::<bool>()).prop_map(|(k, f)| Op::Remove(k, f)),
        any::<bool>().prop_map(Op::RemoveAll),
        key.prop_map(Op::Get),
        (0u16..2_000).prop_map(Op::Advance),
        Just(Op::Evict),
        Just(Op::Sweep),
        Just(Op::Remount),
    ]
}

/// Applies events to a placement model, failing on a redundant or impossible event.
fn replay(
    model: &mut BTreeMap<(String, String), BTreeSet<Medium>>,
    events: Vec<Ev>,
) -> std::result::Result<(), String> {
    for ev in events {
        match ev {
            Ev::Stored(t, k, _, m) => {
                if !model.entry((t, k)).or_default().insert(m) {
                    return Err("stored for a medium already available".into());
                }
            }
            Ev::Removed(t, k, _, m) => {
                let media = model
                    .get_mut(&(t.clone(), k.clone()))
                    .ok_or("removed for an unknown object")?;
                if !media.remove(&m) {
                    return Err("removed for a medium not available".into());
                }
                if media.is_empty() {
                    model.remove(&(t, k));
                }
            }
            Ev::Cleared(t) => model.retain(|(tenant, _), _| *tenant != t),
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let config = EngineConfig {
        put_start_discard_timeout_ms: 1_000,
        put_start_release_timeout_ms: 3_000,
        eviction_high_watermark_ratio: 0.5,
        client_live_ttl_ms: u64::MAX / 4,
        ..Harness::config()
    };
    let h = Harness::bare(config);
    let mut seg_a = h.mount("a", BASE, MIB);
    h.mount("b", 2 * BASE, MIB);
    let mut model = BTreeMap::new();
    let mut started: HashMap<u8, Vec<ReplicaId>> = HashMap::new();
    let key = |k: u8| format!("k{k}");
    for op in ops {
        match op.clone() {
            Op::Put(k, size, replicas) => {
                let cfg = ReplicateConfig {
                    replica_num: replicas as u32,
                    ..Default::default()
                };
                if let Ok(d) = h.put_start_with(&key(k), size as u64, cfg) {
                    let _ = h.put_end(&key(k), &d);
                }
            }
            Op::Start(k, size) => {
                if let Ok(d) = h.put_start(&key(k), size as u64) {
                    started.insert(k, ids(&d));
                }
            }
            Op::End(k) | Op::UpsertEnd(k) => {
                let _ = h.engine.put_end(&h.end_req(
                    "",
                    &key(k),
                    started.get(&k).cloned().unwrap_or_default(),
                ));
            }
            Op::Revoke(k) => {
                let _ = h.engine.put_revoke(&h.revoke_req(
                    "",
                    &key(k),
                    started.get(&k).cloned().unwrap_or_default(),
                ));
            }
            Op::Upsert(k, size) => {
                if let Ok(d) = h.engine.upsert_start(&h.start_req(
                    "",
                    &key(k),
                    size as u64,
                    ReplicateConfig::default(),
                )) {
                    started.insert(k, ids(&d));
                }
            }
            Op::Remove(k, force) => {
                let _ = h.remove(&key(k), force);
            }
            Op::RemoveAll(force) => {
                let _ = h.remove_all("", force);
            }
            Op::Get(k) => {
                let _ = h.get(&key(k));
            }
            Op::Advance(ms) => h.advance(ms as u64),
            Op::Evict => {
                h.engine.run_eviction();
            }
            Op::Sweep => {
                h.engine.sweep_stalled_writes();
            }
            Op::Remount => {
                h.unmount(seg_a)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                seg_a = h.mount("a", BASE, MIB);
            }
        }
        replay(&mut model, h.sink.take())
            .map_err(|e| TestCaseError::fail(format!("{e} after {op:?}")))?;
        let snapshot = h.engine.placement_snapshot(None);
        let placed: BTreeMap<(String, String), BTreeSet<Medium>> = snapshot
            .objects
            .into_iter()
            .map(|o| ((o.tenant, o.key), o.media.into_iter().collect()))
            .collect();
        prop_assert_eq!(
            &placed,
            &model,
            "events disagree with the snapshot after {:?}",
            op
        );
        let used: u64 = h.engine.segments().iter().map(|s| s.used_bytes).sum();
        prop_assert_eq!(h.engine.stats().allocated_bytes, used);
        let readable: BTreeSet<String> = h.engine.all_keys("").into_iter().collect();
        let available: BTreeSet<String> = model.keys().map(|(_, k)| k.clone()).collect();
        prop_assert_eq!(readable, available);
    }
    // Everything freed: after removing all and waiting out parked buffers, no space is held.
    h.advance(10_000);
    h.engine.sweep_stalled_writes();
    h.remove_all("", true)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(h.engine.stats().allocated_bytes, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random sequences: every event is meaningful (no duplicate stored, no removed of something
    /// absent), replaying events yields the snapshot, readable keys equal available keys, and
    /// the space counters match the allocators.
    #[test]
    fn events_snapshot_and_space_stay_consistent(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

/// The harness catches a planted bug: a sink that drops `removed` events must fail the check.
#[test]
fn model_check_catches_a_lost_event() {
    let mut model = BTreeMap::new();
    replay(&mut model, vec![stored("k")]).unwrap();
    assert!(
        replay(&mut model, vec![stored("k")]).is_err(),
        "a duplicate stored is caught"
    );
    assert!(
        replay(&mut model, vec![removed("other")]).is_err(),
        "a removed for nothing is caught"
    );
    let h = Harness::new();
    h.put("k", 64);
    h.remove("k", true).unwrap();
    let mut events = h.sink.take();
    events.retain(|e| !matches!(e, Ev::Removed(..)));
    let mut model = BTreeMap::new();
    replay(&mut model, events).unwrap();
    assert!(
        !model.is_empty(),
        "the lossy stream leaves a ghost the snapshot comparison would reject"
    );
    assert!(h.engine.placement_snapshot(None).objects.is_empty());
}
