//! Standalone mode's memory pool: what `alloc_from_mem_pool` hands out. One zeroed,
//! page-aligned region reserved at `setup_dummy` (the kernel commits its pages as they are first
//! touched), carved out front to back. The node on this machine copies straight to and from it,
//! as it does for any memory of the process; the region is registered whole, so buffers taken
//! from it need no registration of their own.
//!
//! Allocations are not returned one by one (there is no free call in the API): the whole region
//! is released when the store is closed, after which its addresses must not be used.

use crate::errors::invalid;
use moonkv_proto::Error;
use parking_lot::Mutex;
use std::alloc::Layout;

/// Alignment of the region and of every allocation from it.
const ALIGN: usize = 64;
/// Alignment of the region itself.
const PAGE: usize = 4096;

/// The pool of one standalone store.
pub(crate) struct MemPool {
    base: *mut u8,
    layout: Layout,
    /// Offset of the first free byte.
    next: Mutex<usize>,
}

// SAFETY: the pool only hands out addresses; the region is owned by the pool and freed once, in
// `Drop`, and `next` is behind a mutex.
unsafe impl Send for MemPool {}
// SAFETY: as above; shared access only reads `base`/`layout` and locks `next`.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// Reserves `size` bytes (`None` for 0).
    pub(crate) fn new(size: u64) -> Result<Option<MemPool>, Error> {
        if size == 0 {
            return Ok(None);
        }
        let len = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .filter(|&s| s <= isize::MAX as usize - PAGE)
            .ok_or_else(|| {
                invalid(format!(
                    "mem_pool_size {size} is larger than this machine can address"
                ))
            })?;
        let layout = Layout::from_size_align(len, PAGE)
            .map_err(|e| invalid(format!("mem_pool_size {size}: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(invalid(format!(
                "cannot reserve a memory pool of {size} bytes"
            )));
        }
        Ok(Some(MemPool {
            base,
            layout,
            next: Mutex::new(0),
        }))
    }

    /// Start address of the region.
    pub(crate) fn base(&self) -> usize {
        self.base as usize
    }

    /// Length of the region.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The address of `size` fresh bytes, or `None` when the pool has no room left.
    pub(crate) fn alloc(&self, size: usize) -> Option<usize> {
        if size == 0 {
            return None;
        }
        let mut next = self.next.lock();
        let start = next.checked_next_multiple_of(ALIGN)?;
        let end = start.checked_add(size).filter(|&e| e <= self.len())?;
        *next = end;
        Some(self.base() + start)
    }

    /// Bytes still free.
    pub(crate) fn free_bytes(&self) -> usize {
        let next = *self.next.lock();
        self.len().saturating_sub(next.next_multiple_of(ALIGN))
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed only here.
        unsafe { std::alloc::dealloc(self.base, self.layout) };
    }
}
