//! Mounted memory segments: their allocators, the name index used for placement, and the
//! buffer handle replicas hold.
//!
//! A replica refers to its segment through an `Arc<SegmentSlot>`. Unmounting marks the slot dead:
//! every replica on it becomes invalid at once (unreadable, never freed into a reused range), and
//! a remount of the same id gets a fresh slot, so stale replicas can never come back to life.

use super::alloc::Allocator;
use super::catalog::CatalogBook;
use moonkv_proto::msg::CatalogNotice;
use moonkv_proto::{ClientId, Segment, SegmentId, SegmentStatus};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Cluster-wide byte counters shared by every slot, read by the eviction trigger.
#[derive(Debug, Default)]
pub(crate) struct SpaceUsage {
    /// Sum of mounted segment sizes.
    pub(crate) capacity: AtomicU64,
    /// Bytes allocated in mounted segments (live, parked and in-flight buffers).
    pub(crate) allocated: AtomicU64,
    /// Live segments out of placement because a client reported their node unreachable.
    pub(crate) suspects: AtomicU64,
}

/// One mounted segment.
#[derive(Debug)]
pub(crate) struct SegmentSlot {
    pub(crate) info: Segment,
    pub(crate) owner: ClientId,
    alive: AtomicBool,
    status: AtomicU8,
    /// Mirror of the allocator's used bytes, readable without its lock (placement scoring).
    used: AtomicU64,
    allocator: Mutex<Allocator>,
    usage: Arc<SpaceUsage>,
    /// Where notices about committed replicas of this segment go (its owner's mailbox).
    catalog: Arc<CatalogBook>,
    /// Frozen while its owner announces the replicas it holds (`AdoptReplicas`): nothing new
    /// is allocated here until the announcement ends or this deadline (ms) passes; 0 = not
    /// frozen.
    adopt_until_ms: AtomicU64,
    /// A client reported that this segment's node refuses connections or does not answer:
    /// nothing new is placed here until the node's next heartbeat.
    suspect: AtomicBool,
}

impl SegmentSlot {
    pub(crate) fn new(
        info: Segment,
        owner: ClientId,
        usage: Arc<SpaceUsage>,
        catalog: Arc<CatalogBook>,
    ) -> Self {
        let allocator = Mutex::new(Allocator::new(info.base, info.size));
        Self {
            info,
            owner,
            alive: AtomicBool::new(true),
            status: AtomicU8::new(SegmentStatus::Ok as u8),
            used: AtomicU64::new(0),
            allocator,
            usage,
            catalog,
            adopt_until_ms: AtomicU64::new(0),
            suspect: AtomicBool::new(false),
        }
    }

    /// Takes the segment out of placement until [`SegmentSlot::clear_suspect`]; returns whether
    /// it was in placement before.
    pub(crate) fn mark_suspect(&self) -> bool {
        let _a = self.allocator.lock();
        let fresh = self.is_alive() && !self.suspect.swap(true, Ordering::AcqRel);
        if fresh {
            self.usage.suspects.fetch_add(1, Ordering::AcqRel);
        }
        fresh
    }

    /// Puts the segment back into placement (its node answered); returns whether it was
    /// suspect.
    pub(crate) fn clear_suspect(&self) -> bool {
        let _a = self.allocator.lock();
        let was = self.suspect.swap(false, Ordering::AcqRel);
        if was {
            self.usage.suspects.fetch_sub(1, Ordering::AcqRel);
        }
        was
    }

    /// Whether new replicas may be placed here (room aside): mounted, not frozen for
    /// re-adoption, not reported unreachable.
    pub(crate) fn is_placeable(&self) -> bool {
        self.is_alive() && !self.is_adopting() && !self.is_suspect()
    }

    /// Whether a client reported the node unreachable since its last heartbeat.
    pub(crate) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// Freezes the segment for re-adoption until `until_ms`.
    pub(crate) fn freeze_for_adoption(&self, until_ms: u64) {
        self.adopt_until_ms.store(until_ms, Ordering::Release);
    }

    /// Ends the adoption freeze; returns whether the segment was frozen.
    pub(crate) fn thaw(&self) -> bool {
        self.adopt_until_ms.swap(0, Ordering::AcqRel) != 0
    }

    /// Whether the segment is frozen for re-adoption.
    pub(crate) fn is_adopting(&self) -> bool {
        self.adopt_until_ms.load(Ordering::Acquire) != 0
    }

    /// The adoption deadline (0: not frozen).
    pub(crate) fn adopt_deadline_ms(&self) -> u64 {
        self.adopt_until_ms.load(Ordering::Acquire)
    }

    /// Reserves exactly `[address, address + len)` for a re-adopted replica; false when any
    /// of it is taken, outside the segment, or the segment is dead.
    pub(crate) fn reserve(&self, address: u64, len: u64) -> bool {
        let mut a = self.allocator.lock();
        if !self.is_alive() || !a.reserve(address, len) {
            return false;
        }
        self.used.store(a.used(), Ordering::Relaxed);
        self.usage.allocated.fetch_add(len, Ordering::Relaxed);
        true
    }

    /// Queues a notice for this segment's owner (none once the segment is dead: its owner
    /// unmounted it or was expired).
    pub(crate) fn notify_owner(&self, notice: impl FnOnce() -> CatalogNotice) {
        if self.is_alive() {
            self.catalog.push(self.owner, notice);
        }
    }

    /// Whether replicas on this segment are still backed by mounted memory.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub(crate) fn status(&self) -> SegmentStatus {
        SegmentStatus::try_from(self.status.load(Ordering::Acquire))
            .unwrap_or(SegmentStatus::Unmounting)
    }

    pub(crate) fn set_status(&self, status: SegmentStatus) {
        self.status.store(status as u8, Ordering::Release);
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `len` aligned bytes; `None` when full or unmounted.
    pub(crate) fn allocate(&self, len: u64) -> Option<u64> {
        if !self.is_placeable() {
            return None;
        }
        let mut a = self.allocator.lock();
        if !self.is_alive() {
            return None;
        }
        let addr = a.allocate(len)?;
        self.used.store(a.used(), Ordering::Relaxed);
        self.usage.allocated.fetch_add(len, Ordering::Relaxed);
        Some(addr)
    }

    /// Returns a buffer. On a dead segment this is a no-op: its space left the accounting when
    /// it was unmounted.
    fn free(&self, address: u64, len: u64) {
        let mut a = self.allocator.lock();
        if self.is_alive() && a.free(address, len) {
            self.used.store(a.used(), Ordering::Relaxed);
            self.usage.allocated.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// Marks the segment dead and removes its space from the cluster counters. Returns false if
    /// it was already dead.
    pub(crate) fn kill(&self) -> bool {
        let a = self.allocator.lock();
        if !self.alive.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.set_status(SegmentStatus::Unmounting);
        if self.suspect.swap(false, Ordering::AcqRel) {
            self.usage.suspects.fetch_sub(1, Ordering::AcqRel);
        }
        self.usage.allocated.fetch_sub(a.used(), Ordering::Relaxed);
        self.usage
            .capacity
            .fetch_sub(a.capacity(), Ordering::Relaxed);
        true
    }
}

/// A reserved byte range of a segment. Dropping it returns the range to the segment, so no code
/// path that forgets a replica can leak space.
#[derive(Debug)]
pub(crate) struct MemBuffer {
    pub(crate) segment: Arc<SegmentSlot>,
    pub(crate) address: u64,
    /// The length, and in [`CATALOGED`] whether the owner's catalog holds this buffer as a
    /// committed replica (when the buffer leaves its object, the owner is told to forget it).
    /// One word for both keeps a replica at 40 bytes.
    len_and_flag: u64,
}

/// Top bit of `MemBuffer::len_and_flag` (no buffer is 2^63 bytes long).
const CATALOGED: u64 = 1 << 63;

impl MemBuffer {
    /// A fresh, uncataloged buffer.
    pub(crate) fn new(segment: Arc<SegmentSlot>, address: u64, len: u64) -> Self {
        Self {
            segment,
            address,
            len_and_flag: len & !CATALOGED,
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len_and_flag & !CATALOGED
    }

    /// The owner's catalog holds this buffer now.
    pub(crate) fn set_cataloged(&mut self) {
        self.len_and_flag |= CATALOGED;
    }

    /// Tells the owner to forget this buffer's catalog entry (its replica left the object).
    pub(crate) fn uncatalog(&mut self) {
        if self.len_and_flag & CATALOGED != 0 {
            self.len_and_flag &= !CATALOGED;
            self.segment.notify_owner(|| CatalogNotice::Drop {
                segment_id: self.segment.info.id,
                address: self.address,
                len: self.len(),
            });
        }
    }
}

impl Drop for MemBuffer {
    fn drop(&mut self) {
        self.uncatalog();
        self.segment.free(self.address, self.len());
    }
}

/// Segments that share a name; one object never gets two replicas under one name.
#[derive(Debug)]
pub(crate) struct NameGroup {
    pub(crate) name: String,
    pub(crate) slots: Vec<Arc<SegmentSlot>>,
}

impl NameGroup {
    /// Tries the group's segments starting at `start`.
    pub(crate) fn allocate(&self, len: u64, start: usize) -> Option<(Arc<SegmentSlot>, u64)> {
        let n = self.slots.len();
        (0..n).find_map(|i| {
            let slot = &self.slots[(start + i) % n];
            slot.allocate(len).map(|addr| (slot.clone(), addr))
        })
    }

    pub(crate) fn free_ratio(&self) -> f64 {
        let (size, used) = self.slots.iter().fold((0u64, 0u64), |(s, u), slot| {
            (s + slot.info.size, u + slot.used_bytes())
        });
        if size == 0 {
            0.0
        } else {
            size.saturating_sub(used) as f64 / size as f64
        }
    }
}

/// Every mounted segment and the indexes over them.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) by_id: HashMap<SegmentId, Arc<SegmentSlot>>,
    pub(crate) by_client: HashMap<ClientId, Vec<SegmentId>>,
    /// name → most recently mounted id with that name (status-by-name queries).
    pub(crate) last_by_name: HashMap<String, SegmentId>,
    /// Allocatable (status OK) segments grouped by name; rebuilt on every mount change.
    pub(crate) groups: Vec<NameGroup>,
    pub(crate) group_index: HashMap<String, usize>,
    /// Graceful unmounts waiting for their grace period: id → deadline.
    pub(crate) graceful: HashMap<SegmentId, u64>,
}

impl Registry {
    /// Rebuilds the allocatable name groups after a mount, unmount or status change.
    pub(crate) fn rebuild_groups(&mut self) {
        let mut by_name: HashMap<&str, Vec<Arc<SegmentSlot>>> = HashMap::new();
        for slot in self.by_id.values() {
            if slot.is_alive() && slot.status() == SegmentStatus::Ok {
                by_name
                    .entry(&*slot.info.name)
                    .or_default()
                    .push(slot.clone());
            }
        }
        let mut groups: Vec<NameGroup> = by_name
            .into_iter()
            .map(|(name, mut slots)| {
                slots.sort_by_key(|s| s.info.id);
                NameGroup {
                    name: name.to_string(),
                    slots,
                }
            })
            .collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        self.group_index = groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.clone(), i))
            .collect();
        self.groups = groups;
    }

    /// Registers a new slot.
    pub(crate) fn insert(&mut self, slot: Arc<SegmentSlot>) {
        let id = slot.info.id;
        self.by_client.entry(slot.owner).or_default().push(id);
        self.last_by_name.insert(slot.info.name.to_string(), id);
        self.by_id.insert(id, slot);
        self.rebuild_groups();
    }

    /// Unregisters a slot (the caller kills it).
    pub(crate) fn remove(&mut self, id: SegmentId) -> Option<Arc<SegmentSlot>> {
        let slot = self.by_id.remove(&id)?;
        if let Some(ids) = self.by_client.get_mut(&slot.owner) {
            ids.retain(|s| *s != id);
            if ids.is_empty() {
                self.by_client.remove(&slot.owner);
            }
        }
        if self.last_by_name.get(&*slot.info.name) == Some(&id) {
            let replacement = self
                .by_id
                .values()
                .find(|s| s.info.name == slot.info.name)
                .map(|s| s.info.id);
            match replacement {
                Some(other) => self.last_by_name.insert(slot.info.name.to_string(), other),
                None => self.last_by_name.remove(&*slot.info.name),
            };
        }
        self.graceful.remove(&id);
        self.rebuild_groups();
        Some(slot)
    }
}
