//! The master process around the engine: RPC server, admin HTTP, event publisher, maintenance.
//!
//! - [`config`]: upstream config keys, file loading and validation.
//! - `rpc`: the framed TCP protocol (`docs/protocol.md`).
//! - `tls`: the RPC port's optional TLS (plain or TLS halves for `rpc`).
//! - `admin`: HTTP endpoints.
//! - [`events`]: engine changes → KV event publisher.
//! - [`metrics`]: Prometheus registry.

mod admin;
pub mod config;
pub mod events;
pub mod metrics;
mod rpc;
mod space_wait;
mod tls;

pub use config::{ConfigError, KvEventsSettings, MasterConfig, CONFIG_KEYS};

use crate::engine::{Engine, SystemClock};
use events::EventHook;
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
    rpc_addr: SocketAddr,
    admin_addr: SocketAddr,
    engine: Arc<Engine>,
    events: Arc<EventHook>,
    stop: watch::Sender<bool>,
    maintenance_stop: Arc<AtomicBool>,
    maintenance: Option<JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl MasterHandle {
    /// Address the RPC server listens on.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    /// Address the admin HTTP server listens on.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The ZMQ endpoint of the event stream, when events are on.
    pub fn events_endpoint(&self) -> Option<String> {
        self.events.endpoint()
    }

    /// The engine, for embedding and tests.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
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

/// Binds every listener, starts the publisher and the maintenance thread, and serves.
///
/// Must be called inside a tokio runtime.
pub async fn start(config: MasterConfig) -> anyhow::Result<MasterHandle> {
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
    let engine = Arc::new(Engine::new(
        engine_config,
        Arc::new(SystemClock),
        events.clone(),
    ));
    let metrics = Arc::new(Metrics::new(engine.clone(), events.clone()));

    let rpc_listener = tokio::net::TcpListener::bind(config.rpc_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind the RPC port {}: {e}", config.rpc_addr))?;
    let admin_listener = tokio::net::TcpListener::bind(config.admin_addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!("cannot bind the admin HTTP port {}: {e}", config.admin_addr)
        })?;
    let rpc_addr = rpc_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);

    let shared = Arc::new(rpc::RpcShared {
        engine: engine.clone(),
        metrics: metrics.clone(),
        max_frame_bytes: config.max_frame_bytes,
        io_timeout: std::time::Duration::from_millis(config.rpc_io_timeout_ms),
        connections: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
        admin_addr: Some(admin_addr.to_string()),
        secret: config.auth_secret.clone(),
        node_secret: config
            .auth_secret
            .as_ref()
            .and(config.grant_secret.clone())
            .filter(|node| Some(node) != config.auth_secret.as_ref()),
        tls,
    });
    let rpc_task = tokio::spawn(rpc::serve(rpc_listener, shared, stop_rx.clone()));

    let state = admin::AdminState {
        engine: engine.clone(),
        metrics,
        events: events.clone(),
        backend_id: config.kv_events.backend_id.clone(),
        secret: config.auth_secret.clone(),
    };
    let mut admin_stop = stop_rx.clone();
    let admin_task = tokio::spawn(async move {
        let serve =
            axum::serve(admin_listener, admin::router(state)).with_graceful_shutdown(async move {
                let _ = admin_stop.changed().await;
            });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin HTTP server failed");
        }
    });

    let maintenance_stop = Arc::new(AtomicBool::new(false));
    let maintenance = spawn_maintenance(engine.clone(), maintenance_stop.clone())?;
    let tls_on = config.tls().is_some();
    tracing::info!(%rpc_addr, %admin_addr, tls = tls_on, events = ?events.endpoint(), "master ready");
    Ok(MasterHandle {
        rpc_addr,
        admin_addr,
        engine,
        events,
        stop,
        maintenance_stop,
        maintenance: Some(maintenance),
        tasks: vec![rpc_task, admin_task],
    })
}

/// Runs eviction every 10 ms and the slower sweeps every second on a thread of its own, so
/// long scans never occupy an RPC worker.
fn spawn_maintenance(
    engine: Arc<Engine>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("moonkv-maintenance".into())
        .spawn(move || {
            let mut last_sweep = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EVICTION_PERIOD);
                engine.run_eviction();
                if last_sweep.elapsed() >= SWEEP_PERIOD {
                    last_sweep = Instant::now();
                    engine.expire_clients();
                    engine.sweep_stalled_writes();
                    engine.run_graceful_unmounts();
                }
            }
        })
}
