//! Segments and clients: cases 1–9a, fixes 1 and 2.

use super::*;

fn mount_req(h: &Harness, segment: Segment) -> MountSegmentRequest {
    MountSegmentRequest {
        segment,
        client_id: h.client,
        keeps_catalog: true,
    }
}

#[test]
fn case_01_mount_with_zero_base_or_size_is_invalid() {
    let h = Harness::bare(Harness::config());
    let zero_base = h.segment("a", 0, 16 * MIB);
    let zero_size = h.segment("a", BASE, 0);
    assert_eq!(
        code(h.engine.mount_segment(&mount_req(&h, zero_base))),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(h.engine.mount_segment(&mount_req(&h, zero_size))),
        ErrorCode::INVALID_PARAMS
    );
    let overflow = h.segment("a", u64::MAX - 10, 100);
    assert_eq!(
        code(h.engine.mount_segment(&mount_req(&h, overflow))),
        ErrorCode::INVALID_PARAMS
    );
    assert!(h.engine.segments().is_empty());
}

#[test]
fn case_02_mount_and_unmount_are_idempotent() {
    let h = Harness::bare(Harness::config());
    let seg = h.segment("a", BASE, 16 * MIB);
    h.engine.mount_segment(&mount_req(&h, seg.clone())).unwrap();
    h.engine.mount_segment(&mount_req(&h, seg.clone())).unwrap();
    assert_eq!(h.engine.segments().len(), 1);
    assert_eq!(h.engine.stats().capacity_bytes, 16 * MIB);
    h.unmount(seg.id).unwrap();
    h.unmount(seg.id).unwrap();
    h.unmount(SegmentId::new(99, 99)).unwrap();
    assert_eq!(h.engine.stats().capacity_bytes, 0);
    h.engine.mount_segment(&mount_req(&h, seg)).unwrap();
    assert_eq!(h.engine.segments().len(), 1);
}

#[test]
fn case_03_mount_unmount_same_id_with_varying_sizes() {
    let h = Harness::bare(Harness::config());
    let mut seg = h.segment("a", BASE, MIB);
    for i in 1..=5u64 {
        seg.size = i * MIB;
        h.engine.mount_segment(&mount_req(&h, seg.clone())).unwrap();
        assert_eq!(h.engine.stats().capacity_bytes, i * MIB);
        h.unmount(seg.id).unwrap();
    }
    assert_eq!(h.engine.stats().capacity_bytes, 0);
}

#[test]
fn case_04_graceful_unmount_then_gone_after_grace_period() {
    let h = Harness::bare(Harness::config());
    let id = h.mount("a", BASE, 16 * MIB);
    let req = GracefulUnmountSegmentRequest {
        segment_id: id,
        client_id: h.client,
        grace_period_ms: 1000,
    };
    h.engine.graceful_unmount_segment(&req).unwrap();
    let by_id = QuerySegmentStatusByIdRequest { segment_id: id };
    assert_eq!(
        h.engine.query_segment_status_by_id(&by_id),
        Ok(SegmentStatus::GracefullyUnmounting)
    );
    let by_name = QuerySegmentStatusRequest {
        segment_name: "a".into(),
    };
    assert_eq!(
        h.engine.query_segment_status(&by_name),
        Ok(SegmentStatus::GracefullyUnmounting)
    );
    h.engine.graceful_unmount_segment(&req).unwrap();
    h.advance(999);
    assert_eq!(h.engine.run_graceful_unmounts(), 0);
    h.advance(1);
    h.engine
        .ping(&PingRequest {
            client_id: h.client,
            mounted_segments: 0,
        })
        .unwrap();
    h.engine.tick();
    assert_eq!(
        code(h.engine.query_segment_status_by_id(&by_id)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    assert_eq!(
        code(h.engine.query_segment_status(&by_name)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
}

#[test]
fn case_05_graceful_unmount_by_a_stranger() {
    let h = Harness::bare(Harness::config());
    let id = h.mount("a", BASE, 16 * MIB);
    let stranger = ClientId::new(5, 5);
    let req = GracefulUnmountSegmentRequest {
        segment_id: id,
        client_id: stranger,
        grace_period_ms: 10,
    };
    assert_eq!(
        code(h.engine.graceful_unmount_segment(&req)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    // A client owning other segments but not this one.
    h.mount_for(stranger, "b", BASE, MIB);
    assert_eq!(
        code(h.engine.graceful_unmount_segment(&req)),
        ErrorCode::INVALID_PARAMS
    );
    h.unmount(id).unwrap();
    assert!(h.engine.segments().iter().all(|s| s.segment.id != id));
}

#[test]
fn case_06_gracefully_unmounting_segment_gets_no_new_allocations() {
    let h = Harness::bare(Harness::config());
    let a = h.mount("a", BASE, 16 * MIB);
    let req = GracefulUnmountSegmentRequest {
        segment_id: a,
        client_id: h.client,
        grace_period_ms: 10_000,
    };
    h.engine.graceful_unmount_segment(&req).unwrap();
    assert_eq!(
        code(h.put_start("k1", 1024)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    h.mount("b", 2 * BASE, 16 * MIB);
    let descs = h.put_start("k1", 1024).unwrap();
    assert_eq!(&*descs[0].segment_name, "b");
}

#[test]
fn case_07_ping_unknown_client_needs_remount_then_ok_after_remount() {
    let h = Harness::bare(Harness::config());
    let client = ClientId::new(3, 3);
    assert_eq!(h.ping(client), ClientStatus::NeedRemount);
    let segment = h.segment("a", BASE, MIB);
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![segment],
            client_id: client,
            adopt: false,
        })
        .unwrap();
    assert_eq!(h.ping(client), ClientStatus::Ok);
}

#[test]
fn case_08_silent_client_expires_and_its_objects_disappear() {
    let h = Harness::new();
    h.put("k", 1024);
    h.advance(10_001);
    assert_eq!(h.engine.expire_clients(), 1);
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(h.engine.segments().is_empty());
    assert_eq!(h.ping(h.client), ClientStatus::NeedRemount);
    assert_eq!(h.engine.stats().active_clients, 0);
}

#[test]
fn a_client_that_never_expires_keeps_its_objects_through_silence_while_others_expire() {
    let h = Harness::new();
    // The harness's client is the embedded node; a second, ordinary one mounts beside it.
    h.engine.never_expire(h.client);
    h.engine.never_expire(h.client);
    h.put("k", 1024);
    let other = ClientId::new(9, 9);
    h.mount_for(other, "other", BASE + (1 << 40), MIB);
    // Silent far past the heartbeat deadline: only the ordinary client goes.
    h.advance(60_000);
    assert_eq!(h.engine.expire_clients(), 1);
    assert_eq!(h.ping(other), ClientStatus::NeedRemount);
    assert!(h.get("k").is_ok());
    assert_eq!(h.engine.expire_clients(), 0);
    assert_eq!(h.ping(h.client), ClientStatus::Ok);
    assert_eq!(h.engine.stats().active_clients, 1);
}

#[test]
fn case_08_pinging_client_does_not_expire() {
    let h = Harness::new();
    h.put("k", 1024);
    for _ in 0..5 {
        h.advance(6_000);
        assert_eq!(h.ping(h.client), ClientStatus::Ok);
        h.engine.tick();
    }
    assert!(h.get("k").is_ok());
}

#[test]
fn case_09_remount_of_mounted_id_with_different_fields_is_invalid() {
    let h = Harness::bare(Harness::config());
    let mut seg = h.segment("a", BASE, MIB);
    h.engine.mount_segment(&mount_req(&h, seg.clone())).unwrap();
    for change in 0..3 {
        let mut other = seg.clone();
        match change {
            0 => other.base += 4096,
            1 => other.size *= 2,
            _ => other.endpoint = "elsewhere:1".into(),
        }
        let req = ReMountSegmentRequest {
            segments: vec![other],
            client_id: h.client,
            adopt: false,
        };
        assert_eq!(
            code(h.engine.remount_segment(&req)),
            ErrorCode::INVALID_PARAMS
        );
    }
    let foreign = ReMountSegmentRequest {
        segments: vec![seg.clone()],
        client_id: ClientId::new(9, 9),
        adopt: false,
    };
    assert_eq!(
        code(h.engine.remount_segment(&foreign)),
        ErrorCode::INVALID_PARAMS
    );
    seg.name = "a".into();
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![seg],
            client_id: h.client,
            adopt: false,
        })
        .unwrap();
}

#[test]
fn case_09a_remount_adds_new_segments_and_refuses_unmounting_ones() {
    let h = Harness::bare(Harness::config());
    let a = h.segment("a", BASE, MIB);
    let b = h.segment("b", 2 * BASE, MIB);
    h.engine.mount_segment(&mount_req(&h, a.clone())).unwrap();
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![a.clone(), b.clone()],
            client_id: h.client,
            adopt: false,
        })
        .unwrap();
    assert_eq!(h.engine.segments().len(), 2);
    let graceful = GracefulUnmountSegmentRequest {
        segment_id: b.id,
        client_id: h.client,
        grace_period_ms: 1000,
    };
    h.engine.graceful_unmount_segment(&graceful).unwrap();
    let req = ReMountSegmentRequest {
        segments: vec![a, b],
        client_id: h.client,
        adopt: false,
    };
    assert_eq!(
        code(h.engine.remount_segment(&req)),
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
}

#[test]
fn fix_1_ping_after_mount_answers_ok() {
    let h = Harness::bare(Harness::config());
    assert_eq!(h.ping(h.client), ClientStatus::NeedRemount);
    h.mount("a", BASE, MIB);
    assert_eq!(h.ping(h.client), ClientStatus::Ok);
    assert_eq!(h.engine.stats().active_clients, 1);
}

#[test]
fn fix_2_unmount_by_non_owner_is_refused() {
    let h = Harness::new();
    h.put("k", 1024);
    let id = h.engine.segments()[0].segment.id;
    let req = UnmountSegmentRequest {
        segment_id: id,
        client_id: ClientId::new(66, 66),
    };
    assert_eq!(
        code(h.engine.unmount_segment(&req)),
        ErrorCode::ILLEGAL_CLIENT
    );
    assert!(h.get("k").is_ok(), "a refused unmount changes nothing");
    h.unmount(id).unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn segment_accounting_tracks_allocations() {
    let h = Harness::new();
    h.put("a", 100);
    h.put("b", 64);
    let info = &h.engine.segments()[0];
    assert_eq!(info.used_bytes, 128 + 64, "sizes are aligned to 64 bytes");
    assert_eq!(info.capacity_bytes, 16 * MIB);
    h.remove("a", false).unwrap();
    assert_eq!(h.engine.stats().allocated_bytes, 64);
}

#[test]
fn an_owner_whose_segment_was_unmounted_behind_its_back_is_asked_to_remount() {
    let h = Harness::bare(Harness::config());
    let a = h.segment("a", BASE, 16 * MIB);
    let b = h.segment("b", BASE + 16 * MIB, 16 * MIB);
    h.engine.mount_segment(&mount_req(&h, a.clone())).unwrap();
    h.engine.mount_segment(&mount_req(&h, b.clone())).unwrap();
    let ping = |mounted: u32| {
        h.engine
            .ping(&PingRequest {
                client_id: h.client,
                mounted_segments: mounted,
            })
            .unwrap()
            .client_status
    };
    assert_eq!(ping(2), ClientStatus::Ok);
    h.unmount(b.id).unwrap();
    assert_eq!(ping(2), ClientStatus::NeedRemount, "one of its two is gone");
    assert_eq!(ping(1), ClientStatus::Ok, "it unmounted b itself");
    assert_eq!(ping(0), ClientStatus::Ok, "an older client says nothing");
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![a, b],
            client_id: h.client,
            adopt: false,
        })
        .unwrap();
    assert_eq!(h.engine.segments().len(), 2);
    assert_eq!(ping(2), ClientStatus::Ok);
}

fn report(h: &Harness, endpoints: &[&str]) -> Result<u32> {
    h.engine.report_unreachable(&ReportUnreachableRequest {
        client_id: ClientId::new(9, 9),
        endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
    })
}

fn ping(h: &Harness, client: ClientId) {
    h.engine
        .ping(&PingRequest {
            client_id: client,
            mounted_segments: 1,
        })
        .unwrap();
}

fn placed_on(h: &Harness, key: &str) -> String {
    let replicas = h.put_start(key, 4096).unwrap();
    assert_eq!(replicas.len(), 1);
    replicas[0].segment_name.to_string()
}

#[test]
fn a_segment_reported_unreachable_takes_no_new_replicas_until_its_owner_heartbeats() {
    let h = Harness::bare(Harness::config());
    let (a, b) = (ClientId::new(1, 1), ClientId::new(2, 2));
    h.mount_for(a, "node-a", BASE, 16 * MIB);
    h.mount_for(b, "node-b", BASE + 16 * MIB, 16 * MIB);

    assert_eq!(report(&h, &["node-a"]), Ok(1));
    assert_eq!(report(&h, &["node-a"]), Ok(0), "already out of placement");
    let suspects: Vec<(String, bool)> = h
        .engine
        .segments()
        .into_iter()
        .map(|s| (s.segment.name.to_string(), s.suspect))
        .collect();
    assert_eq!(
        suspects,
        vec![("node-a".to_string(), true), ("node-b".to_string(), false)]
    );
    for i in 0..20 {
        assert_eq!(placed_on(&h, &format!("k{i}")), "node-b");
    }

    // Another client's heartbeat does not vouch for node-a; its own does.
    ping(&h, b);
    assert_eq!(placed_on(&h, "after-b"), "node-b");
    assert!(h.engine.segments()[0].suspect);
    ping(&h, a);
    assert!(!h.engine.segments()[0].suspect);
    let names: std::collections::HashSet<String> = (0..20)
        .map(|i| placed_on(&h, &format!("again{i}")))
        .collect();
    assert!(
        names.contains("node-a"),
        "node-a takes replicas again: {names:?}"
    );
}

#[test]
fn a_report_naming_every_segment_leaves_nothing_to_place_and_is_bounded() {
    let h = Harness::bare(Harness::config());
    h.mount("only", BASE, 16 * MIB);
    assert_eq!(report(&h, &["only", "unknown:1"]), Ok(1));
    assert_eq!(code(h.put_start("k", 4096)), ErrorCode::NO_AVAILABLE_HANDLE);
    let too_many: Vec<String> = (0..=MAX_REPORTED_ENDPOINTS)
        .map(|i| format!("h:{i}"))
        .collect();
    let refs: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_eq!(code(report(&h, &refs)), ErrorCode::INVALID_PARAMS);
}

#[test]
fn an_unmounted_suspect_segment_leaves_the_suspect_count_and_a_remount_is_clean() {
    let h = Harness::bare(Harness::config());
    let id = h.mount("gone", BASE, 16 * MIB);
    assert_eq!(report(&h, &["gone"]), Ok(1));
    assert_eq!(h.engine.usage.suspects.load(Ordering::Acquire), 1);
    h.unmount(id).unwrap();
    assert_eq!(h.engine.usage.suspects.load(Ordering::Acquire), 0);
    h.mount("gone", BASE, 16 * MIB);
    assert!(!h.engine.segments()[0].suspect);
    assert_eq!(placed_on(&h, "k"), "gone");
}

#[test]
fn puts_refused_because_no_segment_takes_replicas_evict_nothing() {
    // Eviction makes room; it cannot make a suspect (or re-adopting) segment placeable, so a
    // put refused for that reason must not cost the cluster any of its objects.
    let h = Harness::bare(Harness::config());
    h.mount("only", BASE, 16 * MIB);
    for i in 0..20 {
        h.put(&format!("kept-{i}"), 4096);
    }
    h.advance(10 * LEASE_MS);
    assert_eq!(report(&h, &["only"]), Ok(1));
    for _ in 0..50 {
        let err = h.put_start("refused", 4096).unwrap_err();
        assert_eq!(err.code, ErrorCode::NO_AVAILABLE_HANDLE);
        assert!(err.message.contains("takes new replicas"), "{err}");
        h.engine.tick();
    }
    assert_eq!(h.engine.stats().key_count, 20);
    assert_eq!(h.engine.stats().evictions_total, 0);
}

/// Mounts `name` on `host`.
fn mount_on(h: &Harness, name: &str, host: &str, base: u64, size: u64) {
    let mut segment = h.segment(name, base, size);
    segment.host_id = host.into();
    h.engine
        .mount_segment(&MountSegmentRequest {
            segment,
            client_id: h.client,
            keeps_catalog: true,
        })
        .unwrap();
}

#[test]
fn two_replicas_go_to_two_hosts_while_both_have_room() {
    let h = Harness::bare(Harness::config());
    // Three segments on host a, one on host b: a random pick would pair two of a's often.
    mount_on(&h, "a1", "a", 0x1_0000_0000, 16 * MIB);
    mount_on(&h, "a2", "a", 0x2_0000_0000, 16 * MIB);
    mount_on(&h, "a3", "a", 0x3_0000_0000, 16 * MIB);
    mount_on(&h, "b1", "b", 0x4_0000_0000, 4 * MIB);
    let config = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let hosts = |descs: &[ReplicaDescriptor]| -> Vec<String> {
        let mut names: Vec<String> = descs
            .iter()
            .map(|d| d.segment_name[..1].to_string())
            .collect();
        names.sort();
        names
    };
    // Host b takes 4 MiB: sixteen 256 KiB objects, each with one replica on a and one on b.
    for i in 0..16 {
        let descs = h
            .put_start_with(&format!("k{i}"), 256 << 10, config.clone())
            .unwrap();
        assert_eq!(hosts(&descs), ["a", "b"], "object {i}");
    }
    // Once b is full, both replicas go to a (on two of its segments) rather than one.
    let descs = h.put_start_with("more", 256 << 10, config).unwrap();
    assert_eq!(descs.len(), 2);
    assert_eq!(hosts(&descs), ["a", "a"]);
    assert_ne!(descs[0].segment_name, descs[1].segment_name);
}
