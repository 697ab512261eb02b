//! The ZMQ PUB publisher: callers enqueue under a short mutex, and the queue leaves in
//! messages of at most 64 events. A dedicated OS thread sends what producers leave to it; a
//! producer inside [`InlineSender::scope`] (a master answering a request) sends what it
//! published itself when its work is done, and wakes no thread for it.

mod queue;

pub use queue::{EventQueue, QueueCounters};

use std::cell::Cell;
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
    /// The socket, held by whoever sends (the socket thread, or a producer at the end of its
    /// [`InlineSender::scope`]) from taking a message's events off the queue until the message
    /// has left, so messages leave in sequence order. Taken before `state`, never after.
    /// `None` once the socket thread closed the socket.
    sender: Mutex<Option<Sender>>,
    /// Looks at the queue before the socket thread parks ([`IDLE_POLLS`]; tests change it).
    idle_polls: u32,
}

/// The socket and the buffers a message is built in.
struct Sender {
    socket: zmq::Socket,
    encoder: Encoder,
    batch: Vec<StampedEvent>,
    payload: Vec<u8>,
}

thread_local! {
    /// The publisher whose [`InlineSender::scope`] this thread is in (its `Shared`'s address,
    /// 0: none), and whether it published meanwhile.
    static INLINE: Cell<(usize, bool)> = const { Cell::new((0, false)) };
}

fn address(shared: &Arc<Shared>) -> usize {
    Arc::as_ptr(shared) as usize
}

/// Sends everything queued, in messages of at most [`MAX_EVENTS_PER_MESSAGE`] events, from the
/// calling thread. Returns the events it sent (or lost to a failed send).
fn send_queued(shared: &Shared) -> usize {
    let mut sender = shared.sender.lock();
    let Some(sender) = sender.as_mut() else {
        return 0;
    };
    let mut total = 0;
    // The outcome of a send is recorded in the locked section that takes the next message.
    let mut outcome: Option<SendOutcome> = None;
    loop {
        let sequence = {
            let mut state = shared.state.lock();
            if let Some(o) = outcome.take() {
                record(&mut state.queue, &o);
                state.in_flight = 0;
            }
            match state
                .queue
                .take_batch(&mut sender.batch, MAX_EVENTS_PER_MESSAGE)
            {
                Some(sequence) => {
                    state.in_flight = sender.batch.len();
                    sequence
                }
                None => return total,
            }
        };
        sender.payload.clear();
        sender
            .encoder
            .encode_batch(&mut sender.payload, now_ms(), &sender.batch);
        let sent = send_message(&sender.socket, sequence, &sender.payload);
        if let Err(e) = &sent {
            tracing::warn!(sequence, events = sender.batch.len(), error = %e, "KV event send failed; events dropped");
        }
        total += sender.batch.len();
        outcome = Some(SendOutcome {
            events: sender.batch.len(),
            ok: sent.is_ok(),
        });
        sender.batch.clear();
    }
}

/// Sends a publisher's events from the thread that published them ([`Publisher::inline`]).
/// It outlives the publisher harmlessly: once the socket is closed it sends nothing.
#[derive(Clone)]
pub struct InlineSender(Arc<Shared>);

impl std::fmt::Debug for InlineSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineSender").finish_non_exhaustive()
    }
}

impl InlineSender {
    /// Runs `work`. The events it publishes on this thread wake nobody; when it returns (or
    /// unwinds), this thread sends everything queued, those events and any others. For work
    /// that publishes in bursts and can spend the few microseconds encoding takes (a master
    /// answering a request): a wake-up of the socket thread costs more than that, and on a
    /// busy host the woken thread takes a CPU from the work itself.
    pub fn scope<R>(&self, work: impl FnOnce() -> R) -> R {
        let _restore = Restore::enter(&self.0);
        work()
    }

    /// Like [`InlineSender::scope`], but the events `work` published leave when the
    /// [`DeferredSend`] it returns is dropped (`None`: it published nothing), from the thread
    /// that drops it. For work whose caller waits for an answer: it can answer first and send
    /// the events after. If `work` unwinds, they leave at once.
    pub fn scope_deferred<R>(&self, work: impl FnOnce() -> R) -> (R, Option<DeferredSend>) {
        let mut restore = Restore::enter(&self.0);
        let out = work();
        let published = restore.leave();
        (out, published.then(|| DeferredSend(Arc::clone(&self.0))))
    }
}

/// An [`InlineSender`] scope of this thread, which ends when this is dropped.
struct Restore<'a> {
    shared: &'a Shared,
    /// The scope this one is nested in; `None` once left.
    outer: Option<(usize, bool)>,
}

impl<'a> Restore<'a> {
    fn enter(shared: &'a Arc<Shared>) -> Restore<'a> {
        let outer = INLINE.with(|c| c.replace((address(shared), false)));
        Restore {
            shared,
            outer: Some(outer),
        }
    }

    /// Ends the scope without sending; whether it published.
    fn leave(&mut self) -> bool {
        match self.outer.take() {
            Some(outer) => INLINE.with(|c| c.replace(outer)).1,
            None => false,
        }
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if self.leave() {
            send_queued(self.shared);
        }
    }
}

/// Events an [`InlineSender::scope_deferred`] published, still queued: dropping this sends
/// everything queued from the dropping thread.
pub struct DeferredSend(Arc<Shared>);

impl std::fmt::Debug for DeferredSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredSend").finish_non_exhaustive()
    }
}

impl Drop for DeferredSend {
    fn drop(&mut self) {
        send_queued(&self.0);
    }
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
            sender: Mutex::new(Some(Sender {
                socket,
                encoder: Encoder::new(&cfg),
                batch: Vec::with_capacity(MAX_EVENTS_PER_MESSAGE),
                payload: Vec::with_capacity(MAX_EVENTS_PER_MESSAGE * 320),
            })),
            idle_polls,
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("moonkv-events-pub".into())
            .spawn(move || socket_loop(&thread_shared, ctx))
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
        if id == 0 {
            return 0;
        }
        // Inside this publisher's inline scope the event leaves with the scope's end.
        let me = address(&self.shared);
        let inline = INLINE.with(|c| match c.get() {
            (scope, _) if scope == me => {
                c.set((me, true));
                true
            }
            _ => false,
        });
        // Otherwise only a parked socket thread needs a (syscall-priced) wake-up.
        if !inline && state.consumer_waiting {
            state.consumer_waiting = false;
            state.wakes += 1;
            self.shared.wake.notify_one();
        }
        id
    }

    /// A handle that sends this publisher's events from the thread that published them
    /// ([`InlineSender::scope`]).
    pub fn inline(&self) -> InlineSender {
        InlineSender(Arc::clone(&self.shared))
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

/// The socket thread: sends what producers outside an inline scope queue, then closes the
/// socket once the publisher shuts down and the queue is empty.
fn socket_loop(shared: &Shared, ctx: zmq::Context) {
    let mut idle_polls = shared.idle_polls;
    loop {
        {
            let mut state = shared.state.lock();
            let mut lingered = false;
            loop {
                if !state.queue.is_empty() {
                    break;
                }
                if state.shutting_down {
                    drop(state);
                    close(shared, ctx);
                    return;
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
                    // syscall and a wake-up of another CPU inside the call that published;
                    // the pause adds at most this much event latency.
                    idle_polls += 1;
                    shared.wake.wait_for(&mut state, POLL_PAUSE);
                    continue;
                }
                state.consumer_waiting = true;
                shared.wake.wait(&mut state);
            }
        }
        // A producer sending inline may have taken them first: then nothing came here, and
        // this thread goes on towards parking.
        if send_queued(shared) > 0 {
            idle_polls = 0;
        }
    }
}

/// Closes the socket, giving the drained tail a bounded chance to leave first.
fn close(shared: &Shared, ctx: zmq::Context) {
    if let Some(sender) = shared.sender.lock().take() {
        if let Err(e) = sender.socket.set_linger(SHUTDOWN_LINGER_MS) {
            tracing::debug!(error = %e, "cannot raise LINGER for shutdown");
        }
        drop(sender);
    }
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

    /// Waits (bounded) until the socket thread parks and asks to be woken.
    fn until_parked(publisher: &Publisher) {
        until(publisher, "the socket thread parks", |s| s.consumer_waiting);
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
        until_parked(&publisher);
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
    fn events_published_in_an_inline_scope_leave_at_its_end_and_wake_nobody() {
        let publisher = start(0);
        until_parked(&publisher);
        let inline = publisher.inline();
        inline.scope(|| {
            for i in 0..100 {
                publisher.publish(KvEvent::stored("t", format!("k{i}"), crate::Medium::Cpu));
            }
            // Nobody woke the parked thread: nothing left yet.
            let state = publisher.shared.state.lock();
            assert_eq!(sent(&state), 0);
            assert_eq!(state.queue.len(), 100);
        });
        // Sent by this thread when the scope ended, as two messages (64 + 36 events).
        let state = publisher.shared.state.lock();
        assert_eq!(sent(&state), 100);
        assert_eq!(state.queue.counters().published_batches, 2);
        assert_eq!(state.queue.last_sequence(), 2);
        assert_eq!((state.wakes, state.consumer_waiting), (0, true));
        assert_eq!(state.in_flight, 0);
        drop(state);
        // Outside the scope, the next event wakes the socket thread as before.
        publisher.publish(KvEvent::cleared("t"));
        until(&publisher, "the socket thread sends it", |s| sent(s) == 101);
        assert_eq!(publisher.shared.state.lock().wakes, 1);
    }

    #[test]
    fn events_of_a_deferred_scope_leave_when_its_token_drops_and_wake_nobody() {
        let publisher = start(0);
        until_parked(&publisher);
        let inline = publisher.inline();
        let (n, token) = inline.scope_deferred(|| {
            for i in 0..40 {
                publisher.publish(KvEvent::stored("t", format!("k{i}"), crate::Medium::Cpu));
            }
            40
        });
        assert_eq!(n, 40);
        let token = token.expect("it published");
        // The scope is over and nothing left: the events wait for the token.
        {
            let state = publisher.shared.state.lock();
            assert_eq!((sent(&state), state.queue.len()), (0, 40));
            assert_eq!((state.wakes, state.consumer_waiting), (0, true));
        }
        // Dropping the token sends them, from this thread, waking nobody.
        drop(token);
        {
            let state = publisher.shared.state.lock();
            assert_eq!((sent(&state), state.queue.len()), (40, 0));
            assert_eq!(state.queue.counters().published_batches, 1);
            assert_eq!(state.wakes, 0);
        }
        // Out of the scope, what this thread publishes wakes the socket thread as before.
        publisher.publish(KvEvent::cleared("t"));
        until(&publisher, "the socket thread sends it", |s| sent(s) == 41);
        assert_eq!(publisher.shared.state.lock().wakes, 1);
        // A deferred scope that published nothing hands back no token.
        let ((), none) = inline.scope_deferred(|| ());
        assert!(none.is_none());
    }

    #[test]
    fn a_deferred_scope_that_unwinds_sends_at_once() {
        let publisher = start(0);
        until_parked(&publisher);
        let inline = publisher.inline();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inline.scope_deferred(|| {
                publisher.publish(KvEvent::cleared("t"));
                panic!("the work failed after publishing");
            })
        }));
        assert!(unwound.is_err());
        let state = publisher.shared.state.lock();
        assert_eq!((sent(&state), state.wakes, state.queue.len()), (1, 0, 0));
    }

    #[test]
    fn an_inline_scope_that_unwinds_still_sends_what_it_published() {
        let publisher = start(0);
        until_parked(&publisher);
        let inline = publisher.inline();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inline.scope(|| {
                publisher.publish(KvEvent::cleared("t"));
                panic!("the work failed after publishing");
            })
        }));
        assert!(unwound.is_err());
        let state = publisher.shared.state.lock();
        assert_eq!((sent(&state), state.wakes), (1, 0));
        drop(state);
        // The scope is over: this thread publishes as before.
        publisher.publish(KvEvent::cleared("t"));
        until(&publisher, "the socket thread sends it", |s| sent(s) == 2);
    }

    #[test]
    fn an_inline_scope_leaves_other_publishers_to_their_threads() {
        let (mine, other) = (start(0), start(0));
        for p in [&mine, &other] {
            until_parked(p);
        }
        let nested = mine.inline().scope(|| {
            other.publish(KvEvent::cleared("t"));
            // A scope inside a scope: its events leave at its own end.
            mine.inline().scope(|| mine.publish(KvEvent::cleared("t")));
            sent(&mine.shared.state.lock())
        });
        assert_eq!(nested, 1);
        until(&other, "the other's thread sends its event", |s| {
            sent(s) == 1
        });
        assert_eq!(other.shared.state.lock().wakes, 1);
        assert_eq!(mine.shared.state.lock().wakes, 0);
    }

    #[test]
    fn after_a_shutdown_an_inline_sender_sends_nothing_and_does_not_block() {
        let publisher = start(0);
        let inline = publisher.inline();
        publisher.shutdown();
        // The socket is closed; the events stay counted as queued, nothing panics.
        let value = inline.scope(|| 7);
        assert_eq!(value, 7);
        assert_eq!(send_queued(&inline.0), 0);
    }

    #[test]
    fn after_its_looks_the_socket_thread_parks_and_the_next_event_wakes_it() {
        let publisher = start(2);
        for n in 1..=3 {
            until_parked(&publisher);
            publisher.publish(KvEvent::cleared("t"));
            until(&publisher, "the event is sent", |s| sent(s) == n);
            assert_eq!(publisher.shared.state.lock().wakes, n);
        }
        assert_eq!(publisher.status().dropped_events, 0);
    }
}
