//! `moonkv bench readopt`: how long a new master takes to get every object back from a node.
//!
//! Starts a master and one node in this process, writes N objects with batch puts, waits until
//! the node's catalog holds all of them, stops the master and starts a new one on the same
//! port, and measures the time from the new master's start until it holds N objects again
//! (the node re-mounts on its next heartbeat and announces its catalog).

use moonkv_client::{ReplicateConfig, Store, StoreConfig};
use moonkv_master::server::{self, MasterConfig};
use moonkv_node::{Node, NodeConfig};
use serde::Serialize;
use std::time::{Duration, Instant};

/// `moonkv bench readopt`.
#[derive(clap::Args, Debug)]
pub struct ReadoptBenchArgs {
    /// Objects to write and get back.
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// Size of every object in bytes.
    #[arg(long, default_value_t = 512)]
    value_size: u64,
    /// Keys per batch put.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Node heartbeat period in milliseconds (a restarted master is noticed on the next one).
    #[arg(long, default_value_t = 1000)]
    ping_ms: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Outcome {
    objects: u64,
    value_size: u64,
    write_s: f64,
    catalog_lag_ms: f64,
    readopt_s: f64,
    announce_ms: u64,
    objects_per_s: f64,
}

/// Runs the benchmark.
pub fn run(args: ReadoptBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.objects > 0, "--objects must be positive");
    anyhow::ensure!(args.value_size > 0, "--value-size must be positive");
    anyhow::ensure!(args.batch > 0, "--batch must be positive");
    let runtime = crate::runtime(0)?;
    let outcome = runtime.block_on(measure(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        println!("| objects | value | write (s) | catalog lag (ms) | master start → all re-adopted (s) | announce (ms) | objects/s |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        println!(
            "| {} | {} B | {:.1} | {:.0} | {:.2} | {} | {:.0} |",
            outcome.objects,
            outcome.value_size,
            outcome.write_s,
            outcome.catalog_lag_ms,
            outcome.readopt_s,
            outcome.announce_ms,
            outcome.objects_per_s
        );
    }
    Ok(())
}

async fn measure(args: &ReadoptBenchArgs) -> anyhow::Result<Outcome> {
    let master = server::start(MasterConfig::ephemeral()).await?;
    let rpc = master.rpc_addr();
    let slot = args.value_size.next_multiple_of(64);
    let segment = (args.objects * slot).next_multiple_of(1 << 20) + (64 << 20);
    let mut node = NodeConfig::new(rpc.to_string(), segment);
    node.auth_secret = None;
    node.grant_secret = None;
    node.ping_interval = Duration::from_millis(args.ping_ms);
    let node = Node::start(node).await?;
    let mut config = StoreConfig::new(rpc.to_string());
    config.auth_secret = None;
    let store = Store::connect(config).await?;

    let value = vec![0x5a; args.value_size as usize];
    let started = Instant::now();
    let cfg = ReplicateConfig::default();
    let mut next = 0u64;
    while next < args.objects {
        let n = (args.objects - next).min(args.batch as u64);
        let keys: Vec<String> = (next..next + n)
            .map(|i| format!("readopt-{i:09}"))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values: Vec<&[u8]> = vec![value.as_slice(); keys.len()];
        for (k, r) in keys
            .iter()
            .zip(store.batch_put_from(&key_refs, &values, &cfg).await)
        {
            r.map_err(|e| anyhow::anyhow!("put {k}: {e}"))?;
        }
        next += n;
    }
    let write_s = started.elapsed().as_secs_f64();
    let acked = Instant::now();
    wait_until(Duration::from_secs(120), || {
        node.catalog_len() as u64 >= args.objects
    })
    .await?;
    let catalog_lag_ms = acked.elapsed().as_secs_f64() * 1e3;
    drop(store);

    master.shutdown().await;
    let mut again = MasterConfig::ephemeral();
    again.rpc_addr.set_port(rpc.port());
    let restarted = Instant::now();
    let master = server::start(again).await?;
    let engine = master.engine().clone();
    wait_until(Duration::from_secs(600), || {
        engine.stats().key_count >= args.objects
    })
    .await?;
    let readopt_s = restarted.elapsed().as_secs_f64();
    let (_, announce_ms) = node.last_readoption();
    node.shutdown().await;
    master.shutdown().await;
    Ok(Outcome {
        objects: args.objects,
        value_size: args.value_size,
        write_s,
        catalog_lag_ms,
        readopt_s,
        announce_ms,
        objects_per_s: args.objects as f64 / readopt_s,
    })
}

async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    // Not too often: counting objects visits every shard, and this competes with the work
    // being measured.
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "not done within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
