//! moonkv's KV event stream: what the master publishes when objects become readable or
//! stop being readable per medium, and what a KV-aware router needs to follow it.
//!
//! The wire format (three ZMQ frames, a MessagePack batch of event maps, field order and
//! nil rules) is specified in `docs/events.md`.
//!
//! Modules:
//! - [`codec`]: event types and the publisher configuration (`codec/mod.rs`), and the
//!   byte-exact encoder (`codec/write.rs`, MessagePack written with `rmp`).
//! - [`publisher`]: [`Publisher`], a ZMQ PUB socket sent on by its own thread or, inside an
//!   [`InlineSender`] scope, by the publishing thread (`publisher/mod.rs`), fed by a bounded
//!   drop-oldest queue ([`publisher::EventQueue`] in `queue.rs`, pure and socket-free)
//!   that turns every loss into a visible sequence gap; [`PublisherStatus`] for
//!   `/kv_events/status`.
//! - [`subscriber`]: the blocking [`Subscriber`] (`subscriber/mod.rs`); tolerant decoding
//!   ([`decode_message`], `decode.rs`, over the bounded tokenizer of `reader.rs`); per-connection sequence
//!   tracking ([`StreamTracker`], `stream.rs`); the [`PlacementIndex`] of key → media
//!   (`index.rs`); snapshot sources ([`SnapshotSource`], [`HttpSnapshotSource`], `snapshot.rs`);
//!   and [`IndexSync`], which joins the stream and a snapshot without losing events (`sync.rs`).
//! - [`error`]: [`EventsError`] and [`DecodeError`].
//!
//! The crate does no async I/O and depends on no other moonkv crate.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
pub mod error;
pub mod publisher;
pub mod subscriber;

pub use codec::{
    encode_batch, entry_count, sequence_frame, Encoder, EventConfig, EventKind, KvEvent, Medium,
    StampedEvent, DEFAULT_QUEUE_CAPACITY, MAX_EVENTS_PER_MESSAGE,
};
pub use error::{DecodeError, EventsError};
pub use publisher::{DeferredSend, InlineSender, Publisher, PublisherStatus};
pub use subscriber::{
    decode_message, decode_message_detailed, format_event_line, DecodedEvent, DecodedMessage,
    Delivery, HttpSnapshotSource, IndexSync, MediaSet, PlacementIndex, SequenceVerdict, Snapshot,
    SnapshotObject, SnapshotSource, StreamTracker, Subscriber, SubscriberCounters,
};
