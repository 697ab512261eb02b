//! Standalone mode's memory pool: what `alloc_from_mem_pool` hands out. One zeroed region,
//! starting on a 2 MiB boundary and advised to use 2 MiB pages, reserved at `setup_dummy` (the
//! kernel commits its pages as they are first touched), carved out front to back. The region is
//! registered whole, so buffers taken from it need no registration of their own.
//!
//! The region is a sealed memfd named `moonkv-pool` (`moonkv_node::shared_pool`), whose last
//! page holds a random id: the node on this machine maps it too and copies to and from it with
//! `memcpy`, faster than the system calls it uses for other memory of the process. Where a
//! memfd cannot be made, the pool is anonymous memory, and the node copies by system call.
//!
//! Allocations are not returned one by one (there is no free call in the API): the whole region
//! is released when the store is closed, after which its addresses must not be used.

// Unsafe here: mapping and unmapping the pool region. Every address handed out lies inside the
// mapping, and the mapping is unmapped only when the store closes.
#![allow(unsafe_code)]

use crate::errors::invalid;
use moonkv_node::shared_pool::{ID_LEN, POOL_NAME, POOL_SEALS};
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
    /// The memfd behind the region (kept open so that the node can find it), if any; closed
    /// after the region is unmapped.
    _file: Option<std::fs::File>,
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
        // Reserve one huge page more than asked, so the pool can start on a 2 MiB boundary,
        // and one page for the id of a shared pool.
        let mapped = len.checked_add(HUGE + ID_PAGE).ok_or_else(|| {
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
        // SAFETY: `skip < HUGE`, so `raw + skip .. raw + skip + len + ID_PAGE` lies inside the
        // mapping.
        let base = unsafe { raw.cast::<u8>().add(skip) };
        let file = match shared(base, len) {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::debug!(error = %e, "memory pool kept private: the node copies by system call");
                None
            }
        };
        // 2 MiB pages where the kernel allows them (for a shared pool, where its
        // `shmem_enabled` does): fewer first-touch faults and TLB misses. Only advice: a kernel
        // that refuses keeps 4 KiB pages, and the pool works the same.
        // SAFETY: advice over whole huge pages inside the mapping; it changes no byte.
        unsafe { libc::madvise(base.cast(), len / HUGE * HUGE, libc::MADV_HUGEPAGE) };
        Ok(Some(MemPool {
            raw: raw.cast(),
            mapped,
            base,
            len,
            next: Mutex::new(0),
            _file: file,
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

/// Bytes after the region: a page whose last [`ID_LEN`] bytes hold the pool's id.
const ID_PAGE: usize = 4096;

/// Puts a sealed memfd of `len + ID_PAGE` bytes, with a random id at its end, in place of the
/// anonymous memory at `base` (reserved by the caller, with room for the id page).
fn shared(base: *mut u8, len: usize) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name = std::ffi::CString::new(POOL_NAME).expect("no NUL in the pool name");
    let total = len + ID_PAGE;
    // SAFETY: plain system calls on a descriptor made here, then owned by `file`.
    let file = unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        std::fs::File::from_raw_fd(fd)
    };
    file.set_len(total as u64)?;
    let seals = POOL_SEALS | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on the descriptor owned by `file`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: replaces `[base, base + total)`, which lies inside the caller's fresh anonymous
    // reservation, with the file (MAP_FIXED over memory nobody uses yet).
    let mapped = unsafe {
        libc::mmap(
            base.cast(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let mut id = [0u8; ID_LEN];
    // SAFETY: fills the local array; a short read leaves zeroes, which is still an id (only a
    // pool mapped later at the same address must differ, and 16 random bytes will).
    unsafe { libc::getrandom(id.as_mut_ptr().cast(), ID_LEN, 0) };
    // SAFETY: the last ID_LEN bytes of the file's mapping, past the region handed out.
    unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), base.add(total - ID_LEN), ID_LEN) };
    Ok(file)
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, unmapped only here.
        unsafe { libc::munmap(self.raw.cast(), self.mapped) };
    }
}
