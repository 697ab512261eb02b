//! moonkv client library: what an application links to put and get objects.
//!
//! - [`master_client`]: the multiplexed RPC connection to the master, typed helpers for every
//!   operation, deadlines, reconnects and the heartbeat that remounts segments; its
//!   [`blocking`](master_client::blocking) twin for threads without a runtime, and the one
//!   hello exchange both run.
//! - [`store`]: the API applications use — put/get/upsert/exists/remove and batch forms for one
//!   tenant, with replica failover, read-lease revalidation and in-process copies from the
//!   segments of an embedded node (`StoreConfig::local_segments`).
//! - [`util`]: id helpers and secrets from the environment.
//! - [`failpoints`]: named fault points for tests (feature `failpoints`).
//!
//! The bytes travel over `moonkv-dataplane`; the node that serves them is `moonkv-node`.

#![forbid(unsafe_code)]

pub mod failpoints;
pub mod master_client;
pub mod store;
pub mod util;

pub use master_client::{MasterClient, MasterClientConfig};
pub use moonkv_dataplane::{LocalSegments, TlsClientConfig, TlsServerConfig};
pub use moonkv_proto::{Error, ErrorCode, ReplicateConfig, Result};
pub use store::{ErrorExt, ObjectInfo, Store, StoreConfig};
