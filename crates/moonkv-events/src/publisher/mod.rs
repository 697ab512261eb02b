//! The ZMQ PUB publisher: callers enqueue under a short mutex; one dedicated OS thread
//! drains the queue in messages of at most 64 events and owns the socket.

mod queue;

pub use queue::{EventQueue, QueueCounters};

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::codec::{Encoder, EventConfig, KvEvent, StampedEvent, MAX_EVENTS_PER_MESSAGE};
use crate::error::EventsError;

/// Send high-water mark of the PUB socket, in messages.
pub const SEND_HWM: i32 = 10_000;

/// How long a closing publisher lets already-drained messages reach connected peers.
/// While running the socket uses LINGER 0; only the final close waits, and at most this.
pub const SHUTDOWN_LINGER_MS: i32 = 500;

/// What `/kv_events/status` reports about a publisher.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PublisherStatus {
    /// Whether a publisher is live.
    pub enabled: bool,
    /// ZMQ messages sent.
    pub published_batches: u64,
    /// Events inside those messages.
    pub published_events: u64,
    /// Events dropped by a full queue or a failed send; each leaves a sequence gap.
    pub dropped_events: u64,
    /// Per-object events suppressed because no `object_key` was available.
    pub skipped_keyless_events: u64,
    /// Random per process start; a change means sequence and event ids restarted.
    pub publisher_epoch: u64,
    /// Highest sequence number consumed (sent, or reserved for a loss).
    pub last_sequence: u64,
    /// Highest event id assigned.
    pub last_event_id: u64,
    /// Events accepted but not sent yet (queued, or in the message being sent).
    pub queue_len: u64,
    /// The configured backend id.
    pub backend_id: String,
    /// The endpoint actually bound.
    pub endpoint: String,
}

impl PublisherStatus {
    /// The status to report when events are disabled.
    pub fn disabled() -> Self {
        Self::default()
    }
}

struct State {
    queue: EventQueue,
    /// The socket thread is parked on the condvar and needs a wake-up.
    consumer_waiting: bool,
    /// Wake-ups producers sent the socket thread.
    wakes: u64,
    /// Events taken from the queue whose send has not been recorded yet.
    in_flight: usize,
    shutting_down: bool,
}

struct Shared {
    /// parking_lot's mutex does not poison, so a panic elsewhere cannot stop event
    /// accounting.
    state: Mutex<State>,
    wake: Condvar,
    /// Looks at the queue before the socket thread parks ([`IDLE_POLLS`]; tests change it).
    idle_polls: u32,
}

/// A running KV event publisher. Dropping it drains the queue and stops the thread.
pub struct Publisher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
    backend_id: String,
    epoch: u64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn random_epoch() -> u64 {
    // RandomState is seeded from the OS once per process, which is what an epoch needs.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish()
}

fn socket_err(op: &'static str) -> impl FnOnce(zmq::Error) -> EventsError {
    move |source| EventsError::Socket { op, source }
}

impl Publisher {
    /// Validates `cfg`, binds the PUB socket (reporting a bad or busy endpoint here) and
    /// starts the socket thread.
    pub fn start(cfg: EventConfig) -> Result<Publisher, EventsError> {
        Self::start_polling(cfg, IDLE_POLLS)
    }

    fn start_polling(cfg: EventConfig, idle_polls: u32) -> Result<Publisher, EventsError> {
        cfg.validate()?;
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::PUB).map_err(socket_err("socket"))?;
        socket
            .set_sndhwm(SEND_HWM)
            .map_err(socket_err("set SNDHWM"))?;
        socket.set_linger(0).map_err(socket_err("set LINGER"))?;
        socket
            .bind(&cfg.bind_endpoint)
            .map_err(|source| EventsError::Bind {
                endpoint: cfg.bind_endpoint.clone(),
                source,
            })?;
        let endpoint = match socket
            .get_last_endpoint()
            .map_err(socket_err("get LAST_ENDPOINT"))?
        {
            Ok(s) => s,
            Err(raw) => String::from_utf8_lossy(&raw).into_owned(),
        };

        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: EventQueue::new(cfg.queue_capacity, cfg.emit_object_key),
                consumer_waiting: false,
                wakes: 0,
                in_flight: 0,
                shutting_down: false,
            }),
            wake: Condvar::new(),
            idle_polls,
        });
        let encoder = Encoder::new(&cfg);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("moonkv-events-pub".into())
            .spawn(move || socket_loop(&thread_shared, &encoder, socket, ctx))
            .map_err(EventsError::Thread)?;
        let epoch = random_epoch();
        tracing::info!(%endpoint, backend_id = %cfg.backend_id, epoch, "KV event publisher started");
        Ok(Publisher {
            shared,
            thread: Some(thread),
            endpoint,
            backend_id: cfg.backend_id,
            epoch,
        })
    }

    /// Enqueues `ev` without blocking on I/O and returns its event id, or 0 if the event was
    /// skipped (a stored/removed event with no object key, or with `emit_object_key` off).
    ///
    /// Ids are assigned under the queue lock, so they follow enqueue order: a caller that
    /// publishes while holding its own metadata lock gets ids consistent with its state.
    pub fn publish(&self, ev: KvEvent) -> u64 {
        let timestamp_ms = now_ms();
        let mut state = self.shared.state.lock();
        let id = state.queue.push(ev, timestamp_ms);
        // Only a parked socket thread needs a (syscall-priced) wake-up.
        if id != 0 && state.consumer_waiting {
            state.consumer_waiting = false;
            state.wakes += 1;
            self.shared.wake.notify_one();
        }
        id
    }

    /// Highest event id assigned so far; the master's snapshot watermark.
    pub fn last_event_id(&self) -> u64 {
        self.shared.state.lock().queue.last_event_id()
    }

    /// The endpoint actually bound (ZMQ `LAST_ENDPOINT`), e.g. with the ephemeral port filled in.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Random id of this publisher instance.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Counters and positions for the status endpoint.
    pub fn status(&self) -> PublisherStatus {
        let state = self.shared.state.lock();
        let c = state.queue.counters();
        PublisherStatus {
            enabled: true,
            published_batches: c.published_batches,
            published_events: c.published_events,
            dropped_events: c.dropped_events,
            skipped_keyless_events: c.skipped_keyless_events,
            publisher_epoch: self.epoch,
            last_sequence: state.queue.last_sequence(),
            last_event_id: state.queue.last_event_id(),
            queue_len: (state.queue.len() + state.in_flight) as u64,
            backend_id: self.backend_id.clone(),
            endpoint: self.endpoint.clone(),
        }
    }

    /// Sends everything still queued, then stops the socket thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        {
            let mut state = self.shared.state.lock();
            state.shutting_down = true;
            self.shared.wake.notify_one();
        }
        if thread.join().is_err() {
            tracing::error!("KV event publisher thread panicked");
        }
        tracing::info!(endpoint = %self.endpoint, "KV event publisher stopped");
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long the socket thread waits for more events before it parks and asks producers to
/// wake it.
const LINGER_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(200);

/// After the linger, how long the socket thread pauses between looks at the queue while events
/// came recently ([`IDLE_POLLS`] looks), before it parks and asks producers to wake it.
const POLL_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Looks at the queue, [`POLL_PAUSE`] apart, before the socket thread parks.
const IDLE_POLLS: u32 = 20;

/// Outcome of the previous send, folded into the next locked section to halve lock traffic.
struct SendOutcome {
    events: usize,
    ok: bool,
}

fn socket_loop(shared: &Shared, encoder: &Encoder, socket: zmq::Socket, ctx: zmq::Context) {
    let mut batch: Vec<StampedEvent> = Vec::with_capacity(MAX_EVENTS_PER_MESSAGE);
    let mut payload: Vec<u8> = Vec::with_capacity(MAX_EVENTS_PER_MESSAGE * 320);
    let mut outcome: Option<SendOutcome> = None;
    let mut idle_polls = shared.idle_polls;
    loop {
        let sequence = {
            let mut state = shared.state.lock();
            if let Some(o) = outcome.take() {
                record(&mut state.queue, &o);
                state.in_flight = 0;
            }
            let mut lingered = false;
            loop {
                if let Some(seq) = state.queue.take_batch(&mut batch, MAX_EVENTS_PER_MESSAGE) {
                    state.in_flight = batch.len();
                    idle_polls = 0;
                    break Some(seq);
                }
                if state.shutting_down {
                    break None;
                }
                if !lingered {
                    // Stay awake a moment without asking to be woken: under steady publishing
                    // the next events arrive within this window, so producers skip the
                    // wake-up syscall (one futex call per few events otherwise) and messages
                    // carry fuller batches. Costs at most this much latency per idle period.
                    lingered = true;
                    shared.wake.wait_for(&mut state, LINGER_BEFORE_PARK);
                    continue;
                }
                if idle_polls < shared.idle_polls {
                    // Events came recently and may come again: look again after a pause
                    // instead of asking producers to wake this thread. Waking it is a
                    // syscall and a wake-up of another CPU inside the call that published
                    // (a batch end); the pause adds at most this much event latency.
                    idle_polls += 1;
                    shared.wake.wait_for(&mut state, POLL_PAUSE);
                    continue;
                }
                state.consumer_waiting = true;
                shared.wake.wait(&mut state);
            }
        };
        let Some(sequence) = sequence else { break };
        payload.clear();
        encoder.encode_batch(&mut payload, now_ms(), &batch);
        let sent = send_message(&socket, sequence, &payload);
        if let Err(e) = &sent {
            tracing::warn!(sequence, events = batch.len(), error = %e, "KV event send failed; events dropped");
        }
        outcome = Some(SendOutcome {
            events: batch.len(),
            ok: sent.is_ok(),
        });
        batch.clear();
    }
    // Give the drained tail a bounded chance to leave before the socket closes.
    if let Err(e) = socket.set_linger(SHUTDOWN_LINGER_MS) {
        tracing::debug!(error = %e, "cannot raise LINGER for shutdown");
    }
    drop(socket);
    drop(ctx);
}

fn record(queue: &mut EventQueue, outcome: &SendOutcome) {
    if outcome.ok {
        queue.record_sent(outcome.events);
    } else {
        queue.record_failed(outcome.events);
    }
}

fn send_message(socket: &zmq::Socket, sequence: u64, payload: &[u8]) -> Result<(), zmq::Error> {
    socket.send(&b""[..], zmq::SNDMORE)?;
    socket.send(&sequence.to_be_bytes()[..], zmq::SNDMORE)?;
    socket.send(payload, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded) until `done` holds for the publisher's state.
    fn until(publisher: &Publisher, what: &str, done: impl Fn(&State) -> bool) {
        for _ in 0..5_000 {
            if done(&publisher.shared.state.lock()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("timed out waiting for: {what}");
    }

    fn sent(state: &State) -> u64 {
        state.queue.counters().published_events
    }

    fn start(idle_polls: u32) -> Publisher {
        Publisher::start_polling(EventConfig::new("b", "tcp://127.0.0.1:0"), idle_polls).unwrap()
    }

    #[test]
    fn after_a_first_event_the_socket_thread_looks_by_itself_and_producers_wake_nobody() {
        // A thread that never stops looking once events came.
        let publisher = start(u32::MAX);
        // Nothing published yet: the socket thread parks and asks to be woken.
        until(&publisher, "the socket thread parks", |s| {
            s.consumer_waiting
        });
        publisher.publish(KvEvent::cleared("t"));
        until(&publisher, "the first event is sent", |s| sent(s) == 1);
        assert_eq!(publisher.shared.state.lock().wakes, 1);
        for n in 2..=50 {
            publisher.publish(KvEvent::cleared("t"));
            until(&publisher, "the next event is sent", |s| sent(s) == n);
        }
        let state = publisher.shared.state.lock();
        assert_eq!(state.wakes, 1, "producers woke the socket thread again");
        assert!(!state.consumer_waiting);
    }

    #[test]
    fn a_publisher_dropped_mid_stream_without_shutdown_sends_everything_and_stops() {
        let publisher = start(u32::MAX);
        publisher.publish(KvEvent::cleared("t"));
        until(&publisher, "the first event is sent", |s| sent(s) == 1);
        // The socket thread now looks by itself; nobody will wake it for these.
        for _ in 0..10 {
            publisher.publish(KvEvent::cleared("t"));
        }
        let shared = Arc::clone(&publisher.shared);
        drop(publisher); // joins the socket thread
        let state = shared.state.lock();
        assert_eq!(sent(&state), 11);
        assert_eq!(state.queue.counters().dropped_events, 0);
    }

    #[test]
    fn after_its_looks_the_socket_thread_parks_and_the_next_event_wakes_it() {
        let publisher = start(2);
        for n in 1..=3 {
            until(&publisher, "the socket thread parks", |s| {
                s.consumer_waiting
            });
            publisher.publish(KvEvent::cleared("t"));
            until(&publisher, "the event is sent", |s| sent(s) == n);
            assert_eq!(publisher.shared.state.lock().wakes, n);
        }
        assert_eq!(publisher.status().dropped_events, 0);
    }
}
