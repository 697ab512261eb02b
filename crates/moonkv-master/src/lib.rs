//! The moonkv master.
//!
//! - [`engine`]: the synchronous, I/O-free metadata state machine (objects, replicas, leases,
//!   segments, clients, eviction, tenants) with an injected clock. Builds without the `server`
//!   feature, so it carries no tokio, axum or zmq.
//! - [`server`] (feature `server`, on by default): RPC server, admin HTTP, event publisher hook,
//!   metrics and configuration around the engine.

#![forbid(unsafe_code)]

pub mod engine;
#[cfg(feature = "server")]
pub mod server;
