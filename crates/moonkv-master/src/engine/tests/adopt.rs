//! Re-adoption: the commit/drop notices a node's catalog is fed, the fence of removals, and
//! rebuilding objects from announced catalogs after a restart.

use super::*;
use crate::engine::{fence_scope, PendingNotices};

const NODE: ClientId = ClientId::new(7, 7);

fn sync(h: &Harness, epoch: u64, acked: u64) -> SyncCatalogResponse {
    h.engine
        .sync_catalog(&SyncCatalogRequest {
            client_id: NODE,
            epoch,
            acked,
            wait_ms: 0,
        })
        .unwrap()
}

fn commits(answer: &SyncCatalogResponse) -> Vec<CatalogEntry> {
    answer
        .notices
        .iter()
        .filter_map(|n| match n {
            CatalogNotice::Commit(e) => Some(e.clone()),
            CatalogNotice::Drop { .. } => None,
        })
        .collect()
}

/// Everything the node would hold after applying every notice so far (by address).
fn catalog_of(h: &Harness) -> Vec<CatalogEntry> {
    let answer = sync(h, 0, 0);
    let mut held: std::collections::BTreeMap<u64, CatalogEntry> = Default::default();
    for n in &answer.notices {
        match n {
            CatalogNotice::Commit(e) => {
                held.insert(e.address, e.clone());
            }
            CatalogNotice::Drop { address, .. } => {
                held.remove(address);
            }
        }
    }
    held.into_values().collect()
}

fn remount_adopting(h: &Harness, segment: Segment) {
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![segment],
            client_id: NODE,
            adopt: true,
        })
        .unwrap();
}

fn adopt(
    h: &Harness,
    segment: SegmentId,
    entries: Vec<CatalogEntry>,
    done: bool,
) -> AdoptReplicasResponse {
    h.engine
        .adopt_replicas(&AdoptReplicasRequest {
            client_id: NODE,
            segment_id: segment,
            entries,
            done,
        })
        .unwrap()
}

/// The segment `Harness::new` mounted, as its node would re-mount it.
fn first_segment(h: &Harness) -> Segment {
    let mut s = h.segment("seg-0", BASE, 16 * MIB);
    s.id = SegmentId::new(1, 1);
    s
}

#[test]
fn put_end_queues_a_commit_with_everything_a_master_needs() {
    let h = Harness::new();
    let descs = h.put_start("k", 1000).unwrap();
    assert!(sync(&h, 0, 0).notices.is_empty(), "nothing before PutEnd");
    h.put_end("k", &descs).unwrap();
    let answer = sync(&h, 0, 0);
    let entries = commits(&answer);
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(e.key, "k");
    assert_eq!(e.size, 1000);
    assert_eq!(e.len, 1024);
    assert_eq!(e.replica_id, descs[0].id);
    assert_eq!(e.address, descs[0].address);
    assert_eq!(e.segment_id, descs[0].segment_id);
    assert_eq!(e.epoch, h.engine.epoch());
    assert_eq!(e.write, descs[0].id.0);
    // Acknowledged notices are forgotten; the sequence goes on.
    let later = sync(&h, answer.epoch, answer.last);
    assert!(later.notices.is_empty());
    assert_eq!(later.last, answer.last);
}

#[test]
fn removal_drops_the_entry_and_its_fence_waits_for_the_ack() {
    let h = Harness::new();
    h.put("k", 100);
    let answer = sync(&h, 0, 0);
    let epoch = answer.epoch;
    let acked = answer.last;
    let (result, fence) = fence_scope(|| h.remove("k", false));
    result.unwrap();
    assert!(!fence.is_empty(), "a removed committed replica fences");
    assert!(!h.engine.catalog_fence_passed(&fence, u64::MAX));
    let drops = sync(&h, epoch, acked);
    assert!(matches!(
        drops.notices.as_slice(),
        [CatalogNotice::Drop { .. }]
    ));
    assert!(
        !h.engine.catalog_fence_passed(&fence, u64::MAX),
        "sent is not acknowledged"
    );
    sync(&h, epoch, drops.last);
    assert!(h.engine.catalog_fence_passed(&fence, u64::MAX));
    assert!(catalog_of(&h).is_empty());
    // Nothing committed, nothing to fence: a put that never ended.
    let descs = h.put_start("w", 100).unwrap();
    let (_, fence) = fence_scope(|| h.put_revoke("w", &descs).unwrap());
    assert!(fence.is_empty());
}

#[test]
fn commits_alone_may_wait_for_company_but_an_unacknowledged_drop_is_urgent() {
    let h = Harness::new();
    assert!(!h.engine.catalog_urgent(NODE), "nothing pending");
    h.put("a", 100);
    h.put("b", 100);
    assert!(
        !h.engine.catalog_urgent(NODE),
        "two commits pending, no drop: they may linger"
    );
    let answer = sync(&h, 0, 0);
    assert_eq!(commits(&answer).len(), 2);
    h.remove("a", false).unwrap();
    assert!(
        h.engine.catalog_urgent(NODE),
        "a removal waits for its drop"
    );
    let drops = sync(&h, answer.epoch, answer.last);
    assert!(
        h.engine.catalog_urgent(NODE),
        "sent but not acknowledged is still urgent"
    );
    sync(&h, drops.epoch, drops.last);
    assert!(!h.engine.catalog_urgent(NODE), "acknowledged");
    h.put("c", 100);
    assert!(!h.engine.catalog_urgent(NODE), "a commit after the drop");
    assert!(
        !h.engine.catalog_urgent(ClientId::new(9, 9)),
        "a node with no mailbox"
    );
}

#[test]
fn an_acknowledgement_alone_forgets_what_was_acknowledged_and_tells_whether_more_is_pending() {
    let h = Harness::new();
    let poll = |epoch, acked| SyncCatalogRequest {
        client_id: NODE,
        epoch,
        acked,
        wait_ms: 0,
    };
    let ack = |epoch, acked| h.engine.catalog_acknowledge(&poll(epoch, acked));
    assert_eq!(ack(0, 0), PendingNotices::Nothing, "nothing yet");
    h.put("a", 100);
    h.put("b", 100);
    assert_eq!(ack(0, 0), PendingNotices::MayWait, "commits alone may wait");
    let answer = sync(&h, 0, 0);
    assert_eq!(commits(&answer).len(), 2);
    // Acknowledging the answer leaves nothing; the next poll's answer is empty.
    assert_eq!(ack(answer.epoch, answer.last), PendingNotices::Nothing);
    let after = sync(&h, answer.epoch, answer.last);
    assert!(after.notices.is_empty() && after.last == answer.last);
    // A stale epoch acknowledges nothing.
    h.put("c", 100);
    assert_eq!(
        ack(answer.epoch + 1, answer.last + 1),
        PendingNotices::MayWait
    );
    assert_eq!(commits(&sync(&h, answer.epoch, answer.last)).len(), 1);
    // A drop must not wait, and the acknowledgement says so without copying anything.
    h.remove("c", false).unwrap();
    assert_eq!(ack(answer.epoch, answer.last), PendingNotices::Urgent);
}

#[test]
fn the_catalog_waker_is_told_which_notices_must_not_wait() {
    let h = Harness::new();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    h.engine
        .set_catalog_waker(Arc::new(move |urgent| seen.lock().push(urgent)));
    h.put("a", 100);
    h.put("b", 100);
    assert_eq!(
        *calls.lock(),
        [false, false],
        "commits may wait for company"
    );
    let answer = sync(&h, 0, 0);
    h.remove("a", false).unwrap();
    assert_eq!(calls.lock().last(), Some(&true), "a drop must not wait");
    // Until the drop is acknowledged, a commit queued behind it must not wait either.
    h.put("c", 100);
    assert_eq!(calls.lock().last(), Some(&true));
    let pending = sync(&h, answer.epoch, answer.last);
    sync(&h, pending.epoch, pending.last);
    h.put("d", 100);
    assert_eq!(
        calls.lock().last(),
        Some(&false),
        "acknowledged: commits wait again"
    );
    assert_eq!(
        calls.lock().iter().filter(|u| **u).count(),
        2,
        "{:?}",
        calls.lock()
    );
}

#[test]
fn an_in_place_upsert_drops_the_old_entry_before_its_bytes_change() {
    let h = Harness::new();
    h.put("k", 100);
    let before = catalog_of(&h);
    assert_eq!(before.len(), 1);
    let req = h.start_req("", "k", 100, ReplicateConfig::default());
    let (descs, fence) = fence_scope(|| h.engine.upsert_start(&req).unwrap());
    assert_eq!(descs[0].address, before[0].address, "in place");
    assert!(!fence.is_empty());
    assert!(
        catalog_of(&h).is_empty(),
        "the old value is not re-adoptable any more"
    );
    h.engine
        .upsert_end(&h.end_req("", "k", ids(&descs)))
        .unwrap();
    let after = catalog_of(&h);
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].replica_id, descs[0].id);
}

#[test]
fn a_replacement_waits_for_the_old_value_to_leave_the_catalog_at_its_end() {
    let h = Harness::new();
    // In place (same size, no lease) and replacing (a live read lease forces new buffers).
    for (size, lease) in [(100u64, false), (300, true)] {
        h.put("k", 100);
        if lease {
            h.get("k").unwrap();
        }
        let req = h.start_req("", "k", size, ReplicateConfig::default());
        let (descs, at_start) = fence_scope(|| h.engine.upsert_start(&req).unwrap());
        assert!(
            !at_start.is_empty(),
            "the old value is dropped at the Start"
        );
        let end = h.end_req("", "k", ids(&descs));
        let (ended, at_end) = fence_scope(|| h.engine.upsert_end(&end));
        ended.unwrap();
        assert_eq!(
            at_end, at_start,
            "the End is answered once those drops are acknowledged"
        );
        // A retried End waits for nothing more.
        let (again, after) = fence_scope(|| h.engine.upsert_end(&end));
        again.unwrap();
        assert!(after.is_empty());
        h.remove("k", true).unwrap();
    }
    // A revoked replacement is never acknowledged and leaves nothing to wait for.
    h.put("r", 100);
    let req = h.start_req("", "r", 100, ReplicateConfig::default());
    let (descs, at_start) = fence_scope(|| h.engine.upsert_start(&req).unwrap());
    assert!(!at_start.is_empty());
    h.engine
        .upsert_revoke(&h.revoke_req("", "r", ids(&descs)))
        .unwrap();
    let (_, at_end) = fence_scope(|| h.engine.upsert_end(&h.end_req("", "r", ids(&descs))));
    assert!(at_end.is_empty());
}

#[test]
fn a_restarted_master_rebuilds_objects_from_the_announced_catalog() {
    let mut h = Harness::new();
    let a = h.put("a", 1000);
    let b = h.put("b", 5000);
    let entries = catalog_of(&h);
    assert_eq!(entries.len(), 2);
    let old_epoch = h.engine.epoch();
    h.restart();
    assert!(h.engine.epoch() > old_epoch);
    assert_eq!(code(h.get("a")), ErrorCode::OBJECT_NOT_FOUND);
    let seg = first_segment(&h);
    remount_adopting(&h, seg.clone());
    // Frozen: nothing new lands on the segment while it is announced.
    assert_eq!(
        code(h.put_start("fresh", 100)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    let answer = adopt(&h, seg.id, entries, true);
    assert_eq!(answer.adopted, 2);
    assert!(answer.rejected.is_empty());
    let got = h.get("a").unwrap();
    assert_eq!(got.replicas[0].id, a[0].id, "replica ids are preserved");
    assert_eq!(got.replicas[0].address, a[0].address);
    assert_eq!(h.get("b").unwrap().replicas[0].id, b[0].id);
    // Thawed; new ids are issued past the adopted ones, new ranges avoid the adopted ones.
    let fresh = h.put("fresh", 100);
    assert!(fresh[0].id.0 > a[0].id.0.max(b[0].id.0));
    assert!(fresh[0].address != a[0].address && fresh[0].address != b[0].address);
    assert_eq!(
        h.engine.stats().allocated_bytes,
        1024 + 5056 + 128,
        "allocated bytes include the adopted ones"
    );
    // Leases reset: only the read above holds one.
    assert_eq!(code(h.remove("b", false)), ErrorCode::OBJECT_HAS_LEASE);
    h.advance(LEASE_MS + 1);
    h.remove("b", false).unwrap();
}

#[test]
fn the_newest_version_wins_and_equal_versions_merge() {
    let mut h = Harness::new();
    let seg_b = h.mount("seg-1", BASE + 64 * MIB, 16 * MIB);
    h.put("k", 100);
    let v1 = catalog_of(&h);
    // The value is replaced: a remove, then a later put.
    h.remove("k", true).unwrap();
    h.put("k", 100);
    let v2 = catalog_of(&h);
    assert_eq!(v2.len(), 1);
    assert!((v2[0].epoch, v2[0].write) > (v1[0].epoch, v1[0].write));
    h.restart();
    let seg_a = first_segment(&h);
    let mut seg_b_info = h.segment("seg-1", BASE + 64 * MIB, 16 * MIB);
    seg_b_info.id = seg_b;
    remount_adopting(&h, seg_a.clone());
    remount_adopting(&h, seg_b_info.clone());
    // The old value announced (say by a node that missed the drop) loses to the new one,
    // in either order.
    let new_on = v2[0].segment_id;
    let old_on = v1[0].segment_id;
    let mut old = v1[0].clone();
    if old_on == new_on {
        // Same segment and same range: pretend the stale entry lives on the other segment.
        let other = if new_on == seg_a.id {
            &seg_b_info
        } else {
            &seg_a
        };
        old.segment_id = other.id;
        old.address = other.base;
    }
    let old_seg = old.segment_id;
    assert_eq!(adopt(&h, new_on, v2.clone(), true).adopted, 1);
    let rejected = adopt(&h, old_seg, vec![old.clone()], true);
    assert_eq!(
        rejected.rejected,
        vec![old.address],
        "an older version is rejected"
    );
    assert_eq!(h.get("k").unwrap().replicas[0].id, v2[0].replica_id);

    // Equal versions merge into one object with two replicas.
    let mut twin = v2[0].clone();
    twin.segment_id = old_seg;
    twin.address = old.address;
    twin.replica_id = ReplicaId(v2[0].replica_id.0 + 1);
    assert_eq!(adopt(&h, old_seg, vec![twin], true).adopted, 1);
    assert_eq!(h.get("k").unwrap().replicas.len(), 2);
}

#[test]
fn an_older_object_here_is_replaced_by_a_newer_announced_one() {
    let mut h = Harness::new();
    h.put("k", 100);
    let mut entries = catalog_of(&h);
    h.restart();
    let seg = first_segment(&h);
    remount_adopting(&h, seg.clone());
    let mut older = entries[0].clone();
    older.write -= 1;
    older.address += 4096;
    older.replica_id = ReplicaId(older.replica_id.0 - 10);
    assert_eq!(adopt(&h, seg.id, vec![older], false).adopted, 1);
    assert_eq!(
        adopt(&h, seg.id, std::mem::take(&mut entries), true).adopted,
        1
    );
    let got = h.get("k").unwrap();
    assert_eq!(
        got.replicas.len(),
        1,
        "the older value's replica went with it"
    );
    assert_eq!(got.replicas[0].address, BASE);
}

#[test]
fn a_write_here_or_a_taken_range_beats_an_announcement() {
    let mut h = Harness::new();
    h.put("k", 100);
    h.put("other", 100);
    let entries = catalog_of(&h);
    h.restart();
    let seg = first_segment(&h);
    // Not frozen (an older node): a write lands first on the range of `k`, and `other` is
    // written here anew.
    h.engine
        .remount_segment(&ReMountSegmentRequest {
            segments: vec![seg.clone()],
            client_id: NODE,
            adopt: false,
        })
        .unwrap();
    let here = h.put("new", 100);
    let descs = h.put_start("other", 100).unwrap();
    let answer = adopt(&h, seg.id, entries.clone(), true);
    assert_eq!(answer.adopted, 0);
    assert_eq!(answer.rejected.len(), 2);
    assert!(answer.rejected.contains(&here[0].address));
    h.put_end("other", &descs).unwrap();
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn bad_announcements_are_rejected_one_by_one() {
    let mut h = Harness::new();
    h.put("good", 100);
    let entries = catalog_of(&h);
    h.restart();
    let seg = first_segment(&h);
    remount_adopting(&h, seg.clone());
    let base = entries[0].clone();
    let mut bad = Vec::new();
    let mut e = base.clone();
    e.len = 64; // disagrees with the size
    e.address += 8192;
    bad.push(e);
    let mut e = base.clone();
    e.key = String::new();
    e.address += 16384;
    bad.push(e);
    let mut e = base.clone();
    e.address = BASE + 32 * MIB; // outside the segment
    bad.push(e);
    let mut e = base.clone();
    e.segment_id = SegmentId::new(9, 9);
    bad.push(e);
    let mut e = base.clone();
    e.epoch = 0;
    e.address += 65536;
    bad.push(e);
    let n = bad.len();
    bad.push(base);
    let answer = adopt(&h, seg.id, bad, true);
    assert_eq!(answer.rejected.len(), n);
    assert_eq!(answer.adopted, 1);
    assert!(h.exists("good"));
    // Another node cannot announce into this segment.
    let foreign = h.engine.adopt_replicas(&AdoptReplicasRequest {
        client_id: ClientId::new(8, 8),
        segment_id: seg.id,
        entries: vec![],
        done: true,
    });
    assert_eq!(code(foreign), ErrorCode::ILLEGAL_CLIENT);
}

#[test]
fn an_unfinished_announcement_thaws_after_the_timeout() {
    let mut h = Harness::new();
    h.restart();
    let seg = first_segment(&h);
    remount_adopting(&h, seg);
    assert_eq!(code(h.put_start("x", 100)), ErrorCode::NO_AVAILABLE_HANDLE);
    h.advance(h.engine.config().adopt_timeout_ms - 1);
    h.ping(NODE);
    h.engine.tick();
    assert_eq!(code(h.put_start("x", 100)), ErrorCode::NO_AVAILABLE_HANDLE);
    h.advance(2);
    h.engine.tick();
    h.put("x", 100);
}

#[test]
fn an_expired_node_that_comes_back_regains_only_the_replicas_of_unchanged_objects() {
    const OTHER: ClientId = ClientId::new(8, 8);
    let h = Harness::new();
    h.mount_for(OTHER, "other", BASE + 64 * MIB, 16 * MIB);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    // "same" is placed on the node first (its preferred segment), so at least one object has
    // its smallest replica id there; the others go where placement puts them.
    let node_preferred = ReplicateConfig {
        preferred_segments: vec!["seg-0".into()],
        ..two.clone()
    };
    let mut node_first = 0;
    for key in ["same", "same2", "same3", "same4", "removed", "replaced"] {
        let config = if key == "same" {
            node_preferred.clone()
        } else {
            two.clone()
        };
        let descs = h.put_start_with(key, 1000, config).unwrap();
        assert_eq!(descs.len(), 2, "{key}: a replica on each segment");
        let min = descs.iter().min_by_key(|d| d.id).unwrap();
        node_first += usize::from(min.segment_id == first_segment(&h).id);
        h.put_end(key, &descs).unwrap();
    }
    // Some objects lose their smallest replica id with the node: their version must not move.
    assert!(node_first > 0, "placement put no first replica on the node");
    let entries = catalog_of(&h);
    assert_eq!(entries.len(), 6);
    // The node's heartbeat runs out (a partition, say) while the other owner keeps pinging:
    // its segment and its replicas go, without notices.
    let ttl = h.engine.config().client_live_ttl_ms;
    h.advance(ttl / 2);
    h.ping(OTHER);
    h.advance(ttl / 2 + 1);
    h.ping(OTHER);
    h.engine.tick();
    assert_eq!(h.get("same").unwrap().replicas.len(), 1);
    let after = sync(&h, 0, 0);
    assert!(!after.reset, "its catalog is kept for when it comes back");
    // Meanwhile one object is removed and one replaced (on the other segment).
    h.remove("removed", true).unwrap();
    h.remove("replaced", true).unwrap();
    let replacement = h.put("replaced", 1000);
    // It comes back: remounts and announces what it holds.
    let seg = first_segment(&h);
    remount_adopting(&h, seg.clone());
    let answer = adopt(&h, seg.id, entries.clone(), true);
    assert_eq!(
        answer.adopted, 4,
        "only the unchanged objects get their replicas back"
    );
    assert_eq!(answer.rejected.len(), 2);
    for key in ["same", "same2", "same3", "same4"] {
        let same = h.get(key).unwrap();
        assert_eq!(same.replicas.len(), 2, "{key}");
        assert!(
            same.replicas.iter().any(|r| r.segment_id == seg.id),
            "{key}"
        );
    }
    // A removal and a replacement made while it was away stand.
    assert_eq!(code(h.get("removed")), ErrorCode::OBJECT_NOT_FOUND);
    let replaced = h.get("replaced").unwrap();
    assert_eq!(ids(&replaced.replicas), ids(&replacement));
    // The same announcement to a master that never knew the node (a restart) rebuilds
    // everything it holds, as before.
    assert!(!h.engine.catalog.is_merge_only(ClientId::new(9, 9)));
}

#[test]
fn an_owner_that_keeps_no_catalog_is_sent_no_notices() {
    // A segment whose owner never polls (an older node, a client's fake segment, a bench):
    // nothing is queued for it, however many objects it holds.
    let h = Harness::bare(Harness::config());
    h.engine
        .mount_segment(&MountSegmentRequest {
            segment: h.segment("plain", BASE, 16 * MIB),
            client_id: NODE,
            keeps_catalog: false,
        })
        .unwrap();
    for i in 0..100 {
        h.put(&format!("k{i}"), 1000);
    }
    h.remove("k0", false).unwrap();
    assert_eq!(h.engine.catalog.pending_total(), 0);
    // Its first poll says it keeps one after all: from then on its commits are queued.
    assert!(sync(&h, 0, 0).notices.is_empty());
    h.put("later", 1000);
    assert_eq!(
        commits(&sync(&h, 0, 0))
            .iter()
            .map(|e| e.key.as_str())
            .collect::<Vec<_>>(),
        ["later"]
    );
}
