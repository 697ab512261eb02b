//! The data plane between callers and nodes (`docs/data-plane.md`): fixed binary headers, raw
//! payload bytes, one request at a time per TCP connection.
//!
//! - [`header`]: request/response header codec and the bounds check.
//! - [`handshake`]: the authentication hello that opens a connection when a secret is set.
//! - [`client`]: connections and the per-endpoint connection pool.
//! - `server` (crate-private): the node's listener and per-connection request loop.

pub mod client;
pub mod handshake;
pub mod header;
pub(crate) mod server;

pub use client::{ConnectionPool, DataConnection};
pub use header::{DataOp, DataStatus, FileMeta, RequestHeader, ResponseHeader};
