//! System benchmarks behind `moonkv bench`; their results go to `docs/benchmarks.md`.
//!
//! - [`master`]: metadata operations per second over the wire or in-process (`bench master`).
//! - `memory`: metadata bytes per resident object (`bench memory`).
//! - [`events`]: event stream rate and the master's rate with events on vs off (`bench events`);
//!   `stream` paces a publisher → subscriber run at a fixed offered rate.
//! - `echo`: the loopback round-trip floor of the machine (`bench echo`); `memcpy`: its
//!   single-thread copy rate, the ceiling of same-host copies (`bench memcpy`); `tcp_calls`:
//!   the loopback TCP floor of one call by size, the ceiling of socket cells (`bench tcp`);
//!   `roundtrip`: one round trip over TCP loopback against a Unix socket (`bench roundtrip`);
//!   `latency`: what one cache miss and one line passed between CPUs cost (`bench latency`).
//! - `store`: put and get through the data plane by object size, next to Redis (`resp`) and
//!   the raw loopback TCP probe (`tcp`) (`bench store`).
//! - `readopt`: time for a restarted master to re-adopt N objects from a node (`bench readopt`).
//! - [`charts`]: the report's comparison tables as SVG bar charts (`bench charts`).
//! - `shape`: `OP:CxT:bB` shapes; `target`: the master over the wire or the engine in-process
//!   behind one trait; `load`: the per-thread loop; `histogram`: latency percentiles;
//!   `report`: markdown tables; `loopback`: the publisher → subscriber runner.
//!
//! Over the wire the load runs through `moonkv_client::master_client::blocking`, the blocking
//! protocol client (one connection shared by several threads); `connect` opens one.

mod batch;
mod cancel;
pub mod charts;
mod echo;
pub mod events;
mod histogram;
mod indexer;
mod latency;
mod load;
mod loopback;
pub mod master;
mod memcpy;
mod memory;
mod readopt;
pub mod relay;
mod report;
mod resp;
mod roundtrip;
mod shape;
mod store;
mod stream;
mod target;
mod tcp;
mod tcp_calls;

use moonkv_client::master_client::blocking::Connection;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;

/// Arguments of `moonkv bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(clap::Subcommand, Debug)]
enum BenchCommand {
    /// Metadata operations per second and latency: put, get and their batch forms.
    Master(master::MasterBenchArgs),
    /// Metadata memory per resident object (in-process engine, RSS growth).
    Memory(memory::MemoryBenchArgs),
    /// Event stream rate end to end, and the master's rate with events on vs off.
    Events(events::EventsBenchArgs),
    /// The prefix index: memory per block, ingest on one core, long-query latency, queries/s.
    Indexer(indexer::IndexerBenchArgs),
    /// Loopback round-trip floor: the bench client against a server that does no work.
    Echo(echo::EchoBenchArgs),
    /// Copy rate of one thread by buffer size: the ceiling of same-host copies.
    Memcpy(memcpy::MemcpyBenchArgs),
    /// What a cache miss costs: dependent loads by span, and a line passed between two CPUs.
    Latency(latency::LatencyBenchArgs),
    /// Loopback TCP floor of one call by size: the bytes one way, a short answer back.
    Tcp(tcp_calls::TcpBenchArgs),
    /// One round trip between two threads over TCP loopback and over a Unix socket.
    Roundtrip(roundtrip::RoundtripBenchArgs),
    /// Data plane: put and get GB/s and latency by object size, next to Redis and raw TCP.
    Store(store::StoreBenchArgs),
    /// Restart re-adoption: time for a new master to get N objects back from a node.
    Readopt(readopt::ReadoptBenchArgs),
    /// SVG charts of a report's comparison tables, from the recorded figures (runs nothing).
    Charts(charts::ChartsArgs),
    /// Cancelled reads against a running cluster: is a buffer ever written after its call was
    /// dropped? Fails if one was.
    Cancel(cancel::CancelProbeArgs),
    /// A TCP relay that adds round-trip time (and retransmission delays) to a link, for
    /// cross-host runs where the kernel has no netem.
    Relay(relay::RelayArgs),
}

/// Runs the chosen benchmark; results go to stdout, progress to the log (stderr).
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Master(a) => master::run(a),
        BenchCommand::Memory(a) => memory::run(a),
        BenchCommand::Events(a) => events::run(a),
        BenchCommand::Indexer(a) => indexer::run(a),
        BenchCommand::Echo(a) => echo::run(a),
        BenchCommand::Memcpy(a) => memcpy::run(a),
        BenchCommand::Latency(a) => latency::run(a),
        BenchCommand::Tcp(a) => tcp_calls::run(a),
        BenchCommand::Roundtrip(a) => roundtrip::run(a),
        BenchCommand::Store(a) => store::run(a),
        BenchCommand::Readopt(a) => readopt::run(a),
        BenchCommand::Charts(a) => charts::run(a),
        BenchCommand::Cancel(a) => cancel::run(a),
        BenchCommand::Relay(a) => relay::run(a),
    }
}

/// A multi-threaded tokio runtime (`worker_threads` 0 = one per core).
pub fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(moonkv_client::util::runtime(worker_threads)?)
}

/// A blocking master connection named `name`, proving the shared secret from
/// `MOONKV_AUTH_SECRET[_FILE]` if the master asks for it.
fn connect(addr: SocketAddr, name: &str) -> anyhow::Result<Connection> {
    let secret = moonkv_client::util::secret_from_env();
    Ok(Connection::connect(
        &addr.to_string(),
        name,
        secret.as_ref(),
        None,
    )?)
}

/// A fresh random number, for ids and key prefixes that must not collide between runs.
fn nonce() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

use moonkv_proto::units::duration_flag as parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
