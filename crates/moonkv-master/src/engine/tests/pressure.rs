//! The disk tier under pressure: offload ahead of demand, puts held for offloads (and the bound
//! after which they give up), disk eviction by recency with leases respected, and room made on
//! disk for an offload.

use super::disk::{
    delete_files, disk, heartbeat, kinds, mount_disk, notify, offload_harness, removed_disk,
    start_offload, stored_disk, with_disk,
};
use super::*;

#[test]
fn a_held_put_fits_once_the_offload_lands_and_nothing_is_dropped() {
    let (h, _) = offload_harness(0.5);
    let task = start_offload(&h, "a");
    h.advance(1);
    h.put("b", 6 * MIB);
    h.sink.take();
    let failed = h.put_start("c", 4 * MIB);
    assert_eq!(
        code(h.put_start("c", 4 * MIB)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    let deadline = h
        .engine
        .space_wait_deadline(&failed)
        .expect("a disk is mounted: the put is held");
    assert_eq!(deadline, START_MS + 1 + Harness::config().put_space_wait_ms);
    h.engine.run_eviction();
    assert!(
        h.sink.take().is_empty(),
        "nothing is dropped while an offload is on its way"
    );
    assert!(!h.engine.space_wait_over(deadline));
    notify(&h, h.client, &task, true).unwrap();
    assert_eq!(h.sink.take(), vec![stored_disk("a"), removed("a")]);
    assert!(h.put_start("c", 4 * MIB).is_ok());
    let t = h.engine.tier_stats();
    assert_eq!(t.dropped_objects, 0);
    assert_eq!(t.offloaded_bytes, 9 * MIB);
    assert_eq!((t.offload_backlog, t.offload_backlog_bytes), (0, 0));
    assert_eq!((t.put_space_waits, t.put_space_wait_timeouts), (1, 0));
}

#[test]
fn a_held_put_gives_up_after_the_bound_and_the_next_round_evicts_plainly() {
    let (h, _) = offload_harness(0.5);
    let _stuck = start_offload(&h, "a");
    h.advance(1);
    h.put("b", 6 * MIB);
    h.sink.take();
    let failed = h.put_start("c", 4 * MIB);
    let deadline = h.engine.space_wait_deadline(&failed).unwrap();
    assert_eq!(h.engine.tier_stats().offload_backlog_bytes, 9 * MIB);
    h.advance(Harness::config().put_space_wait_ms - 1);
    assert!(!h.engine.space_wait_over(deadline), "1 ms before the bound");
    h.engine.run_eviction();
    assert!(h.sink.take().is_empty());
    h.advance(1);
    assert!(h.engine.space_wait_over(deadline), "at the bound");
    let report = h.engine.run_eviction();
    assert_eq!((report.evicted_keys, report.offloads_started), (1, 0));
    assert_eq!(h.sink.take(), vec![removed("b")]);
    assert!(h.put_start("c", 4 * MIB).is_ok());
    let t = h.engine.tier_stats();
    assert_eq!((t.dropped_objects, t.dropped_bytes), (1, 6 * MIB));
    assert_eq!(t.put_space_wait_timeouts, 1);
}

#[test]
fn without_a_disk_a_put_that_finds_no_room_fails_at_once() {
    let h = Harness::new();
    h.put("a", 12 * MIB);
    let failed = h.put_start("b", 12 * MIB);
    assert_eq!(
        code(h.put_start("b", 12 * MIB)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert_eq!(h.engine.space_wait_deadline(&failed), None);
    assert_eq!(h.engine.space_wait_deadline(&Ok::<(), Error>(())), None);
}

fn ahead_harness(high: f64, low: f64, disk_capacity: u64) -> Harness {
    let mut config = Harness::config();
    config.offload_high_watermark_ratio = high;
    config.offload_low_watermark_ratio = low;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", disk_capacity);
    mount_disk(&h, h.client, &d, Vec::new());
    h
}

#[test]
fn offload_runs_ahead_of_demand_down_to_the_low_watermark_oldest_first() {
    let h = ahead_harness(0.5, 0.25, 64 * MIB);
    for i in 0..5 {
        h.put(&format!("k{i}"), 2 * MIB);
        h.advance(1);
    }
    h.sink.take();
    // 10 of 16 MiB used, above 0.5: offload until 4 MiB (0.25) remain, oldest first.
    let report = h.engine.run_eviction();
    assert_eq!(report.offloads_started, 3);
    assert!(h.sink.take().is_empty(), "offloading drops nothing");
    let keys: Vec<String> = heartbeat(&h, h.client)
        .tasks
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, vec!["k0", "k1", "k2"]);
    assert_eq!(h.engine.tier_stats().offload_backlog_bytes, 6 * MIB);
    assert_eq!(
        h.engine.run_eviction().offloads_started,
        0,
        "offloads in flight count as freed"
    );
}

#[test]
fn disk_eviction_removes_the_least_recently_used_disk_replicas_and_spares_leased_ones() {
    let mut config = Harness::config();
    config.disk_eviction_low_watermark_ratio = 0.5;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", 4 * (MIB + 4096));
    mount_disk(&h, h.client, &d, Vec::new());
    for i in 0..4 {
        let key = format!("k{i}");
        let descs = h.put_start_with(&key, MIB, with_disk()).unwrap();
        h.put_end(&key, &descs).unwrap();
        h.advance(1);
    }
    h.get("k0").unwrap();
    h.advance(LEASE_MS + 1);
    h.get("k1").unwrap();
    h.sink.take();
    // The disk is full (above 0.95): down to half. k1 is leased; k0 was read after k2 and k3
    // were written.
    h.engine.run_eviction();
    assert_eq!(h.sink.take(), vec![removed_disk("k2"), removed_disk("k3")]);
    assert_eq!(kinds(&h, "k2"), vec![ReplicaKind::Memory]);
    assert_eq!(
        kinds(&h, "k0"),
        vec![ReplicaKind::Memory, ReplicaKind::LocalDisk]
    );
    let t = h.engine.tier_stats();
    assert_eq!((t.disk_evicted_objects, t.disk_evicted_bytes), (2, 2 * MIB));
    assert_eq!(t.dropped_objects, 0, "their memory copies remain");
    h.engine.run_eviction();
    assert!(
        h.sink.take().is_empty(),
        "files being deleted count as freed: no further eviction"
    );
    assert_eq!(delete_files(&h, h.client).len(), 2);
    assert_eq!(h.engine.stats().disk_allocated_bytes, 2 * (MIB + 4096));
}

#[test]
fn an_offload_into_a_full_disk_makes_room_on_disk_first() {
    let mut config = Harness::config();
    config.offload_high_watermark_ratio = 0.2;
    config.offload_low_watermark_ratio = 0.0;
    config.disk_eviction_high_watermark_ratio = 1.0;
    config.disk_eviction_low_watermark_ratio = 1.0;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", 2 * (4 * MIB + 4096));
    mount_disk(&h, h.client, &d, Vec::new());
    for key in ["d0", "d1"] {
        h.put(key, 4 * MIB);
        assert_eq!(h.engine.run_eviction().offloads_started, 1);
        let task = heartbeat(&h, h.client).tasks.remove(0);
        notify(&h, h.client, &task, true).unwrap();
        h.advance(1);
    }
    assert_eq!(h.engine.stats().disk_allocated_bytes, 2 * (4 * MIB + 4096));
    h.advance(LEASE_MS + 1);
    h.put("m", 4 * MIB);
    h.sink.take();
    let report = h.engine.run_eviction();
    assert_eq!(report.offloads_started, 0, "the disk has no room yet");
    assert_eq!(h.sink.take(), vec![removed_disk("d0")]);
    assert!(!h.exists("d0"));
    assert_eq!(h.engine.tier_stats().dropped_objects, 1);
    assert_eq!(
        h.engine.run_eviction().offloads_started,
        0,
        "the room comes once the node deleted the file"
    );
    assert!(
        h.sink.take().is_empty(),
        "and nothing more is evicted meanwhile"
    );
    assert_eq!(delete_files(&h, h.client).len(), 1);
    assert_eq!(h.engine.run_eviction().offloads_started, 1);
    let task = heartbeat(&h, h.client).tasks.remove(0);
    assert_eq!(task.key, "m");
}

#[test]
fn a_write_through_with_no_disk_room_is_not_held() {
    let h = ahead_harness(0.8, 0.6, MIB);
    let failed = h.put_start_with("k", 2 * MIB, with_disk());
    assert_eq!(
        code(h.put_start_with("k", 2 * MIB, with_disk())),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert!(!found_no_memory(&failed));
    assert_eq!(h.engine.space_wait_deadline(&failed), None);
}

#[test]
fn answers_wait_only_for_deletions_on_mounted_disks_until_acknowledged() {
    let (h, _) = offload_harness(0.9);
    let descs = h.put_start_with("k", 1000, with_disk()).unwrap();
    h.put_end("k", &descs).unwrap();
    let before = h.engine.deletion_seq();
    h.remove("k", false).unwrap();
    let after = h.engine.deletion_seq();
    assert!(after > before);
    assert!(!h.engine.deletions_done_through(after));
    let file = descs[1].id.0;
    assert_eq!(heartbeat(&h, h.client).deletions, vec![file]);
    assert!(!h.engine.deletions_done_through(after), "handed out only");
    let ack = OffloadHeartbeatRequest {
        client_id: h.client,
        deleted: vec![file],
    };
    h.engine.offload_heartbeat(&ack).unwrap();
    assert!(h.engine.deletions_done_through(after));
    let deadline = h.engine.deletion_wait_deadline();
    assert!(!h.engine.past(deadline));
    h.advance(Harness::config().disk_removal_ack_wait_ms);
    assert!(h.engine.past(deadline));
}

#[test]
fn a_write_through_into_a_full_disk_is_held_until_disk_eviction_made_room() {
    let mut config = Harness::config();
    config.disk_eviction_high_watermark_ratio = 1.0;
    config.disk_eviction_low_watermark_ratio = 1.0;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", 2 * (MIB + 4096));
    mount_disk(&h, h.client, &d, Vec::new());
    for key in ["k0", "k1"] {
        let descs = h.put_start_with(key, MIB, with_disk()).unwrap();
        h.put_end(key, &descs).unwrap();
        h.advance(1);
    }
    h.sink.take();
    let failed = h.put_start_with("k2", MIB, with_disk());
    assert!(found_no_memory(&failed), "held: {failed:?}");
    assert!(h.engine.space_wait_deadline(&failed).is_some());
    h.engine.run_eviction();
    assert_eq!(h.sink.take(), vec![removed_disk("k0")]);
    assert!(found_no_memory(&h.put_start_with("k2", MIB, with_disk())));
    assert_eq!(delete_files(&h, h.client).len(), 1);
    let descs = h.put_start_with("k2", MIB, with_disk()).unwrap();
    h.put_end("k2", &descs).unwrap();
    assert_eq!(
        kinds(&h, "k0"),
        vec![ReplicaKind::Memory],
        "k0 keeps its memory copy"
    );
}
