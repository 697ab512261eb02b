//! Shared vocabulary of moonkv: everything that crosses a process boundary.
//!
//! - [`ids`]: newtype identifiers (`ClientId`, `SegmentId`, `ReplicaId`, `TenantId`, `ObjectKey`).
//! - [`error`]: the upstream-compatible [`ErrorCode`] numbers and the [`Error`] every layer returns.
//! - [`types`]: replica descriptors, segments, [`ReplicateConfig`], enums with stable numbers.
//! - [`msg`]: one request struct per RPC, its response type, and the opcode table.
//! - [`frame`]: the length-prefixed frame codec of the client ↔ master protocol (`docs/protocol.md`).
//! - [`auth`]: shared-secret challenge-response proofs used by the handshakes.
//! - [`grant`]: capability grants on replica ranges, issued by the master, checked by nodes.
//! - [`tls`]: optional TLS settings; with the `tls` feature, PEM loading into rustls configs.
//! - [`ha`]: the `etcd://` master address, the leader record in etcd, the standby refusal.
//! - [`units`]: the one parser and printer of human sizes (`64MiB`) and durations (`10s`).
//!
//! This crate does no network I/O; it only defines and encodes (and reads secret and PEM files).

#![forbid(unsafe_code)]

pub mod auth;
pub mod error;
pub mod frame;
pub mod grant;
pub mod ha;
pub mod ids;
pub mod local;
pub mod local_socket;
pub mod msg;
pub mod tls;
pub mod types;
pub mod units;

pub use error::{Error, ErrorCode, Result};
pub use ids::{ClientId, ObjectKey, ReplicaId, SegmentId, TenantId, Uuid};
pub use types::*;

/// Version of the client ↔ master wire protocol carried in the handshake.
pub const PROTOCOL_VERSION: u32 = 1;
/// Magic string a client sends in its hello.
pub const PROTOCOL_MAGIC: &str = "moonkv";
/// Longest accepted object key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
