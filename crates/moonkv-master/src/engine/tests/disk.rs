//! The disk tier: write-through, offload-on-evict (success, failure, leases, expiry, progress
//! under pressure), disk-only reads, removal and file deletion, detach and revive on client
//! expiry, tombstones against resurrection, and re-admission by a fresh master.

use super::*;

const CAP: u64 = 64 * MIB;

pub(super) fn stored_disk(key: &str) -> Ev {
    Ev::Stored("default".into(), key.into(), None, Medium::Disk)
}

pub(super) fn removed_disk(key: &str) -> Ev {
    Ev::Removed("default".into(), key.into(), None, Medium::Disk)
}

pub(super) fn disk(h: &Harness, name: &str, capacity: u64) -> DiskSegment {
    let seg = h.segment(name, BASE, 1);
    DiskSegment {
        id: seg.id,
        name: name.into(),
        endpoint: format!("{name}-endpoint"),
        capacity_bytes: capacity,
    }
}

pub(super) fn mount_disk(
    h: &Harness,
    client: ClientId,
    disk: &DiskSegment,
    existing: Vec<DiskFile>,
) -> MountDiskSegmentResponse {
    h.engine
        .mount_disk_segment(&MountDiskSegmentRequest {
            client_id: client,
            disk: disk.clone(),
            existing,
        })
        .unwrap()
}

pub(super) fn with_disk() -> ReplicateConfig {
    ReplicateConfig {
        with_disk_replica: true,
        ..Default::default()
    }
}

pub(super) fn heartbeat(h: &Harness, client: ClientId) -> OffloadHeartbeatResponse {
    h.engine
        .offload_heartbeat(&OffloadHeartbeatRequest {
            client_id: client,
            deleted: Vec::new(),
        })
        .unwrap()
}

pub(super) fn notify(h: &Harness, client: ClientId, task: &OffloadTask, ok: bool) -> Result<()> {
    notify_id(h, client, &task.tenant, &task.key, task.disk_replica_id, ok)
}

/// NotifyOffload of one copy (offload or promotion) producing replica `id`.
pub(super) fn notify_id(
    h: &Harness,
    client: ClientId,
    tenant: &str,
    key: &str,
    id: ReplicaId,
    ok: bool,
) -> Result<()> {
    let results = vec![OffloadResult {
        tenant: tenant.into(),
        key: key.into(),
        disk_replica_id: id,
        ok,
    }];
    h.engine
        .notify_offload(&NotifyOffloadRequest {
            client_id: client,
            results,
        })
        .unwrap()
        .remove(0)
        .0
}

pub(super) fn kinds(h: &Harness, key: &str) -> Vec<ReplicaKind> {
    h.get(key)
        .map(|r| r.replicas.iter().map(|d| d.kind).collect())
        .unwrap_or_default()
}

fn file_of(key: &str, size: u64, id: ReplicaId) -> DiskFile {
    DiskFile {
        tenant: "default".into(),
        key: key.into(),
        size,
        replica_id: id,
    }
}

/// One 16 MiB segment and a disk, both owned by the harness client; eviction above `hw`.
pub(super) fn offload_harness(hw: f64) -> (Harness, DiskSegment) {
    let mut config = Harness::config();
    config.eviction_high_watermark_ratio = hw;
    config.eviction_ratio = 0.05;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "disk-0", CAP);
    mount_disk(&h, h.client, &d, Vec::new());
    h.sink.take();
    (h, d)
}

/// Puts `key` (9 MiB: over a 0.5 watermark) and runs eviction: its offload starts.
pub(super) fn start_offload(h: &Harness, key: &str) -> OffloadTask {
    h.put(key, 9 * MIB);
    h.sink.take();
    let report = h.engine.run_eviction();
    assert_eq!((report.evicted_keys, report.offloads_started), (1, 1));
    let mut beat = heartbeat(h, h.client);
    assert_eq!(beat.tasks.len(), 1);
    beat.tasks.remove(0)
}

#[test]
fn write_through_commits_cpu_and_disk_and_removal_reclaims_the_file() {
    let (h, d) = offload_harness(0.9);
    let descs = h.put_start_with("k", 1000, with_disk()).unwrap();
    let kinds: Vec<ReplicaKind> = descs.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![ReplicaKind::Memory, ReplicaKind::LocalDisk]);
    let file = &descs[1];
    assert_eq!(file.segment_id, d.id);
    assert_eq!(&*file.endpoint, d.endpoint);
    assert_eq!(file.address, file.id.0, "the file id is the replica id");
    assert!(h.sink.take().is_empty());
    h.put_end("k", &descs).unwrap();
    assert_eq!(h.sink.take(), vec![stored("k"), stored_disk("k")]);
    let stats = h.engine.stats();
    assert_eq!(stats.disk_capacity_bytes, CAP);
    assert_eq!(stats.disk_allocated_bytes, 1000 + 4096);
    h.remove("k", false).unwrap();
    assert_eq!(h.sink.take(), vec![removed("k"), removed_disk("k")]);
    assert_eq!(
        h.engine.stats().disk_allocated_bytes,
        1000 + 4096,
        "charged until the node deleted the file"
    );
    assert_eq!(heartbeat(&h, h.client).deletions, vec![file.id.0]);
    ack(&h, h.client, vec![file.id.0]);
    assert_eq!(h.engine.stats().disk_allocated_bytes, 0);
}

/// The node reports these deletions done.
pub(super) fn ack(h: &Harness, client: ClientId, deleted: Vec<u64>) {
    h.engine
        .offload_heartbeat(&OffloadHeartbeatRequest {
            client_id: client,
            deleted,
        })
        .unwrap();
}

/// One heartbeat whose deletions the node carries out and acknowledges at once.
pub(super) fn delete_files(h: &Harness, client: ClientId) -> Vec<u64> {
    let deletions = heartbeat(h, client).deletions;
    ack(h, client, deletions.clone());
    deletions
}

#[test]
fn write_through_without_disk_room_fails_and_frees_memory() {
    let h = Harness::new();
    assert_eq!(
        code(h.put_start_with("k", 1000, with_disk())),
        ErrorCode::NO_AVAILABLE_HANDLE,
        "no disk mounted"
    );
    let d = disk(&h, "small", 1000);
    mount_disk(&h, h.client, &d, Vec::new());
    assert_eq!(
        code(h.put_start_with("k", 1000, with_disk())),
        ErrorCode::NO_AVAILABLE_HANDLE,
        "the file overhead does not fit"
    );
    assert_eq!(h.engine.segments()[0].used_bytes, 0);
    assert!(!h.exists("k"));
}

#[test]
fn revoked_write_through_deletes_the_file() {
    let (h, _) = offload_harness(0.9);
    let descs = h.put_start_with("k", 1000, with_disk()).unwrap();
    h.put_revoke("k", &descs).unwrap();
    assert!(h.sink.take().is_empty());
    assert_eq!(delete_files(&h, h.client), vec![descs[1].id.0]);
    assert_eq!(h.engine.stats().disk_allocated_bytes, 0);
}

#[test]
fn offload_on_evict_lands_stored_disk_then_removed_cpu() {
    let (h, d) = offload_harness(0.5);
    let task = start_offload(&h, "k");
    assert_eq!(task.key, "k");
    assert_eq!(task.source.kind, ReplicaKind::Memory);
    assert_eq!(task.source.size, 9 * MIB);
    assert!(
        h.sink.take().is_empty(),
        "nothing changes until the file lands"
    );
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::Memory]);
    h.advance(LEASE_MS);
    let again = h.engine.run_eviction();
    assert_eq!(again.offloads_started, 0, "the pending offload is credited");
    assert!(heartbeat(&h, h.client).tasks.is_empty());
    assert_eq!(h.engine.stats().offloads_pending, 1);

    notify(&h, h.client, &task, true).unwrap();
    assert_eq!(h.sink.take(), vec![stored_disk("k"), removed("k")]);
    let list = h.get("k").unwrap();
    assert_eq!(list.replicas.len(), 1);
    let file = &list.replicas[0];
    assert_eq!(
        (file.kind, file.id, file.segment_id, file.address),
        (
            ReplicaKind::LocalDisk,
            task.disk_replica_id,
            d.id,
            task.disk_replica_id.0
        )
    );
    assert_eq!(h.revalidate("k", vec![file.id]), Ok(()));
    assert_eq!(h.engine.segments()[0].used_bytes, 0, "memory freed");
    let stats = h.engine.stats();
    assert_eq!(
        (
            stats.offloads_pending,
            stats.offloads_completed,
            stats.evicted_key_count
        ),
        (0, 1, 1)
    );
    assert_eq!(
        code(notify(&h, h.client, &task, true)),
        ErrorCode::INVALID_WRITE,
        "a repeated report changes nothing"
    );
    h.remove("k", true).unwrap();
    assert_eq!(h.sink.take(), vec![removed_disk("k")]);
    assert_eq!(
        heartbeat(&h, h.client).deletions,
        vec![task.disk_replica_id.0]
    );
}

#[test]
fn failed_offload_evicts_normally_and_deletes_the_file() {
    let (h, _) = offload_harness(0.5);
    let task = start_offload(&h, "k");
    notify(&h, h.client, &task, false).unwrap();
    assert_eq!(h.sink.take(), vec![removed("k")]);
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(
        heartbeat(&h, h.client).deletions,
        vec![task.disk_replica_id.0]
    );
    assert_eq!(h.engine.stats().offloads_failed, 1);
}

#[test]
fn offload_reports_from_strangers_or_after_removal_are_refused() {
    let (h, _) = offload_harness(0.5);
    let task = start_offload(&h, "k");
    let stranger = ClientId::new(9, 9);
    let refused = h
        .engine
        .notify_offload(&NotifyOffloadRequest {
            client_id: stranger,
            results: vec![OffloadResult {
                tenant: task.tenant.clone(),
                key: task.key.clone(),
                disk_replica_id: task.disk_replica_id,
                ok: true,
            }],
        })
        .unwrap();
    assert_eq!(
        refused[0].0.as_ref().unwrap_err().code,
        ErrorCode::SEGMENT_NOT_FOUND
    );
    h.remove("k", false).unwrap();
    assert_eq!(h.sink.take(), vec![removed("k")]);
    assert_eq!(
        code(notify(&h, h.client, &task, true)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(h.engine.stats().offloads_pending, 0);
    assert_eq!(
        heartbeat(&h, h.client).deletions,
        vec![task.disk_replica_id.0]
    );
}

#[test]
fn a_reader_keeps_the_memory_copy_until_a_later_round() {
    let (h, _) = offload_harness(0.5);
    let task = start_offload(&h, "k");
    h.get("k").unwrap();
    notify(&h, h.client, &task, true).unwrap();
    assert_eq!(h.sink.take(), vec![stored_disk("k")]);
    assert_eq!(
        kinds(&h, "k"),
        vec![ReplicaKind::Memory, ReplicaKind::LocalDisk]
    );
    h.advance(LEASE_MS + 1);
    let report = h.engine.run_eviction();
    assert_eq!((report.evicted_keys, report.offloads_started), (1, 0));
    assert_eq!(h.sink.take(), vec![removed("k")]);
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::LocalDisk]);
}

#[test]
fn unreported_offloads_expire_and_the_object_stays_in_memory() {
    let (h, _) = offload_harness(0.5);
    let task = start_offload(&h, "k");
    h.advance(Harness::config().put_start_release_timeout_ms + 1);
    h.ping(h.client);
    assert_eq!(h.engine.sweep_stalled_writes(), 1);
    assert_eq!(h.engine.stats().offloads_pending, 0);
    assert_eq!(kinds(&h, "k"), vec![ReplicaKind::Memory]);
    assert_eq!(
        code(notify(&h, h.client, &task, true)),
        ErrorCode::INVALID_WRITE
    );
    assert!(h.sink.take().is_empty());
}

#[test]
fn objects_on_nodes_without_disk_room_are_evicted_as_before() {
    let mut config = Harness::config();
    config.eviction_high_watermark_ratio = 0.5;
    let h = Harness::bare(config);
    h.mount("seg-0", BASE, 16 * MIB);
    let d = disk(&h, "tiny", MIB);
    mount_disk(&h, h.client, &d, Vec::new());
    h.put("k", 9 * MIB);
    h.sink.take();
    let report = h.engine.run_eviction();
    assert_eq!((report.evicted_keys, report.offloads_started), (1, 0));
    assert_eq!(h.sink.take(), vec![removed("k")]);
}

#[test]
fn client_expiry_detaches_disk_replicas_and_a_restart_revives_them() {
    let h = Harness::bare(Harness::config());
    let node = ClientId::new(3, 3);
    h.mount_for(node, "seg-n", BASE, 16 * MIB);
    let d = disk(&h, "disk-n", CAP);
    mount_disk(&h, node, &d, Vec::new());
    let descs = h.put_start_with("k", 100, with_disk()).unwrap();
    h.put_end("k", &descs).unwrap();
    h.sink.take();
    let file_id = descs[1].id;

    h.advance(Harness::config().client_live_ttl_ms + 1);
    assert_eq!(h.engine.expire_clients(), 1);
    assert_eq!(h.sink.take(), vec![removed("k"), removed_disk("k")]);
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(!h.exists("k"));
    assert_eq!(
        code(h.revalidate("k", vec![file_id])),
        ErrorCode::INVALID_REPLICA
    );
    assert_eq!(h.engine.disk_segments()[0].status, "DETACHED");
    assert!(h.engine.placement_snapshot(None).objects.is_empty());

    // The node restarts with a new client id and a new endpoint on the same directory.
    let restarted = ClientId::new(4, 4);
    let moved = DiskSegment {
        endpoint: "new-endpoint".into(),
        ..d.clone()
    };
    let answer = mount_disk(&h, restarted, &moved, vec![file_of("k", 100, file_id)]);
    assert!(answer.rejected.is_empty());
    assert_eq!(h.sink.take(), vec![stored_disk("k")]);
    let list = h.get("k").unwrap();
    assert_eq!(list.replicas.len(), 1);
    assert_eq!(
        (list.replicas[0].id, &*list.replicas[0].endpoint),
        (file_id, "new-endpoint")
    );
    assert_eq!(h.engine.disk_segments().len(), 1);
    assert_eq!(h.engine.stats().disk_allocated_bytes, 100 + 4096);
}

#[test]
fn detached_replicas_not_listed_again_are_dropped_at_remount() {
    let (h, d) = offload_harness(0.9);
    let a = h.put_start_with("a", 100, with_disk()).unwrap();
    h.put_end("a", &a).unwrap();
    let b = h.put_start_with("b", 100, with_disk()).unwrap();
    h.put_end("b", &b).unwrap();
    h.sink.take();
    h.engine
        .unmount_disk_segment(&UnmountDiskSegmentRequest {
            client_id: h.client,
            disk_id: d.id,
        })
        .unwrap();
    let mut events = h.sink.take();
    events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(events, vec![removed_disk("a"), removed_disk("b")]);
    let answer = mount_disk(&h, h.client, &d, vec![file_of("a", 100, a[1].id)]);
    assert!(answer.rejected.is_empty());
    assert_eq!(
        kinds(&h, "a"),
        vec![ReplicaKind::Memory, ReplicaKind::LocalDisk]
    );
    assert_eq!(kinds(&h, "b"), vec![ReplicaKind::Memory]);
    assert!(heartbeat(&h, h.client).deletions.contains(&b[1].id.0));
}

#[test]
fn removed_objects_do_not_come_back_from_disk() {
    let h = Harness::bare(Harness::config());
    let node = ClientId::new(3, 3);
    h.mount_for(node, "seg-n", BASE, 16 * MIB);
    let d = disk(&h, "disk-n", CAP);
    mount_disk(&h, node, &d, Vec::new());
    let descs = h.put_start_with("k", 100, with_disk()).unwrap();
    h.put_end("k", &descs).unwrap();
    h.advance(Harness::config().client_live_ttl_ms + 1);
    h.engine.expire_clients();
    h.remove("k", false).unwrap();
    h.sink.take();
    let answer = mount_disk(&h, node, &d, vec![file_of("k", 100, descs[1].id)]);
    assert_eq!(answer.rejected, vec![descs[1].id]);
    assert!(h.sink.take().is_empty());
    assert_eq!(code(h.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn replaced_objects_reject_their_old_files() {
    let h = Harness::bare(Harness::config());
    let node = ClientId::new(3, 3);
    h.mount_for(node, "seg-n", BASE, 16 * MIB);
    let d = disk(&h, "disk-n", CAP);
    mount_disk(&h, node, &d, Vec::new());
    let old = h.put_start_with("k", 100, with_disk()).unwrap();
    h.put_end("k", &old).unwrap();
    h.sink.take();
    let new = h
        .engine
        .upsert_start(&h.start_req("", "k", 100, with_disk()))
        .unwrap();
    assert_eq!(
        h.sink.take(),
        vec![removed("k"), removed_disk("k")],
        "a disk copy is replaced, never rewritten in place"
    );
    assert_ne!(old[1].id, new[1].id);
    h.engine.upsert_end(&h.end_req("", "k", ids(&new))).unwrap();
    h.sink.take();
    let answer = mount_disk(
        &h,
        node,
        &d,
        vec![file_of("k", 100, old[1].id), file_of("k", 100, new[1].id)],
    );
    assert_eq!(answer.rejected, vec![old[1].id]);
    assert!(
        h.sink.take().is_empty(),
        "the current file is already attached"
    );
}

#[test]
fn detached_disks_are_forgotten_after_the_grace_period() {
    let h = Harness::bare(Harness::config());
    let node = ClientId::new(3, 3);
    h.mount_for(node, "seg-n", BASE, 16 * MIB);
    let d = disk(&h, "disk-n", CAP);
    mount_disk(&h, node, &d, Vec::new());
    let descs = h.put_start_with("k", 100, with_disk()).unwrap();
    h.put_end("k", &descs).unwrap();
    h.advance(Harness::config().client_live_ttl_ms + 1);
    h.engine.expire_clients();
    h.sink.take();
    h.advance(Harness::config().disk_detach_grace_ms);
    h.engine.expire_clients();
    assert!(
        h.sink.take().is_empty(),
        "removed disk was already announced"
    );
    assert!(h.engine.disk_segments().is_empty());
    assert_eq!(h.engine.stats().key_count, 0);
    let answer = mount_disk(&h, node, &d, vec![file_of("k", 100, descs[1].id)]);
    assert_eq!(answer.rejected, vec![descs[1].id], "tombstoned");
}

#[test]
fn a_put_over_a_detached_only_object_replaces_it() {
    let h = Harness::bare(Harness::config());
    let node = ClientId::new(3, 3);
    h.mount_for(node, "seg-n", BASE, 16 * MIB);
    h.mount("seg-0", 2 * BASE, 16 * MIB);
    let d = disk(&h, "disk-n", CAP);
    mount_disk(&h, node, &d, Vec::new());
    let descs = h
        .put_start_with(
            "k",
            100,
            ReplicateConfig {
                preferred_segments: vec!["seg-n".into()],
                with_disk_replica: true,
                ..Default::default()
            },
        )
        .unwrap();
    h.put_end("k", &descs).unwrap();
    h.advance(Harness::config().client_live_ttl_ms + 1);
    h.ping(h.client);
    h.engine.expire_clients();
    h.advance(Harness::config().put_start_discard_timeout_ms + 1);
    h.ping(h.client);
    h.sink.take();
    h.put("k", 100);
    assert_eq!(h.sink.take(), vec![stored("k")]);
    let answer = mount_disk(&h, node, &d, vec![file_of("k", 100, descs[1].id)]);
    assert_eq!(answer.rejected, vec![descs[1].id]);
}

#[test]
fn a_fresh_master_recreates_disk_only_objects_from_listed_files() {
    let h = Harness::bare(Harness::config());
    let d = disk(&h, "disk-0", CAP);
    let files = vec![
        file_of("k", 100, ReplicaId(77)),
        DiskFile {
            tenant: "_bad".into(),
            ..file_of("x", 100, ReplicaId(78))
        },
        file_of("empty", 0, ReplicaId(79)),
    ];
    let answer = mount_disk(&h, h.client, &d, files);
    assert_eq!(answer.rejected, vec![ReplicaId(78), ReplicaId(79)]);
    assert_eq!(h.sink.take(), vec![stored_disk("k")]);
    let list = h.get("k").unwrap();
    assert_eq!(
        (
            list.replicas[0].kind,
            list.replicas[0].id,
            list.replicas[0].size
        ),
        (ReplicaKind::LocalDisk, ReplicaId(77), 100)
    );
    assert_eq!(h.engine.stats().disk_allocated_bytes, 100 + 4096);
    // Same mount listed again (the node retried): nothing changes.
    let again = mount_disk(&h, h.client, &d, vec![file_of("k", 100, ReplicaId(77))]);
    assert!(again.rejected.is_empty());
    assert!(h.sink.take().is_empty());
}

#[test]
fn remove_all_clears_disk_replicas_too() {
    let (h, _) = offload_harness(0.9);
    let descs = h.put_start_with("k", 100, with_disk()).unwrap();
    h.put_end("k", &descs).unwrap();
    h.sink.take();
    assert_eq!(h.remove_all("", false), Ok(1));
    assert_eq!(
        h.sink.take(),
        vec![
            removed("k"),
            removed_disk("k"),
            Ev::Cleared("default".into())
        ]
    );
    assert_eq!(heartbeat(&h, h.client).deletions, vec![descs[1].id.0]);
}

#[test]
fn disk_rpcs_check_their_caller() {
    let h = Harness::new();
    assert_eq!(
        code(h.engine.offload_heartbeat(&OffloadHeartbeatRequest {
            client_id: h.client,
            deleted: Vec::new(),
        })),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    let d = disk(&h, "disk-0", CAP);
    let zero = DiskSegment {
        capacity_bytes: 0,
        ..d.clone()
    };
    assert_eq!(
        code(h.engine.mount_disk_segment(&MountDiskSegmentRequest {
            client_id: h.client,
            disk: zero,
            existing: Vec::new(),
        })),
        ErrorCode::INVALID_PARAMS
    );
    mount_disk(&h, h.client, &d, Vec::new());
    let other = disk(&h, "disk-1", CAP);
    assert_eq!(
        code(h.engine.mount_disk_segment(&MountDiskSegmentRequest {
            client_id: h.client,
            disk: other,
            existing: Vec::new(),
        })),
        ErrorCode::INVALID_PARAMS,
        "one disk per client"
    );
    assert_eq!(
        code(h.engine.unmount_disk_segment(&UnmountDiskSegmentRequest {
            client_id: ClientId::new(9, 9),
            disk_id: d.id,
        })),
        ErrorCode::ILLEGAL_CLIENT
    );
}
