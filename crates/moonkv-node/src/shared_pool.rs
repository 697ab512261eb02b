//! Callers' shared pools: memory a caller on this machine keeps in a sealed memfd named
//! [`POOL_NAME`] (standalone mode's `alloc_from_mem_pool` pool), which the node maps too, so a
//! same-host copy to or from it is one `memcpy` in the node instead of `process_vm_readv` /
//! `process_vm_writev`, whose page-by-page pinning runs at about 60% of `memcpy` on some
//! machines (`docs/benchmarks.md`, *Shared pools and quiet writes*).
//!
//! Found when a connection attaches, after the caller was verified (`crate::same_host`): the
//! node lists the caller's mappings of such files (`/proc/PID/maps`), opens each through the
//! caller's descriptor (`/proc/PID/fd/N`, the same access the node needs for its other
//! copies), and maps it only when the file is sealed against shrinking, so the caller can never
//! pull pages out from under the node (no `SIGBUS`). Anything else (no such file, not sealed,
//! a size that does not cover the mapping) is skipped, and those ranges keep the system-call
//! path. A pool's mapping is shared by every connection of the same caller and unmapped
//! when the last of them ends.
//!
//! The last [`ID_LEN`] bytes of a pool file hold a random id the caller wrote at its creation.
//! Before each copy the node reads them through the caller's address space (one 16-byte
//! `process_vm_readv`) and compares them with its own mapping's: a caller that closed the pool
//! and mapped other memory at the same addresses since the connection attached is then copied
//! by system calls, never into the old file.
//!
//! Unsafe code here, and why it is sound: `mmap`/`munmap` of a file the node opened, over
//! exactly the length it checked; copies between a slice borrowed for the call and a range
//! inside such a mapping (checked by [`SharedPools::resolve`]). The caller may write its pool
//! while the node copies (that is its own data race on its own bytes, as with
//! `process_vm_readv`); the bytes are plain data to the node, never read as anything else.

#![allow(unsafe_code)]

use crate::same_host::Local;
use parking_lot::Mutex;
use rustix::process::Pid;
use std::collections::HashMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock, Weak};

/// Name of the memfd of a caller's shared pool (`memfd_create`); `/proc` shows it as
/// `/memfd:moonkv-pool (deleted)`.
pub const POOL_NAME: &str = "moonkv-pool";

/// Most bytes of one caller's pools the node maps (its address space is the node's to keep):
/// pools past it keep the system-call path.
pub const MAX_MAPPED: u64 = 1 << 40;

/// Most pool regions of one caller the node looks at (each costs a scan of the caller's
/// descriptors): the rest keep the system-call path.
pub const MAX_POOLS: usize = 64;

/// Bytes at the end of a pool file holding its id.
pub const ID_LEN: usize = 16;

/// Seals a pool must carry before the node maps it: it can never shrink (or grow).
pub const POOL_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// One caller pool mapped into the node.
struct Mapping {
    /// Where the caller sees it, and its length.
    remote: u64,
    len: usize,
    /// Where the node sees it.
    local: *mut u8,
    /// The pool's id ([`ID_LEN`] bytes at the end of the file) and where the caller sees it, if
    /// this region maps the end of the file.
    id: Option<([u8; ID_LEN], u64)>,
}

// SAFETY: the mapping is plain shared memory owned by this value; it is unmapped once, in Drop.
unsafe impl Send for Mapping {}
// SAFETY: as above; the pointer is only used for copies of ranges checked against `len`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map_pool` with exactly this length, unmapped only here.
        unsafe { libc::munmap(self.local.cast(), self.len) };
    }
}

/// Mappings in use, by (caller process, memfd inode, caller address): the connections of one
/// caller share them.
type Cache = Mutex<HashMap<(i32, u64, u64), Weak<Mapping>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The shared pools of one attached caller.
#[derive(Default)]
pub(crate) struct SharedPools {
    maps: Vec<Arc<Mapping>>,
}

impl std::fmt::Debug for SharedPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.maps.iter().map(|m| (m.remote, m.len)))
            .finish()
    }
}

impl SharedPools {
    /// Finds and maps the shared pools of process `pid` (blocking: reads `/proc`). Never fails:
    /// what cannot be mapped is left to the system-call path.
    pub(crate) fn discover(pid: Pid) -> SharedPools {
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return SharedPools::default();
        };
        let wanted = format!("/memfd:{POOL_NAME}");
        let mut found = Vec::new();
        let regions =
            PoolRegion::joined(maps.lines().filter_map(|l| PoolRegion::parse(l, &wanted)));
        let mut mapped = 0u64;
        for (i, region) in regions.into_iter().enumerate() {
            mapped = mapped.saturating_add(region.end - region.start);
            if mapped > MAX_MAPPED || i >= MAX_POOLS {
                tracing::debug!(%pid, "caller pools past {MAX_POOLS} regions or {MAX_MAPPED} bytes are not mapped");
                break;
            }
            let key = (pid.as_raw_nonzero().get(), region.inode, region.start);
            // Held while mapping, so that connections of one caller attaching at once share
            // one mapping.
            let mut all = cache().lock();
            if let Some(shared) = all.get(&key).and_then(Weak::upgrade) {
                found.push(shared);
                continue;
            }
            match map_pool(pid, &wanted, &region) {
                Ok(mapping) => {
                    let mapping = Arc::new(mapping);
                    all.retain(|_, m| m.strong_count() > 0);
                    all.insert(key, Arc::downgrade(&mapping));
                    found.push(mapping);
                }
                Err(why) => {
                    tracing::debug!(%pid, start = region.start, %why, "caller pool not mapped")
                }
            }
        }
        SharedPools { maps: found }
    }

    /// Whether no pool is mapped.
    pub(crate) fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// The pool holding the caller's `[address, address + len)` wholly, and where the node sees
    /// that range.
    fn resolve(&self, address: u64, len: u64) -> Option<(&Arc<Mapping>, *mut u8)> {
        let end = address.checked_add(len)?;
        self.maps.iter().find_map(|m| {
            let offset = address.checked_sub(m.remote)?;
            (end <= m.remote + m.len as u64)
                // SAFETY: `offset + len <= m.len`: inside the mapping.
                .then(|| (m, unsafe { m.local.add(offset as usize) }))
        })
    }

    /// Copies between the node's side of a copy and the caller's `ranges` when every range
    /// lies in a mapped pool that is still the one the caller has there (`current`: the
    /// caller's view of a pool's id at an address); false (nothing copied) otherwise.
    pub(crate) fn copy(
        &self,
        local: &mut Local<'_>,
        ranges: &[(u64, u64)],
        current: impl Fn(u64) -> Option<[u8; ID_LEN]>,
        stream: bool,
    ) -> bool {
        let total = match local {
            Local::Out(src) => src.len(),
            Local::In(dst) => dst.len(),
        };
        if self.fits(ranges, total, current).is_none() {
            return false;
        }
        let mut at = 0;
        let level = crate::copy::level();
        for &(address, len) in ranges {
            // `fits` resolved every range already; `self` has not changed since.
            let Some((_, place)) = self.resolve(address, len) else {
                return false;
            };
            let len = len as usize;
            // SAFETY: `place` starts `len` bytes inside a live mapping (`resolve`), and
            // `at + len <= total` (`fits` checked the sum); the node's slice (written only
            // through the exclusive `In` borrow) and the shared mapping never overlap.
            unsafe {
                match local {
                    // Out of the segment into the caller's pool (a get), or from the pool
                    // into the segment (a put); streaming stores when asked to.
                    Local::Out(src) => {
                        crate::copy::copy_raw(level, place, src.as_ptr().add(at), len, stream)
                    }
                    Local::In(dst) => {
                        crate::copy::copy_raw(level, dst.as_mut_ptr().add(at), place, len, stream)
                    }
                }
            }
            at += len;
        }
        true
    }

    /// `Some` when every range lies in a pool that the caller still has there, and they add
    /// up to `total`. Allocates nothing: it runs once per copied key.
    fn fits(
        &self,
        ranges: &[(u64, u64)],
        total: usize,
        current: impl Fn(u64) -> Option<[u8; ID_LEN]>,
    ) -> Option<()> {
        if self.is_empty() {
            return None;
        }
        let mut sum = 0usize;
        // The pools checked so far; a request's ranges are nearly always in one or two. Past
        // this many, a pool is checked again (the same answer, a little more work).
        let mut checked: [*const Mapping; 4] = [std::ptr::null(); 4];
        let mut count = 0;
        for &(address, len) in ranges {
            let (mapping, _) = self.resolve(address, len)?;
            let ptr = Arc::as_ptr(mapping);
            if !checked[..count].contains(&ptr) {
                let (id, at) = mapping.id?;
                if current(at)? != id {
                    return None;
                }
                if count < checked.len() {
                    checked[count] = ptr;
                    count += 1;
                }
            }
            sum = sum.checked_add(usize::try_from(len).ok()?)?;
        }
        (sum == total).then_some(())
    }
}

/// A line of `/proc/PID/maps` that maps a pool file.
#[derive(Debug, PartialEq)]
struct PoolRegion {
    start: u64,
    end: u64,
    offset: u64,
    inode: u64,
}

impl PoolRegion {
    /// Neighbouring lines that map consecutive parts of one file, as one region (the kernel
    /// lists a mapping in parts when parts of it were advised differently).
    fn joined(regions: impl Iterator<Item = PoolRegion>) -> Vec<PoolRegion> {
        let mut out: Vec<PoolRegion> = Vec::new();
        for r in regions {
            match out.last_mut() {
                Some(last)
                    if last.inode == r.inode
                        && last.end == r.start
                        && last.offset + (last.end - last.start) == r.offset =>
                {
                    last.end = r.end;
                }
                _ => out.push(r),
            }
        }
        out
    }

    /// `start-end perms offset dev inode path`, for a shared read-write mapping of `wanted`.
    fn parse(line: &str, wanted: &str) -> Option<PoolRegion> {
        let mut fields = line.split_whitespace();
        let range = fields.next()?;
        let perms = fields.next()?;
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let _dev = fields.next()?;
        let inode = fields.next()?.parse().ok()?;
        let path = fields.next()?;
        if path != wanted || !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b's') {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        (end > start).then_some(PoolRegion {
            start,
            end,
            offset,
            inode,
        })
    }
}

/// Opens the caller's pool file (through its descriptor) and maps the region, if it is sealed
/// and large enough.
fn map_pool(pid: Pid, wanted: &str, region: &PoolRegion) -> Result<Mapping, String> {
    use std::os::unix::fs::MetadataExt;
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| e.to_string())?;
    let file = fds
        .flatten()
        .filter(|entry| {
            fs::read_link(entry.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with(wanted))
        })
        .find_map(|entry| {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(entry.path())
                .ok()?;
            (file.metadata().ok()?.ino() == region.inode).then_some(file)
        })
        .ok_or("no descriptor of the pool file")?;
    // SAFETY: F_GET_SEALS on a descriptor this function owns.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & POOL_SEALS != POOL_SEALS {
        return Err(format!("the pool file is not sealed (seals {seals:#x})"));
    }
    let len = usize::try_from(region.end - region.start).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if region
        .offset
        .checked_add(len as u64)
        .is_none_or(|end| end > size)
    {
        return Err(format!(
            "the mapping ends past the pool file ({size} bytes)"
        ));
    }
    let offset = libc::off_t::try_from(region.offset).map_err(|e| e.to_string())?;
    // SAFETY: a new shared mapping of a file this function opened, over a range the file
    // covers and, being sealed, always will.
    let local = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if local == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let local: *mut u8 = local.cast();
    // The id, when this region maps the end of the file.
    let id = (region.offset + len as u64 == size && len >= ID_LEN).then(|| {
        let mut id = [0u8; ID_LEN];
        // SAFETY: the last ID_LEN bytes of the mapping just made.
        unsafe { std::ptr::copy_nonoverlapping(local.add(len - ID_LEN), id.as_mut_ptr(), ID_LEN) };
        (id, region.start + (len - ID_LEN) as u64)
    });
    Ok(Mapping {
        remote: region.start,
        len,
        local,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's view of a pool id at `at`.
    fn mine(at: u64) -> Option<[u8; ID_LEN]> {
        let mut id = [0u8; ID_LEN];
        // SAFETY: test addresses inside the test's own live mappings.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, id.as_mut_ptr(), ID_LEN) };
        Some(id)
    }

    /// A sealed (or not) pool of `len` bytes in this process, as the Python package makes one
    /// (its id: the last 16 bytes, set to 0xA5).
    fn pool(len: usize, sealed: bool) -> (std::fs::File, *mut u8) {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(POOL_NAME).unwrap();
        // SAFETY: plain system calls on a new descriptor; the mapping is leaked by the test.
        unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            if sealed {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, POOL_SEALS), 0);
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::write_bytes(p.cast::<u8>().add(len - ID_LEN), 0xA5, ID_LEN);
            (std::fs::File::from_raw_fd(fd), p.cast())
        }
    }

    fn me() -> Pid {
        rustix::process::getpid()
    }

    #[test]
    fn a_sealed_pool_is_mapped_and_copies_go_through_it() {
        let (_file, base) = pool(1 << 20, true);
        let pools = SharedPools::discover(me());
        let at = base as u64;
        assert!(pools.resolve(at, 1 << 20).is_some(), "{pools:?}");
        assert_eq!(pools.maps[0].id.map(|(id, _)| id), Some([0xA5; ID_LEN]));
        let src: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let ranges = [(at + 100, 1000), (at + 5000, 3096)];
        assert!(pools.copy(&mut Local::Out(&src), &ranges, mine, false));
        // SAFETY: inside the test's own mapping.
        let seen = unsafe { std::slice::from_raw_parts(base.add(100), 1000) };
        assert_eq!(seen, &src[..1000]);
        let mut back = vec![0u8; 4096];
        assert!(pools.copy(&mut Local::In(&mut back), &ranges, mine, false));
        assert_eq!(back, src);
        // Into the node's memory by streaming stores (a long call): the same bytes, from an
        // odd offset and past the loops' 256-byte steps.
        let long: Vec<u8> = (0..70_001u32).map(|i| (i * 13 + i / 997) as u8).collect();
        let odd = [(at + 8193, 70_001)];
        assert!(pools.copy(&mut Local::Out(&long), &odd, mine, false));
        let mut streamed = vec![0u8; 70_001];
        assert!(pools.copy(&mut Local::In(&mut streamed), &odd, mine, true));
        assert_eq!(streamed, long);
        // Out to the caller's pool by streaming stores (a large get), at another odd offset.
        let reversed: Vec<u8> = long.iter().rev().copied().collect();
        let other = [(at + 100_003, 70_001)];
        assert!(pools.copy(&mut Local::Out(&reversed), &other, mine, true));
        // SAFETY: inside the test's own mapping.
        let seen = unsafe { std::slice::from_raw_parts(base.add(100_003), 70_001) };
        assert_eq!(seen, &reversed[..]);
        // A range that leaves the pool, or lengths that do not add up: left to the other path.
        assert!(!pools.copy(
            &mut Local::Out(&src[..16]),
            &[(at + (1 << 20) - 8, 16)],
            mine,
            false
        ));
        assert!(!pools.copy(&mut Local::Out(&src[..16]), &[(8, 16)], mine, false));
        assert!(!pools.copy(&mut Local::Out(&src[..16]), &[(at, 15)], mine, false));
        // The caller has other memory there now (another id): nothing goes into the old file.
        assert!(!pools.copy(
            &mut Local::Out(&src[..16]),
            &[(at, 16)],
            |_| Some([0; ID_LEN]),
            false
        ));
        assert!(!pools.copy(&mut Local::Out(&src[..16]), &[(at, 16)], |_| None, false));
        // A second attach of the same caller shares the mapping.
        let again = SharedPools::discover(me());
        assert!(again
            .maps
            .iter()
            .any(|m| pools.maps.iter().any(|p| Arc::ptr_eq(m, p))));
    }

    #[test]
    fn an_unsealed_pool_is_left_alone() {
        let (_file, base) = pool(1 << 20, false);
        let pools = SharedPools::discover(me());
        assert!(pools.resolve(base as u64, 16).is_none(), "{pools:?}");
    }

    #[test]
    fn only_shared_writable_mappings_of_the_pool_file_count() {
        let wanted = format!("/memfd:{POOL_NAME}");
        let line = format!("7f0000000000-7f0000200000 rw-s 00000000 00:01 4242 {wanted} (deleted)");
        assert_eq!(
            PoolRegion::parse(&line, &wanted),
            Some(PoolRegion {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0020_0000,
                offset: 0,
                inode: 4242
            })
        );
        let private = line.replace("rw-s", "rw-p");
        assert_eq!(PoolRegion::parse(&private, &wanted), None);
        let other = line.replace(POOL_NAME, "other");
        assert_eq!(PoolRegion::parse(&other, &wanted), None);
        assert_eq!(PoolRegion::parse("garbage", &wanted), None);
        // One file mapped in two consecutive parts is one region; a gap, or another file, not.
        let part = |start: u64, end: u64, offset: u64, inode: u64| PoolRegion {
            start,
            end,
            offset,
            inode,
        };
        let joined = PoolRegion::joined(
            [
                part(0x1000, 0x3000, 0, 7),
                part(0x3000, 0x4000, 0x2000, 7),
                part(0x5000, 0x6000, 0x3000, 7),
                part(0x6000, 0x7000, 0, 8),
            ]
            .into_iter(),
        );
        assert_eq!(
            joined,
            vec![
                part(0x1000, 0x4000, 0, 7),
                part(0x5000, 0x6000, 0x3000, 7),
                part(0x6000, 0x7000, 0, 8)
            ]
        );
        assert_eq!(PoolRegion::parse("", &wanted), None);
    }
}
