//! Availability events through the sink: every row of the SPEC §4 emission table.

use super::*;

#[test]
fn put_end_emits_one_stored_and_repeats_emit_nothing() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    assert!(
        h.sink.take().is_empty(),
        "an uncommitted put publishes nothing"
    );
    h.put_end("k", &descs).unwrap();
    h.put_end("k", &descs).unwrap();
    assert_eq!(h.sink.take(), vec![stored("k")]);
}

#[test]
fn multi_replica_put_emits_one_stored_per_medium() {
    let h = Harness::bare(Harness::config());
    h.mount("a", BASE, MIB);
    h.mount("b", 2 * BASE, MIB);
    let descs = h
        .put_start_with(
            "k",
            64,
            ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            },
        )
        .unwrap();
    h.put_end("k", &descs).unwrap();
    assert_eq!(h.sink.take(), vec![stored("k")]);
}

#[test]
fn revoke_and_failed_puts_emit_nothing() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    h.put_revoke("k", &descs).unwrap();
    let _ = h.put_start("big", 64 * MIB);
    let _ = h.put_start("", 64);
    assert!(h.sink.take().is_empty());
}

#[test]
fn upsert_of_a_readable_object_emits_removed_then_stored() {
    for size in [64, 4096] {
        let h = Harness::new();
        h.put("k", 64);
        h.sink.take();
        let descs = h
            .engine
            .upsert_start(&h.start_req("", "k", size, ReplicateConfig::default()))
            .unwrap();
        assert_eq!(
            h.sink.take(),
            vec![removed("k")],
            "size {size}: removed at UpsertStart"
        );
        h.engine
            .upsert_end(&h.end_req("", "k", ids(&descs)))
            .unwrap();
        assert_eq!(
            h.sink.take(),
            vec![stored("k")],
            "size {size}: stored at commit"
        );
    }
}

#[test]
fn upsert_preempting_an_uncommitted_put_emits_only_the_commit() {
    let h = Harness::new();
    h.put_start("k", 64).unwrap();
    let descs = h
        .engine
        .upsert_start(&h.start_req("", "k", 64, ReplicateConfig::default()))
        .unwrap();
    assert!(h.sink.take().is_empty());
    h.engine
        .upsert_end(&h.end_req("", "k", ids(&descs)))
        .unwrap();
    assert_eq!(h.sink.take(), vec![stored("k")]);
}

#[test]
fn remove_family_emits_removed_per_object() {
    let h = Harness::new();
    for k in ["a", "b", "c", "d"] {
        h.put(k, 64);
    }
    h.sink.take();
    h.remove("a", false).unwrap();
    assert_eq!(h.sink.take(), vec![removed("a")]);
    let req = BatchRemoveRequest {
        tenant: String::new(),
        keys: vec!["b".into(), "zz".into()],
        force: false,
    };
    h.engine.batch_remove(&req).unwrap();
    assert_eq!(h.sink.take(), vec![removed("b")]);
    h.engine
        .remove_by_regex(&RemoveByRegexRequest {
            tenant: String::new(),
            regex: "^c$".into(),
            force: false,
        })
        .unwrap();
    assert_eq!(h.sink.take(), vec![removed("c")]);
    assert_eq!(code(h.remove("zz", true)), ErrorCode::OBJECT_NOT_FOUND);
    assert!(h.sink.take().is_empty(), "failed removals emit nothing");
}

#[test]
fn remove_all_emits_removed_then_cleared_when_emptied() {
    let h = Harness::new();
    h.put("a", 64);
    h.put("b", 64);
    h.put_in("other", "a", 64);
    h.sink.take();
    assert_eq!(h.remove_all("", false), Ok(2));
    let mut events = h.sink.take();
    assert_eq!(events.pop(), Some(Ev::Cleared("default".into())));
    events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(events, vec![removed("a"), removed("b")]);
    assert_eq!(h.remove_all("", false), Ok(0));
    assert!(
        h.sink.take().is_empty(),
        "nothing when the tenant held no objects"
    );
}

#[test]
fn remove_all_with_a_leased_object_emits_no_cleared() {
    let h = Harness::new();
    h.put("a", 64);
    h.put("b", 64);
    h.get("b").unwrap();
    h.sink.take();
    assert_eq!(h.remove_all("", false), Ok(1));
    assert_eq!(h.sink.take(), vec![removed("a")]);
    h.advance(LEASE_MS);
    assert_eq!(h.remove_all("", false), Ok(1));
    assert_eq!(
        h.sink.take(),
        vec![removed("b"), Ev::Cleared("default".into())]
    );
}

#[test]
fn remove_all_with_an_in_flight_write_emits_no_cleared() {
    let h = Harness::new();
    h.put("a", 64);
    h.put_start("w", 64).unwrap();
    h.sink.take();
    assert_eq!(h.remove_all("", true), Ok(1));
    assert_eq!(h.sink.take(), vec![removed("a")]);
}

#[test]
fn eviction_emits_removed() {
    let h = Harness::bare(EngineConfig {
        eviction_high_watermark_ratio: 0.0,
        eviction_ratio: 1.0,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    h.put("k", 64);
    h.sink.take();
    h.engine.run_eviction();
    assert_eq!(h.sink.take(), vec![removed("k")]);
}

#[test]
fn unmount_emits_removed_only_for_objects_losing_their_last_replica() {
    let h = Harness::bare(Harness::config());
    let a = h.mount("a", BASE, MIB);
    h.mount("b", 2 * BASE, MIB);
    let only_a = ReplicateConfig {
        preferred_segments: vec!["a".into()],
        ..Default::default()
    };
    let descs = h.put_start_with("solo", 64, only_a).unwrap();
    h.put_end("solo", &descs).unwrap();
    let descs = h
        .put_start_with(
            "both",
            64,
            ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            },
        )
        .unwrap();
    h.put_end("both", &descs).unwrap();
    h.put_start_with(
        "pending",
        64,
        ReplicateConfig {
            preferred_segments: vec!["a".into()],
            ..Default::default()
        },
    )
    .unwrap();
    h.sink.take();
    h.unmount(a).unwrap();
    assert_eq!(h.sink.take(), vec![removed("solo")]);
    assert_eq!(h.get("both").unwrap().replicas.len(), 1);
    assert_eq!(code(h.get("pending")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn client_expiry_emits_removed() {
    let h = Harness::new();
    h.put("k", 64);
    h.sink.take();
    h.advance(10_001);
    h.engine.tick();
    assert_eq!(h.sink.take(), vec![removed("k")]);
}

#[test]
fn stalled_write_sweep_emits_nothing() {
    let h = Harness::new();
    h.put_start("k", 64).unwrap();
    h.advance(h.engine.config().put_start_release_timeout_ms + 1);
    h.engine.sweep_stalled_writes();
    assert!(h.sink.take().is_empty());
}

#[test]
fn grouped_objects_carry_their_group_and_tenant() {
    let h = Harness::new();
    let req = h.start_req(
        "t1",
        "k",
        64,
        ReplicateConfig {
            group_ids: Some(vec!["g".into()]),
            ..Default::default()
        },
    );
    let descs = h.engine.put_start(&req).unwrap();
    h.engine
        .put_end(&h.end_req("t1", "k", ids(&descs)))
        .unwrap();
    assert_eq!(
        h.sink.take(),
        vec![Ev::Stored(
            "t1".into(),
            "k".into(),
            Some("g".into()),
            Medium::Cpu
        )]
    );
}

#[test]
fn placement_snapshot_plus_later_events_is_exact() {
    let h = Harness::new();
    h.put("a", 64);
    h.put_in("t", "b", 64);
    h.put_start("pending", 64).unwrap();
    let snap = h.engine.placement_snapshot(None);
    assert_eq!(snap.watermark_event_id, 2);
    let keys: Vec<(&str, &str)> = snap
        .objects
        .iter()
        .map(|o| (o.tenant.as_str(), o.key.as_str()))
        .collect();
    assert_eq!(keys, vec![("default", "a"), ("t", "b")]);
    assert_eq!(snap.objects[0].media, vec![Medium::Cpu]);
    let only_t = h.engine.placement_snapshot(Some("t"));
    assert_eq!(only_t.objects.len(), 1);
}
