//! Segment memory: one zeroed, lazily committed allocation per segment, shared by every connection
//! task of the node (and, through `moonkv_dataplane::LocalSegments`, by the copy path of a store
//! in the same process).
//!
//! Access goes through [`ReadView`] / [`WriteView`], which hold a range lock for their bytes;
//! that is what makes handing out `&[u8]` / `&mut [u8]` over the shared allocation sound.
//!
//! Unsafe code here, and why it is sound: [`SegmentMemory`] owns one allocation from
//! `alloc_zeroed`, freed exactly once, in `Drop`. Every slice over it is made by a view whose
//! range was bounds-checked when the view was made, which borrows the memory (so it cannot
//! outlive the allocation) and holds a range guard for its life: shared for a `ReadView`,
//! exclusive for a `WriteView`, so no writer ever overlaps another holder; this is also what
//! the `Send` / `Sync` impls rely on. `prefault` touches the allocation only inside its bounds
//! and before the segment serves, and neither `madvise` changes any of its bytes.

#![allow(unsafe_code)]

use crate::claims::Claims;
use crate::range_lock::{RangeGuard, RangeLock};
use moonkv_dataplane::header::{check_range, DataStatus};
use moonkv_dataplane::local::LocalFuture;
use moonkv_proto::auth::Secret;
use moonkv_proto::grant::Grant;
use moonkv_proto::msg::CatalogEntry;
use moonkv_proto::{Error, ErrorCode, Result, SegmentId};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every segment: one page.
pub(crate) const PAGE_SIZE: usize = 4096;
/// Alignment of the allocation behind a segment. Kept at the allocator's natural alignment on
/// purpose: a larger alignment makes the system allocator zero every byte up front (touching
/// the whole segment), while this one takes the calloc path, whose large blocks come from
/// fresh, lazily zeroed pages — a 1 GiB segment costs nothing until it is written.
const ALLOC_ALIGN: usize = 16;

/// Alignment of a segment's first byte, taken inside a slightly larger allocation (see
/// [`ALLOC_ALIGN`]). One huge page: the segment's 2 MiB blocks are whole huge pages, and every
/// replica, whose offset is a multiple of 64, starts on a cache line. calloc's own start
/// (16 bytes past a page) put every replica 16 bytes into a line, and the same-host copies'
/// streaming stores into such lines ran at half speed (`docs/benchmarks.md`, *Segments
/// aligned to cache lines*).
pub(crate) const SEGMENT_ALIGN: usize = 2 << 20;

/// The bytes of one mounted segment.
pub struct SegmentMemory {
    id: SegmentId,
    /// The segment's first byte, [`SEGMENT_ALIGN`]ed, inside the allocation at `alloc`.
    ptr: NonNull<u8>,
    /// The segment's bytes.
    len: usize,
    /// The allocation (from `alloc_zeroed(layout)`), freed in `Drop`.
    alloc: NonNull<u8>,
    layout: Layout,
    locks: RangeLock,
    /// Committed replicas held here, by address (see `crate::catalog`).
    catalog: parking_lot::Mutex<BTreeMap<u64, CatalogEntry>>,
}

// SAFETY: the allocation is owned by this struct for its whole life and freed only in `Drop`.
// Concurrent access to its bytes goes exclusively through `ReadView` / `WriteView`, whose range
// guards forbid a writer overlapping any other holder, so no data race is possible.
unsafe impl Send for SegmentMemory {}
// SAFETY: see `Send`; shared references only hand out bytes under range guards.
unsafe impl Sync for SegmentMemory {}

impl SegmentMemory {
    /// Allocates `size` zeroed bytes (rounded up to a whole page), committed lazily by the OS.
    pub fn allocate(id: SegmentId, size: u64) -> Result<SegmentMemory> {
        let bad = |why: String| Error::new(ErrorCode::INVALID_PARAMS, why);
        if size == 0 {
            return Err(bad("a segment cannot be empty".into()));
        }
        let size = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE_SIZE))
            .ok_or_else(|| bad(format!("segment size {size} does not fit in memory")))?;
        let layout = size
            .checked_add(SEGMENT_ALIGN)
            .and_then(|whole| Layout::from_size_align(whole, ALLOC_ALIGN).ok())
            .ok_or_else(|| bad(format!("segment size {size} does not fit in memory")))?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let alloc = NonNull::new(raw).ok_or_else(|| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("could not allocate a segment of {size} bytes"),
            )
        })?;
        // Below `SEGMENT_ALIGN`, so the segment's `size` bytes from there lie inside the
        // allocation.
        let skip = (raw as usize).next_multiple_of(SEGMENT_ALIGN) - raw as usize;
        // SAFETY: `skip + size < layout.size()`: inside the allocation, and not null.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(skip)) };
        Ok(SegmentMemory {
            id,
            ptr,
            len: size,
            alloc,
            layout,
            locks: RangeLock::default(),
            catalog: parking_lot::Mutex::new(BTreeMap::new()),
        })
    }

    /// Commits every page now instead of at its first write (`madvise(MADV_POPULATE_WRITE)`,
    /// or a write per page where the kernel lacks it), so the first fill of the cache does not
    /// pay a page fault per 4 KiB and a segment the machine cannot hold fails at start, not
    /// mid-put. Only before the segment serves: the fallback writes zeros.
    pub(crate) fn prefault(&self) -> std::io::Result<()> {
        // The segment starts on a huge page and is whole pages long: populate all of it.
        let (base, len) = (self.ptr.as_ptr(), self.len);
        use rustix::mm::{madvise, Advice};
        // SAFETY: `[base, base + len)` is this segment's own bytes, page-aligned; populating
        // changes no byte of it.
        match unsafe { madvise(base.cast(), len, Advice::LinuxPopulateWrite) } {
            Ok(()) => {}
            // A kernel without MADV_POPULATE_WRITE (before 5.14): one write per page.
            Err(rustix::io::Errno::INVAL) => {
                for offset in (0..len).step_by(PAGE_SIZE) {
                    // SAFETY: `offset < len`, inside the segment; it is zeroed and does not
                    // serve yet, so writing a zero changes nothing.
                    unsafe { std::ptr::write_volatile(base.add(offset), 0) }
                }
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Asks the kernel to back the segment with 2 MiB pages where it can
    /// (`madvise(MADV_HUGEPAGE)` over the whole 2 MiB blocks inside it): one page fault per
    /// 2 MiB instead of per 4 KiB on the first fill, and the same-host copies, which walk the
    /// page tables of both processes, run near `memcpy` speed (docs/benchmarks.md). A kernel
    /// without transparent huge pages says `EINVAL`; that is not an error, the segment just
    /// keeps 4 KiB pages.
    pub(crate) fn advise_huge_pages(&self) -> std::io::Result<()> {
        // The segment starts on a huge page (`SEGMENT_ALIGN`): its whole 2 MiB blocks are the
        // first `whole` bytes.
        let (base, whole) = (self.ptr.as_ptr(), self.len / SEGMENT_ALIGN * SEGMENT_ALIGN);
        if whole == 0 {
            return Ok(());
        }
        use rustix::mm::{madvise, Advice};
        // SAFETY: `[base, base + whole)` lies inside this segment's own bytes and is
        // 2 MiB-aligned; the advice changes no byte of it.
        match unsafe { madvise(base.cast(), whole, Advice::LinuxHugepage) } {
            Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records a committed replica (replacing any entry overlapping its range).
    pub(crate) fn catalog_commit(&self, entry: CatalogEntry) {
        let mut catalog = self.catalog.lock();
        forget_overlapping(&mut catalog, entry.address, entry.len);
        catalog.insert(entry.address, entry);
    }

    /// Forgets every catalog entry overlapping `[address, address + len)`.
    pub(crate) fn catalog_forget(&self, address: u64, len: u64) {
        forget_overlapping(&mut self.catalog.lock(), address, len);
    }

    /// Forgets the entries at these addresses (the master did not adopt them).
    pub(crate) fn catalog_forget_at(&self, addresses: &[u64]) {
        let mut catalog = self.catalog.lock();
        for a in addresses {
            catalog.remove(a);
        }
    }

    /// Forgets every entry.
    pub(crate) fn catalog_clear(&self) {
        self.catalog.lock().clear();
    }

    /// The committed replicas held here, by address.
    pub(crate) fn catalog_entries(&self) -> Vec<CatalogEntry> {
        self.catalog.lock().values().cloned().collect()
    }

    /// Number of committed replicas held here.
    pub(crate) fn catalog_len(&self) -> usize {
        self.catalog.lock().len()
    }

    /// Segment id.
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// Absolute address of the first byte (what the master sees as the segment base).
    pub fn base(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.len as u64
    }

    /// Range-lock acquisitions that had to wait, and the microseconds they waited in total.
    pub(crate) fn range_lock_waits(&self) -> (u64, u64) {
        self.locks.waits()
    }

    /// Checks `[address, address + length)` and returns its offset.
    pub(crate) fn check(
        &self,
        address: u64,
        length: u64,
    ) -> std::result::Result<usize, DataStatus> {
        check_range(self.base(), self.size(), address, length)
    }

    /// Shared view of `[address, address + length)`, waiting for overlapping writers.
    pub async fn read_view(
        &self,
        address: u64,
        length: u64,
    ) -> std::result::Result<ReadView<'_>, DataStatus> {
        let offset = self.check(address, length)?;
        let len = length as usize;
        let guard = self.locks.acquire(offset, offset + len, false).await;
        Ok(ReadView {
            memory: self,
            offset,
            len,
            _guard: guard,
        })
    }

    /// Exclusive view of `[address, address + length)`, waiting for overlapping holders.
    pub async fn write_view(
        &self,
        address: u64,
        length: u64,
    ) -> std::result::Result<WriteView<'_>, DataStatus> {
        let offset = self.check(address, length)?;
        let len = length as usize;
        let guard = self.locks.acquire(offset, offset + len, true).await;
        // Whatever was committed here is being overwritten: it can no longer be re-adopted.
        self.catalog_forget(address, length);
        Ok(WriteView {
            memory: self,
            offset,
            len,
            _guard: guard,
        })
    }
}

/// Removes the entries of `catalog` overlapping `[address, address + len)`. Entries never
/// overlap each other, so going down from the range's end the first one that ends at or before
/// `address` is where they stop. Allocates nothing: every put of a fresh range comes here twice
/// (its write, then its commit) and usually finds nothing.
fn forget_overlapping(catalog: &mut BTreeMap<u64, CatalogEntry>, address: u64, len: u64) {
    let end = address.saturating_add(len);
    while let Some((&at, entry)) = catalog.range(..end).next_back() {
        if entry.address.saturating_add(entry.len) <= address {
            return;
        }
        catalog.remove(&at);
    }
}

impl Drop for SegmentMemory {
    fn drop(&mut self) {
        // SAFETY: `alloc` came from `alloc_zeroed(self.layout)` and is freed exactly once, here.
        // Views borrow `self`, so none can outlive this point.
        unsafe { std::alloc::dealloc(self.alloc.as_ptr(), self.layout) }
    }
}

/// Bytes of a segment readable while the view lives.
pub struct ReadView<'a> {
    memory: &'a SegmentMemory,
    offset: usize,
    len: usize,
    _guard: RangeGuard<'a>,
}

impl std::ops::Deref for ReadView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `offset + len <= size` was checked when the view was made; the shared range
        // guard excludes any writer of these bytes while the view lives; the allocation outlives
        // the view (it borrows the memory).
        unsafe { std::slice::from_raw_parts(self.memory.ptr.as_ptr().add(self.offset), self.len) }
    }
}

/// Bytes of a segment writable by one holder while the view lives.
pub struct WriteView<'a> {
    memory: &'a SegmentMemory,
    offset: usize,
    len: usize,
    _guard: RangeGuard<'a>,
}

impl std::ops::Deref for WriteView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as for `ReadView`; the exclusive guard makes this view the only accessor.
        unsafe { std::slice::from_raw_parts(self.memory.ptr.as_ptr().add(self.offset), self.len) }
    }
}

impl std::ops::DerefMut for WriteView<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: bounds checked at creation; the exclusive range guard guarantees no other view
        // (shared or exclusive) overlaps these bytes while this one lives, and `&mut self` makes
        // this the only slice derived from the view.
        unsafe {
            std::slice::from_raw_parts_mut(self.memory.ptr.as_ptr().add(self.offset), self.len)
        }
    }
}

impl SegmentMemory {
    /// Copies `[address, address + out.len())` into `out` under the range lock.
    pub(crate) async fn copy_out(
        &self,
        address: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), DataStatus> {
        let view = self.read_view(address, out.len() as u64).await?;
        crate::copy::out_of_store(out, &view);
        Ok(())
    }

    /// Copies `data` to `[address, address + data.len())` under the range lock.
    pub(crate) async fn copy_in(
        &self,
        address: u64,
        data: &[u8],
    ) -> std::result::Result<(), DataStatus> {
        let mut view = self.write_view(address, data.len() as u64).await?;
        crate::copy::into_store(&mut view, data);
        Ok(())
    }
}

/// A segment as a store in this process reaches it: with the node's grant checks and replica
/// claims, so an in-process copy obeys the same rules as a request over the network.
pub(crate) struct LocalView {
    memory: Arc<SegmentMemory>,
    grant_key: Option<Secret>,
    claims: Arc<Claims>,
}

impl LocalView {
    /// `memory` checked with `grant_key` (none: open, like the node's data plane) and `claims`.
    pub(crate) fn new(
        memory: Arc<SegmentMemory>,
        grant_key: Option<Secret>,
        claims: Arc<Claims>,
    ) -> Self {
        Self {
            memory,
            grant_key,
            claims,
        }
    }

    fn admit(
        &self,
        address: u64,
        len: usize,
        grant: &[u8],
        write: bool,
    ) -> std::result::Result<(), DataStatus> {
        let Some(key) = &self.grant_key else {
            return Ok(());
        };
        let id = self.memory.id();
        Grant::open(key, id, grant)
            .and_then(|g| self.claims.admit_range(id, &g, address, len as u64, write))
            .map_err(|_| DataStatus::Forbidden)
    }
}

impl moonkv_dataplane::LocalSegment for LocalView {
    fn read_into<'a>(
        &'a self,
        address: u64,
        out: &'a mut [u8],
        grant: &'a [u8],
    ) -> LocalFuture<'a> {
        Box::pin(async move {
            self.admit(address, out.len(), grant, false)?;
            self.memory.copy_out(address, out).await
        })
    }

    fn write_from<'a>(&'a self, address: u64, data: &'a [u8], grant: &'a [u8]) -> LocalFuture<'a> {
        Box::pin(async move {
            self.admit(address, data.len(), grant, true)?;
            self.memory.copy_in(address, data).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_catalog_entries_a_range_overlaps_are_forgotten() {
        let entry = |address: u64, len: u64| CatalogEntry {
            segment_id: SegmentId::new(0, 1),
            address,
            len,
            replica_id: moonkv_proto::ReplicaId(address + 1),
            epoch: 1,
            write: address,
            tenant: String::new(),
            key: format!("k{address}"),
            size: len,
            checksum: None,
        };
        let mut catalog: BTreeMap<u64, CatalogEntry> = [(0, 100), (100, 100), (300, 100), (500, 8)]
            .into_iter()
            .map(|(a, l)| (a, entry(a, l)))
            .collect();
        let left = |c: &BTreeMap<u64, CatalogEntry>| c.keys().copied().collect::<Vec<u64>>();
        // Ranges that only touch an entry, or fall in a gap, forget nothing.
        forget_overlapping(&mut catalog, 200, 100);
        forget_overlapping(&mut catalog, 400, 100);
        forget_overlapping(&mut catalog, 508, 1 << 20);
        assert_eq!(left(&catalog), [0, 100, 300, 500]);
        // One byte into an entry forgets it; a range over several forgets all of them.
        forget_overlapping(&mut catalog, 507, 1);
        assert_eq!(left(&catalog), [0, 100, 300]);
        forget_overlapping(&mut catalog, 150, 151);
        assert_eq!(left(&catalog), [0]);
        // A range past the end of the address space is cut there.
        forget_overlapping(&mut catalog, 99, u64::MAX);
        assert!(catalog.is_empty());
        forget_overlapping(&mut catalog, 0, 10);
    }

    #[tokio::test]
    async fn segments_start_on_a_huge_page_and_are_zeroed_and_bounds_checked() {
        let seg = SegmentMemory::allocate(SegmentId::new(0, 1), 5000).unwrap();
        assert_ne!(seg.base(), 0);
        assert_eq!(seg.base() % SEGMENT_ALIGN as u64, 0);
        assert_eq!(seg.size(), 8192);
        assert!(seg
            .read_view(seg.base(), 8192)
            .await
            .unwrap()
            .iter()
            .all(|b| *b == 0));
        {
            let mut w = seg.write_view(seg.base() + 10, 3).await.unwrap();
            w.copy_from_slice(b"abc");
        }
        assert_eq!(
            &*seg.read_view(seg.base() + 9, 5).await.unwrap(),
            b"\0abc\0"
        );
        assert_eq!(
            seg.read_view(seg.base() + 8190, 3).await.err(),
            Some(DataStatus::OutOfRange)
        );
        assert_eq!(
            seg.write_view(u64::MAX, 1).await.err(),
            Some(DataStatus::AddressOverflow)
        );
        assert!(SegmentMemory::allocate(SegmentId::new(0, 2), 0).is_err());
    }

    /// The `VmFlags` of the mapping of this process that contains `address` (`/proc/self/smaps`).
    pub(crate) fn vm_flags_at(address: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&address);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.trim().to_string());
                }
            }
        }
        None
    }

    #[tokio::test]
    async fn a_segment_is_advised_to_use_huge_pages_and_keeps_its_bytes() {
        let seg = SegmentMemory::allocate(SegmentId::new(0, 4), 16 << 20).unwrap();
        {
            let mut w = seg.write_view(seg.base() + 4096, 4).await.unwrap();
            w.copy_from_slice(b"keep");
        }
        seg.advise_huge_pages().unwrap();
        assert_eq!(
            &*seg.read_view(seg.base() + 4095, 6).await.unwrap(),
            b"\0keep\0"
        );
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.is_empty() || thp.contains("[never]") {
            return; // the kernel ignores the advice; nothing more to see
        }
        let inside = (seg.base() as usize).next_multiple_of(2 << 20);
        let flags = vm_flags_at(inside).expect("the segment is mapped");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "no MADV_HUGEPAGE on the segment: {flags}"
        );
        // Too small to hold a whole huge page: nothing to advise, no error.
        SegmentMemory::allocate(SegmentId::new(0, 5), 8192)
            .unwrap()
            .advise_huge_pages()
            .unwrap();
    }

    #[test]
    fn a_prefaulted_segment_is_resident_and_still_zeroed() {
        let seg = SegmentMemory::allocate(SegmentId::new(0, 3), 64 << 20).unwrap();
        let resident = || {
            let skip = seg.ptr.as_ptr().align_offset(PAGE_SIZE);
            let pages = (seg.size() as usize - skip) / PAGE_SIZE;
            let mut map = vec![0u8; pages];
            // SAFETY: whole pages of the segment's own range; `map` has one byte per page.
            let rc = unsafe {
                let start = seg.ptr.as_ptr().add(skip);
                libc::mincore(start.cast(), pages * PAGE_SIZE, map.as_mut_ptr())
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            map.iter().filter(|b| *b & 1 == 1).count() * 100 / pages
        };
        assert!(resident() < 50, "pages are committed lazily before");
        seg.prefault().unwrap();
        assert_eq!(resident(), 100, "every page is resident after");
        // SAFETY: the segment's own bytes, nothing else touches them here.
        let bytes = unsafe { std::slice::from_raw_parts(seg.ptr.as_ptr(), seg.size() as usize) };
        assert!(bytes.iter().all(|b| *b == 0));
    }

    #[tokio::test]
    async fn local_copies_are_bounds_checked_like_the_network() {
        use moonkv_dataplane::LocalSegment;
        let seg = Arc::new(SegmentMemory::allocate(SegmentId::new(9, 9), 4096).unwrap());
        let open = LocalView::new(seg.clone(), None, Arc::default());
        open.write_from(seg.base() + 1, b"xyz", &[]).await.unwrap();
        let mut out = [0u8; 5];
        open.read_into(seg.base(), &mut out, &[]).await.unwrap();
        assert_eq!(&out, b"\0xyz\0");
        assert_eq!(
            open.read_into(seg.base() + 4094, &mut out, &[]).await,
            Err(DataStatus::OutOfRange)
        );
    }

    #[tokio::test]
    async fn local_copies_check_grants_and_claims_like_the_network() {
        use moonkv_dataplane::LocalSegment;
        use moonkv_proto::grant;
        let key = Secret::new(b"local-view-grant-secret".to_vec()).unwrap();
        let seg = Arc::new(SegmentMemory::allocate(SegmentId::new(9, 8), 4096).unwrap());
        let view = LocalView::new(seg.clone(), Some(key.clone()), Arc::default());
        let base = seg.base();
        let seal = |replica: u64, issued: u64| {
            Grant::new(grant::READ | grant::WRITE, u64::MAX, base, 64, "t")
                .for_replica(replica, issued)
                .seal(&key, seg.id())
        };
        let (old, new) = (seal(1, 1_000), seal(2, 2_000));
        let mut out = [0u8; 64];
        assert_eq!(
            view.write_from(base, b"x", &[]).await,
            Err(DataStatus::Forbidden)
        );
        view.write_from(base, &[1; 64], &old).await.unwrap();
        view.read_into(base, &mut out, &old).await.unwrap();
        view.write_from(base, &[2; 64], &new).await.unwrap();
        assert_eq!(
            view.read_into(base, &mut out, &old).await,
            Err(DataStatus::Forbidden),
            "a freed replica's grant reads nothing of the next one"
        );
        view.read_into(base, &mut out, &new).await.unwrap();
        assert_eq!(out, [2; 64]);
    }
}
