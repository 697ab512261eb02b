//! Table memory on 2 MiB pages: the allocator of the index's and the chain cache's large hash
//! tables.
//!
//! A long query looks up one random slot per block in each of two tables of hundreds of MiB.
//! On 4 KiB pages nearly every such lookup also misses the TLB, and a page walk costs another
//! trip or more to memory, much more in a virtual machine. On 2 MiB pages the tables' mappings
//! fit in the TLB and the walks mostly vanish. `moonkv bench indexer` shows the query time this
//! saves (docs/benchmarks.md, "Prefix index").
//!
//! Allocations of [`FROM`] bytes or more are aligned to 2 MiB and advised `MADV_HUGEPAGE`, so
//! the kernel backs them with transparent huge pages when its THP mode is `always` or `madvise`
//! (the usual default). Where it cannot (mode `never`, no free huge pages), they stay on 4 KiB
//! pages and nothing else changes. Smaller allocations go to the global allocator untouched.
//!
//! Unsafe code here, and why it is sound: [`HugePages`] hands every request to the global
//! allocator with a layout computed from the caller's by [`placed`], the same function for
//! allocation and release, so each block is freed with the layout it was allocated with. The
//! `madvise` covers whole 2 MiB pages inside the block just allocated and changes none of its
//! bytes.

#![allow(unsafe_code)]

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use std::ptr::NonNull;

/// A huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Allocations from this size on are placed on huge pages.
pub const FROM: usize = 4 << 20;

/// The allocator of the large tables (see the module's text).
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePages;

/// The layout a block of `layout` is really allocated with.
fn placed(layout: Layout) -> Layout {
    if layout.size() < FROM {
        return layout;
    }
    Layout::from_size_align(layout.size(), layout.align().max(HUGE_PAGE)).unwrap_or(layout)
}

// SAFETY: every block comes from `Global` and goes back to it with the layout `placed` gives
// for the caller's layout, which `Global` itself accepts; blocks stay valid until released,
// and clones of this unit struct are interchangeable.
unsafe impl Allocator for HugePages {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let placed = placed(layout);
        let block = Global.allocate(placed)?;
        if placed.align() >= HUGE_PAGE {
            let whole = block.len() / HUGE_PAGE * HUGE_PAGE;
            // SAFETY: `[start, start + whole)` lies inside the block just allocated, which is
            // 2 MiB-aligned; the advice changes none of its bytes. A refusal (THP off, an old
            // kernel) leaves ordinary pages, so its error is of no consequence.
            let _ = unsafe {
                rustix::mm::madvise(
                    block.as_ptr().cast::<u8>().cast(),
                    whole,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller gives back a block of this allocator with the layout it asked
        // for; `allocate` took it from `Global` with `placed(layout)`.
        unsafe { Global.deallocate(ptr, placed(layout)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_aligned_to_huge_pages_and_small_ones_are_not_changed() {
        let big = Layout::from_size_align(FROM, 8).unwrap();
        let block = HugePages.allocate(big).unwrap();
        assert_eq!(block.as_ptr().cast::<u8>() as usize % HUGE_PAGE, 0);
        assert!(block.len() >= FROM);
        // SAFETY: the block was just allocated with `big`, and is freed once.
        unsafe { HugePages.deallocate(block.cast(), big) };
        let small = Layout::from_size_align(4096, 8).unwrap();
        assert_eq!(placed(small), small);
        let block = HugePages.allocate(small).unwrap();
        // SAFETY: as above.
        unsafe { HugePages.deallocate(block.cast(), small) };
    }

    #[test]
    fn a_table_on_huge_pages_behaves_as_any_other() {
        // `Table` allocates its slots from `HugePages`: 2^21 slots of 16 bytes, past `FROM`.
        let mut map: crate::index::Table<u64> = crate::index::Table::with_capacity(1 << 20);
        assert!(map.capacity() * 16 >= FROM);
        for i in 0..(1u64 << 20) {
            map.insert(i, i * 3);
        }
        assert!((0..(1u64 << 20)).all(|i| map.get(i) == Some(&(i * 3))));
    }
}
