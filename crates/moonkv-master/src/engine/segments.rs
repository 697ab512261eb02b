//! Mounted memory segments: their allocators, the name index used for placement, and the
//! buffer handle replicas hold.
//!
//! A replica refers to its segment through an `Arc<SegmentSlot>`. Unmounting marks the slot dead:
//! every replica on it becomes invalid at once (unreadable, never freed into a reused range), and
//! a remount of the same id gets a fresh slot, so stale replicas can never come back to life.

use super::alloc::Allocator;
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
}

impl SegmentSlot {
    pub(crate) fn new(info: Segment, owner: ClientId, usage: Arc<SpaceUsage>) -> Self {
        let allocator = Mutex::new(Allocator::new(info.base, info.size));
        Self {
            info,
            owner,
            alive: AtomicBool::new(true),
            status: AtomicU8::new(SegmentStatus::Ok as u8),
            used: AtomicU64::new(0),
            allocator,
            usage,
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
    pub(crate) len: u64,
}

impl Drop for MemBuffer {
    fn drop(&mut self) {
        self.segment.free(self.address, self.len);
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
                    .entry(slot.info.name.as_str())
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
        self.last_by_name.insert(slot.info.name.clone(), id);
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
        if self.last_by_name.get(&slot.info.name) == Some(&id) {
            let replacement = self
                .by_id
                .values()
                .find(|s| s.info.name == slot.info.name)
                .map(|s| s.info.id);
            match replacement {
                Some(other) => self.last_by_name.insert(slot.info.name.clone(), other),
                None => self.last_by_name.remove(&slot.info.name),
            };
        }
        self.graceful.remove(&id);
        self.rebuild_groups();
        Some(slot)
    }
}
