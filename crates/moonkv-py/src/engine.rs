//! One set-up store: its tokio runtime, the connection to the master, the embedded node (when
//! the process contributes memory), the registered buffers and the local-buffer budget.

use crate::errors::invalid;
use crate::registry::Registry;
use crate::settings::{host_and_port, Settings};
use moonkv_client::store::CallerLanes;
use moonkv_client::{Store, StoreConfig};
use moonkv_node::{Node, NodeConfig, NodeHandle};
use moonkv_proto::msg::{Request, ServiceReadyRequest};
use moonkv_proto::{Error, ErrorCode};
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// `health_check` answers, as upstream numbers them.
pub(crate) const HEALTHY: i32 = 0;
/// The store is not set up or was closed.
pub(crate) const NOT_INITIALIZED: i32 = 1;
/// The master does not answer.
pub(crate) const MASTER_UNREACHABLE: i32 = 2;

/// How long `health_check` waits for the master.
const HEALTH_DEADLINE: Duration = Duration::from_secs(2);
/// Attempts at an ephemeral data-plane port that another process may take in between.
const PORT_ATTEMPTS: usize = 20;
/// Longest a close (explicit, by garbage collection or at exit) waits for the master to
/// unmount this process's segments; past it the node stops anyway and the master unmounts them
/// at the heartbeat deadline.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(3);
/// How long a closing store waits for its runtime's worker threads to finish.
const THREADS_DEADLINE: Duration = Duration::from_secs(1);

/// Every engine not yet dropped, so the interpreter's exit closes them (`_close_all`, run by
/// `atexit`) before Python tears down the objects holding them.
static LIVE: Mutex<Vec<Weak<Engine>>> = Mutex::new(Vec::new());

/// The engine of one Python store object (`MooncakeDistributedStore` or `Client`). Dropping it,
/// which is what garbage collection of the object does, closes the store as `close()` does.
#[derive(Default)]
pub(crate) struct EngineSlot(RwLock<Option<Arc<Engine>>>);

impl EngineSlot {
    /// The running engine, if set up and not closed.
    pub(crate) fn get(&self) -> Option<Arc<Engine>> {
        self.0.read().clone()
    }

    /// Whether an engine runs.
    pub(crate) fn is_set(&self) -> bool {
        self.0.read().is_some()
    }

    /// Installs a freshly started engine; false (and the engine is closed) when one runs
    /// already.
    pub(crate) fn install(&self, py: Python<'_>, engine: Engine) -> bool {
        let engine = Arc::new(engine);
        let mut slot = self.0.write();
        if slot.is_some() {
            drop(slot);
            py.detach(|| close_engine(engine));
            return false;
        }
        {
            let mut live = LIVE.lock();
            live.retain(|e| e.strong_count() > 0);
            live.push(Arc::downgrade(&engine));
        }
        *slot = Some(engine);
        true
    }

    /// Closes the engine, if any: unmounts, disconnects, stops its threads. Blocks without the
    /// GIL; a second call does nothing.
    pub(crate) fn close(&self, py: Python<'_>) {
        let engine = self.0.write().take();
        if let Some(engine) = engine {
            py.detach(|| close_engine(engine));
        }
    }
}

impl Drop for EngineSlot {
    fn drop(&mut self) {
        let mut engine = self.0.get_mut().take();
        if engine.is_none() {
            return;
        }
        // Garbage collection runs this holding the GIL: let other threads go on meanwhile.
        // During interpreter teardown (no attaching) no other Python thread runs, so blocking
        // with the GIL held is harmless.
        let _ = Python::try_attach(|py| {
            if let Some(engine) = engine.take() {
                py.detach(move || close_engine(engine));
            }
        });
        if let Some(engine) = engine {
            close_engine(engine);
        }
    }
}

/// Shuts `engine` down and, when no call still holds it, waits for its threads.
fn close_engine(engine: Arc<Engine>) {
    engine.shut_down();
    if let Ok(mut engine) = Arc::try_unwrap(engine) {
        if let Some(rt) = engine.runtime.take() {
            rt.shutdown_timeout(THREADS_DEADLINE);
        }
    }
}

/// Closes every store still open; `moonkv/__init__.py` runs it at interpreter exit, so stores
/// never closed unmount their memory before the process goes.
#[pyfunction]
pub(crate) fn _close_all(py: Python<'_>) {
    let engines: Vec<Arc<Engine>> = LIVE.lock().drain(..).filter_map(|e| e.upgrade()).collect();
    py.detach(|| {
        for engine in engines {
            engine.shut_down();
        }
    });
}

/// A running store.
pub(crate) struct Engine {
    // `Option` so `Drop` can shut it down without waiting for its threads.
    runtime: Option<tokio::runtime::Runtime>,
    pub store: Store,
    node: Mutex<Option<NodeHandle>>,
    /// What `get_hostname` answers: the node's data-plane endpoint, or `local_hostname`.
    pub hostname: String,
    /// The embedded node's segment name (its endpoint), for `prefer_alloc_in_same_node`.
    pub local_segment: Option<String>,
    pub staging: Arc<Staging>,
    pub registry: Registry,
    /// Runtimes driven by the calling thread, for calls that go through [`Engine::run`]
    /// (`None`: disabled, or the master is an HA cluster).
    lanes: Option<CallerLanes>,
    /// Standalone mode's memory pool (`alloc_from_mem_pool`).
    pub pool: Option<crate::mempool::MemPool>,
    /// The master this process runs itself (`enable_standalone`), stopped last.
    master: Mutex<Option<moonkv_master::server::MasterHandle>>,
    /// `shut_down` ran.
    closed: AtomicBool,
    /// Open put and get sessions (`batch_*_session_*`).
    pub sessions: crate::dropin::Sessions,
}

impl Engine {
    /// Connects to the master and, when `global_segment_size > 0`, starts a node in this
    /// process first. Blocks; call it without the GIL.
    pub(crate) fn start(settings: &Settings, connect: StoreTuning) -> Result<Engine, Error> {
        let runtime = new_runtime()?;
        let mut settings = settings.clone();
        let master = if settings.embedded_master {
            let master = runtime.block_on(start_embedded_master())?;
            settings.master_server_addr = master.rpc_addr().to_string();
            Some(master)
        } else {
            None
        };
        let stop_master = |runtime: &tokio::runtime::Runtime, master| {
            if let Some(master) = master {
                runtime.block_on(moonkv_master::server::MasterHandle::shutdown(master));
            }
        };
        let node = if settings.global_segment_size > 0 {
            match runtime.block_on(start_node(&settings)) {
                Ok(node) => Some(node),
                Err(e) => {
                    stop_master(&runtime, master);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let mut config = StoreConfig::new(settings.master_server_addr.clone());
        config.tenant = settings.tenant_id.clone();
        config.local_segments = node.as_ref().map(NodeHandle::local_segments);
        connect.apply(&mut config);
        let store = match runtime.block_on(Store::connect(config)) {
            Ok(store) => store,
            Err(e) => {
                if let Some(node) = node {
                    runtime.block_on(node.shutdown());
                }
                stop_master(&runtime, master);
                return Err(e);
            }
        };
        let lanes = CallerLanes::new(&store, connect.caller_lanes, connect.spin);
        let hostname = node.as_ref().map_or_else(
            || settings.local_hostname.clone(),
            |n| n.endpoint().to_string(),
        );
        Ok(Engine {
            runtime: Some(runtime),
            store,
            local_segment: node.as_ref().map(|n| n.endpoint().to_string()),
            node: Mutex::new(node),
            hostname,
            staging: Arc::new(Staging::new(settings.local_buffer_size)),
            registry: Registry::default(),
            lanes,
            pool: None,
            master: Mutex::new(master),
            closed: AtomicBool::new(false),
            sessions: Default::default(),
        })
    }

    /// Standalone mode (`setup_dummy`): a pure client of the master that the node at
    /// `node_endpoint` (on this machine) mounts on. The node copies straight to and from this
    /// process's memory; `mem_pool_size` bytes are reserved for `alloc_from_mem_pool`. Blocks.
    pub(crate) fn start_standalone(
        node_endpoint: &str,
        local_buffer_size: u64,
        mem_pool_size: u64,
        tenant: &str,
        connect: StoreTuning,
    ) -> Result<Engine, Error> {
        let pool = crate::mempool::MemPool::new(mem_pool_size)?;
        let runtime = new_runtime()?;
        let mut config = StoreConfig::new(String::new());
        config.tenant = tenant.to_string();
        connect.apply(&mut config);
        let store = runtime.block_on(Store::connect_via_node(node_endpoint, config))?;
        let lanes = CallerLanes::new(&store, connect.caller_lanes, connect.spin);
        let registry = Registry::default();
        if let Some(pool) = &pool {
            registry.register_pool(pool.base(), pool.len())?;
        }
        Ok(Engine {
            runtime: Some(runtime),
            store,
            local_segment: None,
            node: Mutex::new(None),
            hostname: node_endpoint.to_string(),
            staging: Arc::new(Staging::new(local_buffer_size)),
            registry,
            lanes,
            pool,
            master: Mutex::new(None),
            closed: AtomicBool::new(false),
            sessions: Default::default(),
        })
    }

    /// Runs `op` on the store to completion with the GIL released: on a lane driven by the
    /// calling thread when one is free (its answers are read by this thread, which polls for a
    /// short while before it sleeps), else on the store's own runtime.
    pub(crate) fn run<F, Fut>(&self, py: Python<'_>, op: F) -> Fut::Output
    where
        F: FnOnce(Store) -> Fut + Send,
        Fut: Future,
        Fut::Output: Send,
    {
        py.detach(
            || match self.lanes.as_ref().and_then(CallerLanes::checkout) {
                Some(lane) => lane.block_on(op(lane.store())),
                None => self.block_on(op(self.store.clone())),
            },
        )
    }

    /// Runs `work` to completion with the GIL released.
    pub(crate) fn wait<F>(&self, py: Python<'_>, work: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        py.detach(|| self.block_on(work))
    }

    /// Runs `work` to completion on the calling thread (which must not hold the GIL).
    pub(crate) fn block_on<F: Future>(&self, work: F) -> F::Output {
        match &self.runtime {
            Some(rt) => rt.block_on(work),
            // Only `Drop` takes the runtime, and nothing runs after it.
            None => unreachable!("the runtime is gone only during drop"),
        }
    }

    /// Unmounts the embedded node's memory and stops it, closes the connections; later calls
    /// fail. Bounded by [`SHUTDOWN_DEADLINE`]; a second call does nothing. Blocks.
    pub(crate) fn shut_down(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(lanes) = &self.lanes {
            lanes.close();
        }
        let node = self.node.lock().take();
        let master = self.master.lock().take();
        let store = self.store.clone();
        let finished = self.block_on(async move {
            tokio::time::timeout(SHUTDOWN_DEADLINE, async move {
                // Writes still running (another thread's put, or one whose thread ends with
                // the process) are revoked first, so their keys are free as the store closes.
                let abandoned = store.abandon_writes().await;
                if abandoned > 0 {
                    tracing::debug!(abandoned, "revoked writes in flight at close");
                }
                if let Some(node) = node {
                    node.shutdown().await;
                }
                store.master().close().await;
                if let Some(master) = master {
                    master.shutdown().await;
                }
            })
            .await
        });
        if finished.is_err() {
            tracing::warn!(
                "closing the store took longer than {SHUTDOWN_DEADLINE:?}; the master unmounts what is left at its heartbeat deadline"
            );
        }
    }

    /// 0 when the master answers within a short deadline, 2 otherwise. Blocks.
    pub(crate) fn health(&self) -> i32 {
        let ready = self.block_on(self.store.master().call_with_timeout::<String>(
            Request::ServiceReady(ServiceReadyRequest {}),
            HEALTH_DEADLINE,
        ));
        match ready {
            Ok(_) => HEALTHY,
            Err(e) => {
                tracing::debug!(error = %e, "health check failed");
                MASTER_UNREACHABLE
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // A node that was never shut down stops serving now (the master expires its
            // segments); its sockets are closed inside the runtime they belong to.
            {
                let _inside = rt.enter();
                drop(self.node.lock().take());
                drop(self.master.lock().take());
            }
            // The last reference may go away on a Python thread holding the GIL: do not wait
            // for worker threads there.
            rt.shutdown_background();
        }
    }
}

/// Deadlines a store is built with (defaults are the Rust client's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreTuning {
    pub rpc_timeout: Option<Duration>,
    /// Most lanes driven by calling threads (`MOONKV_CALLER_LANES`, 0 = none).
    pub caller_lanes: usize,
    /// How long a calling thread polls before it sleeps (`MOONKV_SPIN_US`).
    pub spin: Duration,
}

impl Default for StoreTuning {
    fn default() -> Self {
        StoreTuning {
            rpc_timeout: None,
            caller_lanes: DEFAULT_CALLER_LANES,
            spin: DEFAULT_SPIN,
        }
    }
}

/// Lanes a store keeps at most: one per calling thread up to this many.
const DEFAULT_CALLER_LANES: usize = 16;
/// Polling before sleeping: a small object's round trip on loopback fits well inside it.
const DEFAULT_SPIN: Duration = Duration::from_micros(200);
/// Environment variable: most caller lanes (0 turns them off).
pub(crate) const CALLER_LANES_ENV: &str = "MOONKV_CALLER_LANES";
/// Environment variable: microseconds a calling thread polls before it sleeps (0: never).
pub(crate) const SPIN_ENV: &str = "MOONKV_SPIN_US";

impl StoreTuning {
    /// The defaults, with `MOONKV_CALLER_LANES` and `MOONKV_SPIN_US` applied.
    pub(crate) fn from_env() -> Result<StoreTuning, Error> {
        let mut tuning = StoreTuning::default();
        if let Some(n) = env_number(CALLER_LANES_ENV, "a number of lanes")? {
            tuning.caller_lanes = n as usize;
        }
        if let Some(us) = env_number(SPIN_ENV, "a number of microseconds")? {
            tuning.spin = Duration::from_micros(us);
        }
        Ok(tuning)
    }
}

fn env_number(name: &str, what: &str) -> Result<Option<u64>, Error> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(invalid(format!("{name} is not UTF-8"))),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| invalid(format!("{name} must be {what} (a whole number), got {v:?}"))),
    }
}

impl StoreTuning {
    fn apply(self, config: &mut StoreConfig) {
        if let Some(t) = self.rpc_timeout {
            config.rpc_timeout = t;
            config.connect_timeout = config.connect_timeout.min(t);
        }
    }
}

fn new_runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("moonkv")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot start the runtime: {e}"),
            )
        })
}

fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// Starts the embedded node. Its one segment is named after its endpoint, so
/// `preferred_segments=[store.get_hostname()]` (what LMCache passes for local-first placement)
/// names it; that needs the port before the node starts, hence the probe-and-retry when
/// `local_hostname` has none.
async fn start_node(settings: &Settings) -> Result<NodeHandle, Error> {
    let (host, port) = host_and_port(&settings.local_hostname)?;
    let ports = if port == 0 {
        Some(PortRange::from_env()?)
    } else {
        None
    };
    let attempts = ports.as_ref().map_or(1, |r| r.attempts);
    let mut last = invalid("no port to listen on");
    for _ in 0..attempts {
        let port = match &ports {
            Some(range) => match range.free_port(&host)? {
                Some(port) => port,
                None => continue,
            },
            None => port,
        };
        let endpoint = format!("{host}:{port}");
        let mut config = NodeConfig::new(
            settings.master_server_addr.clone(),
            settings.global_segment_size,
        );
        config.data_bind = endpoint.clone();
        config.advertise_host = Some(host.clone());
        config.segment_names = vec![endpoint];
        config.host_id = host.clone();
        match Node::start(config).await {
            Ok(node) => return Ok(node),
            Err(e) if e.message.contains("cannot listen") => last = e,
            Err(e) => return Err(e),
        }
    }
    if let Some(range) = &ports {
        last = invalid(format!(
            "no free data-plane port on {host} in {}..={} after {} attempts ({}; set {MIN_PORT_ENV} and {MAX_PORT_ENV}, or give local_hostname a port)",
            range.min, range.max, range.attempts, last.message
        ));
    }
    Err(last)
}

/// Environment variables of upstream's client that bound the data-plane port chosen when
/// `local_hostname` names none, and how many ports are tried.
const MIN_PORT_ENV: &str = "MC_STORE_CLIENT_MIN_PORT";
const MAX_PORT_ENV: &str = "MC_STORE_CLIENT_MAX_PORT";
const RETRIES_ENV: &str = "MC_STORE_CLIENT_SETUP_RETRIES";

/// Where an embedded node listens when `local_hostname` has no port: a random free port in
/// 12300..=14300, as upstream's client picks (same variables to move the range), tried up to
/// 20 times against other processes taking it in between.
struct PortRange {
    min: u16,
    max: u16,
    attempts: usize,
}

impl PortRange {
    fn from_env() -> Result<PortRange, Error> {
        let port = |name: &str, default: u16| -> Result<u16, Error> {
            match env_number(name, "a port number")? {
                None => Ok(default),
                Some(p) => u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
                    invalid(format!("{name} must be a port from 1 to 65535, got {p}"))
                }),
            }
        };
        let (min, max) = (port(MIN_PORT_ENV, 12300)?, port(MAX_PORT_ENV, 14300)?);
        if min > max {
            return Err(invalid(format!(
                "{MIN_PORT_ENV}={min} is above {MAX_PORT_ENV}={max}"
            )));
        }
        let attempts =
            env_number(RETRIES_ENV, "a number of attempts")?.unwrap_or(PORT_ATTEMPTS as u64);
        Ok(PortRange {
            min,
            max,
            attempts: attempts.clamp(1, 1000) as usize,
        })
    }

    /// A port of the range that is free on `host` right now, chosen at random; `None` when
    /// the one chosen is taken, an error when `host` cannot be listened on at all.
    fn free_port(&self, host: &str) -> Result<Option<u16>, Error> {
        use std::hash::BuildHasher;
        let span = u64::from(self.max - self.min) + 1;
        // Each RandomState is keyed afresh: a different draw every call.
        let draw = std::collections::hash_map::RandomState::new().hash_one(());
        let port = self.min + (draw % span) as u16;
        match std::net::TcpListener::bind((host.trim_matches(['[', ']']), port)) {
            Ok(_) => Ok(Some(port)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
            Err(e) => Err(invalid(format!("cannot listen on {host}: {e}"))),
        }
    }
}

/// The master of `enable_standalone`: upstream's defaults, listening on 127.0.0.1 only (RPC and
/// admin HTTP on ports of the kernel's choosing), with no event stream.
async fn start_embedded_master() -> Result<moonkv_master::server::MasterHandle, Error> {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = moonkv_master::server::MasterConfig {
        rpc_addr: loopback,
        admin_addr: loopback,
        ..Default::default()
    };
    config.kv_events.enabled = false;
    moonkv_master::server::start(config).await.map_err(|e| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("enable_standalone: the embedded master did not start: {e}"),
        )
    })
}

/// The local buffer of upstream's copying calls, kept as a budget: an object larger than
/// `local_buffer_size` is refused, and so is one that does not fit beside the objects other
/// threads are moving through copying calls at the same time (upstream's allocator fails the
/// same way rather than waiting).
pub(crate) struct Staging {
    limit: u64,
    used: Mutex<u64>,
}

/// Bytes held in the local buffer; given back on drop.
pub(crate) struct StagingLease {
    staging: Arc<Staging>,
    bytes: u64,
}

impl Staging {
    fn new(limit: u64) -> Staging {
        Staging {
            limit,
            used: Mutex::new(0),
        }
    }

    /// Takes `bytes` of the local buffer.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<StagingLease, Error> {
        if bytes > self.limit {
            return Err(invalid(format!(
                "{bytes} bytes do not fit in the local buffer of {} bytes (setup's local_buffer_size bounds put/get/get_buffer; the zero-copy calls have no such bound)",
                self.limit
            )));
        }
        let mut used = self.used.lock();
        if *used + bytes > self.limit {
            return Err(invalid(format!(
                "the local buffer is full: {} of {} bytes are in use by other copying calls or live BufferHandles",
                *used, self.limit
            )));
        }
        *used += bytes;
        Ok(StagingLease {
            staging: self.clone(),
            bytes,
        })
    }
}

impl Drop for StagingLease {
    fn drop(&mut self) {
        *self.staging.used.lock() -= self.bytes;
    }
}
