//! Tenants: case 58 (reversed by fix 6), cases 59–64.

use super::*;

fn multi() -> Harness {
    let h = Harness::bare(EngineConfig {
        enable_multi_tenants: true,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    h
}

fn start(h: &Harness, tenant: &str, key: &str, size: u64) -> Result<Vec<ReplicaDescriptor>> {
    h.engine
        .put_start(&h.start_req(tenant, key, size, ReplicateConfig::default()))
}

fn charged(h: &Harness, tenant: &str) -> u64 {
    h.engine.tenant_quotas(Some(tenant)).unwrap()[0].charged_bytes
}

#[test]
fn case_58_reversed_tenants_isolate_in_single_tenant_mode() {
    let h = Harness::new();
    h.put_in("tenant-a", "k", 64);
    assert!(!h.engine.exist_key(&h.key_req("tenant-b", "k")).unwrap());
    assert!(h.engine.exist_key(&h.key_req("tenant-a", "k")).unwrap());
    assert_eq!(
        code(h.engine.tenant_quotas(None)),
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
    );
    assert_eq!(
        code(h.engine.set_tenant_quota("a", 1)),
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
    );
    assert_eq!(
        code(h.engine.delete_tenant_quota("a")),
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
    );
}

#[test]
fn case_59_registration_is_required_for_writes() {
    let h = multi();
    assert_eq!(
        code(start(&h, "nobody", "k", 64)),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    assert_eq!(
        code(start(&h, "default", "k", 64)),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    h.engine.set_tenant_quota("default", MIB).unwrap();
    start(&h, "default", "k", 64).unwrap();
    assert_eq!(
        code(start(&h, "", "k2", 64)),
        ErrorCode::TENANT_NOT_REGISTERED,
        "empty is refused on writes"
    );
    assert_eq!(
        code(start(&h, "bad\u{1}", "k2", 64)),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    assert_eq!(
        code(h.engine.get_replica_list(&h.key_req("_x", "k"))),
        ErrorCode::INVALID_PARAMS
    );
    let batch = h
        .engine
        .batch_exist_key(&KeysRequest {
            tenant: "_x".into(),
            keys: vec!["a".into(), "b".into()],
        })
        .unwrap();
    assert!(batch
        .iter()
        .all(|r| r.0.as_ref().map_err(|e| e.code) == Err(ErrorCode::INVALID_PARAMS)));
    // Reads with "" mean the default tenant.
    assert!(
        !h.engine.exist_key(&h.key_req("", "k")).unwrap(),
        "still in flight"
    );
}

#[test]
fn case_60_same_key_in_two_tenants_is_independent() {
    let h = multi();
    for t in ["a", "b"] {
        h.engine.set_tenant_quota(t, MIB).unwrap();
        h.put_in(t, "k", if t == "a" { 64 } else { 128 });
    }
    assert_eq!(
        h.engine
            .get_replica_list(&h.key_req("a", "k"))
            .unwrap()
            .replicas[0]
            .size,
        64
    );
    assert_eq!(
        h.engine
            .get_replica_list(&h.key_req("b", "k"))
            .unwrap()
            .replicas[0]
            .size,
        128
    );
    h.advance(LEASE_MS);
    h.engine
        .remove(&RemoveRequest {
            tenant: "a".into(),
            key: "k".into(),
            force: false,
        })
        .unwrap();
    assert!(h.engine.exist_key(&h.key_req("b", "k")).unwrap());
    h.put_in("a", "k", 64);
    let regex = h
        .engine
        .get_replica_list_by_regex(&RegexRequest {
            tenant: "a".into(),
            regex: "k".into(),
        })
        .unwrap();
    assert_eq!(regex[0].1[0].size, 64);
    h.advance(LEASE_MS);
    let req = BatchRemoveRequest {
        tenant: "a".into(),
        keys: vec!["k".into()],
        force: false,
    };
    assert!(h.engine.batch_remove(&req).unwrap()[0].0.is_ok());
    assert!(h.engine.exist_key(&h.key_req("b", "k")).unwrap());
    h.advance(LEASE_MS);
    assert_eq!(h.remove_all("a", false), Ok(0));
    assert_eq!(h.remove_all("b", false), Ok(1));
}

#[test]
fn case_61_quota_charges_at_start_and_refunds_on_revoke() {
    let h = multi();
    h.engine.set_tenant_quota("t", 100).unwrap();
    let descs = start(&h, "t", "k", 100).unwrap();
    assert_eq!(charged(&h, "t"), 100);
    assert_eq!(
        code(start(&h, "t", "k2", 1)),
        ErrorCode::TENANT_QUOTA_EXCEEDED
    );
    h.engine
        .put_revoke(&h.revoke_req("t", "k", ids(&descs)))
        .unwrap();
    assert_eq!(charged(&h, "t"), 0);
    start(&h, "t", "k2", 1).unwrap();
}

#[test]
fn case_62_effective_quota_is_a_proportional_share() {
    let h = Harness::bare(EngineConfig {
        enable_multi_tenants: true,
        ..Harness::config()
    });
    h.engine.set_tenant_quota("a", 200).unwrap();
    h.engine.set_tenant_quota("b", 400).unwrap();
    let seg = h.mount("seg-0", BASE, 300);
    let q = h.engine.tenant_quotas(None).unwrap();
    assert_eq!(
        (q[0].effective_quota_bytes, q[1].effective_quota_bytes),
        (100, 200)
    );
    h.unmount(seg).unwrap();
    h.mount("seg-1", BASE, 100);
    h.engine.set_tenant_quota("c", 200).unwrap();
    // 100 bytes over requests 200/400/200: 25/50/25 exactly.
    let q = h.engine.tenant_quotas(None).unwrap();
    assert_eq!(
        q.iter()
            .map(|s| s.effective_quota_bytes)
            .collect::<Vec<_>>(),
        vec![25, 50, 25]
    );
    h.engine.set_tenant_quota("b", 200).unwrap();
    // 100 over three equal requests: 34/33/33, the extra byte to the smallest tenant id.
    let q = h.engine.tenant_quotas(None).unwrap();
    assert_eq!(
        q.iter()
            .map(|s| s.effective_quota_bytes)
            .collect::<Vec<_>>(),
        vec![34, 33, 33]
    );
}

#[test]
fn case_63_deleting_a_non_empty_tenant_is_refused() {
    let h = multi();
    h.engine.set_tenant_quota("t", MIB).unwrap();
    h.put_in("t", "k", 64);
    assert_eq!(
        code(h.engine.delete_tenant_quota("t")),
        ErrorCode::TENANT_NOT_EMPTY
    );
    let descs = start(&h, "t", "k2", 64).unwrap();
    assert_eq!(
        h.engine.remove_all_tenants(true),
        1,
        "the write in flight is skipped"
    );
    assert_eq!(
        code(h.engine.delete_tenant_quota("t")),
        ErrorCode::TENANT_NOT_EMPTY
    );
    h.engine
        .put_revoke(&h.revoke_req("t", "k2", ids(&descs)))
        .unwrap();
    h.engine.delete_tenant_quota("t").unwrap();
    assert_eq!(
        code(h.engine.delete_tenant_quota("t")),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(h.engine.tenant_quotas(Some("t"))),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(start(&h, "t", "k3", 64)),
        ErrorCode::TENANT_NOT_REGISTERED
    );
}

#[test]
fn case_64_over_quota_evicts_only_that_tenants_objects() {
    let h = multi();
    h.engine.set_tenant_quota("t", 1000).unwrap();
    h.engine.set_tenant_quota("u", 1000).unwrap();
    h.put_in("u", "k0", 500);
    for i in 0..4 {
        h.put_in("t", &format!("k{i}"), 250);
        h.advance(1);
    }
    assert_eq!(charged(&h, "t"), 1000);
    start(&h, "t", "new", 400).unwrap();
    assert_eq!(
        h.engine.all_keys("t"),
        vec!["k2", "k3"],
        "the two oldest made room"
    );
    assert_eq!(h.engine.all_keys("u"), vec!["k0"]);
    assert_eq!(charged(&h, "t"), 900);
}

#[test]
fn quota_follows_removal_and_settles_partial_allocations() {
    let h = multi();
    h.mount("seg-1", 2 * BASE, 16 * MIB);
    h.engine.set_tenant_quota("t", 10_000).unwrap();
    let three = ReplicateConfig {
        replica_num: 3,
        ..Default::default()
    };
    let descs = h
        .engine
        .put_start(&h.start_req("t", "k", 100, three))
        .unwrap();
    assert_eq!(descs.len(), 2);
    assert_eq!(
        charged(&h, "t"),
        200,
        "charge settles to the replicas granted"
    );
    h.engine.put_end(&h.end_req("t", "k", ids(&descs))).unwrap();
    h.engine
        .remove(&RemoveRequest {
            tenant: "t".into(),
            key: "k".into(),
            force: true,
        })
        .unwrap();
    assert_eq!(charged(&h, "t"), 0);
}

#[test]
fn quota_bounds_are_validated() {
    let h = multi();
    assert_eq!(
        code(h.engine.set_tenant_quota("t", 0)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.engine.set_tenant_quota("t", 1 << 63)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.engine.set_tenant_quota("_t", 1)),
        ErrorCode::INVALID_PARAMS
    );
    let snap = h.engine.set_tenant_quota("t", (1 << 63) - 1).unwrap();
    assert!(snap.has_explicit_policy && !snap.over_quota && !snap.admission_closed);
    assert_eq!(
        snap.effective_quota_bytes,
        16 * MIB,
        "capped by mounted memory"
    );
}

#[test]
fn fix_6_tenants_always_isolate() {
    for multi_mode in [false, true] {
        let h = Harness::bare(EngineConfig {
            enable_multi_tenants: multi_mode,
            ..Harness::config()
        });
        h.mount("seg-0", BASE, 16 * MIB);
        if multi_mode {
            h.engine.set_tenant_quota("a", MIB).unwrap();
            h.engine.set_tenant_quota("b", MIB).unwrap();
        }
        h.put_in("a", "same", 64);
        h.put_in("b", "same", 128);
        assert_eq!(h.engine.stats().key_count, 2);
        assert_eq!(h.engine.all_keys("a"), vec!["same"]);
        assert_eq!(h.engine.stats().tenant_key_counts.len(), 2);
        assert_eq!(h.remove_all("a", true), Ok(1));
        assert!(h.engine.exist_key(&h.key_req("b", "same")).unwrap());
        assert!(
            !h.engine.exist_key(&h.key_req("", "same")).unwrap(),
            "nor is default a wildcard"
        );
    }
}
