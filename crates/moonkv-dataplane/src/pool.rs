//! A bounded pool of data-plane connections per node endpoint.
//!
//! At most `cap` connections to one endpoint exist at a time, checked out or idle: a caller
//! beyond the cap waits for a connection to come back instead of dialling another, so a batch of
//! a thousand keys costs a handful of sockets, not a thousand. Connections are reused across
//! calls and batches until one fails. A connection whose write timed out is fenced (see
//! [`DataConnection::fence`]) and stops counting against the cap while it settles.

use crate::connection::DataConnection;
use crate::stream::TlsConnector;
use moonkv_proto::auth::Secret;
use moonkv_proto::{ErrorCode, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Connections per node endpoint when nothing else is configured.
pub const DEFAULT_CONNECTIONS_PER_NODE: usize = 4;

/// Counters of one pool (exported by the store as metrics).
#[derive(Debug, Default)]
pub struct PoolCounters {
    opened: AtomicU64,
    open: AtomicU64,
    waited: AtomicU64,
    attached: AtomicU64,
    local: AtomicU64,
}

/// A point-in-time copy of [`PoolCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections dialled since the pool was made.
    pub opened: u64,
    /// Connections open now (checked out, idle or settling).
    pub open: u64,
    /// Checkouts that had to wait because an endpoint was at its cap.
    pub waited: u64,
    /// Connections dialled whose node copies straight to and from this process (same host).
    pub attached: u64,
    /// Connections dialled over a node's local socket instead of TCP (same host).
    pub local: u64,
}

impl PoolCounters {
    fn snapshot(&self) -> PoolStats {
        PoolStats {
            opened: self.opened.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            attached: self.attached.load(Ordering::Relaxed),
            local: self.local.load(Ordering::Relaxed),
        }
    }
}

/// Decrements the open count when its connection is dropped.
#[derive(Debug)]
pub(crate) struct OpenGuard(Arc<PoolCounters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connections of one endpoint.
struct Endpoint {
    idle: Mutex<Vec<DataConnection>>,
    slots: Arc<Semaphore>,
    /// The last connection dialled here was attached for same-host copies.
    attached: std::sync::atomic::AtomicBool,
    /// The last dial here failed to connect (refused or timed out) and none has succeeded
    /// since: the node is unreachable from this process.
    unreachable: std::sync::atomic::AtomicBool,
    /// What this process knows of the node's local socket.
    local: Mutex<LocalSocket>,
}

/// What a pool knows of a node's local socket (`docs/data-plane.md`, *The local socket*).
#[derive(Clone, Debug, Default)]
enum LocalSocket {
    /// Not asked yet, or the socket it named refused a connection: the next dial over TCP
    /// asks the node's STATS.
    #[default]
    Unknown,
    /// The node offers none (another machine, TLS, same-host copies off, an older node).
    None,
    /// The name the node's STATS gave.
    Named(String),
}

/// Connections to every node a store talks to, at most `cap` per node.
pub struct ConnectionPool {
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    cap: usize,
    connect_timeout: Duration,
    secret: Option<Secret>,
    tls: Option<TlsConnector>,
    same_host: bool,
    counters: Arc<PoolCounters>,
}

impl ConnectionPool {
    /// A pool of at most `cap` connections per node (at least 1); new connections authenticate
    /// with `secret` when one is given.
    pub fn new(cap: usize, connect_timeout: Duration, secret: Option<Secret>) -> Self {
        Self {
            endpoints: Mutex::default(),
            cap: cap.max(1),
            connect_timeout,
            secret,
            tls: None,
            same_host: false,
            counters: Arc::default(),
        }
    }

    /// New connections to nodes on this machine ask for same-host copies
    /// ([`DataConnection::attach`]).
    pub fn with_same_host(mut self, same_host: bool) -> Self {
        self.same_host = same_host;
        self
    }

    /// New connections use TLS with these settings.
    pub fn with_tls(mut self, tls: Option<TlsConnector>) -> Self {
        self.tls = tls;
        self
    }

    /// Connections allowed per node.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether the node at `endpoint` copies straight to and from this process (its last
    /// connection was attached for same-host copies).
    pub fn same_host(&self, endpoint: &str) -> bool {
        self.endpoints
            .lock()
            .get(endpoint)
            .is_some_and(|e| e.attached.load(Ordering::Relaxed))
    }

    /// Connections opened, open now, and checkouts that waited.
    pub fn stats(&self) -> PoolStats {
        self.counters.snapshot()
    }

    fn endpoint(&self, endpoint: &str) -> Arc<Endpoint> {
        self.endpoints
            .lock()
            .entry(endpoint.to_string())
            .or_insert_with(|| {
                Arc::new(Endpoint {
                    idle: Mutex::default(),
                    slots: Arc::new(Semaphore::new(self.cap)),
                    attached: Default::default(),
                    unreachable: Default::default(),
                    local: Default::default(),
                })
            })
            .clone()
    }

    /// A connection to `endpoint` (`true`: reused from the idle list), waiting while the
    /// endpoint is at its cap.
    pub async fn checkout(&self, endpoint: &str) -> Result<(DataConnection, bool)> {
        let entry = self.endpoint(endpoint);
        let slot = match entry.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                self.counters.waited.fetch_add(1, Ordering::Relaxed);
                entry
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("pool semaphores are never closed")
            }
        };
        let idle = entry.idle.lock().pop();
        let (mut conn, reused) = match idle {
            Some(conn) => (conn, true),
            None => (self.dial(endpoint).await?, false),
        };
        conn.permit = Some(slot);
        Ok((conn, reused))
    }

    /// Replaces `conn` (which failed) by a new connection to the same endpoint in the same slot.
    pub async fn redial(&self, conn: &mut DataConnection) -> Result<()> {
        self.forget(conn.endpoint());
        let mut fresh = self.dial(conn.endpoint()).await?;
        fresh.permit = conn.permit.take();
        *conn = fresh;
        Ok(())
    }

    /// Whether the last attempt to connect to `endpoint` failed (refused, or no answer within
    /// the connect timeout) with no successful connection since.
    pub fn unreachable(&self, endpoint: &str) -> bool {
        self.endpoints
            .lock()
            .get(endpoint)
            .is_some_and(|e| e.unreachable.load(Ordering::Relaxed))
    }

    /// Dials `endpoint` once, outside its cap, and reports whether it answered; a failure to
    /// connect marks it [`ConnectionPool::unreachable`]. For telling a node that is gone from a
    /// transfer that failed for another reason; the probe connection is closed again.
    pub async fn probe(&self, endpoint: &str) -> bool {
        self.dial(endpoint).await.is_ok()
    }

    /// Opens a connection to `endpoint`. A pool that asks for same-host copies goes to a node
    /// on this machine through the node's local socket once it knows its name, learning it from
    /// the node's STATS over the first TCP connection; the connection is then attached.
    async fn dial(&self, endpoint: &str) -> Result<DataConnection> {
        let entry = self.endpoint(endpoint);
        let same_host = self.same_host && self.tls.is_none();
        let mut conn = None;
        if same_host {
            let known = entry.local.lock().clone();
            if let LocalSocket::Named(name) = known {
                conn = self.dial_local(&entry, endpoint, &name).await;
            }
        }
        let mut conn = match conn {
            Some(conn) => conn,
            None => {
                let dialled = DataConnection::connect_with_tls(
                    endpoint,
                    self.connect_timeout,
                    self.secret.as_ref(),
                    self.tls.as_ref(),
                )
                .await;
                // TLS and authentication refusals are not a node that is gone.
                let down = matches!(&dialled, Err(e) if e.code == ErrorCode::TRANSFER_FAIL);
                entry.unreachable.store(down, Ordering::Relaxed);
                let conn = dialled?;
                let unknown = matches!(*entry.local.lock(), LocalSocket::Unknown);
                if same_host && unknown && conn.on_loopback() {
                    self.learn_local(&entry, endpoint, conn).await?
                } else {
                    conn
                }
            }
        };
        if same_host {
            let attached = conn.attach(self.connect_timeout).await?;
            if attached {
                self.counters.attached.fetch_add(1, Ordering::Relaxed);
            }
            entry.attached.store(attached, Ordering::Relaxed);
        }
        if conn.is_local() {
            self.counters.local.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        conn._open = Some(OpenGuard(self.counters.clone()));
        Ok(conn)
    }

    /// Asks the node at the other end of `tcp` (on this machine) for its local socket and,
    /// when it has one, returns a connection to it in place of `tcp`.
    async fn learn_local(
        &self,
        entry: &Endpoint,
        endpoint: &str,
        mut tcp: DataConnection,
    ) -> Result<DataConnection> {
        let stats = tokio::time::timeout(self.connect_timeout, tcp.stats())
            .await
            .map_err(|_| {
                crate::connection::transfer_fail(endpoint, "STATS: no answer in time")
            })??;
        let Some(name) = stats
            .local_socket
            .filter(|name| crate::stream::is_local_name(name))
        else {
            *entry.local.lock() = LocalSocket::None;
            return Ok(tcp);
        };
        *entry.local.lock() = LocalSocket::Named(name.clone());
        Ok(self.dial_local(entry, endpoint, &name).await.unwrap_or(tcp))
    }

    /// A connection to the node's local socket `name`, or `None` (the pool then asks again
    /// over TCP at its next dial) when it cannot be opened.
    async fn dial_local(
        &self,
        entry: &Endpoint,
        endpoint: &str,
        name: &str,
    ) -> Option<DataConnection> {
        let dialled = DataConnection::connect_local(
            endpoint,
            name,
            self.connect_timeout,
            self.secret.as_ref(),
        )
        .await;
        match dialled {
            Ok(conn) => {
                entry.unreachable.store(false, Ordering::Relaxed);
                Some(conn)
            }
            Err(e) => {
                tracing::debug!(endpoint, name, error = %e, "node's local socket refused; over TCP");
                *entry.local.lock() = LocalSocket::Unknown;
                None
            }
        }
    }

    /// Returns a connection for reuse if it is still in step; frees its slot either way.
    pub fn checkin(&self, mut conn: DataConnection) {
        let slot = conn.permit.take();
        if conn.healthy {
            self.endpoint(conn.endpoint()).idle.lock().push(conn);
        }
        // The slot is freed only after the connection is idle, so a waiter finds it there.
        drop(slot);
    }

    /// Drops every idle connection to `endpoint` (after a failure there).
    pub fn forget(&self, endpoint: &str) {
        if let Some(entry) = self.endpoints.lock().get(endpoint) {
            entry.idle.lock().clear();
        }
    }
}
