//! The store API: put, get, upsert, exists, remove and their batch forms, for one tenant.
//!
//! Put: PutStart → write every replica in parallel over the data plane (or by direct copy when
//! the replica's segment is served by this process) → PutEnd with the replica ids; on any
//! failure PutRevoke with those ids and the error is reported.
//!
//! Get: GetReplicaList → read one replica, falling over to the next when a transfer fails → if
//! the read lease (measured from before the GetReplicaList call) expired meanwhile, ask the
//! master with RevalidateReplicas whether the replica read is still current; if not, fail with
//! `LEASE_EXPIRED`. Bytes from a replaced replica are never returned.

mod batch;
mod caller;
mod failover;
mod get_local;
mod get_whole;
mod in_flight;
mod lanes;
mod node_call;
mod parts;
mod put_local;
mod put_whole;
mod session;
mod standalone;
pub(crate) mod transfer;

pub(crate) use in_flight::{InFlight, RevokeIfCancelled};

use crate::master_client::{MasterClient, MasterClientConfig};
use crate::util::check_key;
use moonkv_dataplane::FileMeta;
use moonkv_proto::msg::*;
use moonkv_proto::types::*;
use moonkv_proto::{ClientId, Error, ErrorCode, ReplicaId, Result, TenantId};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer::{Transfer, TransferConfig};

pub use caller::{CallerLane, CallerLanes};
pub use session::{RangeRead, RangeWrite};
pub use standalone::master_of_node;

/// How a [`Store`] connects and moves bytes.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Master RPC address, `host:port`.
    pub master_addr: String,
    /// Tenant every operation of this store acts in ("" = `default`).
    pub tenant: String,
    /// Deadline of one master request.
    pub rpc_timeout: Duration,
    /// Deadline of one connection attempt (master or node).
    pub connect_timeout: Duration,
    /// Deadline of one data-plane chunk.
    pub transfer_timeout: Duration,
    /// Data-plane connections one transfer spreads its ranges over, per node (at most
    /// `connections_per_node`).
    pub transfer_connections: usize,
    /// Most data-plane connections this store holds to one node; transfers beyond it wait for a
    /// connection instead of opening another.
    pub connections_per_node: usize,
    /// Bytes per data-plane request; larger objects are split.
    pub chunk_size: usize,
    /// Segments of nodes embedded in this process: replicas in them are copied directly, not
    /// over the network (`NodeHandle::local_segments`); `None` = always the network.
    pub local_segments: Option<moonkv_dataplane::LocalSegments>,
    /// Writer identity; random when `None`.
    pub client_id: Option<ClientId>,
    /// Counter of bytes moved by data-plane transfers (chunks as they complete), for
    /// progress displays; `None` = not counted.
    pub progress: Option<Arc<AtomicU64>>,
    /// Shared secret proven to the master and to nodes when they ask
    /// (`MOONKV_AUTH_SECRET[_FILE]` by default).
    pub auth_secret: Option<moonkv_proto::auth::Secret>,
    /// Connect to the master and to nodes over TLS, verifying them against this CA
    /// (`MOONKV_TLS_CA_FILE` by default); `None` = plain TCP.
    pub tls: Option<moonkv_dataplane::stream::TlsClientConfig>,
    /// Ask nodes on this machine to copy bytes straight to and from this process's memory
    /// (`docs/data-plane.md`, *Same-host copies*); on unless `MOONKV_SAME_HOST=0`. Never over
    /// TLS.
    pub same_host: bool,
    /// A node on this machine that takes whole puts (`docs/data-plane.md`, *Puts through the
    /// node*): set by [`Store::connect_via_node`] when the node says it does.
    pub put_local_node: Option<String>,
    /// A node on this machine that takes whole gets (`docs/data-plane.md`, *Gets through the
    /// node*): set by [`Store::connect_via_node`] when the node says it does.
    pub get_local_node: Option<String>,
    /// Hand puts whole to the node this store's writes land on, once they all land on one
    /// (`docs/data-plane.md`, *Callers given the master*); on by default. Off: every put not
    /// sent to [`StoreConfig::put_local_node`] takes the three requests.
    pub hand_puts_to_node: bool,
}

/// Most keys one request through the node carries (the node's limit); larger calls take the
/// usual path.
pub(crate) const MAX_KEYS_THROUGH_NODE: usize = 4096;

impl StoreConfig {
    /// Defaults: tenant `default`, 5 s requests, 10 s per chunk, 4 connections, 512 KiB chunks
    /// (small enough that a 1–4 MiB object already uses several connections at once;
    /// `docs/benchmarks.md` has the measurement).
    pub fn new(master_addr: impl Into<String>) -> Self {
        Self {
            master_addr: master_addr.into(),
            tenant: String::new(),
            rpc_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            transfer_timeout: Duration::from_secs(10),
            transfer_connections: 4,
            connections_per_node: moonkv_dataplane::DEFAULT_CONNECTIONS_PER_NODE,
            chunk_size: 512 << 10,
            local_segments: None,
            client_id: None,
            progress: None,
            auth_secret: crate::util::secret_from_env(),
            tls: moonkv_dataplane::stream::TlsClientConfig::from_env(),
            same_host: moonkv_dataplane::same_host::enabled_by_env().unwrap_or(true),
            put_local_node: None,
            get_local_node: None,
            hand_puts_to_node: true,
        }
    }
}

/// Tells a missing object apart from a failure.
pub trait ErrorExt {
    /// True when the error means "no such object" (`OBJECT_NOT_FOUND`).
    fn is_not_found(&self) -> bool;
}

impl ErrorExt for Error {
    fn is_not_found(&self) -> bool {
        self.code == ErrorCode::OBJECT_NOT_FOUND
    }
}

/// One object as listed by [`Store::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Object key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Readable replicas.
    pub replicas: Vec<ReplicaDescriptor>,
}

/// A handle on the store for one tenant; cheap to clone, clones share connections.
#[derive(Clone)]
pub struct Store {
    master: MasterClient,
    transfer: Arc<Transfer>,
    tenant: String,
    /// What it was built from, for [`Store::sibling`].
    config: Arc<StoreConfig>,
    /// The node its puts are handed to whole, once it has one (shared with its siblings).
    whole: Arc<put_whole::WholeRoute>,
}

/// Which two-phase write a call performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Put,
    Upsert,
}

impl Store {
    /// Connects to the master and returns a store for `config.tenant`.
    pub async fn connect(config: StoreConfig) -> Result<Store> {
        let store = Store::lazy(config)?;
        store.master.connect_now().await?;
        Ok(store)
    }

    /// Builds a store that connects to the master on its first call.
    fn lazy(config: StoreConfig) -> Result<Store> {
        let whole = Arc::new(put_whole::WholeRoute::for_config(&config));
        Self::lazy_sharing(config, Arc::default(), whole)
    }

    /// [`Store::lazy`], listing its started writes in `in_flight` (shared with the stores it
    /// is a sibling of, so closing any of them revokes them all).
    fn lazy_sharing(
        config: StoreConfig,
        in_flight: Arc<InFlight>,
        whole: Arc<put_whole::WholeRoute>,
    ) -> Result<Store> {
        let tenant = checked_tenant(&config.tenant)?;
        moonkv_dataplane::same_host::enabled_by_env()
            .map_err(|why| Error::new(ErrorCode::INVALID_PARAMS, why.to_string()))?;
        let mut master_config = MasterClientConfig::new(config.master_addr.clone());
        if let Some(id) = config.client_id {
            master_config.client_id = id;
        }
        master_config.rpc_timeout = config.rpc_timeout;
        master_config.connect_timeout = config.connect_timeout;
        master_config.auth_secret = config.auth_secret.clone();
        master_config.tls = config.tls.clone();
        // A caller standing for one on another host (same-host copies off) keeps to TCP.
        master_config.local_socket = config.same_host;
        let tls = moonkv_dataplane::stream::TlsConnector::load_if_set(config.tls.as_ref())
            .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, format!("TLS settings: {e}")))?;
        let master = MasterClient::lazy(master_config);
        let transfer = Transfer::new(TransferConfig {
            chunk_size: config.chunk_size,
            lanes: config.transfer_connections,
            connections_per_node: config.connections_per_node,
            timeout: config.transfer_timeout,
            connect_timeout: config.connect_timeout,
            local: config.local_segments.clone(),
            progress: config.progress.clone(),
            secret: config.auth_secret.clone(),
            same_host: config.same_host,
            in_flight,
        })
        .with_tls(tls);
        Ok(Store {
            master,
            transfer: Arc::new(transfer),
            tenant,
            config: Arc::new(config),
            whole,
        })
    }

    /// A store with the same settings, writer identity and tenant but connections of its own,
    /// opened on first use in whichever runtime first uses them (see [`CallerLanes`]).
    pub fn sibling(&self) -> Result<Store> {
        let mut config = (*self.config).clone();
        config.client_id = Some(self.master.client_id());
        let mut store =
            Store::lazy_sharing(config, self.transfer.in_flight.clone(), self.whole.clone())?;
        store.tenant = self.tenant.clone();
        Ok(store)
    }

    /// Background tasks this store (and its clones) still runs after a call returned: revokes
    /// waiting for an abandoned write to settle.
    pub fn background_tasks(&self) -> usize {
        self.transfer.background_tasks()
    }

    /// Whether a call of this store (or a clone) now waits for a long same-host copy; its
    /// waiting thread then sleeps instead of polling (see `CallerLane::block_on`).
    pub(crate) fn waits_quietly(&self) -> bool {
        self.transfer.waits_quietly()
    }

    /// The same store acting in another tenant (shares connections).
    pub fn with_tenant(&self, tenant: &str) -> Result<Store> {
        Ok(Store {
            tenant: checked_tenant(tenant)?,
            ..self.clone()
        })
    }

    /// Tenant this store acts in ("" means `default`).
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The underlying master client.
    pub fn master(&self) -> &MasterClient {
        &self.master
    }

    /// Data-plane connections this store (and its clones) opened, and holds now.
    pub fn data_plane_stats(&self) -> moonkv_dataplane::PoolStats {
        self.transfer.pool_stats()
    }

    /// Stores `value` under `key`. An existing key is left untouched and reported as
    /// `OBJECT_ALREADY_EXISTS` (first writer wins; use [`Store::upsert`] to replace).
    pub async fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write_object(WriteKind::Put, key, value, config).await
    }

    /// Same as [`Store::put`]; the bytes go from `value` to the sockets (or the in-process
    /// segment) without an intermediate copy. Kept under the name integrations know.
    pub async fn put_from(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write_object(WriteKind::Put, key, value, config).await
    }

    /// Like [`Store::put`] (or [`Store::upsert`] with `upsert`), returning how many memory
    /// replicas were made; with `all_replicas` a write that cannot get every memory replica
    /// asked for (`config.replica_num`) is revoked and fails with `NO_AVAILABLE_HANDLE`, so it
    /// is all or nothing.
    pub async fn put_counted(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
        upsert: bool,
        all_replicas: bool,
    ) -> Result<usize> {
        let kind = if upsert {
            WriteKind::Upsert
        } else {
            WriteKind::Put
        };
        let need = all_replicas.then_some(config.replica_num.max(1) as usize);
        self.write_counted(kind, key, value, config, need).await
    }

    /// Stores `value` under `key`, replacing any current value.
    pub async fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write_object(WriteKind::Upsert, key, value, config)
            .await
    }

    /// Reads the whole object. A missing key fails with `OBJECT_NOT_FOUND`
    /// (see [`ErrorExt::is_not_found`]).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        check_key(key)?;
        let mut sinks = [get_whole::Sink::Fresh(None)];
        let (started, list) = match self.get_whole(&[key], &mut sinks).await {
            Some((started, mut took)) => match (took.pop(), sinks) {
                (Some(get_whole::Took::Read(_)), [get_whole::Sink::Fresh(Some(buf))]) => {
                    return Ok(buf)
                }
                (Some(get_whole::Took::Failed(e)), _) => return Err(self.about(key, e)),
                (Some(get_whole::Took::Listed(list)), _) => (started, list),
                _ => self.listed(key).await?,
            },
            None => self.listed(key).await?,
        };
        let size = object_size(key, &list)?;
        let mut buf = zeroed(size)?;
        self.read_object(key, &list, started, &mut buf).await?;
        Ok(buf)
    }

    /// Reads the object into `buf` and returns its size; `buf` must be at least that large.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        check_key(key)?;
        let answer = self.get_through_node(&[key], &[vec![&mut *buf]]).await;
        if let Some(Some(answer)) = answer.and_then(|a| a.into_iter().next()) {
            return answer.map_err(|e| self.about(key, e));
        }
        let mut listed = None;
        {
            let mut sinks = [get_whole::Sink::Parts(vec![&mut *buf])];
            if let Some((started, mut took)) = self.get_whole(&[key], &mut sinks).await {
                match took.pop() {
                    Some(get_whole::Took::Read(size)) => return Ok(size),
                    Some(get_whole::Took::Failed(e)) => return Err(self.about(key, e)),
                    Some(get_whole::Took::Listed(list)) => listed = Some((started, list)),
                    None => {}
                }
            }
        }
        let (started, list) = match listed {
            Some(listed) => listed,
            None => self.listed(key).await?,
        };
        let size = object_size(key, &list)?;
        let target = buffer_for(key, buf, size)?;
        self.read_object(key, &list, started, target).await?;
        Ok(size)
    }

    /// The key's replica list from the master, and when it was asked for; a store that has
    /// not learnt where its writes land yet learns it from the reads too.
    async fn listed(&self, key: &str) -> Result<(Instant, GetReplicaListResponse)> {
        let started = Instant::now();
        let list = self
            .master
            .get_replica_list(self.key_request(key))
            .await
            .map_err(|e| self.about(key, e))?;
        self.whole.note([list.replicas.as_slice()]);
        Ok((started, list))
    }

    /// Whether the object exists (and is readable).
    pub async fn exists(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.master
            .exist_key(self.key_request(key))
            .await
            .map_err(|e| self.about(key, e))
    }

    /// The object's readable replicas and lease, as the master reports them.
    pub async fn replicas(&self, key: &str) -> Result<GetReplicaListResponse> {
        check_key(key)?;
        self.master
            .get_replica_list(self.key_request(key))
            .await
            .map_err(|e| self.about(key, e))
    }

    /// Removes the object; `force` ignores read leases.
    pub async fn remove(&self, key: &str, force: bool) -> Result<()> {
        check_key(key)?;
        let request = RemoveRequest {
            tenant: self.tenant.clone(),
            key: key.to_string(),
            force,
        };
        self.master
            .remove(request)
            .await
            .map_err(|e| self.about(key, e))
    }

    /// Removes every object whose key matches `regex` (search semantics); returns how many.
    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<i64> {
        let request = RemoveByRegexRequest {
            tenant: self.tenant.clone(),
            regex: regex.to_string(),
            force,
        };
        self.master.remove_by_regex(request).await
    }

    /// Removes every object of this tenant; returns how many.
    pub async fn remove_all(&self, force: bool) -> Result<i64> {
        self.master
            .remove_all(RemoveAllRequest {
                tenant: self.tenant.clone(),
                force,
            })
            .await
    }

    /// Objects whose key matches `regex` (search semantics; `""` matches all), sorted by key.
    pub async fn list(&self, regex: &str) -> Result<Vec<ObjectInfo>> {
        let request = RegexRequest {
            tenant: self.tenant.clone(),
            regex: regex.to_string(),
        };
        let mut found: Vec<ObjectInfo> = self
            .master
            .get_replica_list_by_regex(request)
            .await?
            .into_iter()
            .map(|(key, replicas)| ObjectInfo {
                size: replicas.first().map_or(0, |r| r.size),
                key,
                replicas,
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    /// Adds the key and tenant to a master error, so the message says what it is about.
    fn about(&self, key: &str, e: Error) -> Error {
        let tenant = if self.tenant.is_empty() {
            TenantId::DEFAULT
        } else {
            &self.tenant
        };
        Error::new(
            e.code,
            format!("{} (key '{key}', tenant '{tenant}')", e.message),
        )
    }

    fn key_request(&self, key: &str) -> KeyRequest {
        KeyRequest {
            tenant: self.tenant.clone(),
            key: key.to_string(),
        }
    }

    pub(crate) async fn write_object(
        &self,
        kind: WriteKind,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<()> {
        if check_key(key).is_ok() && check_value(value).is_ok() {
            let answers = if self.config.put_local_node.is_some() {
                self.put_through_node(kind, &[key], &[&[value]], config)
                    .await
            } else {
                self.put_whole(kind, &[key], &[&[value]], config).await
            };
            match answers.and_then(|mut a| a.pop()) {
                // The node's start is a batch start, which answers at once when there is no
                // room; the usual single start waits for space, so such a put goes that way.
                Some(Some(Err(e))) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {}
                Some(Some(result)) => return result,
                _ => {}
            }
        }
        self.write_counted(kind, key, value, config, None)
            .await
            .map(drop)
    }

    /// The two-phase write; returns the number of memory replicas made. With `need`, fewer
    /// memory replicas than that revoke the write before any byte moves. A write that failed
    /// because a target node could not be reached was revoked; it is placed again (the master
    /// was told, so it avoids that node) while the failover window lasts.
    async fn write_counted(
        &self,
        kind: WriteKind,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
        need: Option<usize>,
    ) -> Result<usize> {
        check_key(key)?;
        check_value(value)?;
        let mut window = failover::Window::start(self);
        let mut last: Option<Error> = None;
        loop {
            match self.write_once(kind, key, value, config, need).await {
                Ok(made) => return Ok(made),
                Err(failed) => {
                    let failed = failover::keep_first_cause(failed, last.take());
                    match failed.retry {
                        Some(down) if window.allows_another() => {
                            self.report_unreachable(down).await;
                            tracing::debug!(%key, error = %failed.error, "a target node is unreachable; placing the write again");
                            last = Some(failed.error);
                        }
                        _ => return Err(failed.error),
                    }
                }
            }
        }
    }

    /// One attempt of [`Store::write_counted`].
    async fn write_once(
        &self,
        kind: WriteKind,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
        need: Option<usize>,
    ) -> std::result::Result<usize, failover::Failed> {
        let start = PutStartRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            key: key.to_string(),
            size: value.len() as u64,
            config: config.clone(),
        };
        let replicas: Vec<ReplicaDescriptor> = self
            .master
            .call(kind.start(start))
            .await
            .map_err(|e| failover::Failed::from(self.about(key, e)))?;
        self.whole.note([replicas.as_slice()]);
        let ids: Vec<ReplicaId> = replicas.iter().map(|r| r.id).collect();
        let in_memory = replicas
            .iter()
            .filter(|r| r.kind == ReplicaKind::Memory)
            .count();
        if let Some(need) = need.filter(|need| in_memory < *need) {
            self.revoke(kind, key, ids).await;
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!(
                    "only {in_memory} of the {need} memory replicas asked for could be placed for '{key}'; nothing was stored"
                ),
            )
            .into());
        }
        crate::failpoints::hit(crate::failpoints::AFTER_PUT_START);
        // Dropped before the write ends (a caller's timeout, `select!`), the guard revokes it.
        let mut cancelled = RevokeIfCancelled::new(self, kind, [(key.to_string(), ids.clone())]);
        let quiet = self
            .transfer
            .quiet_write([(replicas.as_slice(), value.len())]);
        let written = self.write_replicas(key, &replicas, value).await;
        let write_failed = written.is_err();
        let result = match written {
            Ok(()) => {
                let end = EndRequest {
                    client_id: self.master.client_id(),
                    tenant: self.tenant.clone(),
                    key: key.to_string(),
                    replica_type: ReplicaType::All,
                    replica_ids: ids.clone(),
                    checksum: None,
                };
                self.master
                    .call::<()>(kind.end(end))
                    .await
                    .map_err(|e| self.about(key, e))
            }
            Err(e) => Err(e),
        };
        drop(quiet);
        // From here the call revokes by itself if it must; a cancellation during that revoke
        // leaves the write to the master's discard and release timeouts.
        cancelled.disarm();
        match result {
            Ok(()) => Ok(in_memory),
            Err(error) => {
                // Revoke carries our own ids, so it can only ever abandon this write's replicas;
                // if the End did land, the master refuses the revoke and the object stays.
                let revoked = self.revoke(kind, key, ids).await;
                tracing::debug!(%key, %error, "write failed and was revoked");
                // Placed again only when the key is free again (the revoke went through) and a
                // node of this placement does not answer.
                let mut retry = None;
                if write_failed && revoked {
                    let down = self
                        .unreachable_endpoints(&replicas, &error, &mut Default::default())
                        .await;
                    retry = (!down.is_empty()).then_some(down);
                }
                Err(failover::Failed { error, retry })
            }
        }
    }

    /// Revokes this write's replicas at once, so the key is free again as the error returns.
    /// When a transfer into them timed out or was cancelled, a node may still apply its bytes:
    /// the revoke then says so (`unsettled`), the master parks their space instead of reusing
    /// it, and the space is released ([`Store::release_when_settled`]) once the abandoned
    /// connections are settled. Returns whether the master accepted the revoke.
    async fn revoke(&self, kind: WriteKind, key: &str, replica_ids: Vec<ReplicaId>) -> bool {
        self.revoke_marked(kind, key, replica_ids, false).await
    }

    /// [`Store::revoke`], marked unsettled whatever the transfer layer knows when `cancelled`
    /// (a dropped call cannot tell whether its abandoned transfer still reaches a node).
    async fn revoke_marked(
        &self,
        kind: WriteKind,
        key: &str,
        replica_ids: Vec<ReplicaId>,
        cancelled: bool,
    ) -> bool {
        let settled = self.transfer.unsettled(&replica_ids);
        let revoke = RevokeRequest {
            client_id: self.master.client_id(),
            tenant: self.tenant.clone(),
            key: key.to_string(),
            replica_type: ReplicaType::All,
            replica_ids: replica_ids.clone(),
            unsettled: cancelled || settled.is_some(),
        };
        let revoked = match self.master.call::<()>(kind.revoke(revoke)).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%key, error = %e, "revoke after a failed write did not go through; the master reclaims the space later");
                false
            }
        };
        if let (true, Some(settled)) = (revoked, settled) {
            self.release_when_settled(settled, replica_ids);
        }
        revoked
    }

    /// Once `settled` says no node can still write into `replica_ids` (their connections
    /// answered or closed), tells the master to free their parked space now rather than at
    /// `put_start_release_timeout`.
    pub(crate) fn release_when_settled(
        &self,
        settled: impl std::future::Future<Output = bool> + Send + 'static,
        replica_ids: Vec<ReplicaId>,
    ) {
        let store = self.clone();
        self.transfer.spawn_background(async move {
            if !settled.await {
                tracing::warn!(
                    replicas = replica_ids.len(),
                    "a timed-out write never settled; the master frees its parked space after put_start_release_timeout"
                );
                return;
            }
            let release = moonkv_proto::msg::ReleaseParkedRequest {
                client_id: store.master.client_id(),
                replica_ids,
            };
            if let Err(e) = store
                .master
                .call::<u32>(Request::ReleaseParked(release))
                .await
            {
                tracing::debug!(error = %e, "ReleaseParked did not go through; the master frees the space at its timeout");
            }
        });
    }

    /// Writes every replica in parallel; the first failure is reported.
    pub(crate) async fn write_replicas(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        value: &[u8],
    ) -> Result<()> {
        if replicas.is_empty() {
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!("the master allocated no replica for '{key}'"),
            ));
        }
        self.transfer
            .write_replicas(replicas, self.file_meta(key), value)
            .await
    }

    /// What a disk file records about the object it holds.
    pub(crate) fn file_meta(&self, key: &str) -> FileMeta {
        FileMeta {
            tenant: TenantId::normalized(&self.tenant).0,
            key: key.to_string(),
        }
    }

    async fn read_object(
        &self,
        key: &str,
        list: &GetReplicaListResponse,
        started: Instant,
        buf: &mut [u8],
    ) -> Result<()> {
        let replica = self.read_any_replica(key, &list.replicas, buf).await?;
        if !lease_expired(started, list.lease_ttl_ms) {
            return Ok(());
        }
        let item = RevalidateItem {
            key: key.to_string(),
            replica_ids: vec![replica],
        };
        self.revalidate(vec![item])
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(lease_error(key, "no answer")))
    }

    /// Complete replicas in the order reads try them: in-process ones first, then memory
    /// before disk, otherwise in master order.
    pub(crate) fn read_order<'r>(
        &self,
        replicas: &'r [ReplicaDescriptor],
    ) -> Vec<&'r ReplicaDescriptor> {
        let mut order: Vec<&ReplicaDescriptor> = replicas
            .iter()
            .filter(|r| r.status == ReplicaStatus::Complete)
            .collect();
        order.sort_by_key(|r| (!self.transfer.is_local(r), r.kind == ReplicaKind::LocalDisk));
        order
    }

    /// Reads from the first replica that works, in [`Store::read_order`].
    pub(crate) async fn read_any_replica(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        buf: &mut [u8],
    ) -> Result<ReplicaId> {
        let order = self.read_order(replicas);
        if order.is_empty() {
            return Err(no_complete_replica(key));
        }
        let mut failures = Vec::new();
        for replica in order {
            match self.transfer.read(replica, buf).await {
                Ok(()) => return Ok(replica.id),
                Err(e) => {
                    tracing::debug!(%key, replica = %replica.id, endpoint = %replica.endpoint, error = %e, "replica read failed");
                    failures.push(e);
                }
            }
        }
        Err(combine_failures(key, failures))
    }

    /// Asks the master whether the replicas read are still current; one result per item.
    pub(crate) async fn revalidate(&self, items: Vec<RevalidateItem>) -> Vec<Result<()>> {
        let keys: Vec<String> = items.iter().map(|i| i.key.clone()).collect();
        let request = RevalidateRequest {
            tenant: self.tenant.clone(),
            items,
        };
        match self.master.revalidate_replicas(request).await {
            Ok(answers) if answers.len() == keys.len() => answers
                .into_iter()
                .zip(&keys)
                .map(|(answer, key)| answer.0.map_err(|e| lease_error(key, &e.to_string())))
                .collect(),
            Ok(_) => keys
                .iter()
                .map(|k| {
                    Err(lease_error(
                        k,
                        "the master answered for a different key count",
                    ))
                })
                .collect(),
            Err(e) => keys
                .iter()
                .map(|k| Err(lease_error(k, &format!("revalidation failed: {e}"))))
                .collect(),
        }
    }
}

impl WriteKind {
    fn batch_start(self, r: BatchPutStartRequest) -> Request {
        match self {
            WriteKind::Put => Request::BatchPutStart(r),
            WriteKind::Upsert => Request::BatchUpsertStart(r),
        }
    }

    fn batch_end(self, r: BatchEndRequest) -> Request {
        match self {
            WriteKind::Put => Request::BatchPutEnd(r),
            WriteKind::Upsert => Request::BatchUpsertEnd(r),
        }
    }

    fn batch_revoke(self, r: BatchRevokeRequest) -> Request {
        match self {
            WriteKind::Put => Request::BatchPutRevoke(r),
            WriteKind::Upsert => Request::BatchUpsertRevoke(r),
        }
    }

    fn start(self, r: PutStartRequest) -> Request {
        match self {
            WriteKind::Put => Request::PutStart(r),
            WriteKind::Upsert => Request::UpsertStart(r),
        }
    }

    fn end(self, r: EndRequest) -> Request {
        match self {
            WriteKind::Put => Request::PutEnd(r),
            WriteKind::Upsert => Request::UpsertEnd(r),
        }
    }

    fn revoke(self, r: RevokeRequest) -> Request {
        match self {
            WriteKind::Put => Request::PutRevoke(r),
            WriteKind::Upsert => Request::UpsertRevoke(r),
        }
    }
}

fn checked_tenant(tenant: &str) -> Result<String> {
    if !tenant.is_empty() && !TenantId(tenant.to_string()).is_valid() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "tenant '{}' is invalid: it must not start with '_' or contain control characters",
                tenant.escape_debug()
            ),
        ));
    }
    Ok(tenant.to_string())
}

pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    check_size(value.len() as u64)
}

pub(crate) fn check_size(size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "the value is empty; objects hold at least one byte",
        ));
    }
    Ok(())
}

pub(crate) fn lease_expired(started: Instant, lease_ttl_ms: u64) -> bool {
    started.elapsed() >= Duration::from_millis(lease_ttl_ms)
}

fn lease_error(key: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::LEASE_EXPIRED,
        format!("the read lease of '{key}' expired during the transfer and the replica read is no longer current ({why})"),
    )
}

/// Object size from the replica list, as a buffer length.
pub(crate) fn object_size(key: &str, list: &GetReplicaListResponse) -> Result<usize> {
    let size = list.replicas.first().map(|r| r.size).ok_or_else(|| {
        Error::new(
            ErrorCode::REPLICA_IS_NOT_READY,
            format!("'{key}' has no readable replica"),
        )
    })?;
    usize::try_from(size).map_err(|_| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("'{key}' is {size} bytes, more than this machine can address"),
        )
    })
}

/// A zeroed buffer of `size` bytes, or an error instead of an abort when memory is short.
pub(crate) fn zeroed(size: usize) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(size).map_err(|_| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cannot allocate {size} bytes for the object"),
        )
    })?;
    buf.resize(size, 0);
    Ok(buf)
}

pub(crate) use transfer::first;

/// One result per key from answers gathered in parts; a key left without one (which the
/// callers do not leave) fails.
pub(crate) fn every_key<T>(results: Vec<Option<Result<T>>>) -> Vec<Result<T>> {
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "no result for the key",
                ))
            })
        })
        .collect()
}

/// The only result of a one-key batch call.
pub(crate) fn first_of<T>(results: Vec<Result<T>>) -> Result<T> {
    results.into_iter().next().unwrap_or_else(|| {
        Err(Error::new(
            ErrorCode::INTERNAL_ERROR,
            "no result for the key",
        ))
    })
}

pub(crate) fn no_complete_replica(key: &str) -> Error {
    Error::new(
        ErrorCode::REPLICA_IS_NOT_READY,
        format!("'{key}' has no complete replica"),
    )
}

/// The error of a read whose every replica failed.
pub(crate) fn combine_failures(key: &str, mut failures: Vec<Error>) -> Error {
    match failures.len() {
        0 => no_complete_replica(key),
        1 => failures.remove(0),
        n => {
            let why: Vec<String> = failures.iter().map(|e| e.to_string()).collect();
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("all {n} replicas of '{key}' failed: {}", why.join("; ")),
            )
        }
    }
}

/// The leading buffers of `parts` holding exactly `size` bytes (the last one cut to fit), or
/// `INVALID_PARAMS` when together they are too small.
pub(crate) fn fit_parts<'a>(
    key: &str,
    parts: Vec<&'a mut [u8]>,
    size: usize,
) -> Result<Vec<&'a mut [u8]>> {
    let have: usize = parts.iter().map(|p| p.len()).sum();
    if have < size {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("buffers of {have} bytes are too small for '{key}' ({size} bytes)"),
        ));
    }
    let mut left = size;
    let mut fitted = Vec::with_capacity(parts.len());
    for part in parts {
        if left == 0 {
            break;
        }
        let take = part.len().min(left);
        left -= take;
        fitted.push(&mut part[..take]);
    }
    Ok(fitted)
}

/// The first `size` bytes of `buf`, or `INVALID_PARAMS` when `buf` is too small.
pub(crate) fn buffer_for<'a>(key: &str, buf: &'a mut [u8], size: usize) -> Result<&'a mut [u8]> {
    let have = buf.len();
    buf.get_mut(..size).ok_or_else(|| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("buffer of {have} bytes is too small for '{key}' ({size} bytes)"),
        )
    })
}

#[cfg(test)]
mod tests;
