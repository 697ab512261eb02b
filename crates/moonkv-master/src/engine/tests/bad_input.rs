//! Bad input: every malformed request gets a precise error and changes nothing.

use super::*;

#[test]
fn empty_and_too_long_keys_are_invalid_everywhere() {
    let h = Harness::new();
    let long = "x".repeat(MAX_KEY_LEN + 1);
    for key in ["", long.as_str()] {
        assert_eq!(code(h.put_start(key, 64)), ErrorCode::INVALID_PARAMS);
        assert_eq!(
            code(h.engine.exist_key(&h.key_req("", key))),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(code(h.get(key)), ErrorCode::INVALID_PARAMS);
        assert_eq!(code(h.remove(key, true)), ErrorCode::INVALID_PARAMS);
        assert_eq!(
            code(h.engine.put_end(&h.end_req("", key, vec![]))),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            code(h.engine.put_revoke(&h.revoke_req("", key, vec![]))),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            code(h.revalidate(key, vec![ReplicaId(1)])),
            ErrorCode::INVALID_PARAMS
        );
    }
    h.put(&"y".repeat(MAX_KEY_LEN), 64);
}

#[test]
fn zero_size_is_invalid() {
    let h = Harness::new();
    assert_eq!(code(h.put_start("k", 0)), ErrorCode::INVALID_PARAMS);
    let req = h.start_req("", "k", 0, ReplicateConfig::default());
    assert_eq!(code(h.engine.upsert_start(&req)), ErrorCode::INVALID_PARAMS);
    assert_eq!(
        code(h.put_start("k", u64::MAX)),
        ErrorCode::NO_AVAILABLE_HANDLE,
        "absurd sizes never allocate"
    );
}

#[test]
fn invalid_tenants_are_refused_on_every_path() {
    let h = Harness::new();
    for tenant in ["_x", "a\u{7f}", "tab\t"] {
        let req = h.start_req(tenant, "k", 64, ReplicateConfig::default());
        assert_eq!(code(h.engine.put_start(&req)), ErrorCode::INVALID_PARAMS);
        assert_eq!(
            code(h.engine.exist_key(&h.key_req(tenant, "k"))),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            code(h.engine.put_end(&h.end_req(tenant, "k", vec![]))),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(code(h.remove_all(tenant, false)), ErrorCode::INVALID_PARAMS);
        let regex = RemoveByRegexRequest {
            tenant: tenant.into(),
            regex: ".".into(),
            force: true,
        };
        assert_eq!(
            code(h.engine.remove_by_regex(&regex)),
            ErrorCode::INVALID_PARAMS
        );
        let batch = BatchPutStartRequest {
            client_id: h.client,
            tenant: tenant.into(),
            keys: vec!["a".into(), "b".into()],
            sizes: vec![1, 1],
            config: ReplicateConfig::default(),
        };
        let items = h.engine.batch_put_start(&batch).unwrap();
        assert!(items
            .iter()
            .all(|r| r.0.as_ref().map_err(|e| e.code) == Err(ErrorCode::INVALID_PARAMS)));
    }
    assert_eq!(h.engine.stats().key_count, 0);
}

#[test]
fn bad_regexes_are_invalid() {
    let h = Harness::new();
    h.put("k", 64);
    for regex in ["(", "[a-", "*"] {
        let get = RegexRequest {
            tenant: String::new(),
            regex: regex.into(),
        };
        assert_eq!(
            code(h.engine.get_replica_list_by_regex(&get)),
            ErrorCode::INVALID_PARAMS
        );
        let rm = RemoveByRegexRequest {
            tenant: String::new(),
            regex: regex.into(),
            force: true,
        };
        assert_eq!(
            code(h.engine.remove_by_regex(&rm)),
            ErrorCode::INVALID_PARAMS
        );
    }
    assert!(h.exists("k"));
}

#[test]
fn unknown_soft_pin_action_is_invalid() {
    let h = Harness::new();
    let cfg = ReplicateConfig {
        soft_pin_action: SoftPinAction::from(7),
        ..Default::default()
    };
    assert_eq!(
        code(h.put_start_with("k", 64, cfg)),
        ErrorCode::INVALID_PARAMS
    );
}

#[test]
fn group_ids_length_must_match() {
    let h = Harness::new();
    let two = ReplicateConfig {
        group_ids: Some(vec!["a".into(), "b".into()]),
        ..Default::default()
    };
    assert_eq!(
        code(h.put_start_with("k", 64, two.clone())),
        ErrorCode::INVALID_PARAMS
    );
    let none = ReplicateConfig {
        group_ids: Some(vec![]),
        ..Default::default()
    };
    assert_eq!(
        code(h.put_start_with("k", 64, none)),
        ErrorCode::INVALID_PARAMS
    );
    let batch = BatchPutStartRequest {
        client_id: h.client,
        tenant: String::new(),
        keys: vec!["a".into(), "b".into(), "c".into()],
        sizes: vec![1, 1, 1],
        config: two,
    };
    let items = h.engine.batch_put_start(&batch).unwrap();
    assert_eq!(items.len(), 3);
    assert!(items
        .iter()
        .all(|r| r.0.as_ref().map_err(|e| e.code) == Err(ErrorCode::INVALID_PARAMS)));
    let mismatched = BatchPutStartRequest {
        sizes: vec![1],
        config: ReplicateConfig::default(),
        ..batch
    };
    let items = h.engine.batch_upsert_start(&mismatched).unwrap();
    assert!(items
        .iter()
        .all(|r| r.0.as_ref().map_err(|e| e.code) == Err(ErrorCode::INVALID_PARAMS)));
    assert_eq!(h.engine.stats().key_count, 0);
}

#[test]
fn batch_items_fail_individually() {
    let h = Harness::new();
    let batch = BatchPutStartRequest {
        client_id: h.client,
        tenant: String::new(),
        keys: vec!["ok".into(), String::new(), "zero".into()],
        sizes: vec![64, 64, 0],
        config: ReplicateConfig::default(),
    };
    let codes: Vec<ErrorCode> = h
        .engine
        .batch_put_start(&batch)
        .unwrap()
        .into_iter()
        .map(|r| r.0.err().map_or(ErrorCode::OK, |e| e.code))
        .collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::OK,
            ErrorCode::INVALID_PARAMS,
            ErrorCode::INVALID_PARAMS
        ]
    );
}

#[test]
fn empty_revalidation_is_invalid() {
    let h = Harness::new();
    h.put("k", 64);
    assert_eq!(code(h.revalidate("k", vec![])), ErrorCode::INVALID_PARAMS);
}

#[test]
fn config_validation_names_the_key() {
    let bad = |f: fn(&mut EngineConfig)| {
        let mut c = EngineConfig::default();
        f(&mut c);
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains(e.key()), "{e} names {}", e.key());
        (e.key(), e.to_string())
    };
    assert_eq!(bad(|c| c.eviction_ratio = 1.5).0, "eviction_ratio");
    assert_eq!(
        bad(|c| c.eviction_high_watermark_ratio = -0.1).0,
        "eviction_high_watermark_ratio"
    );
    let (key, message) = bad(|c| c.put_start_release_timeout_ms = c.put_start_discard_timeout_ms);
    assert_eq!(key, "put_start_release_timeout_sec");
    assert!(
        message.contains("put_start_release_timeout_sec must exceed put_start_discard_timeout_sec")
    );
    assert_eq!(
        bad(|c| c.default_kv_soft_pin_ttl_ms = c.max_kv_soft_pin_ttl_ms + 1).0,
        "default_kv_soft_pin_ttl"
    );
    assert_eq!(bad(|c| c.client_live_ttl_ms = 0).0, "client_live_ttl_sec");
    assert_eq!(bad(|c| c.shard_count = 0).0, "shard_count");
    assert_eq!(EngineConfig::default().validate(), Ok(()));
}
