//! Leases and removal: cases 31–36, fix 3.

use super::*;

fn regex_remove(h: &Harness, regex: &str, force: bool) -> Result<i64> {
    h.engine.remove_by_regex(&RemoveByRegexRequest {
        tenant: String::new(),
        regex: regex.into(),
        force,
    })
}

#[test]
fn case_31_read_lease_blocks_remove_until_it_expires() {
    let h = Harness::new();
    h.put("k", 64);
    assert!(h.exists("k"));
    assert_eq!(code(h.remove("k", false)), ErrorCode::OBJECT_HAS_LEASE);
    h.advance(30);
    h.get("k").unwrap(); // extends the lease to now + 50
    h.advance(30);
    assert_eq!(
        code(h.remove("k", false)),
        ErrorCode::OBJECT_HAS_LEASE,
        "the second read extended the lease"
    );
    h.advance(20);
    h.remove("k", false).unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn case_32_force_bypasses_leases() {
    let h = Harness::new();
    h.put("k", 64);
    h.get("k").unwrap();
    h.remove("k", true).unwrap();
    for i in 0..5 {
        h.put(&format!("r{i}"), 64);
        h.get(&format!("r{i}")).unwrap();
    }
    assert_eq!(regex_remove(&h, "^r", false), Ok(0));
    assert_eq!(regex_remove(&h, "^r", true), Ok(5));
    for i in 0..10 {
        h.put(&format!("a{i}"), 64);
        h.get(&format!("a{i}")).unwrap();
    }
    assert_eq!(h.remove_all("", false), Ok(0));
    assert_eq!(h.remove_all("", true), Ok(10));
}

#[test]
fn case_33_remove_all_skips_leased_until_they_expire() {
    let h = Harness::new();
    for i in 0..10 {
        h.put(&format!("k{i}"), 64);
        if i % 2 == 0 {
            h.get(&format!("k{i}")).unwrap();
        }
    }
    assert_eq!(h.remove_all("", false), Ok(5));
    h.advance(LEASE_MS);
    assert_eq!(h.remove_all("", false), Ok(5));
    assert!(h.engine.all_keys("").is_empty());
}

#[test]
fn case_34_remove_in_flight_or_missing() {
    let h = Harness::new();
    h.put_start("k", 64).unwrap();
    assert_eq!(code(h.remove("k", false)), ErrorCode::REPLICA_IS_NOT_READY);
    assert_eq!(
        code(h.remove("k", true)),
        ErrorCode::REPLICA_IS_NOT_READY,
        "force does not bypass"
    );
    assert_eq!(
        code(h.remove("missing", false)),
        ErrorCode::OBJECT_NOT_FOUND
    );
}

#[test]
fn case_35_soft_pinned_objects_can_be_removed() {
    let h = Harness::new();
    let pin = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        ..Default::default()
    };
    for k in ["a", "b"] {
        let descs = h.put_start_with(k, 64, pin.clone()).unwrap();
        h.put_end(k, &descs).unwrap();
    }
    assert_eq!(h.engine.stats().soft_pin_key_count, 2);
    h.remove("a", false).unwrap();
    assert_eq!(h.remove_all("", false), Ok(1));
    assert_eq!(h.engine.stats().soft_pin_key_count, 0);
}

#[test]
fn case_36_objects_on_an_unmounted_segment_are_gone() {
    let h = Harness::new();
    h.put("k", 64);
    let seg0 = h.engine.segments()[0].segment.id;
    h.mount("seg-1", 2 * BASE, 16 * MIB);
    h.unmount(seg0).unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(!h.exists("k"));
    assert!(!h.engine.all_keys("").contains(&"k".to_string()));
    assert_eq!(code(h.remove("k", false)), ErrorCode::OBJECT_NOT_FOUND);
    let descs = h.put("k", 64);
    assert_eq!(&*descs[0].segment_name, "seg-1");
}

#[test]
fn batch_remove_reports_per_key() {
    let h = Harness::new();
    h.put("a", 64);
    h.put("b", 64);
    h.get("b").unwrap();
    h.put_start("c", 64).unwrap();
    let req = BatchRemoveRequest {
        tenant: String::new(),
        keys: vec![
            "a".into(),
            "b".into(),
            "c".into(),
            "d".into(),
            String::new(),
        ],
        force: false,
    };
    let codes: Vec<ErrorCode> = h
        .engine
        .batch_remove(&req)
        .unwrap()
        .into_iter()
        .map(|r| r.0.err().map_or(ErrorCode::OK, |e| e.code))
        .collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::OK,
            ErrorCode::OBJECT_HAS_LEASE,
            ErrorCode::REPLICA_IS_NOT_READY,
            ErrorCode::OBJECT_NOT_FOUND,
            ErrorCode::INVALID_PARAMS
        ]
    );
}

#[test]
fn fix_3_remove_all_has_an_error_channel() {
    let h = Harness::new();
    h.put("k", 64);
    assert_eq!(
        code(h.remove_all("_hidden", true)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.remove_all("bad\u{1}", true)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(h.remove_all("", false), Ok(1));
}

#[test]
fn remove_all_tenants_clears_every_tenant() {
    let h = Harness::new();
    h.put_in("a", "k", 64);
    h.put_in("b", "k", 64);
    h.put_in("", "k", 64);
    assert_eq!(h.engine.remove_all_tenants(false), 3);
    assert_eq!(h.engine.stats().key_count, 0);
}

fn clear(h: &Harness, client: ClientId, keys: &[&str], segment: &str) -> Result<Vec<String>> {
    h.engine.batch_replica_clear(&BatchReplicaClearRequest {
        client_id: client,
        tenant: String::new(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        segment_name: segment.into(),
    })
}

#[test]
fn replica_clear_takes_only_the_callers_unleased_objects() {
    let h = Harness::new();
    let me = h.client;
    h.put("a", 64);
    h.put("b", 64);
    let other = ClientId::new(8, 8);
    let theirs = h
        .engine
        .put_start(&PutStartRequest {
            client_id: other,
            ..h.start_req("", "theirs", 64, ReplicateConfig::default())
        })
        .unwrap();
    h.engine
        .put_end(&EndRequest {
            client_id: other,
            ..h.end_req("", "theirs", ids(&theirs))
        })
        .unwrap();
    h.get("a").unwrap();
    assert!(h.exists("b"));
    h.sink.take();
    // Both read leases still run: nothing is cleared.
    assert_eq!(clear(&h, me, &["a", "b"], ""), Ok(vec![]));
    assert!(h.exists("a") && h.exists("b"));
    h.advance(LEASE_MS + 1);
    h.get("b").unwrap(); // a new lease on b
    let long = "x".repeat(MAX_KEY_LEN + 1);
    let asked = ["", "missing", "theirs", "b", "a", long.as_str()];
    assert_eq!(clear(&h, me, &asked, ""), Ok(vec!["a".to_string()]));
    assert_eq!(h.sink.take(), vec![removed("a")]);
    assert_eq!(code(h.get("a")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(h.exists("theirs"), "another client's object stays");
    h.advance(LEASE_MS + 1);
    assert_eq!(clear(&h, me, &["b", "b"], ""), Ok(vec!["b".to_string()]));
    assert!(!h.exists("b"));
}

#[test]
fn replica_clear_by_segment_drops_that_segments_replicas_and_the_object_with_its_last() {
    let h = Harness::bare(Harness::config());
    h.mount("a", BASE, MIB);
    h.mount("b", 2 * BASE, MIB);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let descs = h.put_start_with("k", 64, two).unwrap();
    h.put_end("k", &descs).unwrap();
    h.sink.take();
    h.advance(LEASE_MS + 1);
    assert_eq!(clear(&h, h.client, &["k"], "nowhere:1"), Ok(vec![]));
    assert_eq!(h.get("k").unwrap().replicas.len(), 2);
    h.advance(LEASE_MS + 1);
    assert_eq!(clear(&h, h.client, &["k"], "a"), Ok(vec!["k".to_string()]));
    // One memory replica is left: still stored, no event.
    assert!(h.sink.take().is_empty());
    let left = h.get("k").unwrap().replicas;
    assert_eq!(left.len(), 1);
    let kept = &descs.iter().find(|d| d.id == left[0].id).unwrap();
    assert_eq!(kept.id, left[0].id);
    h.advance(LEASE_MS + 1);
    assert_eq!(
        clear(&h, h.client, &["k"], "a"),
        Ok(vec![]),
        "nothing left on a"
    );
    assert_eq!(clear(&h, h.client, &["k"], "b"), Ok(vec!["k".to_string()]));
    assert_eq!(h.sink.take(), vec![removed("k")]);
    assert!(!h.exists("k"));
}

#[test]
fn replica_clear_leaves_a_write_in_flight_and_refuses_a_bad_tenant() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    h.advance(LEASE_MS + 1);
    assert_eq!(clear(&h, h.client, &["k"], ""), Ok(vec![]));
    assert_eq!(clear(&h, h.client, &["k"], "seg-0"), Ok(vec![]));
    h.put_end("k", &descs).unwrap();
    assert!(h.exists("k"));
    let bad = h.engine.batch_replica_clear(&BatchReplicaClearRequest {
        client_id: h.client,
        tenant: "_reserved".into(),
        keys: vec!["k".into()],
        segment_name: String::new(),
    });
    assert_eq!(code(bad), ErrorCode::INVALID_PARAMS);
    assert_eq!(clear(&h, h.client, &[], ""), Ok(vec![]));
}
