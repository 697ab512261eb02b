//! `moonkv node`: contribute memory segments to a cluster and serve their bytes.

use moonkv_node::{DiskConfig, Node, NodeConfig};
use moonkv_proto::auth::Secret;
use moonkv_proto::units::{positive_duration_flag, rate_flag, size_flag};

/// Arguments of `moonkv node`.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Master RPC address.
    #[arg(long, env = "MOONKV_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Bytes per segment, e.g. `1GiB`, `512MiB`.
    #[arg(long, default_value = "1GiB", value_parser = size_flag)]
    pub segment_size: u64,
    /// Number of segments of `--segment-size` each.
    #[arg(long, default_value_t = 1)]
    pub segment_count: usize,
    /// Commit every page of the segments at start instead of at first write: the first fill
    /// of the cache then pays no page fault per 4 KiB, and memory the machine cannot give
    /// fails the start instead of a later put. Resident memory is the whole segment at once.
    #[arg(long)]
    pub prefault: bool,
    /// Keep the segments on 4 KiB pages. By default the node asks the kernel for 2 MiB pages
    /// (`madvise(MADV_HUGEPAGE)`), which cuts page faults on the first fill and speeds up
    /// same-host copies; a kernel whose transparent huge pages are `never` ignores the request.
    #[arg(long)]
    pub no_huge_pages: bool,
    /// Explicit segment names (repeatable; one segment per name, overrides --segment-count).
    #[arg(long = "segment-name", value_name = "NAME")]
    pub segment_names: Vec<String>,
    /// Data-plane listen address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub data_bind: String,
    /// Host that clients should dial when --data-bind is a wildcard such as 0.0.0.0.
    #[arg(long)]
    pub advertise_host: Option<String>,
    /// Host identity reported with each segment (default: this machine's host name).
    #[arg(long, env = "MOONKV_HOST_ID")]
    pub host_id: Option<String>,
    /// File holding the cluster's shared secret: proven to the master, and required of every
    /// data-plane caller together with a grant from the master (default: MOONKV_AUTH_SECRET or
    /// MOONKV_AUTH_SECRET_FILE; neither = the data plane is open).
    #[arg(long, value_name = "FILE")]
    pub auth_secret_file: Option<std::path::PathBuf>,
    /// File holding the secret the master signs grants with, when the cluster keeps it apart
    /// from the one clients hold (the master's --grant-secret-file; default:
    /// MOONKV_GRANT_SECRET or MOONKV_GRANT_SECRET_FILE).
    #[arg(long, value_name = "FILE")]
    pub grant_secret_file: Option<std::path::PathBuf>,
    /// Certificate chain (PEM) for the data plane: with --tls-key-file, callers must use TLS
    /// (they verify it against MOONKV_TLS_CA_FILE). The master connection uses TLS when
    /// MOONKV_TLS_CA_FILE is set.
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// A data-plane caller that makes no progress this long inside a request is disconnected
    /// (and the range it held is released), e.g. `30s`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = positive_duration_flag)]
    pub data_io_timeout: std::time::Duration,
    /// A data-plane connection idle this long between requests is closed.
    #[arg(long, value_name = "DURATION", default_value = "600s", value_parser = positive_duration_flag)]
    pub data_idle_timeout: std::time::Duration,
    /// Every data-plane request's transfers may take this long, plus its length at
    /// --data-min-rate; a caller slower than that is disconnected and its range released.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = positive_duration_flag)]
    pub data_request_floor: std::time::Duration,
    /// The slowest transfer rate, per second, a data-plane request is allowed on top of
    /// --data-request-floor, e.g. `1MiB`.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = rate_flag)]
    pub data_min_rate: u64,
    /// Most data-plane connections open at once; more are closed at accept.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub data_max_connections: u32,
    /// Decline same-host copies: callers on this machine then send their bytes over the
    /// socket instead of letting the node copy them straight to and from their memory.
    #[arg(long)]
    pub no_same_host: bool,
    /// Attach same-host callers that run as another user too, when this node may reach their
    /// memory (root or CAP_SYS_PTRACE). Off: only processes of the node's own user.
    #[arg(long)]
    pub same_host_other_users: bool,
    /// Listen on no local socket: same-host callers then attach over their TCP connection to
    /// the loopback address, a round trip slower (`docs/data-plane.md`, *The local socket*).
    #[arg(long)]
    pub no_local_socket: bool,
    /// A data-plane connection must send its first byte, finish TLS and its hello and proof
    /// within this long of being accepted, else it is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = positive_duration_flag)]
    pub data_handshake_timeout: std::time::Duration,
    /// Serve the node's Prometheus metrics on `/metrics` at this address, e.g. `0.0.0.0:9310`
    /// (port 0 picks a free port); unset = no metrics endpoint.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub disk: DiskArgs,
}

/// Starts the node's `/metrics` endpoint on `addr`; answers the bound address and the task,
/// which stops when aborted.
pub async fn serve_node_metrics(
    addr: &str,
    node: &moonkv_node::NodeHandle,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let metrics = node
        .metrics()
        .ok_or_else(|| anyhow::anyhow!("the node is not serving"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {addr}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?.to_string();
    let task = tokio::spawn(async move {
        let never = std::future::pending::<()>();
        if let Err(e) = moonkv_node::metrics::serve(listener, metrics, never).await {
            tracing::error!(error = %e, "node metrics HTTP server failed");
        }
    });
    Ok((bound, task))
}

/// The disk tier flags of `moonkv node` and `moonkv up`.
#[derive(clap::Args, Debug, Clone)]
pub struct DiskArgs {
    /// Directory for the disk tier (must exist and be writable); objects evicted from memory
    /// are offloaded there, and `put --disk` writes through to it.
    #[arg(long, value_name = "DIR", requires = "disk_capacity")]
    pub disk_dir: Option<std::path::PathBuf>,
    /// Bytes the disk tier may use, e.g. `10GiB`.
    #[arg(long, value_name = "SIZE", value_parser = size_flag, requires = "disk_dir")]
    pub disk_capacity: Option<u64>,
}

impl DiskArgs {
    /// The disk configuration, if a disk directory was given.
    pub fn to_config(&self) -> Option<DiskConfig> {
        Some(DiskConfig {
            dir: self.disk_dir.clone()?,
            capacity: self.disk_capacity?,
        })
    }
}

/// Best-effort host name, without extra dependencies.
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl NodeArgs {
    /// The node configuration these flags describe.
    pub fn to_config(&self) -> anyhow::Result<NodeConfig> {
        let mut config = NodeConfig::new(self.master.clone(), self.segment_size);
        config.segment_count = self.segment_count;
        config.prefault = self.prefault;
        config.huge_pages = !self.no_huge_pages;
        config.segment_names = self.segment_names.clone();
        config.data_deadlines = moonkv_node::Deadlines {
            handshake: self.data_handshake_timeout,
            io: self.data_io_timeout,
            idle: self.data_idle_timeout,
            request_floor: self.data_request_floor,
            min_rate: self.data_min_rate,
        };
        config.data_max_connections = self.data_max_connections as usize;
        config.refuse_same_host = self.no_same_host;
        config.same_host_other_users = self.same_host_other_users;
        config.no_local_socket = self.no_local_socket;
        config.data_bind = self.data_bind.clone();
        config.advertise_host = self.advertise_host.clone();
        config.host_id = self.host_id.clone().unwrap_or_else(host_name);
        config.disk = self.disk.to_config();
        config.auth_secret = match &self.auth_secret_file {
            Some(path) => Some(
                Secret::from_file(path).map_err(|e| anyhow::anyhow!("--auth-secret-file: {e}"))?,
            ),
            None => Secret::from_env().map_err(anyhow::Error::msg)?,
        };
        config.grant_secret = match &self.grant_secret_file {
            Some(path) => Some(
                Secret::from_file(path).map_err(|e| anyhow::anyhow!("--grant-secret-file: {e}"))?,
            ),
            None => Secret::grant_secret_from_env().map_err(anyhow::Error::msg)?,
        };
        // Both secrets were settled just above (a bad one already refused).
        config.secret_error = None;
        if let (Some(cert_file), Some(key_file)) = (&self.tls_cert_file, &self.tls_key_file) {
            let tls = moonkv_client::TlsServerConfig {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: None,
            };
            tls.check()
                .map_err(|e| anyhow::anyhow!("--tls-cert-file/--tls-key-file: {e}"))?;
            config.tls = Some(tls);
        }
        check_client_tls(config.master_tls.as_ref())?;
        Ok(config)
    }
}

/// Loads the TLS client files from the environment once, so a bad one stops the process at
/// start naming the file.
pub fn check_client_tls(tls: Option<&moonkv_client::TlsClientConfig>) -> anyhow::Result<()> {
    if let Some(tls) = tls {
        tls.check()
            .map_err(|e| anyhow::anyhow!("{}: {e}", moonkv_proto::tls::CA_FILE_ENV))?;
    }
    Ok(())
}

/// Starts the node, prints the ready line, serves until SIGINT/SIGTERM, then unmounts.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let node = Node::start(args.to_config()?)
        .await
        .map_err(anyhow::Error::new)?;
    let capacity: u64 = node.segments().iter().map(|s| s.size).sum();
    let disk_capacity = node.disk().map_or(0, |d| d.capacity_bytes);
    let metrics = match &args.metrics_addr {
        Some(addr) => match serve_node_metrics(addr, &node).await {
            Ok(served) => Some(served),
            Err(e) => {
                node.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    let stop = crate::shutdown_signal();
    let mut ready = vec![
        ("data", node.endpoint().to_string()),
        ("master", args.master.clone()),
        ("client_id", node.client_id().to_string()),
        ("segments", node.segments().len().to_string()),
        ("capacity_bytes", capacity.to_string()),
        ("disk_capacity_bytes", disk_capacity.to_string()),
    ];
    if let Some((addr, _)) = &metrics {
        ready.push(("metrics", addr.clone()));
    }
    if let Some(note) = crate::idle_poll_note() {
        tracing::info!("{note}");
    }
    crate::print_ready(&ready);
    stop.await;
    tracing::info!("shutting down: unmounting segments");
    if let Some((_, task)) = metrics {
        task.abort();
    }
    node.shutdown().await;
    Ok(())
}
