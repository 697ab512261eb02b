//! Mounted disks: byte accounting per disk, the file handle disk replicas hold, and what a disk
//! id remembers across its owners (removed file ids and deletions not yet delivered).
//!
//! A disk is accounted as a counter, not an address map: a replica is one file named by its id.
//! A disk replica holds a [`DiskHandle`]; dropping it returns its bytes to the disk, tombstones
//! its file id and queues the file for deletion by the owning node, so no path that forgets a
//! disk replica can leak space or let the file come back after a node restart.

use moonkv_proto::{ClientId, DiskSegment, SegmentId};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Bytes charged per file on top of the object size: the file header and block rounding.
pub(crate) const DISK_FILE_OVERHEAD: u64 = 4096;

/// Removed file ids remembered per disk, so a restarted node cannot re-register them.
pub(crate) const TOMBSTONES_PER_DISK: usize = 1 << 17;

/// Deletions kept for a disk whose owner does not poll; the oldest are dropped beyond this (the
/// tombstones still reject those files at the next mount).
const MAX_PENDING_DELETIONS: usize = 1 << 20;

/// Bytes a disk replica of `size` bytes is charged.
pub(crate) fn disk_charge(size: u64) -> u64 {
    size.saturating_add(DISK_FILE_OVERHEAD)
}

/// Heartbeats after which a deletion handed out and not acknowledged is handed out again (the
/// answer carrying it may have been lost).
const RESEND_AFTER_BEATS: u64 = 20;

/// Numbers every deletion queued in this process, so a caller can wait for the deletions its
/// request caused ([`DiskMemory::unacked_through`]).
static DELETION_SEQ: AtomicU64 = AtomicU64::new(0);

/// The sequence number of the latest deletion queued.
pub(crate) fn deletion_seq() -> u64 {
    DELETION_SEQ.load(Ordering::Acquire)
}

/// What outlives one mount of a disk id: tombstones and deletions the owner has not yet
/// acknowledged.
#[derive(Debug, Default)]
pub(crate) struct DiskMemory {
    tombstones: Mutex<Tombstones>,
    deletions: Mutex<Deletions>,
}

/// Deletions of one disk: queued (not yet handed out) and handed out but not acknowledged.
#[derive(Debug, Default)]
struct Deletions {
    queued: VecDeque<Deletion>,
    /// seq → (deletion, heartbeat it was handed out in).
    sent: std::collections::BTreeMap<u64, (Deletion, u64)>,
    beats: u64,
}

/// One file to delete. Its bytes stay charged to the mount that held it until the node
/// acknowledges the deletion, so the master never places more on a disk than its node has
/// room for.
#[derive(Debug)]
struct Deletion {
    seq: u64,
    id: u64,
    charge: u64,
    slot: std::sync::Weak<DiskSlot>,
}

impl Deletion {
    fn release(self) {
        if let Some(slot) = self.slot.upgrade() {
            let _ = slot
                .releasing
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    Some(r.saturating_sub(self.charge))
                });
            slot.release(self.charge);
        }
    }
}

#[derive(Debug, Default)]
struct Tombstones {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl DiskMemory {
    /// Records that file `id` was removed: it is tombstoned and queued for deletion; its
    /// `charge` returns to `slot` once the node acknowledges the deletion.
    pub(crate) fn forget_file(&self, id: u64, charge: u64, slot: std::sync::Weak<DiskSlot>) {
        {
            let mut t = self.tombstones.lock();
            if t.set.insert(id) {
                t.order.push_back(id);
                if t.order.len() > TOMBSTONES_PER_DISK {
                    if let Some(old) = t.order.pop_front() {
                        t.set.remove(&old);
                    }
                }
            }
        }
        let seq = DELETION_SEQ.fetch_add(1, Ordering::AcqRel) + 1;
        let mut d = self.deletions.lock();
        d.queued.push_back(Deletion {
            seq,
            id,
            charge,
            slot,
        });
        if d.queued.len() > MAX_PENDING_DELETIONS {
            if let Some(old) = d.queued.pop_front() {
                old.release();
            }
        }
    }

    /// Whether file `id` was removed (recently enough to be remembered).
    pub(crate) fn is_tombstoned(&self, id: u64) -> bool {
        self.tombstones.lock().set.contains(&id)
    }

    /// The deletions to hand out now: every queued one, and those handed out long ago without
    /// an acknowledgment.
    pub(crate) fn take_deletions(&self) -> Vec<u64> {
        let mut d = self.deletions.lock();
        d.beats += 1;
        let beat = d.beats;
        let mut out: Vec<u64> = Vec::new();
        for (_, (deletion, sent_at)) in d.sent.iter_mut() {
            if beat.saturating_sub(*sent_at) >= RESEND_AFTER_BEATS {
                *sent_at = beat;
                out.push(deletion.id);
            }
        }
        while let Some(deletion) = d.queued.pop_front() {
            out.push(deletion.id);
            d.sent.insert(deletion.seq, (deletion, beat));
        }
        while d.sent.len() > MAX_PENDING_DELETIONS {
            if let Some((_, (old, _))) = d.sent.pop_first() {
                old.release();
            }
        }
        out
    }

    /// The owner carried out these deletions.
    pub(crate) fn ack_deletions(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let done: HashSet<u64> = ids.iter().copied().collect();
        let released = {
            let mut d = self.deletions.lock();
            let sent = std::mem::take(&mut d.sent);
            let (gone, kept): (Vec<_>, Vec<_>) = sent
                .into_iter()
                .partition(|(_, (del, _))| done.contains(&del.id));
            d.sent = kept.into_iter().collect();
            let queued = std::mem::take(&mut d.queued);
            let (gone_q, kept_q): (Vec<_>, Vec<_>) =
                queued.into_iter().partition(|del| done.contains(&del.id));
            d.queued = kept_q.into_iter().collect();
            gone.into_iter()
                .map(|(_, (del, _))| del)
                .chain(gone_q)
                .collect::<Vec<_>>()
        };
        released.into_iter().for_each(Deletion::release);
    }

    /// Whether a deletion numbered `seq` or lower is still not acknowledged.
    pub(crate) fn unacked_through(&self, seq: u64) -> bool {
        let d = self.deletions.lock();
        d.sent.keys().next().is_some_and(|s| *s <= seq)
            || d.queued.front().is_some_and(|del| del.seq <= seq)
    }
}

/// Lifecycle of one mount of a disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum DiskState {
    /// Owner alive: readable and allocatable.
    Mounted = 0,
    /// Owner gone or unmounted: replicas kept, unreadable, until revived or the grace ends.
    Detached = 1,
    /// Finished: its replicas are dropped.
    Gone = 2,
}

/// One mount of a disk.
#[derive(Debug)]
pub(crate) struct DiskSlot {
    pub(crate) info: DiskSegment,
    pub(crate) owner: ClientId,
    state: AtomicU8,
    /// When a detached disk's replicas are dropped (ms).
    pub(crate) detach_deadline_ms: AtomicU64,
    used: AtomicU64,
    pub(crate) memory: Arc<DiskMemory>,
    /// Set when disk eviction could not free the room an offload needed: memory copies bound
    /// for this disk are dropped instead of waiting for room.
    full: AtomicBool,
    /// Bytes a write-through found missing here; the next disk eviction frees them.
    pub(crate) wanted: AtomicU64,
    /// Of `used`, bytes of removed files whose deletion the node has not acknowledged yet.
    releasing: AtomicU64,
}

impl DiskSlot {
    pub(crate) fn new(info: DiskSegment, owner: ClientId, memory: Arc<DiskMemory>) -> Self {
        Self {
            info,
            owner,
            state: AtomicU8::new(DiskState::Mounted as u8),
            detach_deadline_ms: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            memory,
            full: AtomicBool::new(false),
            wanted: AtomicU64::new(0),
            releasing: AtomicU64::new(0),
        }
    }

    pub(crate) fn state(&self) -> DiskState {
        match self.state.load(Ordering::Acquire) {
            0 => DiskState::Mounted,
            1 => DiskState::Detached,
            _ => DiskState::Gone,
        }
    }

    pub(crate) fn set_state(&self, state: DiskState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// Whether disk eviction found nothing more to free for a pending offload.
    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    pub(crate) fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::Release);
    }

    pub(crate) fn is_mounted(&self) -> bool {
        self.state() == DiskState::Mounted
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that return to the disk once its node has deleted the files removed already.
    pub(crate) fn releasing_bytes(&self) -> u64 {
        self.releasing.load(Ordering::Acquire)
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.info.capacity_bytes.saturating_sub(self.used_bytes())
    }

    /// Reserves `charge` bytes if the disk is mounted and has room.
    pub(crate) fn try_reserve(&self, charge: u64) -> bool {
        if !self.is_mounted() {
            return false;
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(charge)
                    .filter(|total| *total <= self.info.capacity_bytes)
            })
            .is_ok()
    }

    fn force_reserve(&self, charge: u64) {
        self.used.fetch_add(charge, Ordering::AcqRel);
    }

    fn release(&self, charge: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(charge))
            });
    }
}

/// The file of one disk replica. Dropping it releases the bytes and removes the file.
#[derive(Debug)]
pub(crate) struct DiskHandle {
    pub(crate) slot: Arc<DiskSlot>,
    /// File id (the replica id it was created with).
    pub(crate) file_id: u64,
    pub(crate) charge: u64,
    /// False while the disk is detached: the replica exists but is unreadable and unannounced.
    pub(crate) attached: bool,
}

impl DiskHandle {
    /// A handle on bytes already reserved on `slot`.
    pub(crate) fn reserved(slot: Arc<DiskSlot>, file_id: u64, charge: u64) -> Self {
        Self {
            slot,
            file_id,
            charge,
            attached: true,
        }
    }

    /// A handle for a file found on a remounted disk (charged even beyond capacity: the bytes
    /// are already there).
    pub(crate) fn adopted(slot: Arc<DiskSlot>, file_id: u64, charge: u64) -> Self {
        slot.force_reserve(charge);
        Self::reserved(slot, file_id, charge)
    }

    /// Moves the replica to a new mount of the same disk and attaches it.
    pub(crate) fn reattach(&mut self, slot: &Arc<DiskSlot>) {
        if !Arc::ptr_eq(&self.slot, slot) {
            self.slot.release(self.charge);
            slot.force_reserve(self.charge);
            self.slot = slot.clone();
        }
        self.attached = true;
    }

    /// Whether the replica's bytes can be read now.
    pub(crate) fn readable(&self) -> bool {
        self.attached && self.slot.is_mounted()
    }

    /// Whether the replica still stands for a file (its disk is not gone).
    pub(crate) fn valid(&self) -> bool {
        self.slot.state() != DiskState::Gone
    }
}

impl Drop for DiskHandle {
    fn drop(&mut self) {
        self.slot.releasing.fetch_add(self.charge, Ordering::AcqRel);
        self.slot
            .memory
            .forget_file(self.file_id, self.charge, Arc::downgrade(&self.slot));
    }
}

/// Every known disk mount and what each disk id remembers.
#[derive(Debug, Default)]
pub(crate) struct DiskRegistry {
    /// Mounted or detached disks, by id.
    pub(crate) by_id: HashMap<SegmentId, Arc<DiskSlot>>,
    /// Owner → its mounted disk (one per client).
    pub(crate) by_client: HashMap<ClientId, SegmentId>,
    /// Per disk id, across mounts.
    pub(crate) memory: HashMap<SegmentId, Arc<DiskMemory>>,
}

impl DiskRegistry {
    /// The mounted disk of `client`, if any.
    pub(crate) fn of_client(&self, client: ClientId) -> Option<&Arc<DiskSlot>> {
        let id = self.by_client.get(&client)?;
        self.by_id.get(id).filter(|s| s.is_mounted())
    }

    /// What disk `id` remembers (created on first use).
    pub(crate) fn memory_of(&mut self, id: SegmentId) -> Arc<DiskMemory> {
        self.memory.entry(id).or_default().clone()
    }

    /// Mounted disks, emptiest first.
    pub(crate) fn mounted_by_free_space(&self) -> Vec<Arc<DiskSlot>> {
        let mut disks: Vec<Arc<DiskSlot>> = self
            .by_id
            .values()
            .filter(|s| s.is_mounted())
            .cloned()
            .collect();
        disks.sort_by_key(|s| (std::cmp::Reverse(s.free_bytes()), s.info.id));
        disks
    }
}

/// Offloads started and not yet landed, failed or cancelled: how many, and the memory bytes
/// they will free when they land.
#[derive(Debug, Default)]
pub(crate) struct OffloadBacklog {
    count: AtomicU64,
    bytes: AtomicU64,
}

impl OffloadBacklog {
    /// Offloads in flight.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Object bytes of the offloads in flight.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
}

/// An offload in progress: the disk replica being written from a pinned memory replica. Kept
/// beside the object's replicas, so it is neither readable nor seen by writes until it lands.
/// A promotion (`promote.rs`) is the same with the roles swapped: a memory replica being filled
/// from the object's disk replica.
#[derive(Debug)]
pub(crate) struct PendingOffload {
    /// Taken when the copy lands or is discarded.
    replica: Option<super::object::Replica>,
    pub(crate) source: moonkv_proto::ReplicaId,
    pub(crate) deadline_ms: u64,
    /// Set for a promotion: where its buffer goes if it is dropped while the node may still
    /// be writing into it.
    promotion: Option<Arc<super::promote::Promotions>>,
    _count: Option<OffloadCount>,
}

/// One entry of the engine's offload backlog, returned when the offload ends.
#[derive(Debug)]
struct OffloadCount {
    backlog: Arc<OffloadBacklog>,
    bytes: u64,
}

impl Drop for OffloadCount {
    fn drop(&mut self) {
        self.backlog.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.backlog.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for PendingOffload {
    fn drop(&mut self) {
        if let (Some(promotions), Some(replica)) = (&self.promotion, self.replica.take()) {
            // Dropped unresolved (object removed or replaced, segment gone): the node may still
            // be writing into the buffer, so it is kept out of the allocator until the deadline.
            promotions.bury(replica, self.deadline_ms);
        }
    }
}

impl PendingOffload {
    /// An offload of an object of `bytes` bytes, counted in `backlog` until it ends.
    pub(crate) fn new(
        replica: super::object::Replica,
        source: moonkv_proto::ReplicaId,
        deadline_ms: u64,
        backlog: Arc<OffloadBacklog>,
        bytes: u64,
    ) -> Self {
        backlog.count.fetch_add(1, Ordering::AcqRel);
        backlog.bytes.fetch_add(bytes, Ordering::AcqRel);
        Self {
            replica: Some(replica),
            source,
            deadline_ms,
            promotion: None,
            _count: Some(OffloadCount { backlog, bytes }),
        }
    }

    /// Marks this as a promotion tracked by `promotions`.
    pub(crate) fn promotion(mut self, promotions: Arc<super::promote::Promotions>) -> Self {
        self.promotion = Some(promotions);
        self
    }

    /// Whether this is a promotion rather than an offload.
    pub(crate) fn is_promotion(&self) -> bool {
        self.promotion.is_some()
    }

    /// The replica being written.
    pub(crate) fn replica(&self) -> &super::object::Replica {
        match &self.replica {
            Some(r) => r,
            None => unreachable!("a pending copy holds its replica until it is consumed"),
        }
    }

    /// The replica, and the copy's entry in the backlog: drop it once the memory copy is freed,
    /// so eviction never sees the offload done while its memory is still used.
    pub(crate) fn into_replica(mut self) -> (super::object::Replica, impl Drop) {
        let replica = self.replica.take();
        let count = self._count.take();
        match replica {
            Some(r) => (r, Resolved(count)),
            None => unreachable!("a pending copy holds its replica until it is consumed"),
        }
    }

    /// Ends the copy without using its replica: the node reported that it will not write it.
    pub(crate) fn discard(mut self) {
        drop(self.replica.take());
    }
}

/// The backlog entry of a resolved copy.
struct Resolved(Option<OffloadCount>);

impl Drop for Resolved {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(capacity: u64) -> Arc<DiskSlot> {
        let info = DiskSegment {
            id: SegmentId::new(1, 1),
            name: "d".into(),
            endpoint: "e".into(),
            capacity_bytes: capacity,
        };
        Arc::new(DiskSlot::new(
            info,
            ClientId::new(1, 1),
            Arc::new(DiskMemory::default()),
        ))
    }

    #[test]
    fn reservations_respect_capacity_and_drops_release() {
        let s = slot(10_000);
        assert!(s.try_reserve(6000));
        assert!(!s.try_reserve(6000));
        let h = DiskHandle::reserved(s.clone(), 42, 6000);
        assert_eq!(s.used_bytes(), 6000);
        drop(h);
        assert_eq!(
            s.used_bytes(),
            6000,
            "charged until the node deleted the file"
        );
        assert!(s.memory.is_tombstoned(42));
        let seq = deletion_seq();
        assert!(s.memory.unacked_through(seq));
        assert_eq!(s.memory.take_deletions(), vec![42]);
        assert!(s.memory.take_deletions().is_empty());
        assert!(
            s.memory.unacked_through(seq),
            "handed out, not acknowledged"
        );
        for _ in 2..RESEND_AFTER_BEATS {
            assert!(s.memory.take_deletions().is_empty());
        }
        assert_eq!(s.memory.take_deletions(), vec![42], "handed out again");
        s.memory.ack_deletions(&[42]);
        assert_eq!(s.used_bytes(), 0);
        assert!(!s.memory.unacked_through(seq));
        assert!(s.memory.take_deletions().is_empty());
        s.set_state(DiskState::Detached);
        assert!(!s.try_reserve(1), "a detached disk takes no new files");
    }

    #[test]
    fn tombstones_are_bounded() {
        let m = DiskMemory::default();
        for id in 0..(TOMBSTONES_PER_DISK as u64 + 10) {
            m.forget_file(id, 0, std::sync::Weak::new());
        }
        assert!(!m.is_tombstoned(0));
        assert!(m.is_tombstoned(TOMBSTONES_PER_DISK as u64 + 9));
    }

    #[test]
    fn pending_offloads_are_counted_until_resolved() {
        let counter = Arc::new(OffloadBacklog::default());
        let s = slot(1 << 20);
        let replica = |id| super::super::object::Replica {
            id: moonkv_proto::ReplicaId(id),
            status: moonkv_proto::ReplicaStatus::Processing,
            placement: super::super::object::Placement::Disk(Box::new(DiskHandle::reserved(
                s.clone(),
                id,
                10,
            ))),
        };
        let a = PendingOffload::new(
            replica(1),
            moonkv_proto::ReplicaId(9),
            0,
            counter.clone(),
            100,
        );
        let b = PendingOffload::new(
            replica(2),
            moonkv_proto::ReplicaId(9),
            0,
            counter.clone(),
            30,
        );
        assert_eq!((counter.count(), counter.bytes()), (2, 130));
        drop(a);
        let (r, count) = b.into_replica();
        assert_eq!((counter.count(), counter.bytes()), (1, 30));
        drop(count);
        assert_eq!((counter.count(), counter.bytes()), (0, 0));
        assert_eq!(r.id, moonkv_proto::ReplicaId(2));
        assert_eq!(Arc::strong_count(&counter), 1);
    }
}
