//! Sequence tracking for one connection: in order, gap, or a publisher restart.

use serde::Serialize;

/// How one message's sequence number relates to the previous one on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum SequenceVerdict {
    /// The first message seen on this connection; nothing to compare with.
    First,
    /// Exactly one more than the previous message.
    InOrder,
    /// Messages (or, for moonkv and Mooncake publishers, events) were lost.
    Gap {
        /// How many sequence numbers were skipped.
        missed: u64,
    },
    /// The sequence did not move forward: the publisher restarted (its counter begins
    /// again at 1 with no reset signal). The new events are valid and must be kept.
    Restart {
        /// The last sequence seen before the restart.
        previous: u64,
    },
}

impl SequenceVerdict {
    /// True for gaps and restarts, after which derived state must be reconciled.
    pub fn is_discontinuity(self) -> bool {
        matches!(
            self,
            SequenceVerdict::Gap { .. } | SequenceVerdict::Restart { .. }
        )
    }
}

/// Transport-level counters for one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StreamCounters {
    /// Messages whose sequence was observed.
    pub messages: u64,
    /// Gaps seen.
    pub gaps: u64,
    /// Sequence numbers skipped over all gaps.
    pub missed_sequences: u64,
    /// Backward moves (publisher restarts).
    pub restarts: u64,
}

/// Watches the sequence numbers of one connection.
#[derive(Debug, Clone, Default)]
pub struct StreamTracker {
    last: Option<u64>,
    counters: StreamCounters,
}

impl StreamTracker {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies `sequence` against the previous one and remembers it.
    pub fn observe(&mut self, sequence: u64) -> SequenceVerdict {
        self.counters.messages += 1;
        let verdict = match self.last {
            None => SequenceVerdict::First,
            Some(last) if sequence == last.wrapping_add(1) => SequenceVerdict::InOrder,
            Some(last) if sequence > last => {
                let missed = sequence - last - 1;
                self.counters.gaps += 1;
                self.counters.missed_sequences += missed;
                SequenceVerdict::Gap { missed }
            }
            Some(previous) => {
                self.counters.restarts += 1;
                SequenceVerdict::Restart { previous }
            }
        };
        self.last = Some(sequence);
        verdict
    }

    /// The last sequence number observed.
    pub fn last_sequence(&self) -> Option<u64> {
        self.last
    }

    /// Forgets the last sequence (for a new connection); counters are kept.
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// The counters so far.
    pub fn counters(&self) -> StreamCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_in_order_gap_and_restart() {
        let mut t = StreamTracker::new();
        assert_eq!(t.observe(5), SequenceVerdict::First);
        assert_eq!(t.observe(6), SequenceVerdict::InOrder);
        assert_eq!(t.observe(9), SequenceVerdict::Gap { missed: 2 });
        assert_eq!(t.observe(10), SequenceVerdict::InOrder);
        assert_eq!(t.observe(1), SequenceVerdict::Restart { previous: 10 });
        assert_eq!(t.observe(2), SequenceVerdict::InOrder);
        // a repeat is not progress either: the publisher may have restarted and caught up
        assert_eq!(t.observe(2), SequenceVerdict::Restart { previous: 2 });
        let c = t.counters();
        assert_eq!(
            (c.messages, c.gaps, c.missed_sequences, c.restarts),
            (7, 1, 2, 2)
        );
        assert_eq!(t.last_sequence(), Some(2));
    }

    #[test]
    fn first_sequence_may_be_anything_and_reset_forgets_it() {
        let mut t = StreamTracker::new();
        assert_eq!(t.observe(u64::MAX), SequenceVerdict::First);
        t.reset();
        assert_eq!(t.observe(0), SequenceVerdict::First);
        assert_eq!(t.observe(1), SequenceVerdict::InOrder);
        assert!(!SequenceVerdict::InOrder.is_discontinuity());
        assert!(SequenceVerdict::Gap { missed: 1 }.is_discontinuity());
    }
}
