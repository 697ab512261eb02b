//! The node itself: allocates memory segments, mounts them on the master and serves their bytes over the
//! data plane. It runs as its own process (`moonkv node`) or embedded in any tokio program
//! (`moonkv up`, tests, a client that contributes memory). With a disk directory it also serves
//! the disk tier (`disk`, `offload`; see `docs/disk-tier.md`).

use crate::disk::DiskStore;
use crate::offload;
use crate::segment::{LocalView, SegmentMemory};
use crate::server::{Access, DataServer, SegmentTable};
use moonkv_client::master_client::{MasterClient, MasterClientConfig};
use moonkv_dataplane::{LocalSegment, LocalSegments};
use moonkv_proto::auth::{Secret, SecretError};
use moonkv_proto::msg::UnmountDiskSegmentRequest;
use moonkv_proto::types::{DiskSegment, Segment};
use moonkv_proto::{ClientId, Error, ErrorCode, Result, SegmentId};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A disk directory the node contributes as its disk tier.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// Directory holding the replica files (must exist and be writable).
    pub dir: PathBuf,
    /// Bytes the master may place there.
    pub capacity: u64,
}

/// How to start a node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Master RPC address, `host:port`.
    pub master_addr: String,
    /// Bytes per segment (rounded up to a whole page).
    pub segment_size: u64,
    /// Number of segments, used when `segment_names` is empty.
    pub segment_count: usize,
    /// Explicit segment names (one segment each); default names are `<endpoint>/<index>`.
    pub segment_names: Vec<String>,
    /// Data-plane listen address; port 0 picks a free port.
    pub data_bind: String,
    /// Host clients should connect to when `data_bind` is a wildcard address (default: the
    /// bind address itself, or 127.0.0.1 for a wildcard).
    pub advertise_host: Option<String>,
    /// Host identity reported with each segment.
    pub host_id: String,
    /// Identity towards the master; random when `None`.
    pub client_id: Option<ClientId>,
    /// Deadline of one master request.
    pub rpc_timeout: Duration,
    /// Heartbeat period.
    pub ping_interval: Duration,
    /// Optional disk tier.
    pub disk: Option<DiskConfig>,
    /// How often the node asks the master for offload tasks and file deletions.
    pub disk_poll_interval: Duration,
    /// Commit every page of the segments at start (`--prefault`) instead of at first write.
    pub prefault: bool,
    /// Back the segments with 2 MiB pages where the kernel can (`madvise(MADV_HUGEPAGE)`;
    /// `--no-huge-pages` turns it off).
    pub huge_pages: bool,
    /// Where the node lends its segments to stores in the same process (`StoreConfig::
    /// local_segments`); nodes given clones of one handle share it. A fresh handle by default.
    pub local_segments: LocalSegments,
    /// Shared secret: proven to the master, and required of data-plane callers together with
    /// grants (`MOONKV_AUTH_SECRET[_FILE]` by default; `None` = the data plane is open).
    pub auth_secret: Option<moonkv_proto::auth::Secret>,
    /// Secret the master signs grants with when it is not `auth_secret`
    /// (`MOONKV_GRANT_SECRET[_FILE]` by default).
    pub grant_secret: Option<moonkv_proto::auth::Secret>,
    /// Serve the data plane over TLS only, with this certificate; `None` = plain TCP.
    pub tls: Option<moonkv_dataplane::stream::TlsServerConfig>,
    /// Connect to the master over TLS (`MOONKV_TLS_CA_FILE` by default).
    pub master_tls: Option<moonkv_dataplane::stream::TlsClientConfig>,
    /// Why a secret from the environment was unusable, if it was: [`Node::start`] then refuses
    /// rather than serving an open data plane.
    pub secret_error: Option<String>,
    /// How long a data-plane caller may make no progress inside a request (the range lock
    /// it holds is dropped with its connection then), and stay idle between requests.
    pub data_deadlines: crate::Deadlines,
    /// Most data-plane connections open at once; more are closed at accept.
    pub data_max_connections: usize,
    /// Decline same-host copies (`docs/data-plane.md`): callers on this machine then move
    /// bytes over the socket like remote ones.
    pub refuse_same_host: bool,
    /// Attach same-host callers of another user too (see `Access::same_host_other_users`).
    pub same_host_other_users: bool,
    /// Listen on no local socket (see `Access::no_local_socket`).
    pub no_local_socket: bool,
    /// The master as a call in this process (`moonkv up`): puts taken whole from same-host
    /// callers (PUT_LOCAL) start and end through it instead of through a socket.
    pub in_process_master: Option<Arc<dyn moonkv_proto::local::InProcessMaster>>,
    /// Keep a catalog of the committed replicas in this node's segments, fed by the master, to
    /// announce to a master that lost them (`docs/operations.md`, *Restart and re-adoption*).
    /// On by default. Off only for a node whose master can neither lose its metadata while the
    /// node lives nor expire it: the node `moonkv up` runs in its master's process, without HA.
    /// Its master then sends it no catalog notices, which saves every put that bookkeeping.
    pub keep_catalog: bool,
}

impl NodeConfig {
    /// One segment of `segment_size` bytes on an ephemeral loopback port.
    pub fn new(master_addr: impl Into<String>, segment_size: u64) -> Self {
        Self {
            master_addr: master_addr.into(),
            segment_size,
            segment_count: 1,
            segment_names: Vec::new(),
            data_bind: "127.0.0.1:0".into(),
            advertise_host: None,
            host_id: "localhost".into(),
            client_id: None,
            rpc_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(1),
            disk: None,
            disk_poll_interval: Duration::from_millis(100),
            prefault: false,
            huge_pages: true,
            in_process_master: None,
            keep_catalog: true,
            local_segments: LocalSegments::new(),
            auth_secret: None,
            grant_secret: None,
            tls: None,
            master_tls: moonkv_dataplane::stream::TlsClientConfig::from_env(),
            secret_error: None,
            data_deadlines: crate::Deadlines::default(),
            data_max_connections: 4096,
            refuse_same_host: false,
            same_host_other_users: false,
            no_local_socket: false,
        }
        .with_secrets(
            moonkv_proto::auth::Secret::from_env(),
            moonkv_proto::auth::Secret::grant_secret_from_env(),
        )
    }

    /// Takes the shared and grant secrets as read from the environment; an unusable one is
    /// kept as [`NodeConfig::secret_error`], so the node refuses to start instead of serving
    /// without it.
    pub fn with_secrets(
        mut self,
        auth: std::result::Result<Option<Secret>, SecretError>,
        grant: std::result::Result<Option<Secret>, SecretError>,
    ) -> Self {
        let mut errors = Vec::new();
        match auth {
            Ok(secret) => self.auth_secret = secret,
            Err(e) => errors.push(e.to_string()),
        }
        match grant {
            Ok(secret) => self.grant_secret = secret,
            Err(e) => errors.push(e.to_string()),
        }
        self.secret_error = (!errors.is_empty()).then(|| errors.join("; "));
        self
    }
}

/// Entry point of a node.
pub struct Node;

impl Node {
    /// Allocates the segments, starts the data plane and mounts the segments on the master.
    /// On any failure the segments mounted so far are unmounted again.
    pub async fn start(config: NodeConfig) -> Result<NodeHandle> {
        if let Some(why) = &config.secret_error {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("the node's secret is unusable, so it does not start: {why}"),
            ));
        }
        let names = segment_names_or_count(&config)?;
        let tls =
            match &config.tls {
                Some(tls) => Some(moonkv_dataplane::stream::TlsAcceptor::load(tls).map_err(
                    |e| Error::new(ErrorCode::INVALID_PARAMS, format!("data-plane TLS: {e}")),
                )?),
                None => None,
            };
        let opened = match &config.disk {
            Some(d) => {
                let (store, files) = DiskStore::open(&d.dir, d.capacity)?;
                Some((Arc::new(store), files))
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(&config.data_bind)
            .await
            .map_err(|e| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("cannot listen on {}: {e}", config.data_bind),
                )
            })?;
        let mut memories = Vec::with_capacity(names.len());
        for _ in &names {
            let id = SegmentId::random();
            let memory = SegmentMemory::allocate(id, config.segment_size)?;
            if config.huge_pages {
                if let Err(e) = memory.advise_huge_pages() {
                    tracing::warn!(error = %e, "segment memory keeps 4 KiB pages");
                }
            }
            memories.push(Arc::new(memory));
        }
        if config.prefault {
            let started = std::time::Instant::now();
            for memory in &memories {
                memory.prefault().map_err(|e| {
                    Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!(
                            "cannot commit the {} bytes of a segment (--prefault): {e}",
                            memory.size()
                        ),
                    )
                })?;
            }
            tracing::info!(
                segments = memories.len(),
                bytes = config.segment_size * memories.len() as u64,
                ms = started.elapsed().as_millis() as u64,
                "segment memory committed"
            );
        }
        let table: SegmentTable = Arc::new(parking_lot::RwLock::new(
            memories.iter().map(|m| (m.id(), m.clone())).collect(),
        ));
        let disk_store = opened.as_ref().map(|(store, _)| store.clone());
        let catalog_table = table.clone();
        let access = Access {
            secret: config.auth_secret.clone(),
            grant_key: config
                .grant_secret
                .clone()
                .or_else(|| config.auth_secret.clone()),
            tls,
            claims: Arc::default(),
            deadlines: config.data_deadlines,
            max_connections: Some(config.data_max_connections),
            refuse_same_host: config.refuse_same_host,
            same_host_other_users: config.same_host_other_users,
            no_local_socket: config.no_local_socket,
            master_addr: Some(config.master_addr.clone()),
        };
        let local_views: Vec<Arc<dyn LocalSegment>> = memories
            .iter()
            .map(|m| {
                let view =
                    LocalView::new(m.clone(), access.grant_key.clone(), access.claims.clone());
                Arc::new(view) as Arc<dyn LocalSegment>
            })
            .collect();
        let server = DataServer::spawn_with_disk(listener, table.clone(), disk_store, access)
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("data plane failed to start: {e}"),
                )
            })?;
        let endpoint = advertised_endpoint(server.local_addr(), config.advertise_host.as_deref());
        if let Some((store, _)) = &opened {
            store.record_holder(&endpoint);
        }
        let segments: Vec<Segment> = names
            .into_iter()
            .zip(&memories)
            .enumerate()
            .map(|(i, (name, memory))| Segment {
                id: memory.id(),
                name: name.unwrap_or_else(|| format!("{endpoint}/{i}")).into(),
                base: memory.base(),
                size: memory.size(),
                endpoint: endpoint.as_str().into(),
                protocol: "tcp".into(),
                host_id: config.host_id.clone(),
            })
            .collect();

        let mut master_config = MasterClientConfig::new(config.master_addr.clone());
        if let Some(id) = config.client_id {
            master_config.client_id = id;
        }
        master_config.client_name = format!("moonkv-node/{endpoint}");
        master_config.rpc_timeout = config.rpc_timeout;
        master_config.ping_interval = config.ping_interval;
        // With a separate grant secret the node proves that one to the master: it is the node
        // credential, which clients never hold, and only it may mount and serve segments.
        master_config.auth_secret = match (&config.auth_secret, &config.grant_secret) {
            (Some(_), Some(node)) => Some(node.clone()),
            (shared, _) => shared.clone(),
        };
        master_config.tls = config.master_tls.clone();
        let master = match MasterClient::connect(master_config).await {
            Ok(m) => m,
            Err(e) => {
                server.stop().await;
                return Err(e);
            }
        };
        let disk = opened.as_ref().map(|(store, _)| DiskSegment {
            id: store.id(),
            name: format!("{endpoint}/disk"),
            endpoint: endpoint.clone(),
            capacity_bytes: store.capacity(),
        });
        let mut handle = NodeHandle {
            endpoint,
            master,
            memories,
            segments,
            server: Some(server),
            disk,
            disk_task: None,
            local: config.local_segments.clone(),
            local_views,
            catalog: Arc::default(),
            catalog_task: None,
        };
        // The master by calls when it runs in this process, else through the node's client.
        let route = crate::server::MasterRoute {
            client: handle.master.clone(),
            in_process: config.in_process_master.clone(),
        };
        // The catalog of committed replicas: fed by the master, announced after a remount on a
        // master that does not know this node's replicas. A node without one mounts without
        // announcing that it keeps one, so its master sends it no notices.
        if config.keep_catalog {
            handle
                .master
                .set_remount_hook(Arc::new(crate::catalog::Announcer {
                    segments: catalog_table.clone(),
                    state: handle.catalog.clone(),
                }));
            handle.catalog_task = Some(tokio::spawn(crate::catalog::run_sync(
                route.clone(),
                catalog_table,
                handle.catalog.clone(),
            )));
        }
        for segment in handle.segments.clone() {
            if let Err(e) = handle.master.mount(segment.clone()).await {
                handle.shutdown().await;
                return Err(Error::new(
                    e.code,
                    format!("mounting segment {}: {}", segment.name, e.message),
                ));
            }
        }
        // Mounted: same-host callers may now hand this node whole puts (PUT_LOCAL).
        if let Some(server) = &handle.server {
            server.take_puts_through(route);
        }
        if let (Some((store, files)), Some(info)) = (opened, handle.disk.clone()) {
            let agent = offload::DiskAgent {
                master: handle.master.clone(),
                disk: store,
                info,
                segments: table,
            };
            if let Err(e) = agent.mount(files).await {
                handle.shutdown().await;
                return Err(Error::new(
                    e.code,
                    format!("mounting the disk: {}", e.message),
                ));
            }
            handle.disk_task = Some(tokio::spawn(agent.run(config.disk_poll_interval)));
        }
        for (memory, view) in handle.memories.iter().zip(&handle.local_views) {
            handle.local.register(memory.id(), view);
        }
        tracing::info!(
            endpoint = %handle.endpoint,
            segments = handle.segments.len(),
            authenticated = config.auth_secret.is_some(),
            "node ready"
        );
        Ok(handle)
    }
}

fn segment_names_or_count(config: &NodeConfig) -> Result<Vec<Option<String>>> {
    if config.segment_size == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "segment size must be greater than zero",
        ));
    }
    if !config.segment_names.is_empty() {
        return Ok(config.segment_names.iter().cloned().map(Some).collect());
    }
    if config.segment_count == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "a node needs at least one segment",
        ));
    }
    Ok(vec![None; config.segment_count])
}

fn advertised_endpoint(bound: SocketAddr, advertise_host: Option<&str>) -> String {
    match advertise_host {
        Some(host) => format!("{host}:{}", bound.port()),
        None if bound.ip().is_unspecified() => format!("127.0.0.1:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// A running node. Call [`NodeHandle::shutdown`] to unmount and stop; dropping the handle stops
/// serving and heartbeating without unmounting (the master expires the segments after its
/// client TTL).
pub struct NodeHandle {
    endpoint: String,
    master: MasterClient,
    memories: Vec<Arc<SegmentMemory>>,
    segments: Vec<Segment>,
    server: Option<DataServer>,
    disk: Option<DiskSegment>,
    disk_task: Option<tokio::task::JoinHandle<()>>,
    /// This node's segments for stores in the same process.
    local: LocalSegments,
    /// What `local` hands out (it holds weak references).
    local_views: Vec<Arc<dyn LocalSegment>>,
    /// State of the catalog of committed replicas.
    catalog: Arc<crate::catalog::CatalogState>,
    /// The catalog's long poll.
    catalog_task: Option<tokio::task::JoinHandle<()>>,
}

impl NodeHandle {
    /// This node's segments, for a store in the same process to copy from and to without the
    /// network (`StoreConfig::local_segments`).
    pub fn local_segments(&self) -> LocalSegments {
        self.local.clone()
    }

    /// Data-plane connections accepted and open, and requests answered, by this node.
    pub fn data_plane_stats(&self) -> moonkv_dataplane::NodeStats {
        self.server
            .as_ref()
            .map(DataServer::stats)
            .unwrap_or_default()
    }

    /// Committed replicas this node holds in its catalog (what it would announce to a new
    /// master).
    pub fn catalog_len(&self) -> usize {
        self.memories.iter().map(|m| m.catalog_len()).sum()
    }

    /// Replicas adopted by the last re-adoption and how long it took (ms).
    pub fn last_readoption(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.catalog.last_adopted.load(Ordering::Acquire),
            self.catalog.last_adopt_ms.load(Ordering::Acquire),
        )
    }

    /// The node's Prometheus metrics (data plane, range locks, disk), for `/metrics`
    /// ([`crate::metrics::serve`]); `None` once the node stopped serving.
    pub fn metrics(&self) -> Option<crate::metrics::NodeMetrics> {
        self.server.as_ref().map(DataServer::metrics)
    }

    /// Data-plane endpoint clients connect to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Identity of the node towards the master.
    pub fn client_id(&self) -> ClientId {
        self.master.client_id()
    }

    /// The segments this node mounted.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The disk this node mounted, if it has a disk tier.
    pub fn disk(&self) -> Option<&DiskSegment> {
        self.disk.as_ref()
    }

    /// The node's master client (shares its connection and heartbeat).
    pub fn master(&self) -> &MasterClient {
        &self.master
    }

    /// Unmounts the disk (its replicas stay on disk and come back when a node mounts the
    /// directory again within the master's grace period) and every segment, stops serving and
    /// closes the master connection.
    pub async fn shutdown(mut self) {
        self.stop_disk_task().await;
        if let Some(disk) = &self.disk {
            let request = UnmountDiskSegmentRequest {
                client_id: self.master.client_id(),
                disk_id: disk.id,
            };
            if let Err(e) = self.master.unmount_disk_segment(request).await {
                tracing::warn!(disk = %disk.name, error = %e, "disk unmount at shutdown failed");
            }
        }
        for memory in &self.memories {
            self.local.unregister(memory.id());
        }
        for segment in self.master.mounted_segments() {
            if let Err(e) = self.master.unmount(segment.id).await {
                tracing::warn!(segment = %segment.name, error = %e, "unmount at shutdown failed");
            }
        }
        self.stop_serving().await;
    }

    /// Stops serving and heartbeating without telling the master, as if the process died. The
    /// master keeps the segments until the client TTL expires. Meant for fault tests.
    pub async fn crash(mut self) {
        self.stop_disk_task().await;
        for memory in &self.memories {
            self.local.unregister(memory.id());
        }
        self.stop_serving().await;
    }

    /// Stops the disk loop and waits until it is gone (it holds the disk, and so its lock).
    async fn stop_disk_task(&mut self) {
        if let Some(task) = self.disk_task.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(task) = self.catalog_task.take() {
            task.abort();
        }
    }

    async fn stop_serving(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        self.master.close().await;
    }
}
