//! Put / Get / Exist: cases 11, 13–25, 27–30.

use super::*;

fn mount_many(h: &Harness, n: u64, size: u64) {
    for i in 0..n {
        h.mount(
            &format!("seg-{}", i + 1),
            BASE + (i + 1) * 0x1_0000_0000,
            size,
        );
    }
}

#[test]
fn case_11_put_start_rejects_zero_replicas_zero_size_empty_key() {
    let h = Harness::new();
    let zero = ReplicateConfig {
        replica_num: 0,
        ..Default::default()
    };
    assert_eq!(
        code(h.put_start_with("k", 1024, zero)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(code(h.put_start("k", 0)), ErrorCode::INVALID_PARAMS);
    assert_eq!(code(h.put_start("", 1024)), ErrorCode::INVALID_PARAMS);
}

#[test]
fn case_13_soft_pin_validation() {
    let h = Harness::new();
    let cfg = |action, ttl| ReplicateConfig {
        soft_pin_action: action,
        soft_pin_ttl_ms: ttl,
        ..Default::default()
    };
    assert_eq!(
        code(h.put_start_with("k", 64, cfg(SoftPinAction::Preserve, Some(5)))),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.put_start_with("k", 64, cfg(SoftPinAction::Disable, Some(5)))),
        ErrorCode::INVALID_PARAMS
    );
    let too_long = Some(86_400_001);
    assert_eq!(
        code(h.put_start_with("k", 64, cfg(SoftPinAction::Enable, too_long))),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.put_start_with("k", 64, cfg(SoftPinAction::Unknown(9), None))),
        ErrorCode::INVALID_PARAMS
    );
    let descs = h
        .put_start_with("k", 64, cfg(SoftPinAction::Enable, Some(0)))
        .unwrap();
    h.put_end("k", &descs).unwrap();
    assert_eq!(
        h.engine.stats().soft_pin_key_count,
        0,
        "ttl 0 behaves as disable"
    );
    let descs = h
        .put_start_with("p", 64, cfg(SoftPinAction::Enable, None))
        .unwrap();
    h.put_end("p", &descs).unwrap();
    assert_eq!(
        h.engine.stats().soft_pin_key_count,
        1,
        "default ttl applies"
    );
}

#[test]
fn case_14_put_start_returns_processing_replicas() {
    let h = Harness::new();
    let descs = h.put_start("k", 1000).unwrap();
    assert_eq!(descs.len(), 1);
    let d = &descs[0];
    assert_eq!(
        (d.status, d.size, d.kind),
        (ReplicaStatus::Processing, 1000, ReplicaKind::Memory)
    );
    assert_ne!(d.id, ReplicaId(0));
    assert!(d.address >= BASE && d.address + 1000 <= BASE + 16 * MIB);
    assert_eq!(&*d.endpoint, "seg-0");
    assert_eq!(code(h.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    assert!(!h.exists("k"));
}

#[test]
fn case_15_after_put_end_replicas_are_complete() {
    let h = Harness::new();
    let descs = h.put("k", 1000);
    let got = h.get("k").unwrap();
    assert_eq!(got.replicas.len(), 1);
    assert_eq!(got.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(got.replicas[0].id, descs[0].id);
    assert_eq!(got.lease_ttl_ms, LEASE_MS);
    assert!(h.exists("k"));
}

#[test]
fn case_16_end_or_revoke_by_another_client_is_illegal() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    let mut end = h.end_req("", "k", ids(&descs));
    end.client_id = ClientId::new(1, 1);
    assert_eq!(code(h.engine.put_end(&end)), ErrorCode::ILLEGAL_CLIENT);
    let mut revoke = h.revoke_req("", "k", ids(&descs));
    revoke.client_id = ClientId::new(1, 1);
    assert_eq!(
        code(h.engine.put_revoke(&revoke)),
        ErrorCode::ILLEGAL_CLIENT
    );
    h.put_end("k", &descs).unwrap();
}

#[test]
fn case_17_end_or_revoke_without_start_is_not_found() {
    let h = Harness::new();
    assert_eq!(code(h.put_end("k", &[])), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(code(h.put_revoke("k", &[])), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn case_18_put_end_is_idempotent_and_revoke_after_end_is_invalid() {
    let h = Harness::new();
    let descs = h.put("k", 64);
    h.put_end("k", &descs).unwrap();
    h.put_end("k", &descs).unwrap();
    assert_eq!(code(h.put_revoke("k", &descs)), ErrorCode::INVALID_WRITE);
    assert!(h.get("k").is_ok());
}

#[test]
fn case_19_revoke_during_processing_removes_the_object() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    h.put_revoke("k", &descs).unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(
        h.engine.stats().allocated_bytes,
        0,
        "revoked buffers are freed at once"
    );
}

#[test]
fn case_20_put_start_on_existing_or_in_progress_key() {
    let h = Harness::new();
    h.put_start("busy", 64).unwrap();
    assert_eq!(
        code(h.put_start("busy", 64)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    h.put("done", 64);
    assert_eq!(
        code(h.put_start("done", 64)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    h.advance(31_000);
    assert_eq!(
        code(h.put_start("done", 64)),
        ErrorCode::OBJECT_ALREADY_EXISTS,
        "complete objects never expire"
    );
}

#[test]
fn case_21_discarded_buffers_are_parked_until_release() {
    let config = EngineConfig {
        put_start_discard_timeout_ms: 3_000,
        put_start_release_timeout_ms: 5_000,
        ..Harness::config()
    };
    let h = Harness::bare(config);
    mount_many(&h, 3, 16 * MIB);
    let three = ReplicateConfig {
        replica_num: 3,
        ..Default::default()
    };
    h.put_start_with("key_1", 6 * MIB, three.clone()).unwrap();
    h.advance(3_001);
    let second = h.put_start_with("key_1", 6 * MIB, three.clone()).unwrap();
    assert_eq!(second.len(), 3);
    assert_eq!(h.engine.stats().put_start_discard_cnt, 1);
    assert_eq!(
        code(h.put_start_with("key_2", 6 * MIB, three.clone())),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    h.advance(1_000);
    h.engine.sweep_stalled_writes();
    assert_eq!(
        code(h.put_start_with("key_2", 6 * MIB, three.clone())),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    h.advance(1_000);
    h.engine.sweep_stalled_writes();
    assert_eq!(h.put_start_with("key_2", 6 * MIB, three).unwrap().len(), 3);
    assert_eq!(h.engine.stats().put_start_release_cnt, 3);
    assert_eq!(h.engine.stats().discarded_staging_bytes, 0);
}

#[test]
fn case_22_partial_allocation_is_counted() {
    let h = Harness::bare(Harness::config());
    mount_many(&h, 2, 16 * MIB);
    let descs = h
        .put_start_with(
            "k3",
            64,
            ReplicateConfig {
                replica_num: 3,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(descs.len(), 2);
    assert_eq!(h.engine.stats().put_start_partial_allocations, 1);
    h.put_start_with(
        "k2",
        64,
        ReplicateConfig {
            replica_num: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(h.engine.stats().put_start_partial_allocations, 1);
}

#[test]
fn case_23_two_replicas_on_one_segment_gives_one() {
    let h = Harness::new();
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
    assert_eq!(descs.len(), 1);
    assert_eq!(&*descs[0].segment_name, "seg-0");
}

#[test]
fn case_24_replicas_land_on_distinct_segment_names() {
    for strategy in [
        AllocationStrategy::Random,
        AllocationStrategy::FreeRatioFirst,
    ] {
        let h = Harness::bare(EngineConfig {
            allocation_strategy: strategy,
            ..Harness::config()
        });
        mount_many(&h, 20, MIB);
        let descs = h
            .put_start_with(
                "k",
                64,
                ReplicateConfig {
                    replica_num: 10,
                    ..Default::default()
                },
            )
            .unwrap();
        let mut names: Vec<&str> = descs.iter().map(|d| &*d.segment_name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 10, "{strategy:?}");
        let mut replica_ids = ids(&descs);
        replica_ids.dedup();
        assert_eq!(replica_ids.len(), 10);
    }
}

#[test]
fn case_24_two_segments_with_one_name_hold_one_replica_each_object() {
    let h = Harness::bare(Harness::config());
    h.mount("same", BASE, MIB);
    h.mount("same", 2 * BASE, MIB);
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
    assert_eq!(descs.len(), 1);
}

#[test]
fn case_25_preferred_segment_first_when_it_has_room() {
    let h = Harness::bare(Harness::config());
    mount_many(&h, 4, MIB);
    for i in 0..10 {
        let cfg = ReplicateConfig {
            preferred_segments: vec!["seg-3".into()],
            ..Default::default()
        };
        let descs = h.put_start_with(&format!("k{i}"), 64, cfg).unwrap();
        assert_eq!(&*descs[0].segment_name, "seg-3");
    }
    // Fill seg-3; the preferred name is then skipped, not a failure.
    let cfg = ReplicateConfig {
        preferred_segments: vec!["seg-3".into()],
        ..Default::default()
    };
    h.put_start_with("big", MIB - 64 * 10, cfg.clone()).unwrap();
    let descs = h.put_start_with("next", 64, cfg).unwrap();
    assert_ne!(&*descs[0].segment_name, "seg-3");
}

#[test]
fn case_27_checksum_stored_then_cleared_by_memory_upsert_end() {
    let h = Harness::new();
    let descs = h.put_start("k", 64).unwrap();
    let mut end = h.end_req("", "k", ids(&descs));
    end.checksum = Some(0);
    h.engine.put_end(&end).unwrap();
    assert_eq!(h.get("k").unwrap().object_checksum, Some(0));
    let descs = h
        .engine
        .upsert_start(&h.start_req("", "k", 64, ReplicateConfig::default()))
        .unwrap();
    let mut end = h.end_req("", "k", ids(&descs));
    end.replica_type = ReplicaType::Memory;
    h.engine.upsert_end(&end).unwrap();
    assert_eq!(h.get("k").unwrap().object_checksum, None);
}

#[test]
fn case_28_batch_exist_key_preserves_order() {
    let h = Harness::new();
    let mut keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    for k in &keys {
        h.put(k, 64);
    }
    h.put_start("in-flight", 64).unwrap();
    let grouped = ReplicateConfig {
        group_ids: Some(vec!["g".into()]),
        ..Default::default()
    };
    let descs = h.put_start_with("grouped", 64, grouped).unwrap();
    h.put_end("grouped", &descs).unwrap();
    keys.extend([
        "missing".to_string(),
        "in-flight".to_string(),
        "grouped".to_string(),
    ]);
    let res = h
        .engine
        .batch_exist_key(&KeysRequest {
            tenant: String::new(),
            keys,
        })
        .unwrap();
    let got: Vec<bool> = res.into_iter().map(|r| r.0.unwrap()).collect();
    assert_eq!(got, vec![true, true, true, true, true, false, false, true]);
}

#[test]
fn case_29_batch_get_replica_list_order_and_tenant_isolation() {
    let h = Harness::new();
    h.put_in("a", "x", 64);
    h.put_in("b", "y", 128);
    let req = KeysRequest {
        tenant: "a".into(),
        keys: vec!["y".into(), "x".into(), "nope".into()],
    };
    let res = h.engine.batch_get_replica_list(&req).unwrap();
    assert_eq!(
        res[0].0.as_ref().map_err(|e| e.code),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(res[1].0.as_ref().unwrap().replicas[0].size, 64);
    assert_eq!(
        res[2].0.as_ref().map_err(|e| e.code),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
}

#[test]
fn case_30_regex_returns_complete_matches_of_the_tenant() {
    let h = Harness::new();
    h.put("prefix/a", 64);
    h.put("prefix/b", 64);
    h.put("other", 64);
    h.put_in("t2", "prefix/c", 64);
    h.put_start("prefix/in-flight", 64).unwrap();
    let req = RegexRequest {
        tenant: String::new(),
        regex: "fix/".into(),
    };
    let found = h.engine.get_replica_list_by_regex(&req).unwrap();
    let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, vec!["prefix/a", "prefix/b"]);
    let bad = RegexRequest {
        tenant: String::new(),
        regex: "(".into(),
    };
    assert_eq!(
        code(h.engine.get_replica_list_by_regex(&bad)),
        ErrorCode::INVALID_PARAMS
    );
    // Matches were leased.
    assert_eq!(
        code(h.remove("prefix/a", false)),
        ErrorCode::OBJECT_HAS_LEASE
    );
}

#[test]
fn batch_put_start_and_end_round_trip() {
    let h = Harness::new();
    let req = BatchPutStartRequest {
        client_id: h.client,
        tenant: String::new(),
        keys: (0..20).map(|i| format!("b{i}")).collect(),
        sizes: vec![100; 20],
        config: ReplicateConfig::default(),
    };
    let started = h.engine.batch_put_start(&req).unwrap();
    let items = started
        .iter()
        .zip(&req.keys)
        .map(|(r, k)| EndItem {
            key: k.clone(),
            replica_ids: ids(r.0.as_ref().unwrap()).into(),
            checksum: None,
        })
        .collect();
    let end = BatchEndRequest {
        client_id: h.client,
        tenant: String::new(),
        replica_type: ReplicaType::All,
        items,
    };
    assert!(h
        .engine
        .batch_put_end(&end)
        .unwrap()
        .iter()
        .all(|r| r.0.is_ok()));
    assert_eq!(h.engine.all_keys("").len(), 20);
    let again = h.engine.batch_put_start(&req).unwrap();
    assert!(again
        .iter()
        .all(|r| r.0.as_ref().map_err(|e| e.code) == Err(ErrorCode::OBJECT_ALREADY_EXISTS)));
}

#[test]
fn no_available_handle_sets_the_eviction_flag() {
    let h = Harness::new();
    assert_eq!(
        code(h.put_start("huge", 17 * MIB)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert_eq!(h.engine.stats().put_start_alloc_failures, 1);
    assert!(
        h.engine.run_eviction().triggered,
        "the failed allocation requests a round"
    );
    assert!(!h.engine.run_eviction().triggered, "the flag is consumed");
}

#[test]
fn an_unsettled_revoke_frees_the_key_at_once_and_parks_the_space_until_released() {
    let h = Harness::new();
    let descs = h.put_start("k", 4096).unwrap();
    let used = h.engine.stats().allocated_bytes;
    assert!(used >= 4096);
    let mut revoke = h.revoke_req("", "k", ids(&descs));
    revoke.unsettled = true;
    h.engine.put_revoke(&revoke).unwrap();
    // The key is free at once: a new put of it starts.
    let again = h.put_start("k", 4096).expect("the key is free again");
    assert_ne!(ids(&again), ids(&descs), "new replica ids");
    // The old space is still held (a late write could land there), next to the new put's.
    assert!(h.engine.stats().allocated_bytes >= used + 4096);
    // Another client cannot release it; the writer can.
    let mut release = moonkv_proto::msg::ReleaseParkedRequest {
        client_id: ClientId::new(1, 1),
        replica_ids: ids(&descs),
    };
    assert_eq!(h.engine.release_parked_replicas(&release).unwrap(), 0);
    release.client_id = h.client;
    assert_eq!(h.engine.release_parked_replicas(&release).unwrap(), 1);
    assert_eq!(
        h.engine.stats().allocated_bytes,
        used,
        "only the new put's space is held"
    );
    assert_eq!(
        h.engine.release_parked_replicas(&release).unwrap(),
        0,
        "released once"
    );
}

#[test]
fn unsettled_space_nobody_releases_is_freed_at_the_release_timeout() {
    // A release timeout well inside the owner's heartbeat TTL, so the segment stays mounted.
    let h = Harness::bare(EngineConfig {
        put_start_discard_timeout_ms: 500,
        put_start_release_timeout_ms: 2_000,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    let descs = h.put_start("k", 4096).unwrap();
    let mut revoke = h.revoke_req("", "k", ids(&descs));
    revoke.unsettled = true;
    h.engine.put_revoke(&revoke).unwrap();
    assert!(h.engine.stats().allocated_bytes >= 4096);
    h.advance(h.engine.config().put_start_release_timeout_ms - 1);
    h.engine.tick();
    assert!(
        h.engine.stats().allocated_bytes >= 4096,
        "held until the timeout"
    );
    h.advance(1);
    h.engine.tick();
    assert_eq!(h.engine.stats().allocated_bytes, 0);
    // A settled revoke frees at once.
    let descs = h.put_start("k2", 4096).unwrap();
    h.engine
        .put_revoke(&h.revoke_req("", "k2", ids(&descs)))
        .unwrap();
    assert_eq!(h.engine.stats().allocated_bytes, 0);
}
