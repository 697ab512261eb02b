//! Shared test support for moonkv (dev-dependency only; never published).
//!
//! - [`proc`]: the real `moonkv` binary as a child process ([`Moonkv`], [`Proc`]): spawn on
//!   loopback with ephemeral ports (optionally with fault points set), wait for the ready line,
//!   freeze, thaw, kill, wait for a fault-point exit, read its log.
//! - [`admin`]: the admin HTTP port ([`http`], [`http_get`] over ureq) and the readers of its
//!   endpoints (metrics, segments, keys), plus bounded polling ([`wait_for`]).
//! - [`wire`]: the master protocol from a test: the blocking client with conveniences, fake
//!   segments, and raw frames for tests that break the protocol on purpose.
//! - [`cluster`]: a real master and real nodes inside the test process, and stores on them.
//! - [`fake_master`]: a scripted master that answers each request as a closure decides.
//! - [`events`]: a master with the event stream on, a model of what it should hold, and
//!   `moonkv events` child processes.
//! - [`etcd`]: a real etcd member for HA tests, killed and restartable on the same ports.
//! - [`payload`]: self-checking object bytes and a small deterministic generator.
//! - [`peer`]: runs the independent Python peers of `tests/peer/`.
//! - [`hosts`]: several hosts on one machine (network namespaces on a bridge), links to cut.
//! - [`relay`]: a TCP relay that delays a link's bytes (and costs lost segments a
//!   retransmission), where the kernel has no `netem` (`moonkv_bench::relay`).
//!
//! The `publish_fixture` binary publishes a fixed event sequence for the Python peer of the
//! event bytes (`tests/python_peers.rs`).

pub mod admin;
pub mod cluster;
pub mod error;
pub mod etcd;
pub mod events;
pub mod fake_master;
pub mod hosts;
pub mod payload;
pub mod peer;
pub mod proc;
pub mod wire;

pub use admin::{http, http_get, http_with, wait_for};
pub use cluster::Cluster;
pub use error::KitError;
pub use moonkv_bench::relay;
pub use proc::{free_port, free_ports, output_of, signal, Moonkv, Proc};
