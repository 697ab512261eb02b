//! Upsert: cases 37–40, 42, 43.

use super::*;

fn upsert_start(
    h: &Harness,
    client: ClientId,
    key: &str,
    size: u64,
) -> Result<Vec<ReplicaDescriptor>> {
    let mut req = h.start_req("", key, size, ReplicateConfig::default());
    req.client_id = client;
    h.engine.upsert_start(&req)
}

fn upsert_end(h: &Harness, client: ClientId, key: &str, descs: &[ReplicaDescriptor]) -> Result<()> {
    let mut req = h.end_req("", key, ids(descs));
    req.client_id = client;
    h.engine.upsert_end(&req)
}

#[test]
fn case_37_upsert_of_a_new_key_behaves_like_put() {
    let h = Harness::new();
    let descs = upsert_start(&h, h.client, "k", 64).unwrap();
    assert_eq!(descs[0].status, ReplicaStatus::Processing);
    assert_eq!(code(h.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    h.engine
        .upsert_revoke(&h.revoke_req("", "k", ids(&descs)))
        .unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn case_38_same_size_upsert_reuses_buffers() {
    let h = Harness::new();
    let old = h.put("k", 1000);
    let other = ClientId::new(2, 2);
    let new = upsert_start(&h, other, "k", 1000).unwrap();
    assert_eq!(new[0].address, old[0].address);
    assert_eq!(new[0].status, ReplicaStatus::Processing);
    assert_ne!(
        new[0].id, old[0].id,
        "in-place upsert issues new ids (deliberate)"
    );
    assert_eq!(code(h.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    assert!(!h.exists("k"));
    assert_eq!(
        code(upsert_end(&h, h.client, "k", &new)),
        ErrorCode::ILLEGAL_CLIENT
    );
    upsert_end(&h, other, "k", &new).unwrap();
    assert_eq!(
        h.get("k").unwrap().replicas[0].status,
        ReplicaStatus::Complete
    );
}

#[test]
fn same_size_upsert_under_a_read_lease_allocates_new_buffers() {
    let h = Harness::new();
    let old = h.put("k", 1000);
    h.get("k").unwrap(); // a reader holds a lease and may be copying the bytes
    let other = ClientId::new(2, 2);
    let new = upsert_start(&h, other, "k", 1000).unwrap();
    assert_ne!(
        new[0].address, old[0].address,
        "the leased bytes must not be rewritten under the reader"
    );
    upsert_end(&h, other, "k", &new).unwrap();
    assert_eq!(h.get("k").unwrap().replicas[0].address, new[0].address);
}

#[test]
fn case_39_size_changing_upsert_allocates_new_buffers() {
    let h = Harness::new();
    let old = h.put("k", 1000);
    let new = upsert_start(&h, h.client, "k", 5000).unwrap();
    assert_ne!(new[0].address, old[0].address);
    upsert_end(&h, h.client, "k", &new).unwrap();
    let got = h.get("k").unwrap();
    assert_eq!(
        (got.replicas[0].status, got.replicas[0].size),
        (ReplicaStatus::Complete, 5000)
    );

    h.advance(LEASE_MS);
    let again = upsert_start(&h, h.client, "k", 7000).unwrap();
    h.engine
        .upsert_revoke(&h.revoke_req("", "k", ids(&again)))
        .unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn case_40_upsert_preempts_a_write_in_flight() {
    let h = Harness::new();
    let first = h.put_start("k", 64).unwrap();
    let other = ClientId::new(2, 2);
    let second = upsert_start(&h, other, "k", 64).unwrap();
    assert_ne!(
        first[0].address, second[0].address,
        "the preempted buffer is parked, not reused"
    );
    assert_eq!(code(h.put_end("k", &first)), ErrorCode::ILLEGAL_CLIENT);
    upsert_end(&h, other, "k", &second).unwrap();
    assert_eq!(h.get("k").unwrap().replicas.len(), 1);
    assert_eq!(h.engine.stats().put_start_discard_cnt, 1);
}

#[test]
fn case_42_upsert_cannot_change_the_group() {
    let h = Harness::new();
    let grouped = |g: &str| ReplicateConfig {
        group_ids: Some(vec![g.into()]),
        ..Default::default()
    };
    let descs = h.put_start_with("k", 64, grouped("g1")).unwrap();
    h.put_end("k", &descs).unwrap();
    let req = h.start_req("", "k", 64, grouped("g2"));
    assert_eq!(code(h.engine.upsert_start(&req)), ErrorCode::INVALID_PARAMS);
    assert!(h.get("k").is_ok(), "rejected upsert changes nothing");
    let same = h
        .engine
        .upsert_start(&h.start_req("", "k", 64, grouped("g1")))
        .unwrap();
    h.engine
        .upsert_end(&h.end_req("", "k", ids(&same)))
        .unwrap();
    // Without group_ids the group is kept.
    let bigger = h
        .engine
        .upsert_start(&h.start_req("", "k", 128, ReplicateConfig::default()))
        .unwrap();
    h.engine
        .upsert_end(&h.end_req("", "k", ids(&bigger)))
        .unwrap();
    let snapshot = h.engine.placement_snapshot(None);
    assert_eq!(snapshot.objects[0].group_id.as_deref(), Some("g1"));
}

#[test]
fn case_43_batch_upsert_existing_and_new_keys() {
    let h = Harness::new();
    h.put("old", 64);
    let req = BatchPutStartRequest {
        client_id: h.client,
        tenant: String::new(),
        keys: vec!["old".into(), "new".into()],
        sizes: vec![64, 64],
        config: ReplicateConfig::default(),
    };
    let started = h.engine.batch_upsert_start(&req).unwrap();
    let items: Vec<EndItem> = started
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
        .batch_upsert_end(&end)
        .unwrap()
        .iter()
        .all(|r| r.0.is_ok()));
    assert!(h.exists("old") && h.exists("new"));
}

#[test]
fn batch_upsert_revoke_erases_in_place_rewrites() {
    let h = Harness::new();
    h.put("k", 64);
    let descs = upsert_start(&h, h.client, "k", 64).unwrap();
    let req = BatchRevokeRequest {
        client_id: h.client,
        tenant: String::new(),
        replica_type: ReplicaType::All,
        items: vec![RevokeItem {
            key: "k".into(),
            replica_ids: ids(&descs).into(),
            unsettled: false,
        }],
    };
    assert!(h.engine.batch_upsert_revoke(&req).unwrap()[0].0.is_ok());
    assert_eq!(
        code(h.get("k")),
        ErrorCode::OBJECT_NOT_FOUND,
        "revoking an in-place upsert erases the object"
    );
}
