//! Whole-engine properties: the operation table maps onto engine methods, the engine is shareable
//! across threads, and random operation sequences get, operation by operation, the answers of a
//! deliberately simple reference model ([`reference`]), while events, snapshot and space
//! accounting stay consistent.

mod reference;

use super::*;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestError, TestRng, TestRunner};
use reference::{Model, Outcome, Reply, Timing};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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

/// Segment names; every Start prefers them in an order it picks, so the model knows where each
/// replica lands (placement without a preference is covered in `put_get`).
const SEGMENTS: [&str; 2] = ["a", "b"];
const SEGMENT_BYTES: u64 = 16 * MIB;

/// Cases per property: enough to reach the interesting interleavings, few enough to run in a
/// few seconds in a debug build on two cores. The planted-bug self-check uses the same budget.
const CASES: u32 = 512;

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Start then End with the ids it returned: key, size, replicas, whether `b` is preferred.
    Put(u8, u16, u8, bool),
    Start(u8, u16, bool),
    End(u8),
    UpsertEnd(u8),
    Revoke(u8),
    Upsert(u8, u16, bool),
    Remove(u8, bool),
    RemoveAll(bool),
    Get(u8),
    Exist(u8),
    /// Revalidates the ids of the last successful Get of the key.
    Revalidate(u8),
    Advance(u16),
    Evict,
    Sweep,
    /// Segment `a` unmounted, then a new segment of that name mounted.
    Remount,
    /// A fresh engine over the same clock, both segments mounted again.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    // A few fixed sizes make same-size (in-place) upserts common.
    let size = prop_oneof![Just(64u16), Just(4_000), 1u16..40_000];
    let prefer_b = any::<bool>();
    prop_oneof![
        8 => (key.clone(), size.clone(), 1u8..4, prefer_b)
            .prop_map(|(k, s, r, b)| Op::Put(k, s, r, b)),
        4 => (key.clone(), size.clone(), prefer_b).prop_map(|(k, s, b)| Op::Start(k, s, b)),
        4 => key.clone().prop_map(Op::End),
        2 => key.clone().prop_map(Op::UpsertEnd),
        2 => key.clone().prop_map(Op::Revoke),
        4 => (key.clone(), size, prefer_b).prop_map(|(k, s, b)| Op::Upsert(k, s, b)),
        4 => (key.clone(), any::<bool>()).prop_map(|(k, f)| Op::Remove(k, f)),
        1 => any::<bool>().prop_map(Op::RemoveAll),
        4 => key.clone().prop_map(Op::Get),
        2 => key.clone().prop_map(Op::Exist),
        2 => key.prop_map(Op::Revalidate),
        // Short steps cross the 50 ms lease, long ones the discard and release timeouts, exact
        // ones land on a deadline.
        6 => prop_oneof![
            3 => 0u16..100,
            1 => 0u16..4_000,
            1 => proptest::sample::select(vec![1u16, 50, 1_000, 3_000]),
        ]
        .prop_map(Op::Advance),
        2 => Just(Op::Evict),
        2 => Just(Op::Sweep),
        1 => Just(Op::Remount),
        1 => Just(Op::Restart),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..200)
}

/// Bugs planted between the harness and the engine, to show the comparison catches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// Remove without `force` ignores read leases.
    RemoveIgnoresLease,
    /// The End of a Put never reaches the engine, though the writer is told it succeeded.
    LostPutEnd,
}

fn key(k: u8) -> String {
    format!("k{k}")
}

fn done(result: Result<()>) -> Outcome {
    result.map(|()| Reply::Done).map_err(|e| e.code)
}

fn placed(descriptors: &[ReplicaDescriptor]) -> Reply {
    let mut copies: Vec<_> = descriptors
        .iter()
        .map(|d| {
            let complete = d.status == ReplicaStatus::Complete;
            (d.segment_name.to_string(), d.size, complete)
        })
        .collect();
    copies.sort();
    Reply::Placed(copies)
}

fn replicas(response: &GetReplicaListResponse) -> Reply {
    let mut copies: Vec<_> = response
        .replicas
        .iter()
        .map(|d| (d.id, d.segment_name.to_string(), d.size))
        .collect();
    copies.sort();
    Reply::Replicas {
        lease_ms: response.lease_ttl_ms,
        copies,
    }
}

fn agree(op: Op, engine: Outcome, model: Outcome) -> std::result::Result<(), TestCaseError> {
    prop_assert_eq!(
        engine,
        model,
        "engine (left) and model (right) disagree on {:?}",
        op
    );
    Ok(())
}

/// Applies events to a placement model, failing on a redundant or impossible event.
fn replay(
    model: &mut BTreeMap<(String, String), BTreeSet<Medium>>,
    events: Vec<Ev>,
) -> std::result::Result<(), &'static str> {
    for ev in events {
        match ev {
            Ev::Stored(t, k, _, m) => {
                if !model.entry((t, k)).or_default().insert(m) {
                    return Err("stored for a medium already available");
                }
            }
            Ev::Removed(t, k, _, m) => {
                let media = model
                    .get_mut(&(t.clone(), k.clone()))
                    .ok_or("removed for an unknown object")?;
                if !media.remove(&m) {
                    return Err("removed for a medium not available");
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

/// The engine under test, the model it is compared with, and what the one client remembers.
struct World {
    h: Harness,
    model: Model,
    /// Availability as the events tell it.
    events: BTreeMap<(String, String), BTreeSet<Medium>>,
    seg_a: SegmentId,
    /// Replica ids of the last Start per key: what the client's End or Revoke names.
    started: HashMap<u8, Vec<ReplicaId>>,
    /// Replica ids of the last successful Get per key: what the client revalidates.
    read: HashMap<u8, Vec<ReplicaId>>,
    /// Every replica id issued so far, across restarts: none may come twice.
    issued: HashSet<ReplicaId>,
    bug: Option<Bug>,
}

type Step = std::result::Result<(), TestCaseError>;

impl World {
    fn new(bug: Option<Bug>) -> Self {
        let config = EngineConfig {
            put_start_discard_timeout_ms: 1_000,
            put_start_release_timeout_ms: 3_000,
            // Every round evicts every unleased object, so the model needs no eviction order.
            eviction_high_watermark_ratio: 0.0,
            eviction_ratio: 1.0,
            client_live_ttl_ms: u64::MAX / 4,
            ..Harness::config()
        };
        let timing = Timing {
            lease_ms: config.default_kv_lease_ttl_ms,
            discard_ms: config.put_start_discard_timeout_ms,
            release_ms: config.put_start_release_timeout_ms,
        };
        let h = Harness::bare(config);
        let model = Model::new(timing, h.clock.now_ms(), &SEGMENTS);
        let seg_a = h.mount(SEGMENTS[0], BASE, SEGMENT_BYTES);
        h.mount(SEGMENTS[1], 2 * BASE, SEGMENT_BYTES);
        Self {
            h,
            model,
            events: BTreeMap::new(),
            seg_a,
            started: HashMap::new(),
            read: HashMap::new(),
            issued: HashSet::new(),
            bug,
        }
    }

    fn step(&mut self, op: Op) -> Step {
        let compared = match op {
            Op::Put(..) | Op::Start(..) | Op::Upsert(..) => self.write(op)?,
            Op::End(..) | Op::UpsertEnd(..) | Op::Revoke(..) => Some(self.finish_write(op)),
            Op::Remove(..) | Op::RemoveAll(..) => Some(self.remove(op)),
            Op::Get(..) | Op::Exist(..) | Op::Revalidate(..) => Some(self.read(op)?),
            Op::Advance(..) | Op::Evict | Op::Sweep | Op::Remount | Op::Restart => {
                Some(self.duty(op))
            }
        };
        if let Some((engine, expected)) = compared {
            agree(op, engine, expected)?;
        }
        self.check(op)
    }

    /// Put (Start, then End with the ids it returned), Start and Upsert. The Starts are
    /// compared inside [`World::start`]; a Put answers its End.
    fn write(&mut self, op: Op) -> std::result::Result<Option<(Outcome, Outcome)>, TestCaseError> {
        match op {
            Op::Put(k, size, replicas, prefer_b) => {
                let Some(ids) = self.start(op, k, size, replicas, prefer_b, false)? else {
                    return Ok(None);
                };
                let engine = if self.bug == Some(Bug::LostPutEnd) {
                    Ok(())
                } else {
                    let h = &self.h;
                    h.engine.put_end(&h.end_req("", &key(k), ids.clone()))
                };
                Ok(Some((done(engine), self.model.end(&key(k), &ids))))
            }
            Op::Start(k, size, prefer_b) | Op::Upsert(k, size, prefer_b) => {
                let upsert = matches!(op, Op::Upsert(..));
                if let Some(ids) = self.start(op, k, size, 1, prefer_b, upsert)? {
                    self.started.insert(k, ids);
                }
                Ok(None)
            }
            _ => unreachable!("not a write: {op:?}"),
        }
    }

    /// End, UpsertEnd and Revoke, naming the ids of the key's last Start.
    fn finish_write(&mut self, op: Op) -> (Outcome, Outcome) {
        let (h, model) = (&self.h, &mut self.model);
        let started = |k: u8| self.started.get(&k).cloned().unwrap_or_default();
        match op {
            Op::End(k) | Op::UpsertEnd(k) => {
                let ids = started(k);
                let req = h.end_req("", &key(k), ids.clone());
                let engine = if matches!(op, Op::End(_)) {
                    h.engine.put_end(&req)
                } else {
                    h.engine.upsert_end(&req)
                };
                (done(engine), model.end(&key(k), &ids))
            }
            Op::Revoke(k) => {
                let ids = started(k);
                let engine = h.engine.put_revoke(&h.revoke_req("", &key(k), ids.clone()));
                (done(engine), model.revoke(&key(k), &ids))
            }
            _ => unreachable!("not an End or Revoke: {op:?}"),
        }
    }

    fn remove(&mut self, op: Op) -> (Outcome, Outcome) {
        let (h, model) = (&self.h, &mut self.model);
        match op {
            Op::Remove(k, force) => {
                let sent = force || self.bug == Some(Bug::RemoveIgnoresLease);
                (done(h.remove(&key(k), sent)), model.remove(&key(k), force))
            }
            Op::RemoveAll(force) => {
                let engine = h.remove_all("", force);
                let engine = engine.map(|n| Reply::Count(n as u64)).map_err(|e| e.code);
                (engine, model.remove_all(force))
            }
            _ => unreachable!("not a removal: {op:?}"),
        }
    }

    /// Get (whose ids a later Revalidate names), Exist and Revalidate.
    fn read(&mut self, op: Op) -> std::result::Result<(Outcome, Outcome), TestCaseError> {
        let (h, model) = (&self.h, &mut self.model);
        Ok(match op {
            Op::Get(k) => {
                let engine = h.get(&key(k));
                if let Ok(r) = &engine {
                    let complete = r
                        .replicas
                        .iter()
                        .all(|d| d.status == ReplicaStatus::Complete);
                    prop_assert!(complete, "a Get returned an incomplete replica: {:?}", r);
                    self.read.insert(k, ids(&r.replicas));
                }
                let engine = engine.map(|r| replicas(&r)).map_err(|e| e.code);
                (engine, model.get(&key(k)))
            }
            Op::Exist(k) => {
                let engine = h.engine.exist_key(&h.key_req("", &key(k)));
                let engine = engine.map(Reply::Exists).map_err(|e| e.code);
                (engine, model.exists(&key(k)))
            }
            Op::Revalidate(k) => {
                let ids = self.read.get(&k).cloned().unwrap_or_default();
                let engine = done(h.revalidate(&key(k), ids.clone()));
                (engine, model.revalidate(&key(k), &ids))
            }
            _ => unreachable!("not a read: {op:?}"),
        })
    }

    /// Time, the periodic duties, a segment coming back and a master restart.
    fn duty(&mut self, op: Op) -> (Outcome, Outcome) {
        let (h, model) = (&mut self.h, &mut self.model);
        match op {
            Op::Advance(ms) => {
                h.advance(ms as u64);
                model.advance(ms as u64);
                (Ok(Reply::Done), Ok(Reply::Done))
            }
            Op::Evict => {
                let report = h.engine.run_eviction();
                let engine = Reply::Evicted {
                    keys: report.evicted_keys,
                    bytes: report.evicted_bytes,
                    released: report.released_buffers,
                };
                (Ok(engine), model.evict())
            }
            Op::Sweep => {
                let engine = Reply::Count(h.engine.sweep_stalled_writes() as u64);
                (Ok(engine), model.sweep())
            }
            Op::Remount => {
                let engine = done(h.unmount(self.seg_a));
                model.lose_segment(SEGMENTS[0]);
                self.seg_a = h.mount(SEGMENTS[0], BASE, SEGMENT_BYTES);
                (engine, Ok(Reply::Done))
            }
            Op::Restart => {
                h.restart();
                self.seg_a = h.mount(SEGMENTS[0], BASE, SEGMENT_BYTES);
                h.mount(SEGMENTS[1], 2 * BASE, SEGMENT_BYTES);
                model.restart();
                // A new master starts a new event stream; subscribers resynchronise.
                self.events.clear();
                (Ok(Reply::Done), Ok(Reply::Done))
            }
            _ => unreachable!("not a duty: {op:?}"),
        }
    }

    /// A Start compared with the model; on success the model learns the issued ids, which
    /// must be new, and the ids are returned.
    fn start(
        &mut self,
        op: Op,
        k: u8,
        size: u16,
        replicas: u8,
        prefer_b: bool,
        upsert: bool,
    ) -> std::result::Result<Option<Vec<ReplicaId>>, TestCaseError> {
        let prefer = if prefer_b { ["b", "a"] } else { ["a", "b"] };
        let config = ReplicateConfig {
            replica_num: replicas as u32,
            preferred_segments: prefer.map(String::from).to_vec(),
            ..Default::default()
        };
        let req = self.h.start_req("", &key(k), size as u64, config);
        let engine = if upsert {
            self.h.engine.upsert_start(&req)
        } else {
            self.h.engine.put_start(&req)
        };
        let expected = self
            .model
            .start(&key(k), size as u64, replicas as usize, &prefer, upsert);
        let reply = engine.as_deref().map(placed).map_err(|e| e.code);
        agree(op, reply, expected)?;
        let Ok(descriptors) = engine else {
            return Ok(None);
        };
        for d in &descriptors {
            prop_assert!(self.issued.insert(d.id), "{:?} issued twice", d.id);
        }
        let issued: Vec<_> = descriptors
            .iter()
            .map(|d| (d.segment_name.to_string(), d.id))
            .collect();
        self.model.name_copies(&key(k), &issued);
        Ok(Some(ids(&descriptors)))
    }

    /// Invariants after every operation: events are meaningful and add up to the snapshot,
    /// readable keys and object counts match the model, space counters match the allocators.
    fn check(&mut self, op: Op) -> Step {
        let h = &self.h;
        replay(&mut self.events, h.sink.take())
            .map_err(|e| TestCaseError::fail(format!("{e} after {op:?}")))?;
        let placed: BTreeMap<(String, String), BTreeSet<Medium>> = h
            .engine
            .placement_snapshot(None)
            .objects
            .into_iter()
            .map(|o| ((o.tenant, o.key), o.media.into_iter().collect()))
            .collect();
        prop_assert_eq!(
            &placed,
            &self.events,
            "events disagree with the snapshot after {:?}",
            op
        );
        let readable = self.model.readable_keys();
        let available: BTreeSet<String> = self.events.keys().map(|(_, k)| k.clone()).collect();
        prop_assert_eq!(
            &available,
            &readable,
            "events disagree with the model after {:?}",
            op
        );
        let all_keys: BTreeSet<String> = h.engine.all_keys("").into_iter().collect();
        prop_assert_eq!(&all_keys, &readable, "readable keys after {:?}", op);
        let stats = h.engine.stats();
        prop_assert_eq!(
            stats.key_count,
            self.model.object_count(),
            "objects after {:?}",
            op
        );
        let used: u64 = h.engine.segments().iter().map(|s| s.used_bytes).sum();
        prop_assert_eq!(stats.allocated_bytes, used, "space after {:?}", op);
        Ok(())
    }

    /// Everything freed: once stalled writes and parked buffers are past their deadlines and
    /// every object is removed, no space is held.
    fn finish(mut self) -> Step {
        let last = Op::Advance(10_000);
        self.step(last)?;
        self.step(Op::Sweep)?;
        self.step(Op::RemoveAll(true))?;
        prop_assert_eq!(self.h.engine.stats().allocated_bytes, 0);
        prop_assert_eq!(self.model.object_count(), 0);
        Ok(())
    }
}

fn run(ops: &[Op], bug: Option<Bug>) -> Step {
    let mut world = World::new(bug);
    for op in ops {
        world.step(*op)?;
    }
    world.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    /// Random sequences: every answer (error code, replicas placed and read, counts, existence)
    /// is the model's, and the invariants of [`World::check`] hold after every operation.
    #[test]
    fn engine_answers_as_the_model_does(ops in ops()) {
        run(&ops, None)?;
    }
}

/// The comparison catches planted bugs: a hand-written sequence exposes each (and passes
/// without it), and the random search finds each within the usual case budget and shrinks it
/// to a handful of operations.
#[test]
fn model_comparison_catches_planted_bugs() {
    let leased_remove = [Op::Put(0, 64, 1, false), Op::Get(0), Op::Remove(0, false)];
    let cases = [
        (Bug::RemoveIgnoresLease, &leased_remove[..]),
        (Bug::LostPutEnd, &leased_remove[..1]),
    ];
    for (bug, exposing) in cases {
        run(exposing, None).unwrap();
        assert!(run(exposing, Some(bug)).is_err(), "{bug:?} not caught");
        let config = ProptestConfig {
            cases: CASES,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let mut runner = TestRunner::new_with_rng(config, rng);
        match runner.run(&ops(), |ops| run(&ops, Some(bug))) {
            Err(TestError::Fail(_, minimal)) => {
                assert!(minimal.len() <= 3, "{bug:?} shrank only to {minimal:?}")
            }
            other => panic!("random search missed {bug:?}: {other:?}"),
        }
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
