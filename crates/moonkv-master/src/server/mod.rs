//! The master process around the engine: RPC server, admin HTTP, event publisher, maintenance.
//!
//! - [`config`]: upstream config keys, file loading and validation.
//! - `rpc`: the framed TCP protocol (`docs/protocol.md`).
//! - `tls`: the RPC port's optional TLS (plain or TLS halves for `rpc`).
//! - `admin`: HTTP endpoints.
//! - `http`: the admin HTTP listener and its connection limits.
//! - [`events`]: engine changes → KV event publisher.
//! - [`metrics`]: Prometheus registry.
//! - [`ha`]: leader election on etcd and the serving gate every request passes.

mod admin;
pub mod config;
pub mod events;
pub mod ha;
mod http;
pub mod metrics;
mod pending;
mod rpc;
mod space_wait;
mod tls;

pub use config::{ConfigError, KvEventsSettings, MasterConfig, CONFIG_KEYS};
pub use events::EventsStartError;
pub use tls::TlsLoadError;

use crate::engine::{Duties, Engine, SystemClock};
use events::EventHook;
use ha::Gate;
use metrics::Metrics;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often eviction checks the watermark (upstream: 10 ms).
const EVICTION_PERIOD: Duration = Duration::from_millis(10);
/// How often client expiry, the stalled-write sweep and graceful unmounts run.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// A running master. Drop does not stop it; call [`MasterHandle::shutdown`].
pub struct MasterHandle {
    rpc: Arc<rpc::RpcShared>,
    rpc_addr: SocketAddr,
    admin_addr: SocketAddr,
    gate: Arc<Gate>,
    events: Arc<EventHook>,
    stop: watch::Sender<bool>,
    maintenance_stop: Arc<AtomicBool>,
    maintenance: Option<JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The master as a call in this process ([`MasterHandle::in_process`]).
struct InProcess(Arc<rpc::RpcShared>);

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

impl moonkv_proto::local::InProcessMaster for InProcess {
    fn answer(&self, request: moonkv_proto::msg::Request) -> moonkv_proto::local::AnswerFuture {
        let answer = rpc::answer_in_process(self.0.clone(), request, false);
        Box::pin(async move {
            let (request, answer, _sent) = answer.await;
            (request, answer)
        })
    }

    fn answer_then(
        &self,
        request: moonkv_proto::msg::Request,
    ) -> moonkv_proto::local::AnswerThenFuture {
        Box::pin(rpc::answer_in_process(self.0.clone(), request, true))
    }
}

impl MasterHandle {
    /// This master as a call in the same process, answered as on a node's connection: for the
    /// node `moonkv up` runs beside it.
    pub fn in_process(&self) -> Arc<dyn moonkv_proto::local::InProcessMaster> {
        Arc::new(InProcess(self.rpc.clone()))
    }

    /// Address the RPC server listens on.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    /// The local socket RPC is also served on (`@moonkv-master-…`), when there is one.
    pub fn local_socket(&self) -> Option<&str> {
        self.rpc.local_socket.as_deref()
    }

    /// Address the admin HTTP server listens on.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The ZMQ endpoint of the event stream, when events are on.
    pub fn events_endpoint(&self) -> Option<String> {
        self.events.endpoint()
    }

    /// The engine of the current term, for embedding and tests (with HA, an empty one while
    /// this master does not lead).
    pub fn engine(&self) -> Arc<Engine> {
        self.gate.engine()
    }

    /// Takes `client` as a node running in this master's process (`moonkv up`), which lives
    /// exactly as long as the master does: it is never expired ([`Engine::never_expire`]), so it
    /// never has to regain its replicas and needs no catalog of them. `true` when so; `false`
    /// with HA, where another master may lead and the node must be able to announce its replicas
    /// to it (it then keeps its catalog, and is expired like any client).
    pub fn embed_node(&self, client: moonkv_proto::ClientId) -> bool {
        if self.gate.is_ha() {
            return false;
        }
        self.gate.engine().never_expire(client);
        true
    }

    /// Whether this master serves, its HA state and term ([`ha::Gate`]).
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Stops accepting, closes connections, stops maintenance, drains the event queue.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        self.maintenance_stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.maintenance.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let events = self.events.clone();
        let _ = tokio::task::spawn_blocking(move || events.shutdown()).await;
    }
}

/// Why a master did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is out of range or inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS certificate, key or CA could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsLoadError),
    /// The KV event publisher could not bind or start.
    #[error(transparent)]
    Events(#[from] EventsStartError),
    /// A listening port could not be bound.
    #[error("cannot bind the {what} {addr}")]
    Bind {
        /// `RPC port` or `admin HTTP port`.
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The maintenance thread could not be spawned.
    #[error("cannot start the maintenance thread")]
    Thread(#[source] std::io::Error),
}

/// Binds every listener, starts the publisher and the maintenance thread, and serves.
///
/// Must be called inside a tokio runtime.
pub async fn start(config: MasterConfig) -> Result<MasterHandle, StartError> {
    config.validate()?;
    let tls = match config.tls() {
        Some(settings) => Some(tls::RpcTls::load(&settings)?),
        None => None,
    };
    let events = Arc::new(EventHook::start(&config.kv_events)?);
    let mut engine_config = config.engine.clone();
    // With a secret, descriptors carry grants the nodes check (docs/data-plane.md).
    if engine_config.grant_key.is_none() {
        engine_config.grant_key = config
            .grant_secret
            .clone()
            .or_else(|| config.auth_secret.clone());
    }
    let ha_settings = config.ha()?;
    let catalog = Arc::new(rpc::CatalogSignals::default());
    let gate = Arc::new(if ha_settings.is_some() {
        let sink = events.clone();
        let catalog = catalog.clone();
        Gate::for_ha(move |term| {
            // A leader's term orders its writes after every earlier leader's (re-adoption).
            let mut config = engine_config.clone();
            config.epoch = term.max(1);
            let engine = Engine::new(config, Arc::new(SystemClock), sink.clone());
            catalog.wire(&engine);
            engine
        })
    } else {
        let engine = Engine::new(engine_config, Arc::new(SystemClock), events.clone());
        catalog.wire(&engine);
        Gate::always_open(Arc::new(engine))
    });
    let metrics = Arc::new(Metrics::new(gate.clone(), events.clone()));

    let rpc_listener = tokio::net::TcpListener::bind(config.rpc_addr)
        .await
        .map_err(|source| StartError::Bind {
            what: "RPC port",
            addr: config.rpc_addr,
            source,
        })?;
    let admin_listener = tokio::net::TcpListener::bind(config.admin_addr)
        .await
        .map_err(|source| StartError::Bind {
            what: "admin HTTP port",
            addr: config.admin_addr,
            source,
        })?;
    let rpc_addr = rpc_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            what: "RPC port",
            addr: config.rpc_addr,
            source,
        })?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            what: "admin HTTP port",
            addr: config.admin_addr,
            source,
        })?;
    let (stop, stop_rx) = watch::channel(false);
    // Callers on this machine reach the master through a local socket, when the port is plain.
    let local = if config.rpc_local_socket && tls.is_none() {
        match moonkv_proto::local_socket::bind(moonkv_proto::local_socket::MASTER)
            .and_then(|(name, l)| Ok((name, tokio::net::UnixListener::from_std(l)?)))
        {
            Ok(bound) => Some(bound),
            Err(e) => {
                tracing::warn!(error = %e, "no local socket for callers on this machine; they use the RPC port");
                None
            }
        }
    } else {
        None
    };

    let shared = Arc::new(rpc::RpcShared {
        gate: gate.clone(),
        metrics: metrics.clone(),
        max_frame_bytes: config.max_frame_bytes,
        io_timeout: std::time::Duration::from_millis(config.rpc_io_timeout_ms),
        connections: pending::Connections::new(
            pending::HandshakeLimits {
                deadline: std::time::Duration::from_millis(config.handshake_timeout_ms),
                max: config.max_handshaking_connections,
                max_per_source: config.max_handshaking_per_source,
            },
            config.max_connections,
            metrics.connection_metrics(),
        ),
        admin_addr: Some(admin_addr.to_string()),
        local_socket: local.as_ref().map(|(name, _)| name.clone()),
        secret: config.auth_secret.clone(),
        node_secret: config
            .auth_secret
            .as_ref()
            .and(config.grant_secret.clone())
            .filter(|node| Some(node) != config.auth_secret.as_ref()),
        tls,
        catalog,
    });
    let rpc_task = tokio::spawn(rpc::serve(rpc_listener, shared.clone(), stop_rx.clone()));
    let local_task = local.map(|(name, listener)| {
        tracing::info!(socket = %name, "RPC also served on a local socket");
        tokio::spawn(rpc::serve_local(listener, shared.clone(), stop_rx.clone()))
    });

    let state = admin::AdminState {
        gate: gate.clone(),
        metrics,
        events: events.clone(),
        backend_id: config.kv_events.backend_id.clone(),
        secret: config.auth_secret.clone(),
    };
    let limits = http::Limits {
        header_timeout: Duration::from_millis(config.admin_header_timeout_ms),
        idle_timeout: Duration::from_millis(config.admin_idle_timeout_ms),
        max_connections: config.admin_max_connections,
    };
    let admin_task = tokio::spawn(http::serve(
        admin_listener,
        admin::router(state),
        limits,
        stop_rx.clone(),
    ));

    let maintenance_stop = Arc::new(AtomicBool::new(false));
    let maintenance =
        spawn_maintenance(gate.clone(), maintenance_stop.clone()).map_err(StartError::Thread)?;
    let mut tasks = vec![rpc_task, admin_task];
    tasks.extend(local_task);
    if let Some(settings) = ha_settings {
        let me = ha::Advertised {
            rpc_addr: rpc_addr.to_string(),
            admin_addr: admin_addr.to_string(),
            events_endpoint: events.endpoint(),
        };
        tracing::info!(cluster_id = %settings.cluster_id, endpoints = ?settings.endpoints, "HA on: campaigning through etcd");
        // Last in the list: shutdown stops the servers first, then gives the leader key up.
        tasks.push(tokio::spawn(ha::run(
            settings,
            me,
            gate.clone(),
            stop_rx.clone(),
        )));
    }
    let tls_on = config.tls().is_some();
    tracing::info!(%rpc_addr, %admin_addr, tls = tls_on, events = ?events.endpoint(), "master ready");
    Ok(MasterHandle {
        rpc: shared,
        rpc_addr,
        admin_addr,
        gate,
        events,
        stop,
        maintenance_stop,
        maintenance: Some(maintenance),
        tasks,
    })
}

/// Runs eviction every 10 ms and the slower sweeps every second on a thread of its own, so
/// long scans never occupy an RPC worker.
fn spawn_maintenance(gate: Arc<Gate>, stop: Arc<AtomicBool>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("moonkv-maintenance".into())
        .spawn(move || {
            let mut last_sweep = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EVICTION_PERIOD);
                // A standby holds no metadata; its maintenance waits for a term of its own.
                if !gate.serving() {
                    continue;
                }
                let due = if last_sweep.elapsed() >= SWEEP_PERIOD {
                    last_sweep = Instant::now();
                    Duties::All
                } else {
                    Duties::Eviction
                };
                gate.engine().run_duties(due);
            }
        })
}
