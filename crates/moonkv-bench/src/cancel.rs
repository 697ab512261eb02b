//! `moonkv bench cancel`: does a cancelled read ever write into memory the caller got back?
//!
//! Puts one large object through a running cluster (`moonkv up`), then runs rounds of a read
//! under a timeout short enough to cancel it mid-transfer. After each cancelled call the
//! destination is dropped, a new buffer of the same size is filled with `0xAA` (the allocator
//! usually hands back the freed address, which the probe reports), and after `--settle` every
//! byte of it is checked. A store that lets a node go on copying into a dropped buffer shows up
//! as overwritten rounds; a correct one reports 0. Run it with same-host copies on (the
//! default) and off (`MOONKV_SAME_HOST=0`).

use moonkv_client::{ReplicateConfig, Store, StoreConfig};
use serde::Serialize;
use std::time::{Duration, Instant};

/// `moonkv bench cancel`.
#[derive(clap::Args, Debug)]
pub struct CancelProbeArgs {
    /// The master's RPC address (`moonkv up` prints it).
    #[arg(long, default_value = "127.0.0.1:50051")]
    master: String,
    /// Size of the object and of every buffer.
    #[arg(long, default_value = "256MiB", value_parser = moonkv_proto::units::size_flag)]
    size: u64,
    /// Rounds of cancel, drop, reuse and check.
    #[arg(long, default_value_t = 30)]
    rounds: u32,
    /// Shortest timeout; the rounds spread evenly up to `--max-timeout`.
    #[arg(long, default_value = "300us", value_parser = parse_micros)]
    min_timeout: Duration,
    /// Longest timeout.
    #[arg(long, default_value = "3300us", value_parser = parse_micros)]
    max_timeout: Duration,
    /// How long the new buffer is watched before it is checked.
    #[arg(long, default_value = "300ms", value_parser = moonkv_proto::units::duration_flag)]
    settle: Duration,
    /// The call to cancel: `get_into` (caller's buffer) or `get` (the store's buffer).
    #[arg(long, default_value = "get_into", value_parser = ["get_into", "get"])]
    call: String,
    /// Print JSON instead of the summary line.
    #[arg(long)]
    json: bool,
}

/// `300us`, or any duration `moonkv_proto::units::parse_duration` reads.
fn parse_micros(text: &str) -> Result<Duration, moonkv_proto::units::FlagError> {
    match text.trim().strip_suffix("us") {
        Some(n) => n
            .trim()
            .parse::<u64>()
            .map(Duration::from_micros)
            .map_err(|_| {
                moonkv_proto::units::FlagError(format!("`{text}` is not a number of µs").into())
            }),
        None => moonkv_proto::units::duration_flag(text),
    }
}

#[derive(Debug, Serialize)]
struct Outcome {
    call: String,
    same_host: bool,
    size: u64,
    rounds: u32,
    cancelled: u32,
    completed: u32,
    same_address: u32,
    overwritten: u32,
}

/// Runs the probe; an error if any round found an overwritten buffer.
pub fn run(args: CancelProbeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be positive");
    anyhow::ensure!(args.size > 0, "--size must be positive");
    anyhow::ensure!(
        args.min_timeout <= args.max_timeout,
        "--min-timeout is above --max-timeout"
    );
    let runtime = crate::runtime(0)?;
    let outcome = runtime.block_on(probe(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        println!(
            "{} of {} MiB, same-host {}: {} rounds, {} cancelled, {} completed, {} reused the freed address, {} overwritten",
            outcome.call,
            outcome.size >> 20,
            if outcome.same_host { "on" } else { "off" },
            outcome.rounds,
            outcome.cancelled,
            outcome.completed,
            outcome.same_address,
            outcome.overwritten
        );
    }
    anyhow::ensure!(
        outcome.overwritten == 0,
        "{} of {} buffers were written after their call was cancelled",
        outcome.overwritten,
        outcome.rounds
    );
    Ok(())
}

async fn probe(args: &CancelProbeArgs) -> anyhow::Result<Outcome> {
    let size = usize::try_from(args.size)?;
    let store = Store::connect(StoreConfig::new(args.master.clone())).await?;
    let key = format!("cancel-probe-{:x}", crate::nonce());
    let value = vec![0x11u8; size];
    store
        .put(&key, &value, &ReplicateConfig::default())
        .await
        .map_err(|e| anyhow::anyhow!("put {key}: {e}"))?;
    drop(value);
    let mut outcome = Outcome {
        call: args.call.clone(),
        same_host: moonkv_dataplane::same_host::enabled_by_env().unwrap_or(true),
        size: args.size,
        rounds: args.rounds,
        cancelled: 0,
        completed: 0,
        same_address: 0,
        overwritten: 0,
    };
    let spread = args.max_timeout.saturating_sub(args.min_timeout);
    for round in 0..args.rounds {
        let step = if args.rounds > 1 {
            spread * round / (args.rounds - 1)
        } else {
            Duration::ZERO
        };
        let limit = args.min_timeout + step;
        let mut freed = 0usize;
        let finished = if args.call == "get" {
            tokio::time::timeout(limit, store.get(&key)).await.is_ok()
        } else {
            let mut buf = vec![0u8; size];
            freed = buf.as_ptr() as usize;
            let done = tokio::time::timeout(limit, store.get_into(&key, &mut buf))
                .await
                .is_ok();
            drop(buf);
            done
        };
        if finished {
            outcome.completed += 1;
        } else {
            outcome.cancelled += 1;
        }
        let fresh = vec![0xAAu8; size];
        if fresh.as_ptr() as usize == freed {
            outcome.same_address += 1;
        }
        let watched = Instant::now();
        tokio::time::sleep(args.settle).await;
        if let Some(at) = fresh.iter().position(|&b| b != 0xAA) {
            outcome.overwritten += 1;
            tracing::warn!(
                round,
                offset = at,
                after_ms = watched.elapsed().as_millis() as u64,
                "a byte of the new buffer changed"
            );
        }
    }
    let _ = store.remove(&key, true).await;
    Ok(outcome)
}
