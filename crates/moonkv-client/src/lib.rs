//! moonkv client library.
//!
//! - [`master_client`]: the multiplexed RPC connection to the master, typed helpers for every
//!   operation, deadlines, reconnects and the heartbeat that remounts segments.
//! - [`data_plane`]: the node ↔ caller byte protocol (headers, connections, pool, node server).
//! - [`node`]: segments in lazily committed memory, mounted on the master and served over the data
//!   plane; runs standalone or embedded in a client process.
//! - [`store`]: the API applications use — put/get/upsert/exists/remove and batch forms for one
//!   tenant, with replica failover, read-lease revalidation and in-process copies.
//! - [`tls`]: optional TLS for both (plain-or-TLS stream, client and server settings).
//! - [`util`]: human sizes (`64MiB`) and id helpers shared with the CLI.

pub mod data_plane;
pub mod master_client;
pub mod node;
pub mod store;
pub mod tls;
pub mod util;

#[cfg(test)]
mod test_support;

pub use master_client::{MasterClient, MasterClientConfig};
pub use moonkv_proto::{Error, ErrorCode, ReplicateConfig, Result};
pub use node::{Node, NodeConfig, NodeHandle};
pub use store::{ErrorExt, ObjectInfo, Store, StoreConfig};
pub use tls::{TlsClientConfig, TlsServerConfig};
