//! Keeps a [`PlacementIndex`] exact across joins, losses and publisher restarts.
//!
//! Recovery, as documented in `docs/events.md`: while recovering, incoming events are
//! buffered; a snapshot (placement + watermark H) replaces the index's state for the
//! snapshot's backend (and tenant, if scoped); then buffered and later events with
//! `event_id > H` are applied in order and those `<= H` ignored. Live, every event id must
//! be exactly one more than the previous; anything else (a lost message, a slow-joining
//! subscription, a restarted publisher whose ids begin again at 1) triggers a new recovery.
//! A transport gap or restart triggers one too; a restart also discards the buffered events
//! of the old stream, never the new ones.
//!
//! Without a snapshot source the index cannot be reconciled, so a loss invalidates it
//! instead (everything, or everything of the scoped tenant) and it rebuilds from new events.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::decode::DecodedEvent;
use super::index::{ApplyOutcome, PlacementIndex};
use super::snapshot::{Snapshot, SnapshotSource};
use super::stream::SequenceVerdict;
use crate::error::EventsError;

/// Default pause between failed snapshot fetches.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Default bound on events buffered while a snapshot is fetched.
pub const DEFAULT_MAX_BUFFERED_EVENTS: usize = 1_000_000;

/// Counters of the recovery machinery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SyncCounters {
    /// Snapshots applied successfully (including the initial one).
    pub recoveries: u64,
    /// Snapshot fetches that failed.
    pub recovery_failures: u64,
    /// Snapshots applied that still left a hole before the buffered events (retried).
    pub incomplete_recoveries: u64,
    /// Index wipes because of a loss with no snapshot source.
    pub invalidations: u64,
    /// Event-id discontinuities seen while live.
    pub event_id_discontinuities: u64,
    /// Events applied to the index.
    pub applied_events: u64,
    /// Buffered events skipped because the snapshot already covered them.
    pub covered_by_snapshot: u64,
    /// Events outside the tenant scope.
    pub out_of_scope_events: u64,
    /// Events that lack a backend, tenant, key or known medium.
    pub unindexable_events: u64,
    /// Buffered events discarded because the buffer was full.
    pub buffer_overflows: u64,
}

enum State {
    Recovering { buffer: VecDeque<DecodedEvent> },
    Live { last_event_id: Option<u64> },
}

/// The placement index plus the recovery state machine that keeps it exact.
pub struct IndexSync {
    index: PlacementIndex,
    source: Option<Box<dyn SnapshotSource + Send>>,
    tenant: Option<String>,
    state: State,
    retry_at: Option<Instant>,
    retry_interval: Duration,
    max_buffered: usize,
    last_epoch: Option<u64>,
    /// The watermark of the snapshot just applied, until an event past it arrives: events
    /// queued while the snapshot was fetched carry ids up to it, and are skipped as covered.
    /// Any other id at or below the last one means a restarted publisher.
    covered_through: Option<u64>,
    counters: SyncCounters,
}

impl std::fmt::Debug for IndexSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexSync")
            .field("tenant", &self.tenant)
            .field("live", &self.is_live())
            .field("objects", &self.index.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl IndexSync {
    /// An index for every tenant (or only `tenant`), reconciled through `source` if given.
    /// With a source it starts in recovery, so the first [`IndexSync::recover`] loads a snapshot.
    pub fn new(source: Option<Box<dyn SnapshotSource + Send>>, tenant: Option<String>) -> Self {
        let state = match source {
            Some(_) => State::Recovering {
                buffer: VecDeque::new(),
            },
            None => State::Live {
                last_event_id: None,
            },
        };
        IndexSync {
            index: PlacementIndex::new(),
            source,
            tenant,
            state,
            retry_at: None,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            max_buffered: DEFAULT_MAX_BUFFERED_EVENTS,
            last_epoch: None,
            covered_through: None,
            counters: SyncCounters::default(),
        }
    }

    /// Sets the pause between failed fetches.
    pub fn with_retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Sets the bound on events buffered during recovery (oldest dropped beyond it).
    pub fn with_max_buffered_events(mut self, max: usize) -> Self {
        self.max_buffered = max.max(1);
        self
    }

    /// The index.
    pub fn index(&self) -> &PlacementIndex {
        &self.index
    }

    /// The counters.
    pub fn counters(&self) -> SyncCounters {
        self.counters
    }

    /// True when the index is believed exact (not waiting for a snapshot).
    pub fn is_live(&self) -> bool {
        matches!(self.state, State::Live { .. })
    }

    /// True when a snapshot is needed before the index is exact again.
    pub fn needs_recovery(&self) -> bool {
        !self.is_live()
    }

    /// Epoch of the publisher the last snapshot came from.
    pub fn snapshot_epoch(&self) -> Option<u64> {
        self.last_epoch
    }

    /// Feeds one message's events, with the transport verdict for its sequence number.
    pub fn on_message(&mut self, verdict: SequenceVerdict, events: &[DecodedEvent]) {
        match verdict {
            SequenceVerdict::Restart { .. } => self.lose(true),
            SequenceVerdict::Gap { .. } => self.lose(false),
            SequenceVerdict::First | SequenceVerdict::InOrder => {}
        }
        for ev in events {
            self.on_event(ev);
        }
    }

    fn on_event(&mut self, ev: &DecodedEvent) {
        if let (
            State::Live {
                last_event_id: Some(last),
            },
            Some(id),
        ) = (&self.state, ev.event_id)
        {
            let last = *last;
            if id <= last && self.covered_through.is_some_and(|w| id <= w) {
                // Messages queued in the socket while the snapshot was fetched carry events the
                // snapshot already reflects. The transport sequence was in order (a restart or
                // a gap would have sent us to recovery before this event), so skip them instead
                // of refetching: on a busy master the refetch would never settle.
                self.counters.covered_by_snapshot += 1;
                return;
            }
            if id <= last {
                // Ids moving backwards with no snapshot to explain them: a restarted publisher
                // whose transport sequence happened to continue where the old one stopped. Its
                // events are new; reconcile against it rather than dropping them.
                self.counters.event_id_discontinuities += 1;
                tracing::info!(
                    last,
                    id,
                    "event ids moved backwards; the publisher restarted"
                );
                self.lose(true);
            } else if id != last.wrapping_add(1) {
                self.counters.event_id_discontinuities += 1;
                tracing::info!(last, id, "event id discontinuity; reconciling placement");
                // Whatever came before this event (old stream or lost events) is moot.
                self.lose(true);
            }
        }
        match &mut self.state {
            State::Recovering { buffer } => {
                // Ids moving backwards inside the buffer mean a restarted publisher whose
                // transport sequence happened to look like a gap: drop the old stream.
                let back_id = buffer.back().and_then(|b| b.event_id);
                if let (Some(prev), Some(id)) = (back_id, ev.event_id) {
                    if id <= prev {
                        buffer.clear();
                    }
                }
                if buffer.len() >= self.max_buffered {
                    buffer.pop_front();
                    self.counters.buffer_overflows += 1;
                }
                buffer.push_back(ev.clone());
            }
            State::Live { last_event_id } => {
                *last_event_id = ev.event_id.or(*last_event_id);
                if let (Some(w), Some(id)) = (self.covered_through, ev.event_id) {
                    if id > w {
                        self.covered_through = None;
                    }
                }
                self.apply(ev);
            }
        }
    }

    /// Reacts to lost or superseded events: with a source, (re)enter recovery, dropping
    /// buffered events if they belong to a superseded stream; without, wipe the scope.
    fn lose(&mut self, superseded: bool) {
        self.covered_through = None;
        if self.source.is_none() {
            match &self.tenant {
                Some(t) => {
                    self.index.clear_tenant_everywhere(t);
                }
                None => self.index.clear(),
            }
            self.counters.invalidations += 1;
            self.state = State::Live {
                last_event_id: None,
            };
            return;
        }
        match &mut self.state {
            State::Recovering { buffer } if superseded => buffer.clear(),
            State::Recovering { .. } => {}
            State::Live { .. } => {
                self.state = State::Recovering {
                    buffer: VecDeque::new(),
                };
                self.retry_at = None;
            }
        }
    }

    fn apply(&mut self, ev: &DecodedEvent) {
        if let Some(scope) = &self.tenant {
            if ev.tenant_id.as_deref() != Some(scope.as_str()) {
                self.counters.out_of_scope_events += 1;
                return;
            }
        }
        match self.index.apply(ev) {
            ApplyOutcome::Unindexable(reason) => {
                self.counters.unindexable_events += 1;
                tracing::debug!(reason, "event not indexable");
            }
            ApplyOutcome::Changed | ApplyOutcome::Unchanged => self.counters.applied_events += 1,
        }
    }

    /// Fetches and applies a snapshot if one is needed and the retry pause has passed.
    /// Returns `Ok(true)` when the index became live.
    pub fn recover(&mut self, now: Instant) -> Result<bool, EventsError> {
        if self.is_live() {
            return Ok(false);
        }
        if self.retry_at.is_some_and(|at| now < at) {
            return Ok(false);
        }
        let Some(source) = self.source.as_mut() else {
            return Ok(false);
        };
        let snapshot = match source.fetch(self.tenant.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                self.counters.recovery_failures += 1;
                self.retry_at = Some(now + self.retry_interval);
                return Err(e);
            }
        };
        Ok(self.apply_snapshot(snapshot, now))
    }

    /// Replaces the scope's state with `snapshot` and replays buffered events past its
    /// watermark. Returns true when that left the index live.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot, now: Instant) -> bool {
        let buffer = match std::mem::replace(
            &mut self.state,
            State::Live {
                last_event_id: None,
            },
        ) {
            State::Recovering { buffer } => buffer,
            State::Live { .. } => VecDeque::new(),
        };
        self.replace_scope(&snapshot);
        if self
            .last_epoch
            .is_some_and(|e| e != snapshot.publisher_epoch)
        {
            tracing::info!(epoch = snapshot.publisher_epoch, "publisher epoch changed");
        }
        self.last_epoch = Some(snapshot.publisher_epoch);

        let mut last = snapshot.watermark_event_id;
        let mut pending = buffer.into_iter();
        while let Some(ev) = pending.next() {
            match ev.event_id {
                Some(id) if id <= last => self.counters.covered_by_snapshot += 1,
                Some(id) if id != last + 1 => {
                    // Events between the watermark and this one never reached us.
                    self.counters.incomplete_recoveries += 1;
                    let mut rest: VecDeque<_> = std::iter::once(ev).collect();
                    rest.extend(pending);
                    self.state = State::Recovering { buffer: rest };
                    self.retry_at = Some(now);
                    tracing::info!(
                        watermark = last,
                        next = id,
                        "snapshot older than buffered events; refetching"
                    );
                    return false;
                }
                Some(id) => {
                    last = id;
                    self.apply(&ev);
                }
                None => self.apply(&ev),
            }
        }
        self.counters.recoveries += 1;
        self.covered_through = Some(snapshot.watermark_event_id);
        self.retry_at = None;
        self.state = State::Live {
            last_event_id: Some(last),
        };
        tracing::info!(
            watermark = snapshot.watermark_event_id,
            resumed_at = last,
            objects = self.index.len(),
            "placement recovered"
        );
        true
    }

    fn replace_scope(&mut self, snapshot: &Snapshot) {
        let backend = snapshot.backend_id.as_str();
        match &self.tenant {
            Some(t) => {
                self.index.clear_tenant(backend, t);
            }
            None => {
                self.index.clear_backend(backend);
            }
        }
        for obj in &snapshot.objects {
            if self.tenant.as_deref().is_some_and(|t| t != obj.tenant_id) {
                continue;
            }
            for &m in &obj.media {
                self.index
                    .store(backend, &obj.tenant_id, &obj.object_key, m);
            }
        }
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
