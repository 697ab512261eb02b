//! Client commands: `put`, `get`, `rm`, `ls`, `stat`.
//!
//! Output is for people by default and one JSON document with `--json`. A failed command
//! returns an error whose text starts with the error name (`OBJECT_NOT_FOUND: ...`); with
//! `--json` the same error is also printed on stdout as `{"ok":false,"error":NAME,...}`.

/// `println!` for command output, shadowing the standard one in this module: when the reader
/// has gone away (`moonkv ls | head`), the command ends quietly with success instead of
/// panicking on the closed pipe.
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

use anyhow::Context;
use moonkv_client::{Error, ErrorCode, ReplicateConfig, Store, StoreConfig};
use moonkv_proto::units::format_size;
use moonkv_proto::ReplicaKind;
use serde_json::json;
use std::io::{Read, Write};
use std::time::Duration;

/// Options shared by every client command.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientOptions {
    /// Master RPC address.
    #[arg(long, env = "MOONKV_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Tenant to act in (empty = `default`).
    #[arg(long, env = "MOONKV_TENANT", default_value = "")]
    pub tenant: String,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Deadline of one master request, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// `moonkv put KEY FILE|-`.
#[derive(clap::Args, Debug, Clone)]
pub struct PutArgs {
    /// Object key.
    pub key: String,
    /// File holding the value, or `-` for stdin.
    pub file: String,
    /// Replace the value if the key exists.
    #[arg(long)]
    pub upsert: bool,
    /// Memory replicas wanted.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Store nothing unless every one of --replicas can be placed (without it, a put with room
    /// for fewer stores what fits and says how many).
    #[arg(long)]
    pub all_replicas: bool,
    /// Never evict this object.
    #[arg(long)]
    pub hard_pin: bool,
    /// Segment names to try first (repeatable).
    #[arg(long = "preferred-segment", value_name = "NAME")]
    pub preferred_segments: Vec<String>,
    /// Also write a disk replica (needs a node with a disk tier).
    #[arg(long)]
    pub disk: bool,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// `moonkv get KEY [-o FILE]`.
#[derive(clap::Args, Debug, Clone)]
pub struct GetArgs {
    /// Object key.
    pub key: String,
    /// Write the value to FILE instead of stdout (required with --json).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// `moonkv rm KEY [--force]` or `moonkv rm --all [--force]`.
#[derive(clap::Args, Debug, Clone)]
pub struct RmArgs {
    /// Object key.
    #[arg(required_unless_present_any = ["all", "regex"], conflicts_with_all = ["all", "regex"])]
    pub key: Option<String>,
    /// Remove every object of the tenant.
    #[arg(long, conflicts_with = "regex")]
    pub all: bool,
    /// Remove every object whose key matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    /// Remove even objects under a read lease.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// `moonkv ls [REGEX]`.
#[derive(clap::Args, Debug, Clone)]
pub struct LsArgs {
    /// Regular expression matched anywhere in the key (default: every key).
    pub regex: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// `moonkv stat`: segments, capacity, usage and key count, from the master's admin HTTP port
/// (the one the master announces, unless --admin says otherwise).
#[derive(clap::Args, Debug, Clone)]
pub struct StatArgs {
    /// Master admin HTTP address (default: the one the master announces, else the --master
    /// host with port 9003).
    #[arg(long, env = "MOONKV_ADMIN")]
    pub admin: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// The client subcommands, ready to be flattened into the binary's command enum.
#[derive(clap::Subcommand, Debug, Clone)]
#[command(about = None, long_about = None)]
pub enum ClientCommand {
    /// Store a file (or stdin) under a key.
    Put(PutArgs),
    /// Fetch a key to stdout or a file.
    Get(GetArgs),
    /// Remove a key, the keys matching a regex, or every key of the tenant.
    Rm(RmArgs),
    /// List keys with their size and replicas.
    Ls(LsArgs),
    /// Show segments, capacity, usage and key count.
    Stat(StatArgs),
}

/// Runs one client command.
pub async fn run(command: ClientCommand) -> anyhow::Result<()> {
    let (json, result) = match command {
        ClientCommand::Put(a) => (a.options.json, run_put(a).await),
        ClientCommand::Get(a) => (a.options.json, run_get(a).await),
        ClientCommand::Rm(a) => (a.options.json, run_rm(a).await),
        ClientCommand::Ls(a) => (a.options.json, run_ls(a).await),
        ClientCommand::Stat(a) => (a.options.json, run_stat(a).await),
    };
    if let (true, Err(e)) = (json, &result) {
        let (name, code, message) = match e.downcast_ref::<Error>() {
            Some(err) => (err.code.name(), err.code.as_i32(), err.message.to_string()),
            None => (
                "ERROR",
                ErrorCode::INTERNAL_ERROR.as_i32(),
                format!("{e:#}"),
            ),
        };
        println!(
            "{}",
            json!({"ok": false, "error": name, "code": code, "message": message})
        );
    }
    result
}

async fn connect(options: &ClientOptions) -> anyhow::Result<Store> {
    connect_with_progress(options, None).await
}

async fn connect_with_progress(
    options: &ClientOptions,
    progress: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
) -> anyhow::Result<Store> {
    let mut config = StoreConfig::new(options.master.clone());
    config.progress = progress;
    config.tenant = options.tenant.clone();
    config.rpc_timeout = Duration::from_millis(options.timeout_ms.max(1));
    Ok(Store::connect(config).await?)
}

/// `moonkv put`.
pub async fn run_put(args: PutArgs) -> anyhow::Result<()> {
    let value = if args.file == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let config = ReplicateConfig {
        replica_num: args.replicas,
        with_hard_pin: args.hard_pin,
        preferred_segments: args.preferred_segments.clone(),
        with_disk_replica: args.disk,
        ..ReplicateConfig::default()
    };
    let copies = u64::from(config.replica_num.max(1)) + u64::from(config.with_disk_replica);
    let total = value.len() as u64 * copies;
    let (counter, progress) = crate::progress::Progress::start(
        &format!("put {}", args.key),
        Some(total),
        !args.options.json,
    );
    let store = connect_with_progress(&args.options, counter).await?;
    let started = std::time::Instant::now();
    let result = store
        .put_counted(&args.key, &value, &config, args.upsert, args.all_replicas)
        .await;
    progress.finish().await;
    let replicas = match result {
        Ok(made) => made,
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => {
            let hint = format!("{}; use --upsert to replace it", e.message);
            return Err(Error::new(e.code, hint).into());
        }
        Err(e) => return Err(e.into()),
    };
    let wanted = config.replica_num.max(1);
    let elapsed = started.elapsed();
    if args.options.json {
        let ms = elapsed.as_secs_f64() * 1000.0;
        println!(
            "{}",
            json!({"ok": true, "key": args.key, "size": value.len(), "upsert": args.upsert, "replicas": replicas, "replicas_requested": wanted, "elapsed_ms": ms})
        );
    } else {
        let short = if replicas < wanted as usize {
            format!(", only {replicas} of {wanted} replicas: not enough room")
        } else {
            format!(", {replicas} replica(s)")
        };
        println!(
            "stored {} ({}{short}) in {elapsed:.2?}",
            args.key,
            format_size(value.len() as u64)
        );
    }
    Ok(())
}

/// `moonkv get`.
pub async fn run_get(args: GetArgs) -> anyhow::Result<()> {
    if args.options.json && args.output.is_none() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "--json prints metadata only; give -o FILE for the value",
        )
        .into());
    }
    let (counter, progress) =
        crate::progress::Progress::start(&format!("get {}", args.key), None, !args.options.json);
    let store = connect_with_progress(&args.options, counter).await?;
    let value = store.get(&args.key).await;
    progress.finish().await;
    let value = value?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, &value).with_context(|| format!("writing {}", path.display()))?;
            if args.options.json {
                println!(
                    "{}",
                    json!({"ok": true, "key": args.key, "size": value.len(), "output": path})
                );
            } else {
                eprintln!(
                    "wrote {} ({}) to {}",
                    args.key,
                    format_size(value.len() as u64),
                    path.display()
                );
            }
        }
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(&value).and_then(|()| out.flush()) {
                // The reader stopped early (`moonkv get k | head -c 10`): not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                written => written.context("writing to stdout")?,
            }
        }
    }
    Ok(())
}

/// `moonkv rm`.
pub async fn run_rm(args: RmArgs) -> anyhow::Result<()> {
    let store = connect(&args.options).await?;
    let leased = |e: Error| {
        if e.code == ErrorCode::OBJECT_HAS_LEASE {
            Error::new(
                e.code,
                format!(
                    "{}; a recent read holds a lease (default 10 s): retry later or use --force",
                    e.message
                ),
            )
        } else {
            e
        }
    };
    let (what, removed) = if args.all {
        (
            "every object".to_string(),
            store.remove_all(args.force).await?,
        )
    } else if let Some(regex) = &args.regex {
        (
            format!("keys matching '{regex}'"),
            store.remove_by_regex(regex, args.force).await?,
        )
    } else {
        let key = args.key.clone().unwrap_or_default();
        store.remove(&key, args.force).await.map_err(leased)?;
        (key, 1)
    };
    if args.options.json {
        println!("{}", json!({"ok": true, "removed": removed}));
    } else {
        println!("removed {what}: {removed} object(s)");
    }
    Ok(())
}

/// `moonkv ls`.
pub async fn run_ls(args: LsArgs) -> anyhow::Result<()> {
    let store = connect(&args.options).await?;
    let objects = store.list(args.regex.as_deref().unwrap_or(".*")).await?;
    if args.options.json {
        let list: Vec<_> = objects
            .iter()
            .map(|o| {
                let replicas: Vec<_> = o
                    .replicas
                    .iter()
                    .map(|r| json!({"id": r.id.0, "segment": r.segment_name, "endpoint": r.endpoint, "medium": medium(r.kind)}))
                    .collect();
                json!({"key": o.key, "size": o.size, "replicas": replicas})
            })
            .collect();
        println!(
            "{}",
            json!({"ok": true, "count": list.len(), "objects": list})
        );
        return Ok(());
    }
    let width = objects
        .iter()
        .map(|o| o.key.len())
        .max()
        .unwrap_or(3)
        .max(3);
    println!("{:<width$}  {:>10}  REPLICAS", "KEY", "SIZE");
    for o in &objects {
        let segments: Vec<String> = o
            .replicas
            .iter()
            .map(|r| match r.kind {
                ReplicaKind::Memory => r.segment_name.to_string(),
                ReplicaKind::LocalDisk => format!("{} (disk)", r.segment_name),
            })
            .collect();
        println!(
            "{:<width$}  {:>10}  {}",
            o.key,
            format_size(o.size),
            segments.join(",")
        );
    }
    println!("{} object(s)", objects.len());
    Ok(())
}

/// `moonkv stat`.
pub async fn run_stat(args: StatArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(args.options.timeout_ms.max(1));
    let admin = match &args.admin {
        Some(admin) => admin.clone(),
        None => announced_admin(&args.options.master, timeout)
            .await?
            .unwrap_or_else(|| default_admin(&args.options.master)),
    };
    let detail: serde_json::Value =
        serde_json::from_str(&http_get(&admin, "/get_segments_detail", timeout).await?)
            .context("the master's /get_segments_detail answer is not JSON")?;
    let metrics = http_get(&admin, "/metrics", timeout).await?;
    let gauge = |name: &str| metric_value(&metrics, name);
    let capacity = gauge("master_total_capacity_bytes");
    let allocated = gauge("master_allocated_bytes");
    let keys = gauge("master_key_count");
    let disk_capacity = gauge("master_total_file_capacity_bytes");
    let disk_used = gauge("master_allocated_file_size_bytes");
    let segments = detail
        .get("segments")
        .and_then(|s| s.as_array())
        .cloned()
        .unwrap_or_default();
    let nodes = node_stats(&segments, timeout).await;
    if args.options.json {
        let nodes: Vec<serde_json::Value> = nodes
            .iter()
            .map(|(endpoint, stats)| match stats {
                Ok(s) => json!({"endpoint": endpoint, "data_plane": s}),
                Err(e) => json!({"endpoint": endpoint, "error": e.to_string()}),
            })
            .collect();
        let summary = json!({"ok": true, "capacity_bytes": capacity, "allocated_bytes": allocated, "disk_capacity_bytes": disk_capacity, "disk_allocated_bytes": disk_used, "keys": keys, "segments": segments, "nodes": nodes});
        println!("{summary}");
        return Ok(());
    }
    println!("master {}  admin {admin}", args.options.master);
    let (cap, used) = (
        capacity.unwrap_or(0.0) as u64,
        allocated.unwrap_or(0.0) as u64,
    );
    let pct = if cap == 0 {
        0.0
    } else {
        used as f64 * 100.0 / cap as f64
    };
    println!(
        "capacity {}  used {} ({pct:.1}%)  keys {}",
        format_size(cap),
        format_size(used),
        keys.unwrap_or(0.0) as u64
    );
    let (disk_cap, disk_used) = (
        disk_capacity.unwrap_or(0.0) as u64,
        disk_used.unwrap_or(0.0) as u64,
    );
    if disk_cap > 0 {
        let pct = disk_used as f64 * 100.0 / disk_cap as f64;
        println!(
            "disk {}  used {} ({pct:.1}%)",
            format_size(disk_cap),
            format_size(disk_used)
        );
    }
    let mut hosts: Vec<String> = segments
        .iter()
        .filter_map(|s| s.get("host_id").and_then(|h| h.as_str()))
        .map(str::to_string)
        .collect();
    hosts.sort();
    hosts.dedup();
    // Replicas of one object go to distinct hosts while two hosts have room.
    println!(
        "{} segment(s) on {} host(s){}",
        segments.len(),
        hosts.len(),
        if hosts.len() > 1 {
            ": replicas of an object are placed on distinct hosts while they have room"
        } else {
            ""
        }
    );
    for s in &segments {
        let field = |k: &str| {
            s.get(k)
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .unwrap_or_default()
        };
        let size = s
            .get("allocator_capacity_bytes")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let used = s
            .get("allocator_used_bytes")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let medium = s.get("medium").and_then(|m| m.as_str()).unwrap_or("cpu");
        // A segment a client reported unreachable takes no new replicas until its node answers.
        let status = if s.get("suspect").and_then(|v| v.as_bool()) == Some(true) {
            "SUSPECT".to_string()
        } else {
            field("status")
        };
        println!(
            "  {:<28} {:<4} {:<16} {:<22} {:<10} {:>10} / {:<10}",
            field("segment_name"),
            medium,
            field("host_id"),
            field("te_endpoint"),
            status,
            format_size(used),
            format_size(size)
        );
    }
    for (endpoint, stats) in &nodes {
        match stats {
            Ok(s) => println!(
                "node {endpoint}: {} data-plane connection(s) open, {} opened since start ({} on its local socket), {} request(s) served ({} as same-host copies)",
                s.connections_open, s.connections_opened, s.local_connections_opened, s.requests, s.same_host_requests
            ),
            Err(e) => println!("node {endpoint}: no data-plane counters ({e})"),
        }
    }
    Ok(())
}

/// The data-plane counters of every node serving one of `segments`, asked over the data plane
/// itself (a STATS request), each within `timeout`.
async fn node_stats(
    segments: &[serde_json::Value],
    timeout: Duration,
) -> Vec<(String, moonkv_client::Result<moonkv_dataplane::NodeStats>)> {
    let mut endpoints: Vec<String> = segments
        .iter()
        .filter_map(|s| s.get("te_endpoint").and_then(|e| e.as_str()))
        .map(str::to_string)
        .collect();
    endpoints.sort();
    endpoints.dedup();
    let secret = moonkv_client::util::secret_from_env();
    let tls = moonkv_client::TlsClientConfig::from_env();
    let tls = moonkv_dataplane::TlsConnector::load_if_set(tls.as_ref());
    let mut out = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let asked = async {
            let tls = tls
                .as_ref()
                .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, format!("TLS settings: {e}")))?;
            let mut conn = moonkv_dataplane::DataConnection::connect_with_tls(
                &endpoint,
                timeout,
                secret.as_ref(),
                tls.as_ref(),
            )
            .await?;
            tokio::time::timeout(timeout, conn.stats())
                .await
                .map_err(|_| Error::new(ErrorCode::RPC_TIMEOUT, "no answer in time"))?
        };
        let stats = asked.await;
        out.push((endpoint, stats));
    }
    out
}

fn medium(kind: ReplicaKind) -> &'static str {
    moonkv_proto::Medium::from(kind).as_str()
}

/// The admin address the master announces in its hello answer; `Ok(None)` when it cannot be
/// asked (unreachable, TLS, an older master), and an error when the master refused this caller
/// (a missing or wrong secret): guessing the admin port then could show another master's
/// cluster. A wildcard host is replaced by the master's host.
async fn announced_admin(master: &str, timeout: Duration) -> anyhow::Result<Option<String>> {
    if moonkv_client::TlsClientConfig::from_env().is_some() {
        return Ok(None);
    }
    let addr = master.to_string();
    let secret = moonkv_client::util::secret_from_env();
    let announced = tokio::task::spawn_blocking(move || {
        match moonkv_client::master_client::blocking::Connection::connect(
            &addr,
            "moonkv-stat",
            secret.as_ref(),
            Some(timeout),
        ) {
            Ok(conn) => Ok(conn.hello_ack().admin_addr.clone()),
            Err(e) if e.code == moonkv_proto::ErrorCode::ILLEGAL_CLIENT => Err(e),
            Err(_) => Ok(None),
        }
    })
    .await
    .context("asking the master for its admin address")??;
    let Some(announced) = announced else {
        return Ok(None);
    };
    let Ok(parsed) = announced.parse::<std::net::SocketAddr>() else {
        return Ok(None);
    };
    if parsed.ip().is_unspecified() {
        let host = master.rsplit_once(':').map_or(master, |(host, _)| host);
        return Ok(Some(format!("{host}:{}", parsed.port())));
    }
    Ok(Some(announced))
}

/// The admin address matching a master address: same host, port 9003.
pub fn default_admin(master: &str) -> String {
    let host = master.rsplit_once(':').map_or(master, |(host, _)| host);
    format!("{host}:9003")
}

/// Value of an unlabelled Prometheus sample, if present.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name)
                .then(|| value.trim().parse().ok())
                .flatten()
        })
}

/// GET of an admin endpoint; returns the body of a 200 answer. Blocking (ureq) on the
/// blocking pool: these are one-off CLI queries.
async fn http_get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<String> {
    let url = format!("http://{addr}{path}");
    let secret = moonkv_client::util::secret_from_env();
    let fetch = tokio::task::spawn_blocking(move || {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .proxy(None)
            .http_status_as_error(false)
            .build();
        let mut request = ureq::Agent::new_with_config(config).get(&url);
        // The endpoints that reveal keys or ids need the shared secret when the master has one.
        if let Some(bearer) = secret.as_ref().and_then(|s| s.bearer_header()) {
            request = request.header("Authorization", bearer);
        }
        let mut answer = request.call()?;
        let status = answer.status();
        let body = answer.body_mut().read_to_string()?;
        Ok::<_, ureq::Error>((status, body))
    });
    let unreachable = |why: String| {
        Error::new(
            ErrorCode::RPC_FAIL,
            format!("cannot query the master admin port {addr}{path}: {why}"),
        )
    };
    match fetch.await? {
        Ok((status, body)) if status == ureq::http::StatusCode::OK => Ok(body),
        Ok((status, _)) => Err(unreachable(format!("answered '{status}'")).into()),
        Err(ureq::Error::Timeout(_)) => Err(Error::new(
            ErrorCode::RPC_TIMEOUT,
            format!("the master admin port {addr} did not answer {path}"),
        )
        .into()),
        Err(e) => Err(unreachable(e.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_defaults_to_the_master_host() {
        assert_eq!(default_admin("10.0.0.5:50051"), "10.0.0.5:9003");
        assert_eq!(default_admin("host"), "host:9003");
    }

    #[test]
    fn metric_values_are_found_by_exact_name() {
        let text = "# HELP x\nmaster_key_count 12\nmaster_key_count_total 3\nmaster_allocated_bytes 4.5e3\n";
        assert_eq!(metric_value(text, "master_key_count"), Some(12.0));
        assert_eq!(metric_value(text, "master_allocated_bytes"), Some(4500.0));
        assert_eq!(metric_value(text, "missing"), None);
    }
}
