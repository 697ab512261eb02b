//! Errors: [`EventsError`] for setting up and running publishers, subscribers and snapshot
//! fetches, and [`DecodeError`] for one message or event that could not be decoded.

use thiserror::Error;

/// Why a message or an event inside it was rejected by the decoder.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The ZMQ message did not have exactly three frames.
    #[error("expected 3 frames (topic, sequence, payload), got {0}")]
    FrameCount(usize),
    /// The sequence frame was not 8 bytes long.
    #[error("sequence frame must be 8 bytes, got {0}")]
    SequenceLength(usize),
    /// The payload ended in the middle of a value.
    #[error("payload truncated")]
    Truncated,
    /// A byte that MessagePack never uses as a marker (0xc1).
    #[error("invalid MessagePack marker 0x{0:02x}")]
    InvalidMarker(u8),
    /// A container header promised more elements than bytes remain.
    #[error("container declares {declared} elements, more than the payload can hold")]
    LengthOverrun {
        /// The element count the header declared.
        declared: u64,
    },
    /// Bytes remained after the payload's single top-level value.
    #[error("{0} trailing bytes after the payload")]
    TrailingBytes(usize),
    /// The payload array had a number of items other than 2 or 3.
    #[error("payload must be an array of 2 or 3 items, got {0}")]
    BatchShape(u32),
    /// A value had the wrong MessagePack type.
    #[error("{field}: expected {expected}, found {found}")]
    UnexpectedType {
        /// Which field or position.
        field: &'static str,
        /// What was expected there.
        expected: &'static str,
        /// What was found instead.
        found: &'static str,
    },
    /// A string was not valid UTF-8.
    #[error("{field}: string is not valid UTF-8")]
    InvalidUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// A field that must be non-negative held a negative integer.
    #[error("{field}: negative integer")]
    NegativeInteger {
        /// Which field.
        field: &'static str,
    },
    /// A recognized field appeared twice in one event map.
    #[error("field {0} appears twice")]
    DuplicateField(&'static str),
    /// The event carried neither `event_type` nor a legacy `type`.
    #[error("event has no event_type")]
    MissingEventType,
    /// The event type was not one this decoder knows (first 32 bytes shown).
    #[error("unknown event type {0:?}")]
    UnknownEventType(String),
    /// `event_type` and the legacy `type` named different kinds.
    #[error("event_type and legacy type disagree")]
    ConflictingEventType,
}

/// Errors from starting or running the publisher, the subscriber or a snapshot fetch.
#[derive(Debug, Error)]
pub enum EventsError {
    /// The configuration was rejected before any socket was opened.
    #[error("invalid event configuration: {0}")]
    Config(String),
    /// The publisher could not bind its endpoint (malformed address, port in use, ...).
    #[error("cannot bind KV event publisher to {endpoint:?}: {source}")]
    Bind {
        /// The endpoint as configured.
        endpoint: String,
        /// The underlying ZMQ error.
        source: zmq::Error,
    },
    /// The subscriber could not connect to an endpoint.
    #[error("cannot connect KV event subscriber to {endpoint:?}: {source}")]
    Connect {
        /// The endpoint as given.
        endpoint: String,
        /// The underlying ZMQ error.
        source: zmq::Error,
    },
    /// A socket operation other than bind/connect failed.
    #[error("ZMQ {op} failed: {source}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The underlying ZMQ error.
        source: zmq::Error,
    },
    /// The publisher's socket thread could not be spawned.
    #[error("cannot start publisher thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A placement snapshot could not be fetched or parsed.
    #[error("snapshot: {0}")]
    Snapshot(String),
}

impl EventsError {
    /// A stable, machine-readable name for the error class (for logs and metrics labels).
    pub fn code(&self) -> &'static str {
        match self {
            EventsError::Config(_) => "config",
            EventsError::Bind { .. } => "bind",
            EventsError::Connect { .. } => "connect",
            EventsError::Socket { .. } => "socket",
            EventsError::Thread(_) => "thread",
            EventsError::Snapshot(_) => "snapshot",
        }
    }
}
