//! Space allocator of one memory segment.
//!
//! Best fit over free extents kept in two ordered indexes (by address and by length), with
//! coalescing on free, so mixed object sizes do not fragment the segment the way a bump or
//! first-fit allocator would. Every operation is O(log n) in the number of free extents.

use std::collections::{BTreeMap, BTreeSet};

/// Allocation granularity in bytes; every buffer starts and ends on this boundary (relative to
/// the segment base).
pub(crate) const ALIGN: u64 = 64;

/// Rounds `size` up to [`ALIGN`]; `None` when that overflows.
pub(crate) fn aligned_len(size: u64) -> Option<u64> {
    size.checked_add(ALIGN - 1).map(|s| s & !(ALIGN - 1))
}

/// Free-space map of one segment `[base, base + capacity)`.
#[derive(Debug)]
pub(crate) struct Allocator {
    base: u64,
    capacity: u64,
    used: u64,
    /// Free extents: offset → length.
    by_offset: BTreeMap<u64, u64>,
    /// The same extents ordered by (length, offset), for best fit.
    by_len: BTreeSet<(u64, u64)>,
}

impl Allocator {
    /// An empty allocator over `[base, base + capacity)`.
    pub(crate) fn new(base: u64, capacity: u64) -> Self {
        let mut a = Self {
            base,
            capacity,
            used: 0,
            by_offset: BTreeMap::new(),
            by_len: BTreeSet::new(),
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    /// Bytes handed out and not yet freed.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Size of the segment.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Number of free extents (fragmentation indicator).
    #[cfg(test)]
    pub(crate) fn free_extents(&self) -> usize {
        self.by_offset.len()
    }

    /// Largest single buffer that could be allocated now.
    #[cfg(test)]
    pub(crate) fn largest_free(&self) -> u64 {
        self.by_len
            .iter()
            .next_back()
            .map(|(len, _)| *len)
            .unwrap_or(0)
    }

    /// Reserves `len` bytes (already [`ALIGN`]ed, non-zero); returns the absolute address.
    pub(crate) fn allocate(&mut self, len: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let &(free_len, offset) = self.by_len.range((len, 0)..).next()?;
        self.remove_free(offset, free_len);
        if free_len > len {
            self.insert_free(offset + len, free_len - len);
        }
        self.used += len;
        Some(self.base + offset)
    }

    /// Returns `[address, address + len)` to the free map, merging with free neighbours.
    /// A range that is outside the segment or overlaps free space is refused (returns false)
    /// rather than corrupting the map.
    pub(crate) fn free(&mut self, address: u64, len: u64) -> bool {
        let Some(offset) = address.checked_sub(self.base) else {
            return false;
        };
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0 || end > self.capacity {
            return false;
        }
        let prev = self
            .by_offset
            .range(..=offset)
            .next_back()
            .map(|(o, l)| (*o, *l));
        if let Some((p_off, p_len)) = prev {
            if p_off + p_len > offset {
                return false;
            }
        }
        let next = self.by_offset.range(offset..).next().map(|(o, l)| (*o, *l));
        if let Some((n_off, _)) = next {
            if n_off < end {
                return false;
            }
        }
        let (mut start, mut total) = (offset, len);
        if let Some((p_off, p_len)) = prev.filter(|(o, l)| o + l == offset) {
            self.remove_free(p_off, p_len);
            start = p_off;
            total += p_len;
        }
        if let Some((n_off, n_len)) = next.filter(|(o, _)| *o == end) {
            self.remove_free(n_off, n_len);
            total += n_len;
        }
        self.insert_free(start, total);
        self.used -= len;
        true
    }

    /// Reserves exactly `[address, address + len)` (a replica re-adopted where its node holds
    /// it). False, with nothing changed, unless the whole range is one free extent's part and
    /// on the [`ALIGN`] grid.
    pub(crate) fn reserve(&mut self, address: u64, len: u64) -> bool {
        let Some(offset) = address.checked_sub(self.base) else {
            return false;
        };
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0
            || end > self.capacity
            || !offset.is_multiple_of(ALIGN)
            || !len.is_multiple_of(ALIGN)
        {
            return false;
        }
        let Some((&f_off, &f_len)) = self.by_offset.range(..=offset).next_back() else {
            return false;
        };
        if f_off + f_len < end {
            return false;
        }
        self.remove_free(f_off, f_len);
        if f_off < offset {
            self.insert_free(f_off, offset - f_off);
        }
        if end < f_off + f_len {
            self.insert_free(end, f_off + f_len - end);
        }
        self.used += len;
        true
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_len.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_len.remove(&(len, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BASE: u64 = 0x3_0000_0000;

    #[test]
    fn freeing_everything_coalesces_into_one_extent() {
        let mut a = Allocator::new(BASE, 1 << 20);
        let sizes = [64u64, 4096, 192, 65536, 640, 128];
        let addrs: Vec<u64> = sizes.iter().map(|s| a.allocate(*s).unwrap()).collect();
        assert_eq!(a.used(), sizes.iter().sum::<u64>());
        for (i, addr) in addrs.iter().enumerate().rev().step_by(2) {
            assert!(a.free(*addr, sizes[i]));
        }
        for (i, addr) in addrs.iter().enumerate().rev().skip(1).step_by(2) {
            assert!(a.free(*addr, sizes[i]));
        }
        assert_eq!(a.used(), 0);
        assert_eq!(a.free_extents(), 1);
        assert_eq!(a.largest_free(), 1 << 20);
    }

    #[test]
    fn best_fit_reuses_the_smallest_hole() {
        let mut a = Allocator::new(BASE, 10 * 1024);
        let small = a.allocate(1024).unwrap();
        let _keep1 = a.allocate(64).unwrap();
        let big = a.allocate(4096).unwrap();
        let _keep2 = a.allocate(64).unwrap();
        assert!(a.free(small, 1024));
        assert!(a.free(big, 4096));
        // A 1 KiB request must land in the 1 KiB hole, keeping the 4 KiB hole whole.
        assert_eq!(a.allocate(1024), Some(small));
        assert_eq!(a.allocate(4096), Some(big));
    }

    #[test]
    fn bad_frees_are_refused() {
        let mut a = Allocator::new(BASE, 4096);
        let x = a.allocate(1024).unwrap();
        assert!(!a.free(BASE - 64, 64), "below base");
        assert!(!a.free(BASE + 4096, 64), "beyond end");
        assert!(!a.free(BASE + 2048, 64), "already free");
        assert!(a.free(x, 1024));
        assert!(!a.free(x, 1024), "double free");
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn exhaustion_returns_none() {
        let mut a = Allocator::new(BASE, 1024);
        assert!(a.allocate(1024).is_some());
        assert_eq!(a.allocate(64), None);
        assert_eq!(a.allocate(0), None);
    }

    #[test]
    fn reserve_takes_exact_free_ranges_only() {
        let mut a = Allocator::new(BASE, 4096);
        assert!(a.reserve(BASE + 1024, 1024));
        assert!(!a.reserve(BASE + 1024, 64), "taken");
        assert!(!a.reserve(BASE + 960, 128), "overlaps the reserved range");
        assert!(!a.reserve(BASE + 4032, 128), "beyond the end");
        assert!(!a.reserve(BASE + 10, 64), "off the grid");
        assert!(a.reserve(BASE, 1024));
        assert!(a.reserve(BASE + 2048, 2048));
        assert_eq!(a.used(), 4096);
        assert_eq!(a.allocate(64), None);
        assert!(a.free(BASE + 1024, 1024));
        assert_eq!(a.allocate(1024), Some(BASE + 1024));
    }

    proptest! {
        /// Random mixed-size allocate/free sequences never hand out overlapping ranges, keep the
        /// used counter exact, and coalesce back to one extent when everything is freed.
        #[test]
        fn no_overlap_and_full_coalescing(ops in proptest::collection::vec((any::<bool>(), 1u64..20_000), 1..300)) {
            let cap = 1u64 << 20;
            let mut a = Allocator::new(BASE, cap);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, size) in ops {
                if alloc || live.is_empty() {
                    let len = aligned_len(size).unwrap();
                    if let Some(addr) = a.allocate(len) {
                        prop_assert!(addr >= BASE && addr + len <= BASE + cap);
                        for (o, l) in &live {
                            prop_assert!(addr + len <= *o || *o + *l <= addr, "overlap");
                        }
                        live.push((addr, len));
                    }
                } else {
                    let (addr, len) = live.swap_remove((size as usize) % live.len());
                    prop_assert!(a.free(addr, len));
                }
                prop_assert_eq!(a.used(), live.iter().map(|(_, l)| l).sum::<u64>());
            }
            for (addr, len) in live.drain(..) {
                prop_assert!(a.free(addr, len));
            }
            prop_assert_eq!(a.used(), 0);
            prop_assert_eq!(a.free_extents(), 1);
            prop_assert_eq!(a.largest_free(), cap);
        }
    }
}
