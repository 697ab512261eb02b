//! `moonkv bench memory`: metadata bytes per resident object. Puts N objects into an
//! in-process engine and reports the growth of the process's resident set per object.

use super::load::{LoadSettings, Requests};
use super::report::grouped;
use super::target;
use moonkv_proto::ClientId;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `moonkv bench memory`.
#[derive(clap::Args, Debug)]
pub struct MemoryBenchArgs {
    /// Objects to put (PutStart + PutEnd each, one replica of `--value-size` bytes).
    #[arg(long, default_value_t = 10_000_000)]
    objects: u64,
    /// Object size announced by every put, in bytes.
    #[arg(long, default_value_t = 4096)]
    value_size: u64,
    /// Report the resident set this many times along the way.
    #[arg(long, default_value_t = 5)]
    checkpoints: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// One point of the run.
#[derive(Clone, Debug, Serialize)]
struct Checkpoint {
    objects: u64,
    rss_bytes: u64,
    bytes_per_object: f64,
    puts_per_s: f64,
}

/// Resident set size of this process, from `/proc/self/statm` (pages) and the page size
/// implied by `/proc/self/status` (`VmRSS`, kB), falling back to 4 KiB pages.
pub fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| anyhow::anyhow!("cannot read /proc/self/statm (Linux only): {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/statm: {statm:?}"))?;
    Ok(pages * page_size())
}

fn page_size() -> u64 {
    // KernelPageSize of the first mapping; every mapping of a normal process shares it.
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4096, |kb| kb * 1024)
}

/// Puts the objects, measuring the resident set before and at each checkpoint.
pub fn run(args: MemoryBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.objects > 0, "--objects must be positive");
    let settings = LoadSettings {
        duration: Duration::ZERO,
        segments: 128,
        segment_size: 64 << 30,
        value_size: args.value_size,
        prefill: 0,
    };
    let capacity = settings.segments * settings.segment_size;
    anyhow::ensure!(
        args.objects
            .saturating_mul(args.value_size.next_multiple_of(64))
            <= capacity,
        "{} objects of {} bytes do not fit the 8 TiB of fake segments",
        args.objects,
        args.value_size
    );
    let engine = Arc::new(super::master::new_engine());
    let nonce = super::nonce();
    target::mount_all(
        &*engine,
        ClientId::new(nonce, 1),
        &target::fake_segments(nonce, &settings),
    )?;
    let prefix = format!("mkb{:08x}-w000-", nonce as u32);
    let key_len = prefix.len() + 12;
    let mut requests = Requests::new(ClientId::new(nonce, 2), prefix, args.value_size);

    let before = rss_bytes()?;
    let step = (args.objects / args.checkpoints.max(1)).max(1);
    let mut points = Vec::new();
    let started = Instant::now();
    let mut n = 0;
    while n < args.objects {
        let until = (n + step).min(args.objects);
        while n < until {
            requests
                .put(&*engine, n)
                .map_err(|e| anyhow::anyhow!("put {n} failed: {e}"))?;
            n += 1;
        }
        let rss = rss_bytes()?;
        let point = Checkpoint {
            objects: n,
            rss_bytes: rss,
            bytes_per_object: rss.saturating_sub(before) as f64 / n as f64,
            puts_per_s: n as f64 / started.elapsed().as_secs_f64(),
        };
        tracing::info!(
            objects = n,
            bytes_per_object = point.bytes_per_object,
            "memory checkpoint"
        );
        points.push(point);
    }
    let stats = engine.stats();
    if args.json {
        let out = serde_json::json!({
            "objects": args.objects,
            "key_bytes": key_len,
            "value_size": args.value_size,
            "rss_before_bytes": before,
            "engine_objects": stats.key_count,
            "checkpoints": points,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "Metadata memory: {} objects (keys of {key_len} bytes, one {}-byte replica each), \
         resident set {} MiB before the puts; engine reports {} objects.\n",
        grouped(args.objects as f64),
        args.value_size,
        grouped(before as f64 / (1 << 20) as f64),
        grouped(stats.key_count as f64),
    );
    println!("| objects | RSS MiB | RSS growth B/object | puts/s so far |");
    println!("|--:|--:|--:|--:|");
    for p in &points {
        println!(
            "| {} | {} | {:.0} | {} |",
            grouped(p.objects as f64),
            grouped(p.rss_bytes as f64 / (1 << 20) as f64),
            p.bytes_per_object,
            grouped(p.puts_per_s)
        );
    }
    Ok(())
}
