//! `moonkv bench store`: put and get through the data plane by object size and number of
//! clients, with a Redis server as the comparator (`--redis`) and the raw loopback TCP probe
//! (`tcp`, streaming writes of the object size) as the ceiling, all in the same invocation.
//!
//! Each client is a task on the bench's runtime sharing one [`Store`] (as an application
//! would), with its own key and its own buffer. A put is `Store::upsert` of the client's fixed
//! key: the first writes the object, the following ones rewrite it in place (same size, no read
//! lease), as Redis SET replaces a value; each is UpsertStart + the bytes over the data plane +
//! UpsertEnd. A get is `Store::get_into` of a key written before the clock starts, into a
//! buffer allocated and touched beforehand: GetReplicaList + the bytes. Keys are removed when
//! their cell is done. The store is given no in-process segments (`local_segments` unset), so every byte
//! crosses a loopback socket even with `--spawn`.

use super::histogram::Histogram;
use super::report::{grouped, micros};
use super::{resp, tcp};
use moonkv_client::{ReplicateConfig, Store, StoreConfig};
use moonkv_master::server::{self, MasterConfig, MasterHandle};
use moonkv_node::{Node, NodeConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Objects of at least this size have targets.
const TARGET_FROM: u64 = 1 << 20;
/// Wanted put/get throughput relative to Redis SET/GET.
const TARGET_VS_REDIS: f64 = 1.5;
/// Wanted share of the raw loopback TCP probe.
const TARGET_VS_TCP: f64 = 0.7;

/// `moonkv bench store`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["master", "spawn"])))]
pub struct StoreBenchArgs {
    /// RPC address of a running master with at least one node (`moonkv up`). Keys written are
    /// removed after each cell.
    #[arg(long, value_name = "ADDR")]
    master: Option<String>,
    /// Start a master and one node in this process, on their own runtime; the store reaches
    /// the node over loopback TCP like any other.
    #[arg(long)]
    spawn: bool,
    /// Segment size of the node started by `--spawn`.
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    segment_size: u64,
    /// Object sizes (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Concurrent clients, each with its own key (comma separated: one cell per value).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    concurrency: Vec<usize>,
    /// Operations to measure (comma separated): put, get.
    #[arg(long, value_delimiter = ',', default_value = "put,get")]
    ops: Vec<StoreOp>,
    /// Measured time per run of a cell.
    #[arg(long, default_value = "2s", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per cell (moonkv and Redis interleaved); the median by GB/s is reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// A running Redis server (HOST:PORT) to run the same cells against, with SET and GET.
    #[arg(long, value_name = "ADDR")]
    redis: Option<String>,
    /// Skip the raw loopback TCP probe.
    #[arg(long)]
    no_tcp_probe: bool,
    /// Connection counts of the TCP probe; the best of them at a size is the ceiling the cells
    /// of that size are compared with (a transfer may use several connections).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    tcp_connections: Vec<usize>,
    /// Data-plane chunk size of the store (default: the library's).
    #[arg(long, value_parser = parse_size)]
    chunk_size: Option<u64>,
    /// Parallel data-plane connections per transfer (default: the library's).
    #[arg(long)]
    transfer_connections: Option<usize>,
    /// Batch mode: calls of `batch_put_from` / `batch_get_into` / `batch_exists` with this
    /// many keys each (one cell per value of --sizes), instead of the single-object cells.
    #[arg(long, value_name = "KEYS")]
    batch: Option<usize>,
    /// Calls per batch cell.
    #[arg(long, default_value_t = 40)]
    calls: usize,
    /// Most data-plane connections the store holds per node (default: the library's).
    #[arg(long)]
    connections_per_node: Option<usize>,
}

/// What a cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreOp {
    /// Upsert of the client's key (Redis: SET).
    Put,
    /// Read of the client's key (Redis: GET).
    Get,
}

impl StoreOp {
    fn name(self) -> &'static str {
        match self {
            StoreOp::Put => "put",
            StoreOp::Get => "get",
        }
    }
}

use moonkv_proto::units::size_flag as parse_size;

/// One run of one cell, all clients together.
#[derive(Clone, Debug)]
pub struct Run {
    bytes_per_s: f64,
    ops_per_s: f64,
    latency: Histogram,
}

impl Run {
    /// Combines the clients' `(operations, measured time, latencies)`.
    pub fn from_workers(
        size: usize,
        workers: Vec<anyhow::Result<(u64, Duration, Histogram)>>,
    ) -> anyhow::Result<Run> {
        let mut latency = Histogram::default();
        let (mut ops, mut longest) = (0u64, Duration::ZERO);
        for w in workers {
            let (n, elapsed, h) = w?;
            ops += n;
            longest = longest.max(elapsed);
            latency.merge(&h);
        }
        let seconds = longest.as_secs_f64().max(f64::MIN_POSITIVE);
        Ok(Run {
            bytes_per_s: ops as f64 * size as f64 / seconds,
            ops_per_s: ops as f64 / seconds,
            latency,
        })
    }
}

/// The median run by bytes/s, and the spread of all runs.
struct Summary {
    median: Run,
    min: f64,
    max: f64,
}

impl Summary {
    fn of(mut runs: Vec<Run>) -> Option<Summary> {
        runs.sort_by(|a, b| a.bytes_per_s.total_cmp(&b.bytes_per_s));
        let min = runs.first()?.bytes_per_s;
        let max = runs.last()?.bytes_per_s;
        let median = runs.swap_remove(runs.len() / 2);
        Some(Summary { median, min, max })
    }
}

/// One row of the report.
struct Row {
    size: u64,
    clients: usize,
    op: StoreOp,
    moonkv: Summary,
    redis: Option<Summary>,
}

/// The bytes every put writes (and every get must find at both ends).
pub fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8).collect()
}

/// A master and one node in this process, on a runtime of their own.
struct Cluster {
    runtime: tokio::runtime::Runtime,
    master: MasterHandle,
    node: moonkv_node::NodeHandle,
}

impl Cluster {
    fn start(segment_size: u64) -> anyhow::Result<Cluster> {
        let runtime = crate::runtime(0)?;
        let master = runtime.block_on(server::start(MasterConfig::ephemeral()))?;
        let mut node = NodeConfig::new(master.rpc_addr().to_string(), segment_size);
        // The spawned master has no secret, whatever the environment says.
        node.auth_secret = None;
        node.grant_secret = None;
        let node = runtime.block_on(Node::start(node))?;
        tracing::info!(master = %master.rpc_addr(), node = node.endpoint(), "cluster started");
        Ok(Cluster {
            runtime,
            master,
            node,
        })
    }

    fn stop(self) {
        self.runtime.block_on(async {
            self.node.shutdown().await;
            self.master.shutdown().await;
        });
    }
}

/// Runs every cell, then the TCP probe, and prints the tables.
pub fn run(args: StoreBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    anyhow::ensure!(
        args.concurrency.iter().all(|c| *c > 0),
        "--concurrency values must be positive"
    );
    anyhow::ensure!(
        args.sizes
            .iter()
            .all(|s| *s > 0 && usize::try_from(*s).is_ok()),
        "--sizes must be positive"
    );
    let cluster = if args.spawn {
        Some(Cluster::start(args.segment_size)?)
    } else {
        None
    };
    let outcome = run_cells(&args, cluster.as_ref());
    if let Some(cluster) = cluster {
        cluster.stop();
    }
    let (rows, probe) = outcome?;
    if args.batch.is_none() {
        print!("{}", table(&rows, &probe));
    }
    Ok(())
}

/// Every cell, size by size, each size followed by its TCP probe (the cluster idle meanwhile).
fn run_cells(
    args: &StoreBenchArgs,
    cluster: Option<&Cluster>,
) -> anyhow::Result<(Vec<Row>, Vec<Probe>)> {
    let master_addr = match (cluster, &args.master) {
        (Some(c), _) => c.master.rpc_addr().to_string(),
        (None, Some(addr)) => addr.clone(),
        (None, None) => anyhow::bail!("give --spawn or --master"),
    };
    let mut config = StoreConfig::new(master_addr);
    if cluster.is_some() {
        config.auth_secret = None;
    }
    if let Some(chunk) = args.chunk_size {
        config.chunk_size = usize::try_from(chunk)?;
    }
    if let Some(lanes) = args.transfer_connections {
        config.transfer_connections = lanes;
    }
    if let Some(cap) = args.connections_per_node {
        config.connections_per_node = cap;
    }
    let runtime = crate::runtime(0)?;
    let store = runtime.block_on(Store::connect(config))?;
    let key_space = format!("mkbs{:08x}", super::nonce() as u32);
    if let Some(batch) = args.batch {
        anyhow::ensure!(
            batch > 0 && args.calls > 0,
            "--batch and --calls must be positive"
        );
        let mut rows = Vec::new();
        for &size in &args.sizes {
            let cell = super::batch::BatchCell {
                runtime: &runtime,
                store: &store,
                batch,
                size: size as usize,
                calls: args.calls,
                key_space: &key_space,
            };
            rows.extend(cell.run()?);
        }
        let stats = store.data_plane_stats();
        print!("{}", super::batch::table(&rows));
        println!(
            "\ndata-plane connections: {} opened in all, {} open at the end, {} checkouts waited for a free connection, {} attached for same-host copies",
            stats.opened, stats.open, stats.waited, stats.attached
        );
        return Ok((Vec::new(), Vec::new()));
    }
    let (mut rows, mut probes) = (Vec::new(), Vec::new());
    for &size in &args.sizes {
        for &clients in &args.concurrency {
            let keys: Vec<String> = (0..clients)
                .map(|c| format!("{key_space}-{size}-{clients}-{c}"))
                .collect();
            let cell = Cell {
                runtime: &runtime,
                store: &store,
                redis: args.redis.as_deref(),
                size: size as usize,
                keys: &keys,
            };
            let outcome = args
                .ops
                .iter()
                .map(|&op| cell.measure(op, args.duration, args.repeat))
                .collect::<anyhow::Result<Vec<Row>>>();
            cell.cleanup();
            rows.extend(outcome?);
        }
        if !args.no_tcp_probe {
            probes.extend(run_probe(args, size as usize)?);
        }
    }
    Ok((rows, probes))
}

/// One object size and client count: each op measured on moonkv and on Redis.
struct Cell<'a> {
    runtime: &'a tokio::runtime::Runtime,
    store: &'a Store,
    redis: Option<&'a str>,
    size: usize,
    keys: &'a [String],
}

impl Cell<'_> {
    fn measure(&self, op: StoreOp, duration: Duration, repeat: usize) -> anyhow::Result<Row> {
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("{k}-{}", op.name()))
            .collect();
        if op == StoreOp::Get {
            self.runtime
                .block_on(prepare(self.store, &keys, self.size))?;
            if let Some(addr) = self.redis {
                resp::prepare(addr, &keys, self.size)?;
            }
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            let run = self
                .runtime
                .block_on(moonkv_cell(self.store, op, self.size, &keys, duration))?;
            tracing::info!(
                size = self.size,
                clients = keys.len(),
                op = op.name(),
                gb_per_s = run.bytes_per_s / 1e9,
                "moonkv run done"
            );
            ours.push(run);
            if let Some(addr) = self.redis {
                let run = resp::run_cell(addr, op, self.size, &keys, duration)?;
                tracing::info!(
                    size = self.size,
                    clients = keys.len(),
                    op = op.name(),
                    gb_per_s = run.bytes_per_s / 1e9,
                    "Redis run done"
                );
                theirs.push(run);
            }
        }
        Ok(Row {
            size: self.size as u64,
            clients: keys.len(),
            op,
            moonkv: Summary::of(ours).ok_or_else(|| anyhow::anyhow!("no run"))?,
            redis: Summary::of(theirs),
        })
    }

    /// Removes the cell's keys on both sides; failures are logged, not fatal.
    fn cleanup(&self) {
        let all: Vec<String> = [StoreOp::Put, StoreOp::Get]
            .iter()
            .flat_map(|op| self.keys.iter().map(move |k| format!("{k}-{}", op.name())))
            .collect();
        self.runtime.block_on(async {
            for key in &all {
                if let Err(e) = self.store.remove(key, true).await {
                    if e.code != moonkv_client::ErrorCode::OBJECT_NOT_FOUND {
                        tracing::warn!(%key, error = %e, "removing a benchmark key failed");
                    }
                }
            }
        });
        if let Some(addr) = self.redis {
            if let Err(e) = resp::cleanup(addr, &all) {
                tracing::warn!(error = %e, "deleting the Redis keys failed");
            }
        }
    }
}

/// Writes every key once, before a get cell.
async fn prepare(store: &Store, keys: &[String], size: usize) -> anyhow::Result<()> {
    let value = pattern(size);
    for key in keys {
        store
            .upsert(key, &value, &ReplicateConfig::default())
            .await?;
    }
    Ok(())
}

/// One run of a cell on moonkv: one task per key, all released together.
async fn moonkv_cell(
    store: &Store,
    op: StoreOp,
    size: usize,
    keys: &[String],
    duration: Duration,
) -> anyhow::Result<Run> {
    let start_line = Arc::new(tokio::sync::Barrier::new(keys.len()));
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, key, start_line) = (store.clone(), key.clone(), start_line.clone());
            tokio::spawn(async move { client(store, op, key, size, duration, start_line).await })
        })
        .collect();
    let mut workers = Vec::with_capacity(tasks.len());
    for task in tasks {
        workers.push(
            task.await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("client task failed: {e}"))),
        );
    }
    Run::from_workers(size, workers)
}

async fn client(
    store: Store,
    op: StoreOp,
    key: String,
    size: usize,
    duration: Duration,
    start_line: Arc<tokio::sync::Barrier>,
) -> anyhow::Result<(u64, Duration, Histogram)> {
    // Allocated and touched before the clock starts, for puts and gets alike.
    let mut buf = pattern(size);
    let config = ReplicateConfig::default();
    let mut latency = Histogram::default();
    start_line.wait().await;
    let started = Instant::now();
    let deadline = started + duration;
    let (mut now, mut ops) = (started, 0u64);
    while now < deadline {
        match op {
            StoreOp::Put => store.upsert(&key, &buf, &config).await?,
            StoreOp::Get => {
                let got = store.get_into(&key, &mut buf).await?;
                anyhow::ensure!(got == size, "get {key} returned {got} bytes");
            }
        }
        let after = Instant::now();
        latency.record(after - now);
        now = after;
        ops += 1;
    }
    if op == StoreOp::Get {
        anyhow::ensure!(buf == pattern(size), "get {key} returned other bytes");
    }
    Ok((ops, now - started, latency))
}

/// The probe's result at one write size and connection count.
struct Probe {
    size: u64,
    connections: usize,
    rate: Summary,
}

/// The probe at one write size (the object size: the same bytes per write and the same buffer
/// footprint as the cells), once per connection count, `repeat` times each.
fn run_probe(args: &StoreBenchArgs, size: usize) -> anyhow::Result<Vec<Probe>> {
    let mut out = Vec::new();
    for &connections in &args.tcp_connections {
        let mut runs = Vec::with_capacity(args.repeat);
        for _ in 0..args.repeat {
            let rate = tcp::probe(connections, size, args.duration)?;
            tracing::info!(
                size,
                connections,
                gb_per_s = rate / 1e9,
                "TCP probe run done"
            );
            runs.push(Run {
                bytes_per_s: rate,
                ops_per_s: rate / size as f64,
                latency: Histogram::default(),
            });
        }
        if let Some(rate) = Summary::of(runs) {
            out.push(Probe {
                size: size as u64,
                connections,
                rate,
            });
        }
    }
    Ok(out)
}

/// `4 KiB`, `1 MiB`, or bytes.
pub(crate) fn size_label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

fn gbps(bytes_per_s: f64) -> String {
    format!("{:.2}", bytes_per_s / 1e9)
}

/// The markdown report: one row per cell and op, then the probe.
fn table(rows: &[Row], probe: &[Probe]) -> String {
    let runs_note = |s: &Summary| format!("{}–{}", gbps(s.min), gbps(s.max));
    let ceiling = |size: u64| {
        probe
            .iter()
            .filter(|p| p.size == size)
            .map(|p| p.rate.median.bytes_per_s)
            .max_by(f64::total_cmp)
    };
    let mut t = String::from(
        "| size | clients | op | GB/s | min–max | ops/s | p50 µs | p99 µs \
         | Redis GB/s | Redis p50 µs | Redis p99 µs | × Redis | of TCP ceiling | target |\n\
         |--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for r in rows {
        let m = &r.moonkv.median;
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            size_label(r.size),
            r.clients,
            r.op.name(),
            gbps(m.bytes_per_s),
            runs_note(&r.moonkv),
            grouped(m.ops_per_s),
            micros(m.latency.quantile_us(0.5)),
            micros(m.latency.quantile_us(0.99)),
        ));
        let vs_redis = r
            .redis
            .as_ref()
            .map(|s| m.bytes_per_s / s.median.bytes_per_s);
        match &r.redis {
            Some(s) => t.push_str(&format!(
                " {} | {} | {} | {:.2}× |",
                gbps(s.median.bytes_per_s),
                micros(s.median.latency.quantile_us(0.5)),
                micros(s.median.latency.quantile_us(0.99)),
                vs_redis.unwrap_or_default(),
            )),
            None => t.push_str(" – | – | – | – |"),
        }
        let vs_tcp = ceiling(r.size).map(|c| m.bytes_per_s / c);
        match vs_tcp {
            Some(share) => t.push_str(&format!(" {:.0}% |", share * 100.0)),
            None => t.push_str(" – |"),
        }
        t.push_str(&format!(" {} |\n", verdict(r.size, vs_redis, vs_tcp)));
    }
    if !probe.is_empty() {
        t.push_str("\n| raw loopback TCP, write size | connections | GB/s | min–max |\n");
        t.push_str("|--:|--:|--:|--:|\n");
        for p in probe {
            t.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                size_label(p.size),
                p.connections,
                gbps(p.rate.median.bytes_per_s),
                runs_note(&p.rate)
            ));
        }
    }
    t
}

/// `met`, `**missed**` or `–` (no target below 1 MiB, or nothing to compare with).
fn verdict(size: u64, vs_redis: Option<f64>, vs_tcp: Option<f64>) -> &'static str {
    if size < TARGET_FROM || (vs_redis.is_none() && vs_tcp.is_none()) {
        return "–";
    }
    let met =
        vs_redis.is_none_or(|r| r >= TARGET_VS_REDIS) && vs_tcp.is_none_or(|s| s >= TARGET_VS_TCP);
    if met {
        "met"
    } else {
        "**missed**"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_labelled() {
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(64 << 20), "64 MiB");
        assert_eq!(size_label(1000), "1000 B");
    }

    #[test]
    fn targets_apply_from_one_mib() {
        assert_eq!(verdict(4096, Some(0.1), Some(0.1)), "–");
        assert_eq!(verdict(1 << 20, Some(1.6), Some(0.75)), "met");
        assert_eq!(verdict(1 << 20, Some(1.4), Some(0.75)), "**missed**");
        assert_eq!(verdict(1 << 20, None, Some(0.6)), "**missed**");
        assert_eq!(verdict(1 << 20, None, None), "–");
    }
}
