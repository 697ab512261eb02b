//! The publisher's queue and numbering, free of sockets and threads.
//!
//! Invariants the tests pin down:
//! - event ids are assigned at enqueue, start at 1 and increase by one per enqueued event;
//!   skipped (keyless) events get none;
//! - sequence numbers start at 1 and are consumed by sent batches, by each event dropped
//!   from a full queue (one per event, reserved when it is dropped), and by failed sends
//!   (one per event of the failed batch), so the sequence gaps a subscriber sees add up to
//!   exactly `dropped_events`.

use std::collections::VecDeque;

use crate::codec::{EventKind, KvEvent, StampedEvent};

/// Counters reported by `/kv_events/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Messages handed to the socket.
    pub published_batches: u64,
    /// Events inside those messages.
    pub published_events: u64,
    /// Events lost to a full queue or a failed send; each consumed one sequence number.
    pub dropped_events: u64,
    /// Per-object events not sent because no object key may be (or was) emitted.
    pub skipped_keyless_events: u64,
}

/// Bounded drop-oldest event queue with event-id and sequence bookkeeping.
#[derive(Debug)]
pub struct EventQueue {
    capacity: usize,
    emit_object_key: bool,
    events: VecDeque<StampedEvent>,
    next_event_id: u64,
    next_sequence: u64,
    counters: QueueCounters,
}

impl EventQueue {
    /// A queue holding at most `capacity` events (0 = unbounded).
    pub fn new(capacity: usize, emit_object_key: bool) -> Self {
        let initial = if capacity == 0 {
            1024
        } else {
            capacity.min(4096)
        };
        EventQueue {
            capacity,
            emit_object_key,
            events: VecDeque::with_capacity(initial),
            next_event_id: 1,
            next_sequence: 1,
            counters: QueueCounters::default(),
        }
    }

    /// Enqueues `event` stamped with `timestamp_ms` and returns its event id, or 0 when the
    /// event was skipped because it is a per-object event without an emittable key.
    pub fn push(&mut self, event: KvEvent, timestamp_ms: i64) -> u64 {
        let per_object = event.kind != EventKind::Cleared;
        if per_object && (!self.emit_object_key || event.object_key.is_none()) {
            self.counters.skipped_keyless_events += 1;
            return 0;
        }
        if self.capacity != 0 && self.events.len() >= self.capacity {
            self.events.pop_front();
            self.counters.dropped_events += 1;
            // The dropped event's loss must show up as a gap in the sequence.
            self.next_sequence += 1;
        }
        let event_id = self.next_event_id;
        self.next_event_id += 1;
        self.events.push_back(StampedEvent {
            event_id,
            timestamp_ms,
            event,
        });
        event_id
    }

    /// Moves up to `max` of the oldest events into `out` (which the caller has emptied) and
    /// returns the sequence number of the message they will form, or `None` if empty.
    pub fn take_batch(&mut self, out: &mut Vec<StampedEvent>, max: usize) -> Option<u64> {
        if self.events.is_empty() || max == 0 {
            return None;
        }
        let n = max.min(self.events.len());
        out.extend(self.events.drain(..n));
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        Some(sequence)
    }

    /// Records that a message of `events` events was handed to the socket.
    pub fn record_sent(&mut self, events: usize) {
        self.counters.published_batches += 1;
        self.counters.published_events += events as u64;
    }

    /// Records that sending a message of `events` events failed. The message already
    /// consumed one sequence number; the others are reserved here so the gap equals the
    /// number of lost events.
    pub fn record_failed(&mut self, events: usize) {
        let events = events as u64;
        self.counters.dropped_events += events;
        self.next_sequence += events.saturating_sub(1);
    }

    /// Highest event id assigned so far (0 before the first).
    pub fn last_event_id(&self) -> u64 {
        self.next_event_id - 1
    }

    /// Highest sequence number consumed so far, by a message or reserved for a loss.
    pub fn last_sequence(&self) -> u64 {
        self.next_sequence - 1
    }

    /// Events waiting to be sent.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The status counters.
    pub fn counters(&self) -> QueueCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Medium;

    fn stored(i: u64) -> KvEvent {
        KvEvent::stored("t", format!("k{i}"), Medium::Cpu)
    }

    /// Drains the queue like the socket thread, returning (sequence, event ids) per message.
    fn drain(q: &mut EventQueue) -> Vec<(u64, Vec<u64>)> {
        let mut msgs = Vec::new();
        let mut batch = Vec::new();
        while let Some(seq) = q.take_batch(&mut batch, 64) {
            q.record_sent(batch.len());
            msgs.push((seq, batch.iter().map(|e| e.event_id).collect()));
            batch.clear();
        }
        msgs
    }

    /// Sum of gaps a subscriber would see, counting from an implied sequence 0.
    fn gap_sum(seqs: impl IntoIterator<Item = u64>) -> u64 {
        let mut last = 0;
        let mut missed = 0;
        for s in seqs {
            assert!(s > last, "sequence must strictly increase");
            missed += s - last - 1;
            last = s;
        }
        missed
    }

    #[test]
    fn ids_and_sequences_start_at_one_and_batches_cap_at_64() {
        let mut q = EventQueue::new(0, true);
        for i in 0..130 {
            assert_eq!(q.push(stored(i), 0), i + 1);
        }
        let msgs = drain(&mut q);
        let sizes: Vec<_> = msgs.iter().map(|(_, ids)| ids.len()).collect();
        assert_eq!(sizes, [64, 64, 2]);
        assert_eq!(msgs.iter().map(|m| m.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(msgs[2].1, [129, 130]);
        assert_eq!(q.last_event_id(), 130);
        assert_eq!(q.last_sequence(), 3);
        assert_eq!(q.counters().published_events, 130);
        assert_eq!(q.counters().published_batches, 3);
    }

    #[test]
    fn burst_into_tiny_queue_leaves_gaps_equal_to_drops() {
        let mut q = EventQueue::new(4, true);
        let mut seqs = Vec::new();
        let mut batch = Vec::new();
        for round in 0..50u64 {
            for i in 0..(round % 9) {
                q.push(stored(i), 0);
            }
            // the socket thread sometimes keeps up, sometimes not
            if round % 3 == 0 {
                if let Some(seq) = q.take_batch(&mut batch, 2) {
                    q.record_sent(batch.len());
                    seqs.push(seq);
                    batch.clear();
                }
            }
        }
        seqs.extend(drain(&mut q).into_iter().map(|m| m.0));
        let c = q.counters();
        assert!(c.dropped_events > 0);
        assert_eq!(gap_sum(seqs), c.dropped_events);
        assert_eq!(c.published_events + c.dropped_events, q.last_event_id());
    }

    #[test]
    fn drop_oldest_keeps_the_newest_events() {
        let mut q = EventQueue::new(3, true);
        for i in 0..5 {
            q.push(stored(i), 0);
        }
        let msgs = drain(&mut q);
        assert_eq!(msgs, [(3, vec![3, 4, 5])]);
        assert_eq!(q.counters().dropped_events, 2);
    }

    #[test]
    fn failed_send_reserves_one_sequence_per_lost_event() {
        let mut q = EventQueue::new(0, true);
        for i in 0..10 {
            q.push(stored(i), 0);
        }
        let mut batch = Vec::new();
        assert_eq!(q.take_batch(&mut batch, 4), Some(1));
        q.record_failed(batch.len());
        batch.clear();
        let rest = drain(&mut q);
        assert_eq!(rest[0].0, 5);
        assert_eq!(q.counters().dropped_events, 4);
        assert_eq!(gap_sum(rest.iter().map(|m| m.0)), 4);
    }

    #[test]
    fn keyless_events_are_skipped_without_ids_but_cleared_passes() {
        let mut q = EventQueue::new(0, false);
        assert_eq!(q.push(stored(0), 0), 0);
        assert_eq!(q.push(KvEvent::removed("t", "k", Medium::Disk), 0), 0);
        assert_eq!(q.push(KvEvent::cleared("t"), 0), 1);
        assert_eq!(q.counters().skipped_keyless_events, 2);

        let mut keyed = EventQueue::new(0, true);
        let mut no_key = stored(1);
        no_key.object_key = None;
        assert_eq!(keyed.push(no_key, 0), 0);
        assert_eq!(keyed.push(stored(2), 0), 1);
        assert_eq!(keyed.counters().skipped_keyless_events, 1);
    }

    #[test]
    fn empty_queue_yields_no_batch_and_consumes_no_sequence() {
        let mut q = EventQueue::new(8, true);
        assert_eq!(q.take_batch(&mut Vec::new(), 64), None);
        assert_eq!(q.last_sequence(), 0);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }
}
