//! The `moonkv` binary: one executable for every role.
//!
//! - `master`: metadata server (`master_cmd`).
//! - `up`, `node`, `put`, `get`, `rm`, `ls`, `stat`: see their modules.

mod master_cmd;

use clap::{Parser, Subcommand};

/// moonkv: a distributed KV-cache store for LLM serving.
#[derive(Parser, Debug)]
#[command(version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the master: object metadata, placement, leases, eviction, events, admin HTTP.
    Master(master_cmd::MasterArgs),
}

/// Prints the one JSON line that tells scripts and tests where a server listens.
pub fn print_ready(fields: &[(&str, String)]) {
    let mut map = serde_json::Map::new();
    map.insert("event".into(), "ready".into());
    for (k, v) in fields {
        map.insert((*k).into(), v.clone().into());
    }
    println!("{}", serde_json::Value::Object(map));
}

/// Resolves on SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Master(args) => {
            let config = args.config()?;
            runtime(config.rpc_threads)?.block_on(master_cmd::run(config))
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
