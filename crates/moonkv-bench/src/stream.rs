//! Publisher → subscriber on loopback at a fixed offered rate, to check that a stream the
//! subscriber can keep up with arrives whole (no drops, no sequence gaps). The unpaced
//! firehose is `moonkv_events::run_loopback`.

use moonkv_events::{Delivery, EventConfig, KvEvent, Medium, Publisher, Subscriber};
use serde::Serialize;
use std::time::{Duration, Instant};

const BENCH_TENANT: &str = "bench";
const PROBE_TENANT: &str = "__probe__";
const END_TENANT: &str = "__end__";
/// Publishing is scheduled in 1 ms slices: a burst, then a sleep to the next slice.
const SLICE: Duration = Duration::from_millis(1);

/// What a paced run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PacedReport {
    /// Offered events per second.
    pub offered_per_s: f64,
    /// Events published in the measured phase.
    pub published: u64,
    /// Of those, events the subscriber decoded.
    pub received: u64,
    /// Events the publisher dropped (queue overrun or failed send).
    pub dropped: u64,
    /// Sequence numbers the subscriber saw skipped.
    pub missed_sequences: u64,
    /// Achieved publish rate.
    pub publish_per_s: f64,
    /// Received events over the time from the first publish to the last arrival.
    pub end_to_end_per_s: f64,
    /// False if the subscriber never saw the end of the run.
    pub completed: bool,
}

/// Publishes `events` stored events at `rate` per second (default queue capacity) to a
/// subscriber on 127.0.0.1 and reports what arrived.
pub fn paced_loopback(events: u64, rate: u64, key_len: usize) -> anyhow::Result<PacedReport> {
    anyhow::ensure!(rate > 0, "the offered rate must be positive");
    let publisher = Publisher::start(EventConfig::new("moonkv-bench", "tcp://127.0.0.1:0"))?;
    let mut subscriber = Subscriber::connect(publisher.endpoint(), Duration::from_millis(20))?;
    join(&publisher, &mut subscriber)?;
    let missed_before = subscriber.counters().missed_sequences;
    let dropped_before = publisher.status().dropped_events;
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_secs(events / rate);

    let receiver = std::thread::Builder::new()
        .name("moonkv-bench-sub".into())
        .spawn(move || receive(subscriber, events, deadline))?;

    let key_len = key_len.max(8);
    let batch: Vec<KvEvent> = (0..events)
        .map(|i| KvEvent::stored(BENCH_TENANT, format!("{i:0>key_len$}"), Medium::Cpu))
        .collect();
    let per_slice = (rate as f64 * SLICE.as_secs_f64()).ceil().max(1.0) as usize;
    let started = Instant::now();
    for (i, ev) in batch.into_iter().enumerate() {
        if i % per_slice == 0 {
            // An absolute schedule, so a late wake-up is caught up rather than accumulated.
            let due = started + SLICE * (i / per_slice) as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        publisher.publish(ev);
    }
    let publish_seconds = started.elapsed().as_secs_f64();
    // Messages over the PUB high-water mark vanish silently, so the end marker repeats.
    while !receiver.is_finished() && Instant::now() < deadline {
        publisher.publish(KvEvent::cleared(END_TENANT));
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcome = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the benchmark subscriber panicked"))??;
    let dropped = publisher.status().dropped_events - dropped_before;
    publisher.shutdown();
    let elapsed = outcome
        .last_arrival
        .map_or(0.0, |t| t.saturating_duration_since(started).as_secs_f64());
    let rate_of = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    Ok(PacedReport {
        offered_per_s: rate as f64,
        published: events,
        received: outcome.received,
        dropped,
        missed_sequences: outcome.missed_sequences - missed_before,
        publish_per_s: rate_of(events, publish_seconds),
        end_to_end_per_s: rate_of(outcome.received, elapsed),
        completed: outcome.completed,
    })
}

/// Publishes probes until the subscriber receives one (ZMQ's slow joiner), then drains them.
fn join(publisher: &Publisher, subscriber: &mut Subscriber) -> anyhow::Result<()> {
    for _ in 0..500 {
        publisher.publish(KvEvent::cleared(PROBE_TENANT));
        if let Delivery::Message { .. } = subscriber.poll()? {
            while subscriber.poll()? != Delivery::Idle {}
            return Ok(());
        }
    }
    anyhow::bail!("the benchmark subscriber never joined the stream")
}

struct Received {
    received: u64,
    last_arrival: Option<Instant>,
    missed_sequences: u64,
    completed: bool,
}

fn receive(
    mut subscriber: Subscriber,
    expected: u64,
    deadline: Instant,
) -> anyhow::Result<Received> {
    let mut received = 0u64;
    let mut last_arrival = None;
    let mut completed = false;
    'poll: while Instant::now() < deadline {
        let Delivery::Message { message, .. } = subscriber.poll()? else {
            continue;
        };
        for ev in &message.events {
            match ev.tenant_id.as_deref() {
                Some(BENCH_TENANT) => {
                    received += 1;
                    last_arrival = Some(Instant::now());
                }
                Some(END_TENANT) => {
                    completed = true;
                    break 'poll;
                }
                _ => {}
            }
        }
        if received == expected {
            completed = true;
            break;
        }
    }
    Ok(Received {
        received,
        last_arrival,
        missed_sequences: subscriber.counters().missed_sequences,
        completed,
    })
}
