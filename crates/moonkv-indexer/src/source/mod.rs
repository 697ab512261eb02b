//! Source subscribers, one OS thread each (ordering per source is then a given, and sources
//! run side by side):
//!
//! - `engine.rs`: vLLM and SGLang ZMQ streams: sequence tracking, replay through the
//!   engine's ROUTER where one is registered, and the engine-hash → index-hash map
//!   ([`engine::EngineBlocks`]) that recomputes hashes from tokens.
//! - `pool.rs`: moonkv and Mooncake master streams through `moonkv-events`' subscriber (its
//!   gap detection and snapshot recovery), with object keys read by [`crate::keys`].

pub mod engine;
pub mod pool;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use crate::api::SourceSpec;
use crate::error::IndexerError;
use crate::hash::HashProfile;
use crate::ids::SourceSlot;
use crate::state::Indexer;

/// How long one receive waits before the thread checks whether it should stop.
pub const POLL: Duration = Duration::from_millis(100);

/// A source's counters, shown by `GET /sources`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// Messages received.
    pub messages: u64,
    /// Events applied.
    pub events: u64,
    /// Events refused (malformed, wrong block size, unknown medium, unknown parent).
    pub rejected_events: u64,
    /// Messages refused as a whole.
    pub malformed_messages: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Publisher restarts seen.
    pub restarts: u64,
    /// Gaps repaired by replay.
    pub repaired_gaps: u64,
    /// Times the source's blocks were dropped because history was lost.
    pub resets: u64,
    /// Object keys no grammar recognized (store sources).
    pub unrecognized_keys: u64,
    /// The last sequence number applied.
    pub last_sequence: Option<u64>,
    /// False while the source's blocks are withheld (a store source waiting for a snapshot).
    pub live: bool,
}

/// Everything a source thread needs.
pub struct SourceCtx {
    /// The indexer it feeds.
    pub indexer: Arc<Indexer>,
    /// Its slot.
    pub slot: SourceSlot,
    /// Its registration.
    pub spec: SourceSpec,
    /// The profile of its partitions.
    pub profile: HashProfile,
    /// Set when it must stop.
    pub stop: Arc<AtomicBool>,
    /// Its counters.
    pub status: Arc<Mutex<SourceStatus>>,
}

impl SourceCtx {
    /// True once the source was unregistered.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A running source thread.
pub struct SourceHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    status: Arc<Mutex<SourceStatus>>,
}

impl SourceHandle {
    /// Stops the thread and waits for it (at most one poll interval).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("a source thread panicked");
            }
        }
    }

    /// Its counters now.
    pub fn status(&self) -> SourceStatus {
        self.status.lock().clone()
    }
}

/// Starts the thread for `spec`. Socket setup errors (a malformed endpoint) are returned here.
pub fn spawn(
    indexer: Arc<Indexer>,
    slot: SourceSlot,
    spec: SourceSpec,
    profile: HashProfile,
) -> Result<SourceHandle, IndexerError> {
    let stop = Arc::new(AtomicBool::new(false));
    let status = Arc::new(Mutex::new(SourceStatus::default()));
    let ctx = SourceCtx {
        indexer,
        slot,
        spec,
        profile,
        stop: Arc::clone(&stop),
        status: Arc::clone(&status),
    };
    let name = format!("source-{}", slot.0);
    let thread = if ctx.spec.source_type.is_engine() {
        let sub = engine::EngineSubscriber::connect(&ctx.spec)?;
        std::thread::Builder::new()
            .name(name)
            .spawn(move || sub.run(ctx))?
    } else {
        let sub = pool::PoolSubscriber::connect(&ctx.spec)?;
        std::thread::Builder::new()
            .name(name)
            .spawn(move || sub.run(ctx))?
    };
    Ok(SourceHandle {
        stop,
        thread: Some(thread),
        status,
    })
}
