//! Moving one replica's bytes: split into chunks spread over several connections, or copied
//! directly when the replica's segment lives in this process. A disk replica moves as one
//! whole-file request to the node that owns the disk.

use futures_util::future::join_all;
use moonkv_dataplane::{ConnectionPool, DataConnection, FileMeta};
use moonkv_dataplane::{LocalSegment, LocalSegments};
use moonkv_proto::auth::Secret;
use moonkv_proto::types::{ReplicaDescriptor, ReplicaKind};
use moonkv_proto::{Error, ErrorCode, ReplicaId, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long a timed-out write is waited for before its space is left to the master's
/// stalled-write sweep (the default `put_start_release_timeout_sec`).
const FENCE_LIMIT: Duration = Duration::from_secs(600);

/// Transfer settings and the connection pool shared by a store's clones.
pub(crate) struct Transfer {
    pool: ConnectionPool,
    chunk_size: usize,
    lanes: usize,
    timeout: Duration,
    local: Option<LocalSegments>,
    /// Bytes moved so far, for progress displays.
    progress: Option<Arc<AtomicU64>>,
    /// Writes whose deadline passed while the node may still be applying them, by replica:
    /// each task settles once the node has closed the abandoned connection.
    fences: Mutex<HashMap<ReplicaId, Vec<JoinHandle<bool>>>>,
}

impl Transfer {
    pub fn new(
        chunk_size: usize,
        lanes: usize,
        timeout: Duration,
        connect_timeout: Duration,
        local: Option<LocalSegments>,
        progress: Option<Arc<AtomicU64>>,
        secret: Option<Secret>,
    ) -> Self {
        let lanes = lanes.max(1);
        Self {
            pool: ConnectionPool::new(lanes * 2, connect_timeout, secret),
            chunk_size: chunk_size.max(4096),
            lanes,
            timeout,
            local,
            progress,
            fences: Mutex::default(),
        }
    }

    /// New data-plane connections use TLS with these settings.
    pub fn with_tls(mut self, tls: Option<moonkv_dataplane::stream::TlsConnector>) -> Self {
        self.pool = self.pool.with_tls(tls);
        self
    }

    fn advance(&self, bytes: usize) {
        if let Some(progress) = &self.progress {
            progress.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    /// A future that resolves once no timed-out write into `ids` can still land (true), or
    /// when that could not be established in time (false); `None` if no write timed out.
    /// Space must not be revoked before then: a stalled node could apply the old bytes over
    /// the next object allocated there.
    pub fn unsettled(
        &self,
        ids: &[ReplicaId],
    ) -> Option<impl Future<Output = bool> + Send + 'static> {
        let tasks: Vec<JoinHandle<bool>> = {
            let mut fences = self.fences.lock();
            ids.iter()
                .filter_map(|id| fences.remove(id))
                .flatten()
                .collect()
        };
        if tasks.is_empty() {
            return None;
        }
        Some(async move {
            let mut settled = true;
            for task in tasks {
                settled &= task.await.unwrap_or(false);
            }
            settled
        })
    }

    fn fence(&self, replica: ReplicaId, conn: DataConnection) {
        let task = tokio::spawn(conn.fence(FENCE_LIMIT));
        self.fences.lock().entry(replica).or_default().push(task);
    }

    /// Whether reading `replica` needs no network (its segment is served by this process).
    pub fn is_local(&self, replica: &ReplicaDescriptor) -> bool {
        self.local(replica).is_some()
    }

    fn local(&self, replica: &ReplicaDescriptor) -> Option<Arc<dyn LocalSegment>> {
        match &self.local {
            Some(local) if replica.kind == ReplicaKind::Memory => local.get(replica.segment_id),
            _ => None,
        }
    }

    /// Reads a whole replica into `buf` (exactly the object size).
    pub async fn read(&self, replica: &ReplicaDescriptor, buf: &mut [u8]) -> Result<()> {
        if replica.kind == ReplicaKind::LocalDisk {
            return self.read_file(replica, buf).await;
        }
        check_memory(replica, buf.len())?;
        if let Some(memory) = self.local(replica) {
            memory
                .read_into(replica.address, buf)
                .await
                .map_err(|s| local_refusal(replica, s))?;
            self.advance(buf.len());
            return Ok(());
        }
        let lanes = spread(buf.chunks_mut(self.chunk_size), self.lanes, self.chunk_size);
        // Lanes borrow the caller's buffer, so they run concurrently on this task rather than
        // as spawned tasks; for socket I/O that is as fast.
        let work = lanes
            .into_iter()
            .map(|items| self.read_lane(replica, items));
        join_all(work).await.into_iter().collect()
    }

    /// Writes `data` (the whole object) into a replica; `meta` names the object for disk files.
    pub async fn write_replica(
        &self,
        replica: &ReplicaDescriptor,
        meta: &FileMeta,
        data: &[u8],
    ) -> Result<()> {
        if replica.kind == ReplicaKind::LocalDisk {
            return self.write_file(replica, meta, data).await;
        }
        self.write(replica, data).await
    }

    /// Writes `data` (the whole object) into a memory replica.
    pub async fn write(&self, replica: &ReplicaDescriptor, data: &[u8]) -> Result<()> {
        check_memory(replica, data.len())?;
        if let Some(memory) = self.local(replica) {
            memory
                .write_from(replica.address, data)
                .await
                .map_err(|s| local_refusal(replica, s))?;
            self.advance(data.len());
            return Ok(());
        }
        let lanes = spread(data.chunks(self.chunk_size), self.lanes, self.chunk_size);
        let work = lanes
            .into_iter()
            .map(|items| self.write_lane(replica, items));
        join_all(work).await.into_iter().collect()
    }

    /// Deadline of a whole-file request: the chunk deadline per chunk-sized share.
    fn file_timeout(&self, len: usize) -> Duration {
        let chunks = len.div_ceil(self.chunk_size).max(1) as u32;
        self.timeout.saturating_mul(chunks)
    }

    async fn read_file(&self, replica: &ReplicaDescriptor, buf: &mut [u8]) -> Result<()> {
        let timeout = self.file_timeout(buf.len());
        let mut lane = Lane::open(self, &replica.endpoint).await?;
        loop {
            let attempt = tokio::time::timeout(
                timeout,
                lane.conn.read_file(
                    replica.segment_id,
                    replica.address,
                    &mut *buf,
                    grant_of(replica),
                ),
            )
            .await;
            if lane.settle(self, attempt).await? {
                break;
            }
        }
        self.pool.checkin(lane.conn);
        self.advance(buf.len());
        Ok(())
    }

    async fn write_file(
        &self,
        replica: &ReplicaDescriptor,
        meta: &FileMeta,
        data: &[u8],
    ) -> Result<()> {
        let timeout = self.file_timeout(data.len());
        let mut lane = Lane::open(self, &replica.endpoint).await?;
        loop {
            let attempt = tokio::time::timeout(
                timeout,
                lane.conn.write_file(
                    replica.segment_id,
                    replica.address,
                    meta,
                    data,
                    grant_of(replica),
                ),
            )
            .await;
            if lane.settle(self, attempt).await? {
                break;
            }
        }
        self.pool.checkin(lane.conn);
        self.advance(data.len());
        Ok(())
    }

    async fn read_lane(
        &self,
        replica: &ReplicaDescriptor,
        items: Vec<(u64, &mut [u8])>,
    ) -> Result<()> {
        let mut lane = Lane::open(self, &replica.endpoint).await?;
        for (offset, chunk) in items {
            let address = replica.address + offset;
            loop {
                let attempt = tokio::time::timeout(
                    self.timeout,
                    lane.conn
                        .read(replica.segment_id, address, &mut *chunk, grant_of(replica)),
                )
                .await;
                if lane.settle(self, attempt).await? {
                    break;
                }
            }
            self.advance(chunk.len());
        }
        self.pool.checkin(lane.conn);
        Ok(())
    }

    async fn write_lane(
        &self,
        replica: &ReplicaDescriptor,
        items: Vec<(u64, &[u8])>,
    ) -> Result<()> {
        let mut lane = Lane::open(self, &replica.endpoint).await?;
        for (offset, chunk) in items {
            let address = replica.address + offset;
            loop {
                let attempt = tokio::time::timeout(
                    self.timeout,
                    lane.conn
                        .write(replica.segment_id, address, chunk, grant_of(replica)),
                )
                .await;
                if attempt.is_err() {
                    // Bytes already sent may still be applied by a stalled node.
                    let error = lane.timed_out(self);
                    self.fence(replica.id, lane.conn);
                    return Err(error);
                }
                if lane.settle(self, attempt).await? {
                    break;
                }
            }
            self.advance(chunk.len());
        }
        self.pool.checkin(lane.conn);
        Ok(())
    }
}

/// One connection working through its share of chunks.
struct Lane {
    conn: DataConnection,
    /// Taken from the idle pool: the node may have closed it meanwhile, so one transport
    /// failure on it is retried on a fresh connection.
    reused: bool,
}

impl Lane {
    async fn open(transfer: &Transfer, endpoint: &str) -> Result<Lane> {
        let (conn, reused) = transfer.pool.checkout(endpoint).await?;
        Ok(Lane { conn, reused })
    }

    /// `Ok(true)`: chunk done; `Ok(false)`: retry it on the fresh connection now in place.
    async fn settle(
        &mut self,
        transfer: &Transfer,
        attempt: std::result::Result<Result<()>, tokio::time::error::Elapsed>,
    ) -> Result<bool> {
        match attempt {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) if self.reused && e.code == ErrorCode::TRANSFER_FAIL => {
                let endpoint = self.conn.endpoint().to_string();
                transfer.pool.forget(&endpoint);
                self.conn = transfer.pool.fresh(&endpoint).await?;
                self.reused = false;
                Ok(false)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.timed_out(transfer)),
        }
    }

    fn timed_out(&self, transfer: &Transfer) -> Error {
        Error::new(
            ErrorCode::TRANSFER_FAIL,
            format!(
                "data transfer with node {} took longer than {:?}",
                self.conn.endpoint(),
                transfer.timeout
            ),
        )
    }
}

/// A memory replica, moved whole: the transfer touches exactly the descriptor's range (the
/// direct local copy has no node to check a grant, so it checks the length here).
fn check_memory(replica: &ReplicaDescriptor, len: usize) -> Result<()> {
    if replica.kind != ReplicaKind::Memory {
        return Err(Error::new(
            ErrorCode::NOT_SUPPORTED,
            format!(
                "replica {} is a {:?} replica; this client moves memory replicas only",
                replica.id, replica.kind
            ),
        ));
    }
    if len as u64 != replica.size {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "replica {} holds {} bytes, not {len}",
                replica.id, replica.size
            ),
        ));
    }
    Ok(())
}

/// The replica's grant, empty when the master issued none.
fn grant_of(replica: &ReplicaDescriptor) -> &[u8] {
    replica.grant.as_deref().unwrap_or_default()
}

fn local_refusal(replica: &ReplicaDescriptor, status: moonkv_dataplane::DataStatus) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!(
            "replica {} at {:#x} in local segment {}: {}",
            replica.id,
            replica.address,
            replica.segment_name,
            status.describe()
        ),
    )
}

/// Deals chunks round-robin into at most `lanes` lanes, each chunk tagged with its offset.
fn spread<T>(
    chunks: impl Iterator<Item = T>,
    lanes: usize,
    chunk_size: usize,
) -> Vec<Vec<(u64, T)>> {
    let mut out: Vec<Vec<(u64, T)>> = (0..lanes).map(|_| Vec::new()).collect();
    for (i, chunk) in chunks.enumerate() {
        out[i % lanes].push(((i * chunk_size) as u64, chunk));
    }
    out.retain(|lane| !lane.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_spread_round_robin_with_offsets() {
        let data = [0u8; 10];
        let lanes = spread(data.chunks(4), 2, 4);
        let offsets: Vec<Vec<u64>> = lanes
            .iter()
            .map(|l| l.iter().map(|(o, _)| *o).collect())
            .collect();
        assert_eq!(offsets, vec![vec![0, 8], vec![4]]);
        assert_eq!(spread(data.chunks(16), 4, 16).len(), 1);
    }

    #[tokio::test]
    async fn join_all_answers_in_input_order_whatever_finishes_first() {
        // Lanes and batch items are matched to their results by position. The library takes a
        // different path above 30 futures, so both sizes are checked.
        for n in [5u64, 40] {
            let futures = (0..n).map(|i| async move {
                for _ in 0..(n - i) {
                    tokio::task::yield_now().await;
                }
                i
            });
            assert_eq!(join_all(futures).await, (0..n).collect::<Vec<_>>());
        }
    }
}
