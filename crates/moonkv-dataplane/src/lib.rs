//! The data plane between callers and nodes (`docs/data-plane.md`): fixed binary headers, raw
//! payload bytes; requests on one connection are answered in order, so a caller may pipeline them. Both sides depend on this crate:
//! the node serves it (`moonkv-node`), the store calls it (`moonkv-client`).
//!
//! - [`header`]: request/response header codec and the bounds check every request passes.
//! - [`handshake`]: the authentication hello that opens a connection when a secret is set.
//! - [`connection`]: one caller-side connection, one request at a time.
//! - [`pipeline`]: bursts of many requests in flight on one connection.
//! - [`pool`]: at most a few connections per node, reused across calls and batches.
//! - [`stream`]: plain TCP or TLS behind one type, connect/accept helpers (also used for the
//!   master connection).
//! - [`local`]: the handle through which an embedded node lends its segments to a store in the
//!   same process, so local replicas are copied without the network.
//! - [`same_host`]: what a caller on the node's own machine needs to let the node copy bytes
//!   straight between its segments and the caller's memory (READ_LOCAL / WRITE_LOCAL).
//! - [`low_water`]: long payloads read with a receive low-water mark, so the reader wakes
//!   for large chunks instead of every segment.
//! - [`local_stream`]: local socket connections that hear of writing space only while a write
//!   waits for it, so a peer's reads do not wake a caller that waits for an answer.
//!
//! Unsafe code is denied crate-wide. Two modules allow it: `low_water`, for its one
//! `setsockopt` call, which rustix does not wrap, and `local_stream`, for tokio's API that
//! lends a read buffer's spare capacity (the system calls of `same_host` go through rustix's
//! safe wrappers).

#![deny(unsafe_code)]

pub mod connection;
pub mod handshake;
pub mod header;
pub mod local;
pub mod local_stream;
pub mod low_water;
pub mod pipeline;
pub mod pool;
pub mod same_host;
pub mod stream;

pub use connection::DataConnection;
pub use header::{DataOp, DataStatus, FileMeta, NodeStats, RequestHeader, ResponseHeader};
pub use local::{LocalSegment, LocalSegments};
pub use local_stream::LocalStream;
pub use pipeline::{Burst, BurstBreak, Piece};
pub use pool::{ConnectionPool, PoolStats, DEFAULT_CONNECTIONS_PER_NODE};
pub use stream::{Stream, TlsAcceptor, TlsClientConfig, TlsConnector, TlsError, TlsServerConfig};
