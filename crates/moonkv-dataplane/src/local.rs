//! In-process segments. A node embedded in a process registers its segments in a
//! [`LocalSegments`] handle and gives a clone of that handle to the stores it should serve
//! directly: their reads and writes of those segments become memory copies, with the same
//! bounds checks and range locks as the network path. Nothing is process-global: a store only
//! sees the segments of the nodes whose handle it was given.

use crate::header::DataStatus;
use moonkv_proto::SegmentId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

/// A boxed future borrowing its arguments (what [`LocalSegment`] methods return).
pub type LocalFuture<'a> = Pin<Box<dyn Future<Output = Result<(), DataStatus>> + Send + 'a>>;

/// One segment's bytes, as a store in the same process reaches them. `grant` is the replica's
/// grant (empty when the master issued none); a node that checks grants checks it here as it
/// would for a request over the network.
pub trait LocalSegment: Send + Sync {
    /// Copies `[address, address + out.len())` into `out`, waiting for overlapping writers.
    fn read_into<'a>(&'a self, address: u64, out: &'a mut [u8], grant: &'a [u8])
        -> LocalFuture<'a>;
    /// Copies `data` to `[address, address + data.len())`, waiting for overlapping holders.
    fn write_from<'a>(&'a self, address: u64, data: &'a [u8], grant: &'a [u8]) -> LocalFuture<'a>;
}

/// Segments served by nodes of this process, shared by a node and the stores it embeds in.
///
/// Holds weak references: a segment dropped by its node disappears from the handle.
#[derive(Clone, Default)]
pub struct LocalSegments {
    segments: Arc<Mutex<HashMap<SegmentId, Weak<dyn LocalSegment>>>>,
}

impl std::fmt::Debug for LocalSegments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSegments")
            .field("segments", &self.segments.lock().len())
            .finish()
    }
}

impl LocalSegments {
    /// An empty handle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `segment` reachable under `id` by every holder of this handle.
    pub fn register(&self, id: SegmentId, segment: &Arc<dyn LocalSegment>) {
        let mut map = self.segments.lock();
        map.retain(|_, weak| weak.strong_count() > 0);
        map.insert(id, Arc::downgrade(segment));
    }

    /// Hides segment `id` (unmounted or about to be freed).
    pub fn unregister(&self, id: SegmentId) {
        self.segments.lock().remove(&id);
    }

    /// The segment `id`, if a node sharing this handle still serves it.
    pub fn get(&self, id: SegmentId) -> Option<Arc<dyn LocalSegment>> {
        self.segments.lock().get(&id).and_then(Weak::upgrade)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Zeroes;

    impl LocalSegment for Zeroes {
        fn read_into<'a>(&'a self, _: u64, out: &'a mut [u8], _: &'a [u8]) -> LocalFuture<'a> {
            out.fill(0);
            Box::pin(async { Ok(()) })
        }
        fn write_from<'a>(&'a self, _: u64, _: &'a [u8], _: &'a [u8]) -> LocalFuture<'a> {
            Box::pin(async { Err(DataStatus::OutOfRange) })
        }
    }

    #[test]
    fn a_handle_forgets_dropped_and_unregistered_segments() {
        let handle = LocalSegments::new();
        let other = LocalSegments::new();
        let seg: Arc<dyn LocalSegment> = Arc::new(Zeroes);
        handle.register(SegmentId::new(9, 9), &seg);
        assert!(handle.get(SegmentId::new(9, 9)).is_some());
        assert!(
            other.get(SegmentId::new(9, 9)).is_none(),
            "handles are not process-global"
        );
        handle.clone().unregister(SegmentId::new(9, 9));
        assert!(handle.get(SegmentId::new(9, 9)).is_none());
        handle.register(SegmentId::new(9, 9), &seg);
        drop(seg);
        assert!(handle.get(SegmentId::new(9, 9)).is_none());
    }
}
