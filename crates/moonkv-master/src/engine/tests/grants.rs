//! Capability grants on descriptors: only with a grant key, with the documented rights,
//! ranges and lifetimes.

use super::*;
use moonkv_proto::auth::Secret;
use moonkv_proto::grant::{tenant_digest, Grant, READ, WRITE};

fn key() -> Secret {
    Secret::new(b"engine-grant-test-secret".to_vec()).unwrap()
}

fn secured(read_grant_ttl_ms: Option<u64>) -> Harness {
    let h = Harness::bare(EngineConfig {
        grant_key: Some(key()),
        read_grant_ttl_ms,
        ..Harness::config()
    });
    h.mount("seg-0", BASE, 16 * MIB);
    h
}

fn opened(d: &ReplicaDescriptor) -> Grant {
    Grant::open(&key(), d.segment_id, d.grant.as_deref().expect("a grant")).unwrap()
}

#[test]
fn without_a_key_descriptors_carry_no_grant() {
    let h = Harness::new();
    let descs = h.put("k", 100);
    assert!(descs.iter().all(|d| d.grant.is_none()));
    assert!(h
        .get("k")
        .unwrap()
        .replicas
        .iter()
        .all(|d| d.grant.is_none()));
}

#[test]
fn writes_get_read_write_grants_for_exactly_their_range() {
    let h = secured(None);
    let descs = h
        .engine
        .put_start(&h.start_req("alice", "k", 1000, ReplicateConfig::default()))
        .unwrap();
    let g = opened(&descs[0]);
    let release = h.engine.config().put_start_release_timeout_ms;
    assert_eq!(
        g,
        Grant {
            rights: READ | WRITE,
            expires_ms: START_MS + release,
            address: descs[0].address,
            size: 1000,
            tenant_digest: tenant_digest("alice"),
            replica: descs[0].id.0,
            issued_ms: START_MS,
        }
    );
    let upserted = h
        .engine
        .upsert_start(&h.start_req("", "u", 10, ReplicateConfig::default()))
        .unwrap();
    assert_eq!(opened(&upserted[0]).tenant_digest, tenant_digest("default"));
    let batch = h
        .engine
        .batch_put_start(&BatchPutStartRequest {
            client_id: h.client,
            tenant: "bob".into(),
            keys: vec!["b1".into(), "b2".into()],
            sizes: vec![10, 20],
            config: ReplicateConfig::default(),
        })
        .unwrap();
    for item in batch {
        let d = &item.0.unwrap()[0];
        assert_eq!(opened(d).rights, READ | WRITE);
        assert_eq!(opened(d).size, d.size);
    }
}

#[test]
fn reads_get_read_grants_that_outlive_the_lease_by_the_margin_only() {
    let h = secured(None);
    h.put_in("alice", "k", 500);
    h.advance(7);
    let response = h.engine.get_replica_list(&h.key_req("alice", "k")).unwrap();
    let g = opened(&response.replicas[0]);
    assert_eq!(g.rights, READ);
    assert_eq!(
        g.expires_ms,
        START_MS + 7 + LEASE_MS + config::READ_GRANT_MARGIN_MS
    );
    assert_eq!((g.address, g.size), (response.replicas[0].address, 500));

    let batch = h
        .engine
        .batch_get_replica_list(&KeysRequest {
            tenant: "alice".into(),
            keys: vec!["k".into(), "missing".into()],
        })
        .unwrap();
    assert_eq!(
        opened(&batch[0].0.as_ref().unwrap().replicas[0]).rights,
        READ
    );
    let listed = h
        .engine
        .get_replica_list_by_regex(&RegexRequest {
            tenant: "alice".into(),
            regex: "^k$".into(),
        })
        .unwrap();
    assert_eq!(opened(&listed[0].1[0]).rights, READ);

    // The admin view looks, it does not hand out grants.
    let admin = h.engine.query_key("alice", "k").unwrap();
    assert!(admin.replicas[0].grant.is_none());
}

#[test]
fn the_read_grant_lifetime_can_be_set() {
    let h = secured(Some(5));
    h.put("k", 10);
    let g = opened(&h.get("k").unwrap().replicas[0]);
    assert_eq!(g.expires_ms, START_MS + 5);
}
