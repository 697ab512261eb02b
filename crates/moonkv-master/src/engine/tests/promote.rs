//! Promotion on hit: the frequency gate, the memory replica filled beside the object (reads keep
//! the disk replica until it lands), `stored cpu`, and the failed, cancelled and watermark paths
//! with upstream's counting.

use super::disk::{disk, heartbeat, kinds, mount_disk, notify, notify_id};
use super::*;

fn promo_harness(promotion_on_hit: bool) -> Harness {
    let mut config = Harness::config();
    config.offload_high_watermark_ratio = 0.5;
    config.offload_low_watermark_ratio = 0.0;
    config.promotion_on_hit = promotion_on_hit;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", 64 * MIB);
    mount_disk(&h, h.client, &d, Vec::new());
    h
}

/// `k` (2 MiB) and `m` (7 MiB) offloaded to disk: both disk-only, memory empty.
fn disk_only(h: &Harness) {
    h.put("k", 2 * MIB);
    h.advance(1);
    h.put("m", 7 * MIB);
    assert_eq!(h.engine.run_eviction().offloads_started, 2);
    for task in heartbeat(h, h.client).tasks {
        notify(h, h.client, &task, true).unwrap();
    }
    h.sink.take();
    assert_eq!(h.engine.segments()[0].used_bytes, 0);
}

fn promotion_task(h: &Harness) -> PromotionTask {
    let mut beat = heartbeat(h, h.client);
    assert_eq!(beat.promotions.len(), 1, "{beat:?}");
    beat.promotions.remove(0)
}

#[test]
fn a_second_read_promotes_and_the_memory_copy_lands_with_stored_cpu() {
    let h = promo_harness(true);
    disk_only(&h);
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::LocalDisk]);
    assert_eq!(
        h.engine.promotion_stats().rejected_frequency,
        1,
        "first read"
    );
    assert!(heartbeat(&h, h.client).promotions.is_empty());
    assert_eq!(
        kinds(&h, "k"),
        vec![ReplicaKind::LocalDisk],
        "still disk only"
    );
    let task = promotion_task(&h);
    assert_eq!(task.key, "k");
    assert_eq!(task.source.kind, ReplicaKind::LocalDisk);
    assert_eq!(task.target.kind, ReplicaKind::Memory);
    assert_eq!(task.target.size, 2 * MIB);
    let s = h.engine.promotion_stats();
    assert_eq!((s.admitted, s.in_flight), (1, 1));
    assert_eq!(
        h.engine.segments()[0].used_bytes,
        2 * MIB,
        "the target is allocated"
    );
    // Until the node reports, readers get the disk replica only: no read of a half-filled
    // buffer.
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::LocalDisk]);
    assert!(h.sink.take().is_empty());
    notify_id(&h, h.client, &task.tenant, &task.key, task.target.id, true).unwrap();
    assert_eq!(h.sink.take(), vec![stored("k")]);
    let mut got = kinds(&h, "k");
    got.sort_by_key(|k| *k as u8);
    assert_eq!(got, vec![ReplicaKind::Memory, ReplicaKind::LocalDisk]);
    let s = h.engine.promotion_stats();
    assert_eq!(
        (s.in_flight, s.completed, s.completed_bytes),
        (0, 1, 2 * MIB)
    );
    assert!(
        heartbeat(&h, h.client).promotions.is_empty(),
        "no second one"
    );
}

#[test]
fn a_failed_promotion_frees_its_buffer_and_counts_failed() {
    let h = promo_harness(true);
    disk_only(&h);
    kinds(&h, "k");
    kinds(&h, "k");
    let task = promotion_task(&h);
    notify_id(&h, h.client, &task.tenant, &task.key, task.target.id, false).unwrap();
    assert!(h.sink.take().is_empty());
    assert_eq!(h.engine.segments()[0].used_bytes, 0);
    let s = h.engine.promotion_stats();
    assert_eq!((s.failed, s.in_flight, s.completed), (1, 0, 0));
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::LocalDisk]);
}

#[test]
fn removing_a_promoting_object_cancels_it_and_keeps_the_buffer_until_the_deadline() {
    let h = promo_harness(true);
    disk_only(&h);
    kinds(&h, "k");
    kinds(&h, "k");
    let task = promotion_task(&h);
    h.advance(LEASE_MS + 1);
    h.remove("k", false).unwrap();
    let s = h.engine.promotion_stats();
    assert_eq!((s.cancelled, s.in_flight), (1, 0));
    assert_eq!(
        h.engine.segments()[0].used_bytes,
        2 * MIB,
        "the node may still be writing into it"
    );
    assert_eq!(
        code(notify_id(
            &h,
            h.client,
            &task.tenant,
            &task.key,
            task.target.id,
            true
        )),
        ErrorCode::OBJECT_NOT_FOUND
    );
    h.advance(Harness::config().put_start_release_timeout_ms);
    h.ping(h.client);
    h.engine.sweep_stalled_writes();
    assert_eq!(h.engine.segments()[0].used_bytes, 0);
}

#[test]
fn no_promotion_above_the_watermark_or_when_turned_off() {
    let h = promo_harness(true);
    disk_only(&h);
    h.put("f", 7 * MIB);
    kinds(&h, "k");
    kinds(&h, "k");
    assert!(heartbeat(&h, h.client).promotions.is_empty());
    assert_eq!(h.engine.promotion_stats().rejected_watermark, 1);

    let h = promo_harness(false);
    disk_only(&h);
    for _ in 0..3 {
        kinds(&h, "k");
    }
    assert!(heartbeat(&h, h.client).promotions.is_empty());
    assert_eq!(h.engine.promotion_stats(), PromotionStats::default());
}
