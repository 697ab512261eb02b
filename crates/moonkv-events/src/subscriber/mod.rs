//! Consuming the stream: decoding, sequence tracking, the placement index, snapshot
//! recovery, and a blocking ZMQ SUB [`Subscriber`] that ties them together.

mod decode;
mod index;
pub(crate) mod reader;
mod snapshot;
mod stream;
mod sync;

pub use decode::{
    decode_message, decode_message_detailed, decode_payload, format_event_line, DecodedEvent,
    DecodedMessage,
};
pub use index::{ApplyOutcome, MediaSet, PlacementEntry, PlacementIndex};
pub use snapshot::{
    HttpSnapshotSource, Snapshot, SnapshotObject, SnapshotSource, DEFAULT_MAX_SNAPSHOT_BYTES,
    SNAPSHOT_PATH,
};
pub use stream::{SequenceVerdict, StreamCounters, StreamTracker};
pub use sync::{IndexSync, SyncCounters, DEFAULT_MAX_BUFFERED_EVENTS, DEFAULT_RETRY_INTERVAL};

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{DecodeError, EventsError};

/// Default wait of one [`Subscriber::poll`].
pub const DEFAULT_RECV_TIMEOUT: Duration = Duration::from_millis(100);

/// Receive high-water mark: messages libzmq buffers while the caller is busy (for
/// example fetching a snapshot). Beyond it messages are lost and show up as a gap.
pub const RECV_HWM: i32 = 100_000;

/// Largest frame accepted; larger messages are discarded by libzmq.
pub const MAX_FRAME_BYTES: i64 = 64 << 20;

/// What one [`Subscriber::poll`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A decoded message and how its sequence relates to the previous one.
    Message {
        /// The message.
        message: DecodedMessage,
        /// Gap / restart / in-order classification.
        verdict: SequenceVerdict,
    },
    /// A message that could not be decoded; it was counted and skipped.
    Malformed {
        /// Its sequence number, if frame 1 was readable.
        sequence: Option<u64>,
        /// Why it was rejected.
        error: DecodeError,
    },
    /// Nothing arrived within the receive timeout.
    Idle,
}

/// Subscriber counters, for `moonkv events` output and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SubscriberCounters {
    /// Messages received (well-formed or not).
    pub messages: u64,
    /// Events decoded.
    pub events: u64,
    /// Sequence gaps.
    pub gaps: u64,
    /// Sequence numbers skipped over all gaps.
    pub missed_sequences: u64,
    /// Publisher restarts (sequence moved backwards).
    pub restarts: u64,
    /// Messages rejected as a whole.
    pub malformed: u64,
    /// Events rejected inside otherwise valid messages.
    pub rejected_events: u64,
    /// Snapshots applied.
    pub recoveries: u64,
    /// Snapshot fetches that failed.
    pub recovery_failures: u64,
    /// Last sequence number seen.
    pub last_sequence: Option<u64>,
}

/// A blocking ZMQ SUB subscriber, optionally maintaining a placement index.
pub struct Subscriber {
    // Field order matters: the socket must close before its context terminates.
    socket: zmq::Socket,
    _ctx: zmq::Context,
    endpoint: String,
    tracker: StreamTracker,
    sync: Option<IndexSync>,
    counters: SubscriberCounters,
    frames: [zmq::Message; 3],
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("endpoint", &self.endpoint)
            .field("counters", &self.counters)
            .finish()
    }
}

fn socket_err(op: &'static str) -> impl FnOnce(zmq::Error) -> EventsError {
    move |source| EventsError::Socket { op, source }
}

impl Subscriber {
    /// Connects a SUB socket to `endpoint`, subscribed to every topic; each
    /// [`Subscriber::poll`] waits at most `recv_timeout`.
    pub fn connect(endpoint: &str, recv_timeout: Duration) -> Result<Subscriber, EventsError> {
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::SUB).map_err(socket_err("socket"))?;
        let timeout_ms = i32::try_from(recv_timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1);
        socket
            .set_rcvtimeo(timeout_ms)
            .map_err(socket_err("set RCVTIMEO"))?;
        socket
            .set_rcvhwm(RECV_HWM)
            .map_err(socket_err("set RCVHWM"))?;
        socket
            .set_maxmsgsize(MAX_FRAME_BYTES)
            .map_err(socket_err("set MAXMSGSIZE"))?;
        socket.set_linger(0).map_err(socket_err("set LINGER"))?;
        socket
            .set_reconnect_ivl(100)
            .map_err(socket_err("set RECONNECT_IVL"))?;
        socket
            .set_reconnect_ivl_max(5_000)
            .map_err(socket_err("set RECONNECT_IVL_MAX"))?;
        socket.set_subscribe(b"").map_err(socket_err("subscribe"))?;
        socket
            .connect(endpoint)
            .map_err(|source| EventsError::Connect {
                endpoint: endpoint.to_owned(),
                source,
            })?;
        Ok(Subscriber {
            socket,
            _ctx: ctx,
            endpoint: endpoint.to_owned(),
            tracker: StreamTracker::new(),
            sync: None,
            counters: SubscriberCounters::default(),
            frames: [
                zmq::Message::new(),
                zmq::Message::new(),
                zmq::Message::new(),
            ],
        })
    }

    /// Maintains `sync`'s index from now on. Its first snapshot is fetched after the first
    /// poll, so the subscription has had time to reach the publisher.
    pub fn with_index(mut self, sync: IndexSync) -> Self {
        self.sync = Some(sync);
        self
    }

    /// The endpoint connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The index, if one is maintained.
    pub fn index(&self) -> Option<&PlacementIndex> {
        self.sync.as_ref().map(IndexSync::index)
    }

    /// The index and its recovery state, if maintained.
    pub fn sync(&self) -> Option<&IndexSync> {
        self.sync.as_ref()
    }

    /// The counters so far.
    pub fn counters(&self) -> SubscriberCounters {
        let mut c = self.counters;
        let s = self.tracker.counters();
        c.gaps = s.gaps;
        c.missed_sequences = s.missed_sequences;
        c.restarts = s.restarts;
        c.last_sequence = self.tracker.last_sequence();
        if let Some(sync) = &self.sync {
            c.recoveries = sync.counters().recoveries;
            c.recovery_failures = sync.counters().recovery_failures;
        }
        c
    }

    /// Waits up to the receive timeout for one message, decodes and classifies it, feeds
    /// the index, and runs a due recovery. Only socket failures are errors; bad messages
    /// come back as [`Delivery::Malformed`].
    pub fn poll(&mut self) -> Result<Delivery, EventsError> {
        let delivery = match self.receive()? {
            None => Delivery::Idle,
            Some(count) => self.handle(count),
        };
        if let Some(sync) = &mut self.sync {
            if sync.needs_recovery() {
                if let Err(e) = sync.recover(Instant::now()) {
                    tracing::warn!(error = %e, "placement snapshot fetch failed; will retry");
                }
            }
        }
        Ok(delivery)
    }

    /// Receives one multipart message into the reusable frames; returns its frame count.
    fn receive(&mut self) -> Result<Option<usize>, EventsError> {
        match self.socket.recv(&mut self.frames[0], 0) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => return Ok(None),
            Err(e) => {
                return Err(EventsError::Socket {
                    op: "recv",
                    source: e,
                })
            }
        }
        let mut count = 1;
        let mut spill = zmq::Message::new();
        while self
            .socket
            .get_rcvmore()
            .map_err(socket_err("get RCVMORE"))?
        {
            // The rest of a multipart message is already here; extra frames are drained.
            let target = if count < 3 {
                &mut self.frames[count]
            } else {
                &mut spill
            };
            self.socket.recv(target, 0).map_err(socket_err("recv"))?;
            count += 1;
        }
        Ok(Some(count))
    }

    fn handle(&mut self, frame_count: usize) -> Delivery {
        self.counters.messages += 1;
        let decoded = if frame_count == 3 {
            let frames: [&[u8]; 3] = [
                &self.frames[0][..],
                &self.frames[1][..],
                &self.frames[2][..],
            ];
            decode_message_detailed(&frames)
        } else {
            Err(DecodeError::FrameCount(frame_count))
        };
        match decoded {
            Ok(message) => {
                let verdict = self.tracker.observe(message.sequence);
                self.counters.events += message.events.len() as u64;
                self.counters.rejected_events += u64::from(message.rejected_events);
                if let Some(err) = &message.first_rejection {
                    tracing::debug!(sequence = message.sequence, rejected = message.rejected_events, error = %err, "events rejected");
                }
                if verdict.is_discontinuity() {
                    tracing::info!(
                        ?verdict,
                        sequence = message.sequence,
                        "KV event stream discontinuity"
                    );
                }
                if let Some(sync) = &mut self.sync {
                    sync.on_message(verdict, &message.events);
                }
                Delivery::Message { message, verdict }
            }
            Err(error) => {
                self.counters.malformed += 1;
                // Keep transport tracking honest even when the payload is unreadable; the
                // index notices the missing events through event-id continuity.
                let sequence = (frame_count == 3)
                    .then(|| {
                        <[u8; 8]>::try_from(&self.frames[1][..])
                            .ok()
                            .map(u64::from_be_bytes)
                    })
                    .flatten();
                if let Some(seq) = sequence {
                    let verdict = self.tracker.observe(seq);
                    if let Some(sync) = &mut self.sync {
                        sync.on_message(verdict, &[]);
                    }
                }
                tracing::debug!(?sequence, %error, "malformed KV event message skipped");
                Delivery::Malformed { sequence, error }
            }
        }
    }
}
