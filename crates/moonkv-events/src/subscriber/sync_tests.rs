use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::*;
use crate::codec::{EventKind, Medium};
use crate::subscriber::index::MediaSet;
use crate::subscriber::snapshot::SnapshotObject;
use crate::subscriber::stream::StreamTracker;

fn ev(id: u64, kind: EventKind, tenant: &str, key: &str, medium: Medium) -> DecodedEvent {
    DecodedEvent {
        event_id: Some(id),
        timestamp_ms: Some(0),
        kind,
        tenant_id: Some(tenant.into()),
        backend_id: Some("b".into()),
        medium: (kind != EventKind::Cleared).then(|| medium.as_str().into()),
        object_key: (kind != EventKind::Cleared).then(|| key.into()),
        group_id: None,
        model_name: None,
        block_size: None,
        additional_salt: None,
        lora_name: None,
        dp_rank: Some(0),
    }
}

fn stored(id: u64, key: &str) -> DecodedEvent {
    ev(id, EventKind::Stored, "t", key, Medium::Cpu)
}

fn snap(watermark: u64, objects: &[(&str, &str)]) -> Snapshot {
    Snapshot {
        backend_id: "b".into(),
        publisher_epoch: 1,
        watermark_event_id: watermark,
        objects: objects
            .iter()
            .map(|(t, k)| SnapshotObject {
                tenant_id: (*t).into(),
                object_key: (*k).into(),
                media: vec![Medium::Cpu],
            })
            .collect(),
    }
}

/// Serves queued answers and records each request's tenant filter.
#[derive(Clone, Default)]
struct FakeSource {
    answers: Arc<Mutex<VecDeque<Result<Snapshot, String>>>>,
    requests: Arc<Mutex<Vec<Option<String>>>>,
}

impl FakeSource {
    fn answer(&self, a: Result<Snapshot, String>) {
        self.answers.lock().expect("test lock").push_back(a);
    }
    fn requests(&self) -> Vec<Option<String>> {
        self.requests.lock().expect("test lock").clone()
    }
}

impl SnapshotSource for FakeSource {
    fn fetch(&mut self, tenant_id: Option<&str>) -> Result<Snapshot, EventsError> {
        self.requests
            .lock()
            .expect("test lock")
            .push(tenant_id.map(Into::into));
        match self.answers.lock().expect("test lock").pop_front() {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(EventsError::Snapshot(e)),
            None => Err(EventsError::Snapshot("no answer queued".into())),
        }
    }
}

fn keys(sync: &IndexSync) -> Vec<String> {
    sync.index()
        .entries()
        .into_iter()
        .map(|e| format!("{}/{}", e.tenant_id, e.object_key))
        .collect()
}

#[test]
fn initial_snapshot_then_buffered_events_past_the_watermark() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    assert!(sync.needs_recovery());
    // Subscribed first: events 3..=6 arrive before the snapshot.
    sync.on_message(SequenceVerdict::First, &[stored(3, "a"), stored(4, "b")]);
    sync.on_message(SequenceVerdict::InOrder, &[stored(5, "c"), stored(6, "d")]);
    assert!(
        sync.index().is_empty(),
        "nothing applied before the snapshot"
    );
    src.answer(Ok(snap(4, &[("t", "a"), ("t", "b"), ("t", "old")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    assert_eq!(keys(&sync), ["t/a", "t/b", "t/c", "t/d", "t/old"]);
    assert_eq!(sync.counters().covered_by_snapshot, 2);
    sync.on_message(
        SequenceVerdict::InOrder,
        &[ev(7, EventKind::Removed, "t", "old", Medium::Cpu)],
    );
    assert_eq!(keys(&sync).len(), 4);
    assert!(sync.is_live());
}

#[test]
fn event_id_jump_while_live_triggers_recovery() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    src.answer(Ok(snap(10, &[])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    sync.on_message(SequenceVerdict::InOrder, &[stored(11, "a")]);
    // 12 never arrived (slow joiner / lost without a sequence gap)
    sync.on_message(SequenceVerdict::InOrder, &[stored(13, "c")]);
    assert!(sync.needs_recovery());
    assert_eq!(sync.counters().event_id_discontinuities, 1);
    src.answer(Ok(snap(13, &[("t", "a"), ("t", "b"), ("t", "c")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    assert_eq!(keys(&sync), ["t/a", "t/b", "t/c"]);
}

#[test]
fn gap_keeps_buffering_and_restart_keeps_only_the_new_stream() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    src.answer(Ok(snap(0, &[])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    sync.on_message(SequenceVerdict::InOrder, &[stored(1, "a")]);
    sync.on_message(SequenceVerdict::Gap { missed: 3 }, &[stored(5, "e")]);
    assert!(sync.needs_recovery());
    sync.on_message(SequenceVerdict::InOrder, &[stored(6, "f")]);
    // The master restarts before our fetch succeeds: its ids begin again at 1.
    sync.on_message(
        SequenceVerdict::Restart { previous: 9 },
        &[stored(1, "x"), stored(2, "y")],
    );
    src.answer(Ok(snap(1, &[("t", "x")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    assert_eq!(
        keys(&sync),
        ["t/x", "t/y"],
        "new events kept, old stream dropped"
    );
    sync.on_message(SequenceVerdict::InOrder, &[stored(3, "z")]);
    assert!(sync.is_live());
}

#[test]
fn restart_detected_only_by_ids_going_backwards() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    src.answer(Err("master down".into()));
    sync.on_message(SequenceVerdict::First, &[stored(100, "old")]);
    assert!(sync.recover(Instant::now()).is_err());
    // transport looked like a gap, but ids restart: the old buffered event must go
    sync.on_message(
        SequenceVerdict::Gap { missed: 1 },
        &[stored(1, "n1"), stored(2, "n2")],
    );
    src.answer(Ok(snap(1, &[("t", "n1")])));
    assert_eq!(
        sync.recover(Instant::now() + Duration::from_secs(5)).ok(),
        Some(true)
    );
    assert_eq!(keys(&sync), ["t/n1", "t/n2"]);
}

#[test]
fn stale_snapshot_is_refetched() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    sync.on_message(SequenceVerdict::First, &[stored(8, "h")]);
    src.answer(Ok(snap(5, &[])));
    let now = Instant::now();
    assert_eq!(sync.recover(now).ok(), Some(false));
    assert_eq!(sync.counters().incomplete_recoveries, 1);
    src.answer(Ok(snap(8, &[("t", "f"), ("t", "g"), ("t", "h")])));
    assert_eq!(
        sync.recover(now).ok(),
        Some(true),
        "a refetch is due at once"
    );
    assert_eq!(keys(&sync), ["t/f", "t/g", "t/h"]);
}

#[test]
fn failed_fetch_waits_for_the_retry_interval() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None)
        .with_retry_interval(Duration::from_secs(1));
    let t0 = Instant::now();
    src.answer(Err("refused".into()));
    assert!(sync.recover(t0).is_err());
    assert_eq!(
        sync.recover(t0 + Duration::from_millis(500)).ok(),
        Some(false)
    );
    assert_eq!(src.requests().len(), 1);
    src.answer(Ok(snap(0, &[])));
    assert_eq!(sync.recover(t0 + Duration::from_secs(1)).ok(), Some(true));
    assert_eq!(sync.counters().recovery_failures, 1);
    assert_eq!(sync.counters().recoveries, 1);
}

#[test]
fn tenant_scope_replaces_only_that_tenant() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), Some("t".into()));
    src.answer(Ok(snap(2, &[("t", "a"), ("other", "ignored")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    assert_eq!(src.requests(), [Some("t".to_string())]);
    sync.on_message(
        SequenceVerdict::InOrder,
        &[
            ev(3, EventKind::Stored, "other", "x", Medium::Cpu),
            ev(4, EventKind::Stored, "t", "b", Medium::Disk),
        ],
    );
    assert_eq!(keys(&sync), ["t/a", "t/b"]);
    assert_eq!(sync.counters().out_of_scope_events, 1);
    assert!(
        sync.is_live(),
        "ids of other tenants still count for continuity"
    );
}

#[test]
fn without_a_source_a_loss_invalidates() {
    let mut sync = IndexSync::new(None, None);
    assert!(sync.is_live());
    sync.on_message(SequenceVerdict::First, &[stored(1, "a"), stored(2, "b")]);
    assert_eq!(keys(&sync).len(), 2);
    sync.on_message(SequenceVerdict::Gap { missed: 1 }, &[stored(9, "c")]);
    assert_eq!(keys(&sync), ["t/c"]);
    sync.on_message(SequenceVerdict::InOrder, &[stored(11, "d")]);
    assert_eq!(keys(&sync), ["t/d"], "an id jump is a loss too");
    assert_eq!(sync.counters().invalidations, 2);
    assert_eq!(sync.recover(Instant::now()).ok(), Some(false));
}

#[test]
fn buffer_is_bounded() {
    let mut sync =
        IndexSync::new(Some(Box::new(FakeSource::default())), None).with_max_buffered_events(3);
    let events: Vec<_> = (1..=5).map(|i| stored(i, "k")).collect();
    sync.on_message(SequenceVerdict::First, &events);
    assert_eq!(sync.counters().buffer_overflows, 2);
}

// ---- model-based: a master model, a lossy stream, snapshots at random moments ----

type Placement = BTreeMap<(String, String), MediaSet>;

/// A deliberately simple master: placement plus the event log with ids.
#[derive(Default)]
struct Master {
    placement: Placement,
    last_id: u64,
}

impl Master {
    fn apply(&mut self, op: (u8, u8, bool)) -> Vec<DecodedEvent> {
        let (tenant_no, key_no, disk) = op;
        let tenant = format!("t{}", tenant_no % 2);
        let key = format!("k{}", key_no % 6);
        let medium = if disk { Medium::Disk } else { Medium::Cpu };
        let slot = (tenant.clone(), key.clone());
        let mut out = Vec::new();
        let mut emit = |m: &mut Master, kind| {
            m.last_id += 1;
            out.push(ev(m.last_id, kind, &tenant, &key, medium));
        };
        match key_no % 4 {
            0 | 1 => {
                self.placement.entry(slot).or_default().insert(medium);
                emit(self, EventKind::Stored);
            }
            2 => {
                if let Some(media) = self.placement.get_mut(&slot) {
                    media.remove(medium);
                    if media.is_empty() {
                        self.placement.remove(&slot);
                    }
                }
                emit(self, EventKind::Removed);
            }
            _ => {
                let before = self.placement.len();
                self.placement.retain(|(t, _), _| *t != tenant);
                if self.placement.len() != before {
                    emit(self, EventKind::Cleared);
                }
            }
        }
        out
    }

    fn snapshot(&self) -> Snapshot {
        let objects = self
            .placement
            .iter()
            .map(|((t, k), m)| SnapshotObject {
                tenant_id: t.clone(),
                object_key: k.clone(),
                media: m.iter().collect(),
            })
            .collect();
        Snapshot {
            backend_id: "b".into(),
            publisher_epoch: 7,
            watermark_event_id: self.last_id,
            objects,
        }
    }
}

struct ModelSource(Arc<Mutex<Master>>);

impl SnapshotSource for ModelSource {
    fn fetch(&mut self, _tenant: Option<&str>) -> Result<Snapshot, EventsError> {
        Ok(self.0.lock().expect("test lock").snapshot())
    }
}

fn index_placement(sync: &IndexSync) -> Placement {
    sync.index()
        .entries()
        .into_iter()
        .map(|e| ((e.tenant_id, e.object_key), e.media))
        .collect()
}

/// Runs ops through a lossy stream; returns (model placement, index placement).
fn run_model(ops: &[(u8, u8, bool)], lose: &[bool], fetch_at: &[bool]) -> (Placement, Placement) {
    let master = Arc::new(Mutex::new(Master::default()));
    let mut sync = IndexSync::new(Some(Box::new(ModelSource(Arc::clone(&master)))), None);
    let mut tracker = StreamTracker::new();
    let mut seq = 0;
    let now = Instant::now();
    for (i, op) in ops.iter().enumerate() {
        let events = master.lock().expect("test lock").apply(*op);
        if events.is_empty() {
            continue;
        }
        seq += 1;
        if !lose.get(i).copied().unwrap_or(false) {
            sync.on_message(tracker.observe(seq), &events);
        }
        if fetch_at.get(i).copied().unwrap_or(false) {
            let _ = sync.recover(now);
        }
    }
    // A final reliably delivered message makes any tail loss visible.
    let tail = master.lock().expect("test lock").apply((0, 0, false));
    sync.on_message(tracker.observe(seq + 1), &tail);
    for _ in 0..3 {
        let _ = sync.recover(now);
    }
    assert!(sync.is_live());
    let model = master.lock().expect("test lock").placement.clone();
    (model, index_placement(&sync))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn snapshot_plus_later_events_equals_current_placement(
        ops in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..120),
        lose in proptest::collection::vec(proptest::bool::weighted(0.15), 120),
        fetch_at in proptest::collection::vec(proptest::bool::weighted(0.2), 120),
    ) {
        let (model, index) = run_model(&ops, &lose, &fetch_at);
        prop_assert_eq!(model, index);
    }
}

/// Self-check of the harness: an index fed the same lossy stream without recovery diverges.
#[test]
fn harness_catches_an_index_that_ignores_losses() {
    let ops: Vec<(u8, u8, bool)> = (0..40u8).map(|i| (i % 3, i, i % 5 == 0)).collect();
    let lose: Vec<bool> = (0..40).map(|i| i % 4 == 1).collect();
    let master = Arc::new(Mutex::new(Master::default()));
    let mut naive = PlacementIndex::new();
    for (i, op) in ops.iter().enumerate() {
        let events = master.lock().expect("test lock").apply(*op);
        if !lose[i] {
            events.iter().for_each(|e| {
                naive.apply(e);
            });
        }
    }
    let naive: Placement = naive
        .entries()
        .into_iter()
        .map(|e| ((e.tenant_id, e.object_key), e.media))
        .collect();
    assert_ne!(naive, master.lock().expect("test lock").placement);
    let (model, index) = run_model(&ops, &lose, &[]);
    assert_eq!(model, index);
}

#[test]
fn events_queued_during_the_snapshot_fetch_are_skipped_without_refetching() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    sync.on_message(SequenceVerdict::First, &[stored(1, "a")]);
    // The master moved on to event 5 while the snapshot was fetched.
    src.answer(Ok(snap(5, &[("t", "a"), ("t", "b"), ("t", "c")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    // Messages already queued in the socket: ids 2..=5 are in the snapshot, 6 is new.
    sync.on_message(SequenceVerdict::InOrder, &[stored(2, "b"), stored(3, "c")]);
    sync.on_message(
        SequenceVerdict::InOrder,
        &[
            ev(4, EventKind::Stored, "t", "x", Medium::Cpu),
            ev(5, EventKind::Removed, "t", "x", Medium::Cpu),
            stored(6, "d"),
        ],
    );
    assert!(
        sync.is_live(),
        "covered events must not send the index back to recovery"
    );
    assert_eq!(src.requests().len(), 1, "exactly one snapshot fetched");
    assert_eq!(keys(&sync), ["t/a", "t/b", "t/c", "t/d"]);
    assert_eq!(sync.counters().event_id_discontinuities, 0);
    // A real jump past the last id still triggers recovery.
    sync.on_message(SequenceVerdict::InOrder, &[stored(9, "e")]);
    assert!(!sync.is_live());
}

#[test]
fn a_restarted_publisher_whose_transport_sequence_continues_is_reconciled_not_skipped() {
    let src = FakeSource::default();
    let mut sync = IndexSync::new(Some(Box::new(src.clone())), None);
    src.answer(Ok(snap(10, &[("t", "old")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    sync.on_message(
        SequenceVerdict::InOrder,
        &[stored(11, "a"), stored(12, "b")],
    );
    // The publisher restarts; its first message's transport sequence happens to be the next
    // one, so only the ids (back at 1) tell. Its events are new: nothing may be dropped.
    sync.on_message(
        SequenceVerdict::InOrder,
        &[stored(1, "n1"), stored(2, "n2")],
    );
    assert!(sync.needs_recovery(), "ids moving backwards mean a restart");
    assert_eq!(sync.counters().event_id_discontinuities, 1);
    assert_eq!(sync.counters().covered_by_snapshot, 0);
    // The new master's snapshot holds what it re-adopted plus n1; n2 comes from the buffer.
    src.answer(Ok(snap(1, &[("t", "a"), ("t", "n1")])));
    assert_eq!(sync.recover(Instant::now()).ok(), Some(true));
    assert_eq!(keys(&sync), ["t/a", "t/n1", "t/n2"]);
}
