//! `moonkv up`: a master and one node in one process, events on — what a newcomer starts with.

use crate::master_cmd::MasterFlags;
use crate::node_cmd::{host_name, DiskArgs};
use moonkv_master::server::{self, MasterConfig};
use moonkv_node::{Node, NodeConfig};
use moonkv_proto::units::format_size;
use moonkv_proto::units::size_flag;

/// Arguments of `moonkv up`: every master flag, plus the embedded node's.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    master: MasterFlags,
    /// Bytes of memory the embedded node contributes, e.g. `1GiB` (pages are used on demand).
    #[arg(long, default_value = "1GiB", value_parser = size_flag)]
    segment_size: u64,
    /// Number of segments of `--segment-size` each.
    #[arg(long, default_value_t = 1)]
    segment_count: usize,
    /// Commit every page of the node's segments at start instead of at first write (see
    /// `moonkv node --prefault`).
    #[arg(long)]
    prefault: bool,
    /// Keep the node's segments on 4 KiB pages (see `moonkv node --no-huge-pages`).
    #[arg(long)]
    no_huge_pages: bool,
    /// Give the embedded node and the master no local socket: same-host callers attach and
    /// call the master over TCP (see `moonkv node --no-local-socket` and the master's
    /// `--rpc-local-socket`).
    #[arg(long)]
    no_local_socket: bool,
    /// Data-plane listen address of the embedded node (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    data_bind: String,
    /// Serve the embedded node's Prometheus metrics on `/metrics` at this address (the
    /// master's stay on the admin port); unset = none.
    #[arg(long, value_name = "ADDR")]
    node_metrics_addr: Option<String>,
    #[command(flatten)]
    disk: DiskArgs,
}

impl UpArgs {
    /// Master configuration: events on at upstream's default endpoint unless flags say otherwise.
    pub fn config(&self) -> anyhow::Result<MasterConfig> {
        let mut base = MasterConfig::default();
        base.kv_events.enabled = true;
        base.kv_events.bind_endpoint = "tcp://127.0.0.1:5557".into();
        base.kv_events.backend_id = "moonkv-local".into();
        base.rpc_local_socket = !self.no_local_socket;
        self.master.to_config(base)
    }
}

/// Runs master and node until SIGINT or SIGTERM, then unmounts and stops both.
pub async fn run(args: UpArgs, config: MasterConfig) -> anyhow::Result<()> {
    // The embedded node shares the master's secret (if any): it proves it to the master and
    // requires it, with grants, of data-plane callers.
    let secret = config.auth_secret.clone();
    let grant_secret = config.grant_secret.clone();
    // TLS on the master applies to the node's data plane too; the node verifies the master
    // against MOONKV_TLS_CA_FILE like any client.
    let tls = config.tls();
    let master_tls = moonkv_client::TlsClientConfig::from_env();
    if tls.is_some() && master_tls.is_none() {
        anyhow::bail!(
            "--tls-cert-file needs {} (the CA that signed the certificate): the embedded node \
             and the clients verify the master with it",
            moonkv_proto::tls::CA_FILE_ENV
        );
    }
    crate::node_cmd::check_client_tls(master_tls.as_ref())?;
    let master = server::start(config).await?;
    let mut node_config = NodeConfig::new(master.rpc_addr().to_string(), args.segment_size);
    node_config.segment_count = args.segment_count;
    node_config.prefault = args.prefault;
    node_config.huge_pages = !args.no_huge_pages;
    node_config.no_local_socket = args.no_local_socket;
    node_config.data_bind = args.data_bind.clone();
    node_config.host_id = host_name();
    node_config.disk = args.disk.to_config();
    node_config.auth_secret = secret;
    node_config.grant_secret = grant_secret;
    // The master's configuration settled the secrets (and refused bad ones).
    node_config.secret_error = None;
    node_config.tls = tls;
    node_config.master_tls = master_tls;
    // The node reaches this master by calls, not through a socket, for the puts it takes whole.
    node_config.in_process_master = Some(master.in_process());
    // It lives as long as this master does: never expired, it never has to regain its replicas,
    // so it keeps no catalog of them (with HA it does, for whichever master leads next).
    let client_id = moonkv_proto::ClientId::random();
    node_config.client_id = Some(client_id);
    node_config.keep_catalog = !master.embed_node(client_id);
    // The node runs on a runtime of its own, as it would in its own process: its copies then
    // never hold the master's answers back on a shared worker.
    let node_runtime = NodeRuntime::new()?;
    let node = match node_runtime.run(Node::start(node_config)).await {
        Ok(node) => node,
        Err(e) => {
            master.shutdown().await;
            return Err(anyhow::anyhow!("embedded node failed to start: {e}"));
        }
    };
    let node_metrics = match &args.node_metrics_addr {
        Some(addr) => match crate::node_cmd::serve_node_metrics(addr, &node).await {
            Ok(served) => Some(served),
            Err(e) => {
                node_runtime.run(node.shutdown()).await;
                master.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    let events = master.events_endpoint().unwrap_or_default();
    let stop = crate::shutdown_signal();
    let mut ready = vec![
        ("rpc", master.rpc_addr().to_string()),
        ("admin", master.admin_addr().to_string()),
        ("kv_events", events.clone()),
        ("data", node.endpoint().to_string()),
    ];
    if let Some((addr, _)) = &node_metrics {
        ready.push(("node_metrics", addr.clone()));
    }
    crate::print_ready(&ready);
    let capacity: u64 = node.segments().iter().map(|s| s.size).sum();
    let disk = match (node.disk(), &args.disk.disk_dir) {
        (Some(disk), Some(dir)) => format!(
            "\n  disk tier     {} in {}",
            format_size(disk.capacity_bytes),
            dir.display()
        ),
        _ => String::new(),
    };
    let note = crate::idle_poll_note()
        .map(|note| format!("\n  note          {note}"))
        .unwrap_or_default();
    eprintln!(
        "moonkv is up\n  master RPC    {rpc}   (clients: --master {rpc} or MOONKV_MASTER)\n  admin HTTP    http://{admin}   (/metrics /health /get_segments_detail /kv_events/status)\n  event stream  {events}   (moonkv events tail --endpoint {events})\n  memory        {capacity} on {data}{disk}{note}\nStop with Ctrl-C.",
        rpc = master.rpc_addr(),
        admin = master.admin_addr(),
        capacity = format_size(capacity),
        data = node.endpoint(),
    );
    stop.await;
    tracing::info!("shutting down");
    if let Some((_, task)) = node_metrics {
        task.abort();
    }
    node_runtime.run(node.shutdown()).await;
    master.shutdown().await;
    Ok(())
}

/// The embedded node's own runtime (see [`run`]).
struct NodeRuntime(Option<tokio::runtime::Runtime>);

impl NodeRuntime {
    fn new() -> anyhow::Result<NodeRuntime> {
        Ok(NodeRuntime(Some(moonkv_client::util::runtime(0)?)))
    }

    /// Runs `work` to its end on the node's runtime.
    async fn run<F>(&self, work: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self.0.as_ref().expect("only Drop takes the runtime");
        match runtime.spawn(work).await {
            Ok(out) => out,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        // Dropped inside the master's runtime: let its threads go without blocking there.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
