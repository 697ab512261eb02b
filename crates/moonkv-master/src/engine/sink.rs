//! The one narrow interface through which availability changes leave the engine.
//!
//! The engine never talks to the event publisher directly: it reports, per object and medium,
//! that the object became available (`stored`) or stopped being available (`removed`), and that a
//! tenant was emptied (`cleared`). Calls are made while the object's shard lock is held, so their
//! order is the commit order and a snapshot taken under all shard locks is exact.

use moonkv_proto::TenantId;

pub use moonkv_proto::Medium;

fn bit(m: Medium) -> u8 {
    match m {
        Medium::Cpu => 1,
        Medium::Disk => 2,
    }
}

/// Receiver of availability changes (the event publisher hangs off it).
pub trait AvailabilitySink: Send + Sync {
    /// `key` gained its first readable replica in `medium`.
    fn stored(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium);
    /// `key` lost its last readable replica in `medium`.
    fn removed(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium);
    /// Every object of `tenant` was removed.
    fn cleared(&self, tenant: &TenantId);
    /// Highest event id assigned so far (snapshot watermark); 0 when none.
    fn last_event_id(&self) -> u64;
    /// Runs `work`, after which the changes it reported on this thread leave from this thread,
    /// waking no other (the master answering a request: [`super::Engine::reporting_inline`]).
    /// By default it only runs `work`.
    fn inline(&self, work: &mut dyn FnMut()) {
        work()
    }
    /// Like [`AvailabilitySink::inline`], but the changes `work` reported leave when the value
    /// it returns is dropped, from the thread that drops it (`None`: nothing to send). By
    /// default it only runs `work`.
    fn inline_deferred(&self, work: &mut dyn FnMut()) -> Option<Box<dyn Send>> {
        work();
        None
    }
}

/// A sink that drops everything (events disabled).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSink;

impl AvailabilitySink for NoopSink {
    fn stored(&self, _: &TenantId, _: &str, _: Option<&str>, _: Medium) {}
    fn removed(&self, _: &TenantId, _: &str, _: Option<&str>, _: Medium) {}
    fn cleared(&self, _: &TenantId) {}
    fn last_event_id(&self) -> u64 {
        0
    }
}

/// A small set of media, one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MediaSet(u8);

impl MediaSet {
    /// The empty set.
    pub(crate) const EMPTY: MediaSet = MediaSet(0);

    /// Adds `m`.
    pub(crate) fn insert(&mut self, m: Medium) {
        self.0 |= bit(m);
    }

    /// Whether `m` is present.
    pub(crate) fn contains(self, m: Medium) -> bool {
        self.0 & bit(m) != 0
    }

    /// Whether no medium is present.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Media in the set, in event order.
    pub(crate) fn iter(self) -> impl Iterator<Item = Medium> {
        Medium::ALL.into_iter().filter(move |m| self.contains(*m))
    }
}

/// Reports the difference between the media an object was available in before and after a
/// change: `removed` for lost media first, then `stored` for gained ones.
pub(crate) fn emit_diff(
    sink: &dyn AvailabilitySink,
    tenant: &TenantId,
    key: &str,
    group_id: Option<&str>,
    before: MediaSet,
    after: MediaSet,
) {
    if before == after {
        return;
    }
    for m in Medium::ALL {
        if before.contains(m) && !after.contains(m) {
            sink.removed(tenant, key, group_id, m);
        }
    }
    for m in Medium::ALL {
        if !before.contains(m) && after.contains(m) {
            sink.stored(tenant, key, group_id, m);
        }
    }
}
