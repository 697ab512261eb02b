//! The moonkv storage node: contributes memory segments and a disk directory to a cluster,
//! mounts them on the master and serves their bytes over the data plane.
//!
//! What other crates use is re-exported here or lives in the four public modules:
//!
//! - [`Node::start`], [`NodeConfig`], [`DiskConfig`], [`NodeHandle`], [`Deadlines`]: start a node
//!   and stop it; it runs as its own process (`moonkv node`) or embedded in any tokio program
//!   (`moonkv up`, tests, benchmarks, an inference worker).
//! - [`metrics`]: the node's Prometheus metrics ([`NodeHandle::metrics`]) and the small HTTP
//!   server of `/metrics` ([`metrics::serve`]).
//! - [`failpoints`]: the names of the fault points (feature `failpoints`) and their
//!   configuration from `FAILPOINTS` at process start.
//! - [`segment`] and [`server`]: a segment's memory ([`segment::SegmentMemory`]) and a bare
//!   data-plane listener ([`server::DataServer`], [`server::Access`]), for tests of other
//!   crates that serve segments without a master.
//!
//! Inside the crate:
//!
//! - `node`: allocate, mount, heartbeat, serve, shut down ([`Node`], [`NodeHandle`]).
//! - `segment`: segment memory (one lazily committed allocation) and its range-locked views,
//!   also lent to a store in the same process.
//! - `range_lock`: the byte-range reader/writer lock that makes those views sound.
//! - `claims`: which replica owns which range, so a freed replica's grant is worthless.
//! - `catalog`: the node's record of its committed replicas, fed by the master and announced
//!   to a master that lost its metadata (re-adoption).
//! - `timed`: I/O and idle deadlines on every connection ([`Deadlines`]).
//! - `server`: the data-plane listener and the request loop of a connection (bounds, grants,
//!   auth), split by operation: `requests`, `handshake`, `memory`, `same_host`, `file`.
//! - `same_host`: the node's side of same-host copies — verifying the process that attaches a
//!   connection, then copying between segment memory and that process's memory;
//!   `shared_pool`: callers' pools that the node maps and copies with its own loops (`copy`:
//!   AVX2, streaming stores into the store); `copy_helper`: the second thread that takes
//!   pieces of a request's copies while the caller waits.
//! - `disk`: the disk tier — replica files, their format and checksums, capacity accounting,
//!   the directory's lock and free space.
//! - `offload`: the agent that copies evicted memory replicas to disk when the master asks.
//! - `metrics`, `failpoints`: as above; their other items (the request loop's counters, passing
//!   a point) are crate-internal, as are the rest of `segment` and `server`.
//!
//! The wire it speaks is `moonkv-dataplane`; the master connection is `moonkv-client`'s
//! `MasterClient`.
//!
//! Unsafe code is denied crate-wide; only `segment` (the raw segment allocation and its views),
//! `same_host` (cross-process copies), `shared_pool` (mapped pools), `copy` (SIMD copy loops)
//! and `copy_helper` (a second copy thread borrowing a request's closure) allow it, each
//! stating why its unsafe is sound.

#![deny(unsafe_code)]

mod catalog;
mod claims;
mod copy;
mod copy_helper;
mod disk;
pub mod failpoints;
pub mod metrics;
mod node;
mod offload;
mod range_lock;
mod same_host;
pub mod segment;
pub mod server;
pub mod shared_pool;
mod timed;

pub use timed::Deadlines;

pub use copy::copy_streaming;

pub use node::{DiskConfig, Node, NodeConfig, NodeHandle};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_same_host;
