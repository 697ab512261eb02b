//! Memory the caller registered with `register_buffer`: the only raw addresses the zero-copy
//! calls ever turn into slices.
//!
//! A range is used only after checking that it lies inside one registered buffer; a call holds
//! a lease on every buffer it touches, and `unregister_buffer` waits for those leases, so the
//! caller may free the memory as soon as it returns.

// Unsafe here: turning a registered address range into a slice (`slice`, `slice_mut`). Sound
// while the range lies inside a registration and the caller holds its lease, so
// `unregister_buffer` cannot return (and the memory be freed) during the call.
#![allow(unsafe_code)]

use crate::errors::invalid;
use moonkv_proto::Error;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One registered buffer.
struct Region {
    start: usize,
    len: usize,
    /// Calls currently reading or writing inside the buffer.
    users: Mutex<usize>,
    idle: Condvar,
    /// Standalone mode's memory pool: registered for the store's whole life; registering or
    /// unregistering memory inside it is accepted and changes nothing.
    pool: bool,
}

impl Region {
    fn new(start: usize, len: usize, pool: bool) -> Arc<Region> {
        Arc::new(Region {
            start,
            len,
            users: Mutex::new(0),
            idle: Condvar::new(),
            pool,
        })
    }
}

/// The registered buffers of one store, keyed by start address.
#[derive(Default)]
pub(crate) struct Registry {
    regions: RwLock<BTreeMap<usize, Arc<Region>>>,
    /// Buffers registered inside standalone mode's pool (start → length). The pool stays the
    /// region that is leased, but a range that starts inside such a buffer must also end inside
    /// it, as a range must inside any registered buffer: a caller that registered 32 bytes and
    /// asks for bytes 30..34 is refused, not allowed to run into its pool neighbour.
    pool_buffers: RwLock<BTreeMap<usize, usize>>,
}

/// A caller range `[ptr, ptr + len)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Range {
    pub ptr: usize,
    pub len: usize,
}

/// Keeps the buffers a call uses registered until it is dropped.
pub(crate) struct Lease {
    regions: Vec<Arc<Region>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        for region in &self.regions {
            let mut users = region.users.lock();
            *users -= 1;
            if *users == 0 {
                region.idle.notify_all();
            }
        }
    }
}

impl Registry {
    /// Registers `[ptr, ptr + size)`. Registering the same range again is a no-op; a range that
    /// overlaps another registered buffer is refused.
    pub(crate) fn register(&self, ptr: usize, size: usize) -> Result<(), Error> {
        if ptr == 0 || size == 0 {
            return Err(invalid(format!(
                "cannot register buffer_ptr={ptr:#x} size={size}: both must be non-zero"
            )));
        }
        let end = ptr
            .checked_add(size)
            .filter(|_| size <= isize::MAX as usize)
            .ok_or_else(|| invalid(format!("buffer {ptr:#x}+{size} wraps the address space")))?;
        let mut regions = self.regions.write();
        if let Some(existing) = regions.get(&ptr) {
            if existing.len == size {
                return Ok(());
            }
        }
        if find(&regions, Range { ptr, len: size }).is_ok_and(|r| r.pool) {
            self.pool_buffers.write().insert(ptr, size);
            return Ok(());
        }
        let before = regions.range(..end).next_back();
        if let Some((_, other)) = before {
            if other.start + other.len > ptr {
                return Err(invalid(format!(
                    "buffer {ptr:#x}+{size} overlaps the registered buffer {:#x}+{}",
                    other.start, other.len
                )));
            }
        }
        regions.insert(ptr, Region::new(ptr, size, false));
        Ok(())
    }

    /// Registers standalone mode's memory pool for the life of the store.
    pub(crate) fn register_pool(&self, ptr: usize, size: usize) -> Result<(), Error> {
        let mut regions = self.regions.write();
        if !regions.is_empty() {
            return Err(invalid(
                "the memory pool is registered before any other buffer",
            ));
        }
        regions.insert(ptr, Region::new(ptr, size, true));
        Ok(())
    }

    /// Whether `range` lies inside one registered buffer.
    pub(crate) fn covers(&self, range: Range) -> bool {
        self.find_for_use(&self.regions.read(), range).is_ok()
    }

    /// The registered buffer a call may use `range` of: [`find`], and for pool memory also
    /// [`Registry::within_pool_buffer`].
    fn find_for_use<'r>(
        &self,
        regions: &'r BTreeMap<usize, Arc<Region>>,
        range: Range,
    ) -> Result<&'r Arc<Region>, Error> {
        let region = find(regions, range)?;
        self.within_pool_buffer(region, range)?;
        Ok(region)
    }

    /// For a range inside the pool: when it starts inside a buffer registered there, it must
    /// end inside that buffer too.
    fn within_pool_buffer(&self, region: &Region, range: Range) -> Result<(), Error> {
        if !region.pool {
            return Ok(());
        }
        let buffers = self.pool_buffers.read();
        let Some((&start, &len)) = buffers.range(..=range.ptr).next_back() else {
            return Ok(());
        };
        let end = start + len;
        if range.ptr < end && range.ptr + range.len > end {
            return Err(invalid(format!(
                "buffer {:#x}+{} runs past the end of the registered buffer {start:#x}+{len}",
                range.ptr, range.len
            )));
        }
        Ok(())
    }

    /// Unregisters the buffer that starts at `ptr`, after the calls using it have finished.
    /// Blocks; call it without the GIL.
    pub(crate) fn unregister(&self, ptr: usize) -> Result<(), Error> {
        let mut regions = self.regions.write();
        if find(&regions, Range { ptr, len: 1 }).is_ok_and(|r| r.pool) {
            self.pool_buffers.write().remove(&ptr);
            return Ok(());
        }
        let region = regions
            .remove(&ptr)
            .ok_or_else(|| invalid(format!("no buffer is registered at {ptr:#x}")))?;
        // Calls that use the buffer need the registry to finish.
        drop(regions);
        let mut users = region.users.lock();
        while *users > 0 {
            region.idle.wait(&mut users);
        }
        Ok(())
    }

    /// Leases the buffers holding each range. One error per range that is not inside a
    /// registered buffer; the lease covers the others.
    pub(crate) fn lease(&self, ranges: &[Range]) -> (Lease, Vec<Option<Error>>) {
        let regions = self.regions.read();
        let mut held: Vec<Arc<Region>> = Vec::new();
        let mut errors = Vec::with_capacity(ranges.len());
        for range in ranges {
            match self.find_for_use(&regions, *range) {
                Ok(region) => {
                    if !held.iter().any(|r| Arc::ptr_eq(r, region)) {
                        *region.users.lock() += 1;
                        held.push(region.clone());
                    }
                    errors.push(None);
                }
                Err(e) => errors.push(Some(e)),
            }
        }
        (Lease { regions: held }, errors)
    }
}

fn find(regions: &BTreeMap<usize, Arc<Region>>, range: Range) -> Result<&Arc<Region>, Error> {
    let outside = || {
        invalid(format!(
            "buffer {:#x}+{} is not inside a registered buffer (register_buffer first)",
            range.ptr, range.len
        ))
    };
    let end = range.ptr.checked_add(range.len).ok_or_else(outside)?;
    let (_, region) = regions
        .range(..=range.ptr)
        .next_back()
        .ok_or_else(outside)?;
    if range.ptr == 0 || end > region.start + region.len {
        return Err(outside());
    }
    Ok(region)
}

/// Marks every range that overlaps another one: two writable slices must never alias.
pub(crate) fn overlapping(ranges: &[Range]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].len > 0).collect();
    order.sort_by_key(|&i| ranges[i].ptr);
    let mut marks = vec![false; ranges.len()];
    // The furthest end seen so far, and which range reached it.
    let mut reach: Option<(usize, usize)> = None;
    for &i in &order {
        let r = ranges[i];
        if let Some((end, owner)) = reach {
            if r.ptr < end {
                marks[i] = true;
                marks[owner] = true;
            }
        }
        let end = r.ptr.saturating_add(r.len);
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, i));
        }
    }
    marks
}

/// The bytes of a range the registry checked. The lease must outlive the slice.
///
/// # Safety
/// `range` must lie inside a buffer covered by a live `Lease`, and the caller's promise at
/// registration (the memory stays valid and is not used by others during the call) must hold.
pub(crate) unsafe fn slice(range: Range, _lease: &Lease) -> &[u8] {
    if range.len == 0 {
        return &[];
    }
    // SAFETY: see the function contract; the range was bounds-checked against the registration.
    unsafe { std::slice::from_raw_parts(range.ptr as *const u8, range.len) }
}

/// The bytes of a range the registry checked, for writing.
///
/// # Safety
/// As [`slice`], and no other slice handed out for this call may overlap it
/// ([`overlapping`]).
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn slice_mut(range: Range, _lease: &Lease) -> &mut [u8] {
    if range.len == 0 {
        return &mut [];
    }
    // SAFETY: see the function contract.
    unsafe { std::slice::from_raw_parts_mut(range.ptr as *mut u8, range.len) }
}
