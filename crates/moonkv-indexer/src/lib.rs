//! moonkv's prefix index for KV-aware routers: for a prompt's token ids, how long a prefix
//! each instance holds, and in which tier.
//!
//! Modules:
//! - [`ids`]: block hashes, tiers, source slots, workers and partition keys.
//! - [`cbor`] and [`hash`]: the hashing profiles (vLLM v1 `sha256_cbor` with its
//!   `PYTHONHASHSEED` root, SGLang's page hash) and the lazy [`hash::Chain`].
//! - [`keys`]: connector key grammars (vLLM `MooncakeStoreConnector`, SGLang HiCache, LMCache)
//!   that turn a moonkv object key into a block hash.
//! - [`wire`]: vLLM and SGLang event payloads (tagged arrays and tagged maps).
//! - [`index`]: the hashed-chain prefix index and the query walk.
//! - [`source`]: one thread per registered source: engine streams (`engine.rs`, replay on
//!   gaps) and moonkv / Mooncake master streams (`pool.rs`, through `moonkv-events`).
//! - [`state`]: [`Indexer`], the registry of sources and workers, and the query answer.
//! - [`api`], [`http`]: the RFC #1403 HTTP API in JSON and MessagePack.
//! - [`metrics`], [`config`], [`error`]: Prometheus metrics, static sources, [`IndexerError`].

// Unsafe code is allowed only in `index::huge` (the tables' allocator) and in `index::table`'s
// prefetch hint.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod cbor;
pub mod config;
pub mod error;
pub mod hash;
pub mod http;
pub mod ids;
pub mod index;
pub mod keys;
pub mod metrics;
pub mod source;
pub mod state;
pub mod wire;

pub use error::IndexerError;
pub use state::Indexer;
