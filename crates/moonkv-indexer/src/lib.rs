//! moonkv's prefix index for KV-aware routers.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cbor;
pub mod error;
pub mod hash;
pub mod ids;
pub mod index;
pub mod keys;

pub use error::IndexerError;
