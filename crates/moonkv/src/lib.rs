//! The `moonkv` command: one executable for every role. The binary (`main.rs`) and the Python
//! package's `moonkv` script both run [`main_with_args`].
//!
//! - `master`: metadata server (`master_cmd`).
//! - `up`: master and node in one process (`up_cmd`).
//! - `node`: memory segments and the data plane (`node_cmd`).
//! - `put`, `get`, `rm`, `ls`, `stat`: the client commands (`client_cmd`).
//! - `events tail`, `events index`: follow the KV event stream (`events_cmd`).
//! - `indexer`: the prefix index routers query, and `indexer hash` (`indexer_cmd`).

mod client_cmd;
mod events_cmd;
mod indexer_cmd;
mod master_cmd;
mod node_cmd;
mod progress;
mod up_cmd;

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
    /// Run a master and one node in one process, with the event stream on: the quick start.
    Up(up_cmd::UpArgs),
    /// Run the master: object metadata, placement, leases, eviction, events, admin HTTP.
    Master(master_cmd::MasterArgs),
    /// Run a node: contribute memory segments to a cluster and serve their bytes.
    Node(node_cmd::NodeArgs),
    #[command(flatten)]
    Client(client_cmd::ClientCommand),
    /// Follow the KV event stream: tail it or keep a placement index.
    Events(events_cmd::EventsArgs),
    /// Serve the prefix index KV-aware routers query (RFC #1403 HTTP API), fed by event streams.
    Indexer(indexer_cmd::IndexerArgs),
    /// Measure moonkv: master metadata rate, data plane, event stream rate.
    #[cfg(feature = "bench")]
    Bench(moonkv_bench::BenchArgs),
    /// Measure moonkv (not in this build: `cargo build --release -p moonkv` has it).
    #[cfg(not(feature = "bench"))]
    Bench(NoBench),
}

/// `moonkv bench` in a build without the `bench` feature (the Python wheel's).
#[cfg(not(feature = "bench"))]
#[derive(clap::Args, Debug)]
struct NoBench {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
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

/// A note for the operator when this machine is a virtual machine whose idle CPUs halt without
/// polling first (`cpuidle-haltpoll` with `guest_halt_poll_ns` 0): every small call then waits
/// for hypervisor wake-ups (`docs/operations.md`, *Small calls on virtual machines*).
pub fn idle_poll_note() -> Option<String> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    halt_poll_note(
        read("/sys/devices/system/cpu/cpuidle/current_driver").as_deref(),
        read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").as_deref(),
    )
}

/// [`idle_poll_note`] from the two sysfs files' contents.
fn halt_poll_note(driver: Option<&str>, poll_ns: Option<&str>) -> Option<String> {
    let off = driver?.trim() == "haltpoll" && poll_ns?.trim().parse::<u64>().ok()? == 0;
    off.then(|| {
        "idle vCPUs halt without polling (haltpoll guest_halt_poll_ns is 0): small calls wait \
         for hypervisor wake-ups; see docs/operations.md, \"Small calls on virtual machines\""
            .to_string()
    })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    shutdown_signal().await
}

/// Registers SIGINT and SIGTERM handlers now and returns a future that resolves on either.
///
/// Servers call this before printing their ready line, so a signal sent right after the line
/// is seen (a handler registered only when first awaited would miss it and the default action
/// would kill the process without a clean shutdown).
pub fn shutdown_signal() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            return Box::pin(async move {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
        }
    }
    Box::pin(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(moonkv_client::util::runtime(worker_threads)?)
}

/// For the long-running servers (master, node, `up`): glibc's malloc raises its mmap threshold
/// after each large free (up to 32 MiB), after which large buffers (scan answers, 16 MiB
/// frames) come from heaps it rarely gives back, and a burst's memory stays resident for good.
/// A fixed threshold keeps every buffer of 256 KiB or more in its own mapping, returned to the
/// system when freed. Called before the runtime starts any thread.
#[allow(unsafe_code)] // one libc call, before any other thread exists
fn return_large_buffers_when_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no other thread is running yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if matches!(
        cli.command,
        Command::Up(_) | Command::Node(_) | Command::Master(_)
    ) {
        return_large_buffers_when_freed();
    }
    match cli.command {
        Command::Up(args) => {
            let config = args.config()?;
            runtime(config.rpc_threads)?.block_on(up_cmd::run(args, config))
        }
        Command::Node(args) => runtime(0)?.block_on(node_cmd::run(args)),
        Command::Client(command) => runtime(2)?.block_on(client_cmd::run(command)),
        Command::Events(args) => events_cmd::run(args),
        Command::Indexer(args) => indexer_cmd::run(args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => moonkv_bench::run(args),
        #[cfg(not(feature = "bench"))]
        Command::Bench(_) => anyhow::bail!(
            "this moonkv was built without `moonkv bench` (the Python wheel leaves it out); \
             build the full binary with `cargo build --release -p moonkv`"
        ),
        Command::Master(args) => {
            let config = args.config()?;
            runtime(config.rpc_threads)?.block_on(master_cmd::run(config))
        }
    }
}

/// Runs the command line `args` (the program name first, as in `std::env::args_os`) and
/// returns the process's exit status: 0 on success, 1 on an error (printed to stderr). Usage
/// errors, `--help` and `--version` end the process from inside, as clap does.
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    // A host process (the Python package) may have set up logging already; keep it then.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse_from(args);
    if let Err(e) = moonkv_node::failpoints::configure_from_env() {
        eprintln!("error: {e}");
        return 1;
    }
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::halt_poll_note;

    #[test]
    fn a_note_only_for_a_haltpoll_driver_that_never_polls() {
        let note = halt_poll_note(Some("haltpoll\n"), Some("0\n")).expect("polling off");
        assert!(note.contains("guest_halt_poll_ns is 0"), "{note}");
        assert!(note.contains("docs/operations.md"), "{note}");
        // Polling on, another idle driver, files missing or unreadable: nothing to say.
        assert_eq!(halt_poll_note(Some("haltpoll\n"), Some("200000\n")), None);
        assert_eq!(halt_poll_note(Some("acpi_idle\n"), Some("0\n")), None);
        assert_eq!(halt_poll_note(Some("haltpoll"), None), None);
        assert_eq!(halt_poll_note(None, Some("0")), None);
        assert_eq!(halt_poll_note(Some("haltpoll"), Some("garbage")), None);
    }
}
