//! Client of the master's RPC protocol (`docs/protocol.md`).
//!
//! One multiplexed TCP connection per master: callers pipeline requests, responses are matched
//! by request id. A call that outlives its deadline fails with `RPC_TIMEOUT`; a broken
//! connection fails its in-flight calls with `RPC_FAIL` and is re-established (with backoff) by
//! the next call. Mutations are never retried automatically, since their outcome is unknown.
//!
//! Segments mounted through [`MasterClient::mount`] are remembered; a background heartbeat pings
//! the master every second and, when the master answers `NEED_REMOUNT` (it restarted or expired
//! this client), re-registers them with `ReMountSegment`.
//!
//! The master address is `host:port`, or `etcd://host:port[;host:port...][/cluster_id]` for an
//! HA cluster: the client reads the leader from etcd, connects to it, and when the connection
//! breaks, a call times out or a master answers that it is not the leader, it reads the leader
//! again and reconnects (bounded backoff). A refusal by a standby means the request did not run,
//! so that call is retried on the new leader within its deadline; the heartbeat then re-mounts
//! this client's segments on the new leader (it answers `NEED_REMOUNT`).
//!
//! [`blocking`] is the same protocol over `std::net` for threads that have no runtime (the
//! benchmarks, tests); both clients run the one hello exchange of [`handshake`].

pub mod blocking;
mod connection;
pub mod handshake;
mod heartbeat;
mod leader;

use connection::Connection;
use leader::LeaderLookup;
use moonkv_proto::frame;
use moonkv_proto::ha::{is_not_leader, MasterAddr};
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{ClientId, Error, ErrorCode, Result, SegmentId};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest response frame accepted from the master (batch and regex answers may exceed its
/// request limit).
const MAX_RESPONSE_BYTES: u32 = 1 << 30;

/// How a [`MasterClient`] talks to the master.
#[derive(Clone, Debug)]
pub struct MasterClientConfig {
    /// Master RPC address, `host:port`, or `etcd://host:port[;host:port...][/cluster_id]` to
    /// follow the leader of an HA cluster.
    pub master_addr: String,
    /// Identity of this process towards the master (writer id, segment owner).
    pub client_id: ClientId,
    /// Name sent in the hello, for the master's logs.
    pub client_name: String,
    /// Deadline of one request.
    pub rpc_timeout: Duration,
    /// Deadline of one connection attempt (TCP connect plus hello).
    pub connect_timeout: Duration,
    /// Connection attempts per call before it fails with `RPC_FAIL`.
    pub connect_attempts: u32,
    /// Heartbeat period.
    pub ping_interval: Duration,
    /// Shared secret to prove when the master asks (`MOONKV_AUTH_SECRET[_FILE]` by default).
    pub auth_secret: Option<moonkv_proto::auth::Secret>,
    /// Connect with TLS, verifying the master against this CA (`MOONKV_TLS_CA_FILE` by
    /// default); `None` = plain TCP.
    pub tls: Option<moonkv_dataplane::stream::TlsClientConfig>,
    /// Reconnect to the master's local socket when it offers one and this process is on its
    /// machine (it was reached on a loopback address); on by default. Never with TLS.
    pub local_socket: bool,
}

impl MasterClientConfig {
    /// Defaults for `master_addr`: 5 s requests, 3 s connects, 3 attempts, 1 s heartbeat.
    pub fn new(master_addr: impl Into<String>) -> Self {
        Self {
            master_addr: master_addr.into(),
            client_id: ClientId::random(),
            client_name: format!("moonkv-client/{}", env!("CARGO_PKG_VERSION")),
            rpc_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            connect_attempts: 3,
            ping_interval: Duration::from_secs(1),
            auth_secret: crate::util::secret_from_env(),
            tls: moonkv_dataplane::stream::TlsClientConfig::from_env(),
            local_socket: true,
        }
    }
}

/// Makes `conn` the live connection in `slot`.
fn install(slot: &mut Option<Arc<Connection>>, conn: Connection) -> Arc<Connection> {
    let conn = Arc::new(conn);
    *slot = Some(conn.clone());
    conn
}

/// Handle to the master; cheap to clone, all clones share one connection.
#[derive(Clone)]
pub struct MasterClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: MasterClientConfig,
    /// `config.master_addr`, parsed (or why it could not be).
    addr: std::result::Result<MasterAddr, Error>,
    /// Set for an `etcd://` address.
    lookup: Option<LeaderLookup>,
    /// `config.tls`, loaded (or why it could not be).
    tls: std::result::Result<Option<moonkv_dataplane::stream::TlsConnector>, String>,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The local socket the master at an address offered (address, name): reconnects go
    /// there first.
    local: Mutex<Option<(String, String)>>,
    next_request_id: AtomicU64,
    segments: Mutex<Vec<Segment>>,
    heartbeat: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Runs after every heartbeat-driven remount (a node announces its catalog there).
    remount_hook: Mutex<Option<Arc<dyn RemountHook>>>,
    /// The hook's current run.
    hook_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.lock().take() {
            task.abort();
        }
        if let Some(task) = self.hook_task.lock().take() {
            task.abort();
        }
    }
}

/// What a segment owner does after the master asked it to remount and the remount succeeded:
/// a node announces the replicas it holds (re-adoption). With a hook set, remounts ask the
/// master to freeze the segments it did not know until the hook's announcement ends.
pub trait RemountHook: Send + Sync {
    /// Runs in its own task; a new remount aborts a run still going. `master_epoch` is the
    /// epoch the master reported with its `NEED_REMOUNT`, and `merges_returning` whether it
    /// takes back the catalog of a node it expired (`PingResponse::merges_returning`).
    fn remounted(
        &self,
        master: MasterClient,
        master_epoch: u64,
        merges_returning: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

impl MasterClient {
    /// Connects to the master (hello included) and returns the client.
    pub async fn connect(config: MasterClientConfig) -> Result<MasterClient> {
        let client = MasterClient::lazy(config);
        client.connect_now().await?;
        Ok(client)
    }

    /// Builds a client that connects on its first call.
    pub fn lazy(config: MasterClientConfig) -> MasterClient {
        let addr = MasterAddr::parse(&config.master_addr);
        let lookup = match &addr {
            Ok(MasterAddr::Etcd {
                endpoints,
                cluster_id,
            }) => Some(LeaderLookup::new(endpoints.clone(), cluster_id.clone())),
            _ => None,
        };
        MasterClient {
            inner: Arc::new(Inner {
                addr,
                lookup,
                tls: moonkv_dataplane::stream::TlsConnector::load_if_set(config.tls.as_ref())
                    .map_err(|e| e.to_string()),
                config,
                conn: tokio::sync::Mutex::new(None),
                local: Mutex::new(None),
                next_request_id: AtomicU64::new(1),
                segments: Mutex::new(Vec::new()),
                heartbeat: Mutex::new(None),
                remount_hook: Mutex::new(None),
                hook_task: Mutex::new(None),
            }),
        }
    }

    /// Opens the connection now (hello included) instead of on the first call.
    pub async fn connect_now(&self) -> Result<()> {
        self.connection().await.map(drop)
    }

    /// Whether the address is `etcd://`: the client follows an HA cluster's leader.
    pub fn follows_leader(&self) -> bool {
        self.inner.lookup.is_some()
    }

    /// Identity of this client towards the master.
    pub fn client_id(&self) -> ClientId {
        self.inner.config.client_id
    }

    /// The configuration in use.
    pub fn config(&self) -> &MasterClientConfig {
        &self.inner.config
    }

    /// Whether the live connection is to the master's local socket (false while there is
    /// none).
    pub async fn over_local_socket(&self) -> bool {
        let slot = self.inner.conn.lock().await;
        slot.as_ref().is_some_and(|c| c.is_alive() && c.is_local)
    }

    /// Opens a connection to the master's local socket `name`.
    async fn open_local(&self, name: &str) -> Result<Connection> {
        let config = &self.inner.config;
        Connection::open_local(
            name,
            &config.client_name,
            config.connect_timeout,
            config.auth_secret.as_ref(),
        )
        .await
    }

    /// Returns the live connection, opening a new one (with backoff between attempts) if needed.
    async fn connection(&self) -> Result<Arc<Connection>> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| c.is_alive()) {
            return Ok(conn.clone());
        }
        let config = &self.inner.config;
        let tls = self.inner.tls.as_ref().map_err(|why| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("TLS settings for the master: {why}"),
            )
        })?;
        if let Err(e) = &self.inner.addr {
            return Err(e.clone());
        }
        // Following a leader: keep trying through a failover (about 10 s at most), since a new
        // leader is normally elected within one lease TTL.
        let (attempts, max_backoff) = match &self.inner.lookup {
            Some(_) => (config.connect_attempts.max(20), Duration::from_millis(500)),
            None => (config.connect_attempts.max(1), Duration::from_secs(2)),
        };
        let mut backoff = Duration::from_millis(50);
        let mut last_error = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max_backoff);
            }
            let addr = match &self.inner.lookup {
                None => config.master_addr.clone(),
                Some(lookup) => match lookup.resolve(config.connect_timeout).await {
                    Ok(leader) => leader.rpc_addr,
                    Err(e) => {
                        tracing::debug!(attempt, error = %e, "no leader to connect to yet");
                        last_error = Some(e);
                        continue;
                    }
                },
            };
            let use_local = config.local_socket && tls.is_none();
            let known = match &*self.inner.local.lock() {
                Some((at, name)) if use_local && *at == addr => Some(name.clone()),
                _ => None,
            };
            if let Some(name) = known {
                // The master offered its local socket before: straight there.
                match self.open_local(&name).await {
                    Ok(conn) => return Ok(install(&mut slot, conn)),
                    Err(e) => {
                        // A restarted master has another name: it is learnt again over TCP.
                        tracing::debug!(socket = %name, error = %e, "the master's local socket is gone");
                        *self.inner.local.lock() = None;
                    }
                }
            }
            match Connection::open(
                &addr,
                &config.client_name,
                config.connect_timeout,
                config.auth_secret.as_ref(),
                tls.as_ref(),
            )
            .await
            {
                Ok(conn) => {
                    let offer = conn.local_offer.clone().filter(|_| use_local);
                    if let Some(name) = offer {
                        match self.open_local(&name).await {
                            Ok(local) => {
                                *self.inner.local.lock() = Some((addr.clone(), name));
                                return Ok(install(&mut slot, local));
                            }
                            Err(e) => {
                                tracing::debug!(socket = %name, error = %e, "the master's local socket refused; staying on TCP");
                            }
                        }
                    }
                    return Ok(install(&mut slot, conn));
                }
                Err(e) => {
                    tracing::debug!(%addr, attempt, error = %e, "master connect failed");
                    // A refused hello (wrong protocol version) will not get better by retrying.
                    if e.code != ErrorCode::RPC_FAIL && e.code != ErrorCode::RPC_TIMEOUT {
                        return Err(e);
                    }
                    last_error = Some(e);
                }
            }
        }
        *slot = None;
        Err(last_error
            .unwrap_or_else(|| Error::new(ErrorCode::RPC_FAIL, "no connection attempt was made")))
    }

    /// Sends one request and decodes its response, within the configured deadline.
    pub async fn call<T: DeserializeOwned>(&self, request: Request) -> Result<T> {
        self.call_with_timeout(request, self.inner.config.rpc_timeout)
            .await
    }

    /// Sends one request and decodes its response, within `deadline`.
    ///
    /// Following a leader (`etcd://`), a refusal by a master that is not the leader is retried
    /// on the leader registered now, and a broken or silent connection is dropped so the next
    /// call looks the leader up again.
    pub async fn call_with_timeout<T: DeserializeOwned>(
        &self,
        request: Request,
        deadline: Duration,
    ) -> Result<T> {
        self.call_borrowed(&request, deadline).await
    }

    /// [`MasterClient::call_with_timeout`] of a request the caller keeps.
    pub async fn call_borrowed<T: DeserializeOwned>(
        &self,
        request: &Request,
        deadline: Duration,
    ) -> Result<T> {
        if self.inner.lookup.is_none() {
            return self.call_once(request, deadline).await;
        }
        let until = tokio::time::Instant::now() + deadline;
        let mut backoff = Duration::from_millis(50);
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let result = self.call_once(request, left).await;
            let Err(e) = &result else { return result };
            let retry = is_not_leader(e);
            if retry || matches!(e.code, ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT) {
                self.drop_connection().await;
            }
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !retry || left <= backoff {
                return result;
            }
            tracing::debug!(error = %e, "the master is not the leader; looking the leader up again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Closes the current connection, so the next call connects (and resolves) anew.
    async fn drop_connection(&self) {
        if let Some(conn) = self.inner.conn.lock().await.take() {
            conn.close();
        }
    }

    async fn call_once<T: DeserializeOwned>(
        &self,
        request: &Request,
        deadline: Duration,
    ) -> Result<T> {
        let op = request.op();
        let attempt = async {
            let conn = self.connection().await?;
            let request_id = self.inner.next_request_id.fetch_add(1, Ordering::Relaxed);
            let mut out = Vec::new();
            frame::encode_request(&mut out, request_id, request)?;
            if out.len() > conn.max_frame_bytes as usize {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!(
                        "{op:?} request of {} bytes exceeds the master's frame limit of {}",
                        out.len(),
                        conn.max_frame_bytes
                    ),
                ));
            }
            let rx = conn.send(request_id, out)?;
            let guard = ForgetOnDrop {
                conn: &conn,
                request_id,
            };
            let raw = rx.await.map_err(|_| {
                Error::new(ErrorCode::RPC_FAIL, "the connection to the master closed")
            })??;
            std::mem::forget(guard);
            let frame = frame::Frame {
                kind: frame::FrameKind::Response,
                request_id,
                code: raw.code,
                body: &raw.body,
            };
            frame::decode_response::<T>(&frame)
        };
        match tokio::time::timeout(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorCode::RPC_TIMEOUT,
                format!(
                    "{op:?} got no answer from the master at {} within {deadline:?}",
                    self.inner.config.master_addr
                ),
            )),
        }
    }

    /// Mounts a segment owned by this client and remembers it for automatic remounts; starts the
    /// heartbeat on first use.
    pub async fn mount(&self, segment: Segment) -> Result<()> {
        // An owner with a remount hook announces its catalog (see `RemountHook`): it keeps one.
        let keeps_catalog = self.inner.remount_hook.lock().is_some();
        self.mount_segment(MountSegmentRequest {
            segment: segment.clone(),
            client_id: self.client_id(),
            keeps_catalog,
        })
        .await?;
        self.inner.segments.lock().push(segment);
        self.start_heartbeat();
        Ok(())
    }

    /// Unmounts a segment mounted with [`MasterClient::mount`] and forgets it.
    pub async fn unmount(&self, segment_id: SegmentId) -> Result<()> {
        self.inner.segments.lock().retain(|s| s.id != segment_id);
        self.unmount_segment(UnmountSegmentRequest {
            segment_id,
            client_id: self.client_id(),
        })
        .await
    }

    /// Sets what runs after each heartbeat-driven remount (see [`RemountHook`]).
    pub fn set_remount_hook(&self, hook: Arc<dyn RemountHook>) {
        *self.inner.remount_hook.lock() = Some(hook);
    }

    /// Segments this client has mounted and not unmounted.
    pub fn mounted_segments(&self) -> Vec<Segment> {
        self.inner.segments.lock().clone()
    }

    /// Stops the heartbeat and closes the connection.
    pub async fn close(&self) {
        if let Some(task) = self.inner.heartbeat.lock().take() {
            task.abort();
        }
        if let Some(task) = self.inner.hook_task.lock().take() {
            task.abort();
        }
        if let Some(conn) = self.inner.conn.lock().await.take() {
            conn.close();
        }
    }

    fn start_heartbeat(&self) {
        let mut slot = self.inner.heartbeat.lock();
        if slot.is_none() {
            let weak = Arc::downgrade(&self.inner);
            *slot = Some(tokio::spawn(heartbeat::run(
                weak,
                self.inner.config.ping_interval,
            )));
        }
    }
}

/// Removes a pending entry when its caller stops waiting (deadline or cancellation).
struct ForgetOnDrop<'a> {
    conn: &'a Connection,
    request_id: u64,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.conn.forget(self.request_id);
    }
}

macro_rules! typed_helpers {
    ($($code:literal => $name:ident($req:ty) -> $resp:ty, $method:ident;)*) => {
        /// One typed method per RPC of the protocol table, named after the operation.
        impl MasterClient {
            $(
                #[doc = concat!("Calls `", stringify!($name), "` (opcode ", stringify!($code), ").")]
                pub async fn $method(&self, request: $req) -> Result<$resp> {
                    self.call(Request::$name(request)).await
                }
            )*
        }
    };
}

moonkv_proto::for_each_op!(typed_helpers);

#[cfg(test)]
mod tests;
