//! The moonkv storage node: contributes memory segments and a disk directory to a cluster,
//! mounts them on the master and serves their bytes over the data plane.
//!
//! - [`node`]: [`Node::start`] and [`NodeHandle`] — allocate, mount, heartbeat, serve, shut down;
//!   also embeddable in any tokio program (`moonkv up`, tests, an inference worker).
//! - [`segment`]: segment memory (one lazily committed allocation) and its range-locked views.
//! - `range_lock`: the byte-range reader/writer lock that makes those views sound.
//! - [`claims`]: which replica owns which range, so a freed replica's grant is worthless.
//! - [`catalog`]: the node's record of its committed replicas, fed by the master and announced
//!   to a master that lost its metadata (re-adoption).
//! - `timed`: I/O and idle deadlines on every connection ([`Deadlines`]).
//! - [`server`]: the data-plane listener and per-connection request loop (bounds, grants, auth).
//! - [`disk`]: the disk tier — replica files, their format and checksums, capacity accounting.
//! - [`metrics`]: the node's Prometheus metrics and the small HTTP server of `/metrics`.
//! - `offload`: the agent that copies evicted memory replicas to disk when the master asks.
//! - [`failpoints`]: named fault points for tests (feature `failpoints`).
//!
//! The wire it speaks is `moonkv-dataplane`; the master connection is `moonkv-client`'s
//! `MasterClient`.
//!
//! Unsafe code is denied crate-wide; only `segment` (the raw segment allocation and its views)
//! and `same_host` (cross-process copies) allow it, each stating why its unsafe is sound.

#![deny(unsafe_code)]

pub mod catalog;
pub mod claims;
pub mod disk;
pub mod failpoints;
pub mod metrics;
pub mod node;
mod offload;
mod range_lock;
mod same_host;
pub mod segment;
pub mod server;
mod timed;

pub use timed::Deadlines;

pub use node::{DiskConfig, Node, NodeConfig, NodeHandle};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_same_host;
