//! Standalone mode's memory pool: what `alloc_from_mem_pool` hands out. One zeroed anonymous
//! mapping, starting on a 2 MiB boundary and advised to use 2 MiB pages, reserved at
//! `setup_dummy` (the kernel commits its pages as they are first touched), carved out front to
//! back. The node on this machine copies straight to and from it, as it does for any memory of
//! the process; the region is registered whole, so buffers taken
//! from it need no registration of their own.
//!
//! Allocations are not returned one by one (there is no free call in the API): the whole region
//! is released when the store is closed, after which its addresses must not be used.

// Unsafe here: mapping and unmapping the pool region. Every address handed out lies inside the
// mapping, and the mapping is unmapped only when the store closes.
#![allow(unsafe_code)]

use crate::errors::invalid;
use moonkv_proto::Error;
use parking_lot::Mutex;

/// Alignment of every allocation from the pool (the region itself starts on a 2 MiB boundary).
const ALIGN: usize = 64;
/// One huge page.
const HUGE: usize = 2 << 20;

/// The pool of one standalone store.
pub(crate) struct MemPool {
    /// The whole mapping, and its length: `base` rounded up to 2 MiB inside it.
    raw: *mut u8,
    mapped: usize,
    base: *mut u8,
    len: usize,
    /// Offset of the first free byte.
    next: Mutex<usize>,
}

// SAFETY: the pool only hands out addresses; the mapping is owned by the pool and unmapped once,
// in `Drop`, and `next` is behind a mutex.
unsafe impl Send for MemPool {}
// SAFETY: as above; shared access only reads `base`/`len` and locks `next`.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// Reserves `size` bytes of address space (`None` for 0). Anonymous private memory reads as
    /// zeroes and commits a page only when it is first touched, so a large pool costs nothing
    /// until it is used.
    pub(crate) fn new(size: u64) -> Result<Option<MemPool>, Error> {
        if size == 0 {
            return Ok(None);
        }
        let len = usize::try_from(size)
            .ok()
            .filter(|&s| s <= isize::MAX as usize / 2)
            .ok_or_else(|| {
                invalid(format!(
                    "mem_pool_size {size} is larger than this machine can address"
                ))
            })?;
        // Reserve one huge page more than asked, so the pool can start on a 2 MiB boundary.
        let mapped = len.checked_add(HUGE).ok_or_else(|| {
            invalid(format!(
                "mem_pool_size {size} is larger than this machine can address"
            ))
        })?;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(invalid(format!(
                "cannot reserve a memory pool of {size} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let skip = (raw as usize).next_multiple_of(HUGE) - raw as usize;
        // SAFETY: `skip < HUGE`, so `raw + skip .. raw + skip + len` lies inside the mapping.
        let base = unsafe { raw.cast::<u8>().add(skip) };
        // 2 MiB pages where the kernel allows them: fewer first-touch faults, and the node's
        // copies to and from the pool run near memcpy speed. Only advice: a kernel that
        // refuses keeps 4 KiB pages, and the pool works the same.
        // SAFETY: advice over whole huge pages inside the mapping; it changes no byte.
        unsafe { libc::madvise(base.cast(), len / HUGE * HUGE, libc::MADV_HUGEPAGE) };
        Ok(Some(MemPool {
            raw: raw.cast(),
            mapped,
            base,
            len,
            next: Mutex::new(0),
        }))
    }

    /// Start address of the region.
    pub(crate) fn base(&self) -> usize {
        self.base as usize
    }

    /// Length of the region.
    pub(crate) fn len(&self) -> usize {
        self.len
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
        // SAFETY: mapped in `new` with this length, unmapped only here.
        unsafe { libc::munmap(self.raw.cast(), self.mapped) };
    }
}
