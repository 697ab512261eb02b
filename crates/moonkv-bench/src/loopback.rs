//! Publisher → subscriber over loopback TCP at full speed, for `moonkv bench events`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use moonkv_events::{Delivery, EventConfig, EventsError, KvEvent, Medium, Publisher, Subscriber};

const PROBE_TENANT: &str = "__probe__";
const END_TENANT: &str = "__end__";
const BENCH_TENANT: &str = "bench";

/// What to run.
#[derive(Debug, Clone)]
pub struct LoopbackOptions {
    /// Events to publish in the measured phase.
    pub events: u64,
    /// Length of each object key in bytes (at least 8).
    pub key_len: usize,
    /// Publisher queue capacity (0 = unbounded).
    pub queue_capacity: usize,
    /// Give up waiting for the subscriber after this long.
    pub deadline: Duration,
}

impl Default for LoopbackOptions {
    fn default() -> Self {
        LoopbackOptions {
            events: 1_000_000,
            key_len: 32,
            queue_capacity: 0,
            deadline: Duration::from_secs(60),
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Serialize)]
pub struct LoopbackReport {
    /// Events handed to `publish` in the measured phase.
    pub published: u64,
    /// Of those, events the subscriber decoded.
    pub received: u64,
    /// Events the publisher dropped (full queue or failed send).
    pub dropped: u64,
    /// Sequence numbers the subscriber saw skipped.
    pub missed_sequences: u64,
    /// Time spent in `publish` calls.
    pub publish_seconds: f64,
    /// From the first publish to the last event received.
    pub end_to_end_seconds: f64,
    /// `received / end_to_end_seconds`.
    pub events_per_second: f64,
    /// False if the deadline passed before the end marker arrived.
    pub completed: bool,
}

/// Publishes `opts.events` stored events to a subscriber on `127.0.0.1` and measures the
/// rate at which they arrive decoded.
pub fn run_loopback(opts: &LoopbackOptions) -> Result<LoopbackReport, EventsError> {
    let cfg = EventConfig {
        queue_capacity: opts.queue_capacity,
        ..EventConfig::new("loopback", "tcp://127.0.0.1:0")
    };
    let publisher = Publisher::start(cfg)?;
    let mut subscriber = Subscriber::connect(publisher.endpoint(), Duration::from_millis(20))?;
    let joined = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + opts.deadline;

    let sub_joined = Arc::clone(&joined);
    let expected = opts.events;
    let receiver = std::thread::Builder::new()
        .name("moonkv-events-loopback-sub".into())
        .spawn(
            move || -> Result<(u64, Option<Instant>, u64, bool), EventsError> {
                let mut received = 0u64;
                let mut last_at = None;
                while Instant::now() < deadline {
                    let Delivery::Message { message, .. } = subscriber.poll()? else {
                        continue;
                    };
                    sub_joined.store(true, Ordering::Release);
                    for ev in &message.events {
                        match ev.tenant_id.as_deref() {
                            Some(BENCH_TENANT) => received += 1,
                            Some(END_TENANT) => {
                                let missed = subscriber.counters().missed_sequences;
                                return Ok((received, Some(Instant::now()), missed, true));
                            }
                            _ => {}
                        }
                        if expected > 0 && received == expected {
                            // Everything arrived; the end marker is only needed after losses.
                            let missed = subscriber.counters().missed_sequences;
                            return Ok((received, Some(Instant::now()), missed, true));
                        }
                    }
                    last_at = Some(Instant::now());
                }
                Ok((
                    received,
                    last_at,
                    subscriber.counters().missed_sequences,
                    false,
                ))
            },
        )
        .map_err(EventsError::Thread)?;

    // Slow joiner: the subscription needs a moment to reach the publisher.
    for _ in 0..500 {
        if joined.load(Ordering::Acquire) {
            break;
        }
        publisher.publish(KvEvent::cleared(PROBE_TENANT));
        std::thread::sleep(Duration::from_millis(10));
    }

    let key_len = opts.key_len.max(8);
    let events: Vec<KvEvent> = (0..opts.events)
        .map(|i| {
            let key = format!("{i:0>key_len$}");
            KvEvent::stored(
                BENCH_TENANT,
                key,
                if i % 2 == 0 {
                    Medium::Cpu
                } else {
                    Medium::Disk
                },
            )
        })
        .collect();
    let dropped_before = publisher.status().dropped_events;
    let start = Instant::now();
    for ev in events {
        publisher.publish(ev);
    }
    let publish_seconds = start.elapsed().as_secs_f64();
    // Messages over the PUB high-water mark are dropped silently; a lost tail would go
    // unnoticed, so the end marker repeats until the subscriber has finished.
    while !receiver.is_finished() && Instant::now() < deadline {
        publisher.publish(KvEvent::cleared(END_TENANT));
        std::thread::sleep(Duration::from_millis(20));
    }
    let joined_result = receiver.join();
    let dropped = publisher.status().dropped_events - dropped_before;
    publisher.shutdown();
    let (received, last_at, missed_sequences, completed) = joined_result.map_err(|_| {
        EventsError::Thread(std::io::Error::other("loopback subscriber panicked"))
    })??;
    let end_to_end_seconds =
        last_at.map_or(0.0, |t| t.saturating_duration_since(start).as_secs_f64());
    let events_per_second = if end_to_end_seconds > 0.0 {
        received as f64 / end_to_end_seconds
    } else {
        0.0
    };
    Ok(LoopbackReport {
        published: opts.events,
        received,
        dropped,
        missed_sequences,
        publish_seconds,
        end_to_end_seconds,
        events_per_second,
        completed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_runner_delivers_everything() {
        let report = run_loopback(&LoopbackOptions {
            events: 20_000,
            key_len: 24,
            queue_capacity: 0,
            deadline: Duration::from_secs(30),
        })
        .expect("loopback runs");
        assert!(report.completed, "{report:?}");
        assert_eq!(report.received, 20_000);
        assert_eq!(report.dropped, 0);
        assert!(report.events_per_second > 0.0);
    }
}
