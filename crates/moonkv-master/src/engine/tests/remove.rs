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
