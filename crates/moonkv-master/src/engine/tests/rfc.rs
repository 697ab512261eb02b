//! Replica identity (the RFC): stale End/Revoke after preemption, and read revalidation.

use super::*;

fn short_discard() -> Harness {
    let h = Harness::bare(EngineConfig {
        put_start_discard_timeout_ms: 1_000,
        put_start_release_timeout_ms: 5_000,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    h
}

fn upsert(h: &Harness, key: &str, size: u64) -> Vec<ReplicaDescriptor> {
    let descs = h
        .engine
        .upsert_start(&h.start_req("", key, size, ReplicateConfig::default()))
        .unwrap();
    h.engine
        .upsert_end(&h.end_req("", key, ids(&descs)))
        .unwrap();
    descs
}

#[test]
fn rfc_ids_are_non_zero_unique_and_returned_everywhere() {
    let h = Harness::bare(Harness::config());
    for i in 0..4 {
        h.mount(&format!("s{i}"), BASE * (i + 1), MIB);
    }
    let descs = h
        .put_start_with(
            "k",
            64,
            ReplicateConfig {
                replica_num: 3,
                ..Default::default()
            },
        )
        .unwrap();
    let mut seen = ids(&descs);
    assert!(seen.iter().all(|id| id.0 != 0));
    h.put_end("k", &descs).unwrap();
    let listed = ids(&h.get("k").unwrap().replicas);
    assert_eq!(listed, seen);
    let regex = h
        .engine
        .get_replica_list_by_regex(&RegexRequest {
            tenant: String::new(),
            regex: "k".into(),
        })
        .unwrap();
    assert_eq!(ids(&regex[0].1), seen);
    let more = h.put("k2", 64);
    seen.extend(ids(&more));
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4);
}

#[test]
fn rfc_race_a_stale_put_end_after_put_start_preemption_is_rejected() {
    let h = short_discard();
    let first = h.put_start("k", 64).unwrap();
    h.advance(1_001);
    let second = h.put_start("k", 64).unwrap();
    assert_eq!(code(h.put_end("k", &first)), ErrorCode::INVALID_WRITE);
    assert_eq!(
        code(h.get("k")),
        ErrorCode::REPLICA_IS_NOT_READY,
        "write #2 was not completed by the stale End"
    );
    h.put_end("k", &second).unwrap();
    assert_eq!(ids(&h.get("k").unwrap().replicas), ids(&second));
}

#[test]
fn rfc_race_a_stale_put_end_after_upsert_preemption_is_rejected() {
    let h = Harness::new();
    let first = h.put_start("k", 64).unwrap();
    let second = h
        .engine
        .upsert_start(&h.start_req("", "k", 64, ReplicateConfig::default()))
        .unwrap();
    assert_eq!(code(h.put_end("k", &first)), ErrorCode::INVALID_WRITE);
    assert_eq!(code(h.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    h.engine
        .upsert_end(&h.end_req("", "k", ids(&second)))
        .unwrap();
    assert!(h.exists("k"));
}

#[test]
fn rfc_race_b_stale_put_revoke_after_preemption_is_rejected() {
    let h = short_discard();
    let first = h.put_start("k", 64).unwrap();
    h.advance(1_001);
    let second = h.put_start("k", 64).unwrap();
    assert_eq!(code(h.put_revoke("k", &first)), ErrorCode::INVALID_WRITE);
    h.put_end("k", &second).unwrap();
    assert!(h.exists("k"), "write #2 survived the stale revoke");

    let third = h.put_start("u", 64).unwrap();
    let fourth = h
        .engine
        .upsert_start(&h.start_req("", "u", 64, ReplicateConfig::default()))
        .unwrap();
    assert_eq!(code(h.put_revoke("u", &third)), ErrorCode::INVALID_WRITE);
    h.engine
        .upsert_end(&h.end_req("", "u", ids(&fourth)))
        .unwrap();
    assert!(h.exists("u"));
}

#[test]
fn rfc_end_with_wrong_or_partial_ids_changes_nothing() {
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
    let all = ids(&descs);
    for bad in [
        vec![],
        vec![all[0]],
        vec![all[0], all[0]],
        vec![all[0], ReplicaId(12345)],
        vec![all[0], all[1], all[1]],
    ] {
        assert_eq!(
            code(h.engine.put_end(&h.end_req("", "k", bad.clone()))),
            ErrorCode::INVALID_WRITE,
            "{bad:?}"
        );
        assert_eq!(
            code(h.engine.put_revoke(&h.revoke_req("", "k", bad))),
            ErrorCode::INVALID_WRITE
        );
    }
    assert_eq!(code(h.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    h.engine
        .put_end(&h.end_req("", "k", vec![all[1], all[0]]))
        .unwrap();
    assert_eq!(h.get("k").unwrap().replicas.len(), 2);
    h.engine.put_end(&h.end_req("", "k", all.clone())).unwrap();
    assert_eq!(
        code(h.engine.put_end(&h.end_req("", "k", vec![all[0]]))),
        ErrorCode::INVALID_WRITE
    );
}

#[test]
fn rfc_writer_is_checked_before_ids() {
    let h = Harness::new();
    h.put_start("k", 64).unwrap();
    let mut end = h.end_req("", "k", vec![ReplicaId(1)]);
    end.client_id = ClientId::new(4, 4);
    assert_eq!(code(h.engine.put_end(&end)), ErrorCode::ILLEGAL_CLIENT);
}

#[test]
fn rfc_revalidate_unchanged_replicas_is_ok() {
    let h = Harness::new();
    h.put("k", 64);
    let read = ids(&h.get("k").unwrap().replicas);
    h.advance(10 * LEASE_MS);
    assert_eq!(h.revalidate("k", read), Ok(()));
}

#[test]
fn rfc_revalidate_after_eviction_is_invalid() {
    let h = Harness::bare(EngineConfig {
        eviction_high_watermark_ratio: 0.0,
        eviction_ratio: 1.0,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    h.put("k", 64);
    let read = ids(&h.get("k").unwrap().replicas);
    h.advance(LEASE_MS);
    assert_eq!(h.engine.run_eviction().evicted_keys, 1);
    assert_eq!(code(h.revalidate("k", read)), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn rfc_revalidate_after_removal_or_unmount_is_not_found() {
    let h = Harness::new();
    h.put("k", 64);
    let read = ids(&h.get("k").unwrap().replicas);
    h.remove("k", true).unwrap();
    assert_eq!(code(h.revalidate("k", read)), ErrorCode::OBJECT_NOT_FOUND);
    // Recreated under the same key: the old ids are still not valid.
    let old = ids(&h.put("k", 64));
    h.remove("k", true).unwrap();
    h.put("k", 64);
    assert_eq!(code(h.revalidate("k", old)), ErrorCode::INVALID_REPLICA);
}

#[test]
fn rfc_revalidate_after_same_size_upsert_is_invalid() {
    let h = Harness::new();
    h.put("k", 64);
    let read = h.get("k").unwrap().replicas;
    // Rewritten in place only once the reader's lease is over (then it must revalidate).
    h.advance(10 * LEASE_MS);
    let new = upsert(&h, "k", 64);
    assert_eq!(new[0].address, read[0].address, "same buffer...");
    assert_eq!(
        code(h.revalidate("k", ids(&read))),
        ErrorCode::INVALID_REPLICA,
        "...but new identity"
    );
    assert_eq!(h.revalidate("k", ids(&new)), Ok(()));
}

#[test]
fn rfc_revalidate_after_size_changing_upsert_is_invalid() {
    let h = Harness::new();
    h.put("k", 64);
    let read = ids(&h.get("k").unwrap().replicas);
    let new = upsert(&h, "k", 4096);
    assert_eq!(code(h.revalidate("k", read)), ErrorCode::INVALID_REPLICA);
    assert_eq!(h.revalidate("k", ids(&new)), Ok(()));
}

#[test]
fn rfc_revalidate_during_in_place_upsert_is_invalid() {
    let h = Harness::new();
    h.put("k", 64);
    let read = ids(&h.get("k").unwrap().replicas);
    h.engine
        .upsert_start(&h.start_req("", "k", 64, ReplicateConfig::default()))
        .unwrap();
    assert_eq!(code(h.revalidate("k", read)), ErrorCode::INVALID_REPLICA);
}
