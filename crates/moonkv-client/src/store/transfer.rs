//! Moving objects' bytes. A call hands over every object it moves at once: memory replicas on
//! other nodes become ranges moved in pipelined bursts over a few pooled connections per node
//! (`lanes`), replicas whose segment lives in this process are copied directly, and a disk
//! replica moves as one whole-file request to the node that owns the disk. Objects may come
//! from, or go to, several caller buffers ("parts") without a staging copy, except that a disk
//! file read into several parts is gathered through one buffer.

use super::lanes::{Job, JobIo};
use futures_util::future::{join_all, BoxFuture, FutureExt, Shared};
use moonkv_dataplane::{ConnectionPool, DataConnection, FileMeta, PoolStats};
use moonkv_dataplane::{LocalSegment, LocalSegments};
use moonkv_proto::auth::Secret;
use moonkv_proto::types::{ReplicaDescriptor, ReplicaKind};
use moonkv_proto::{Error, ErrorCode, ReplicaId, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a timed-out write is waited for before its space is left to the master's
/// stalled-write sweep (the default `put_start_release_timeout_sec`).
const FENCE_LIMIT: Duration = Duration::from_secs(600);

/// Settles once an abandoned connection can no longer apply bytes (true), or gave up (false).
type Fence = Shared<BoxFuture<'static, bool>>;

/// One object to write: its bytes are the concatenation of `parts`.
pub(crate) struct WriteObject<'a> {
    pub replicas: &'a [ReplicaDescriptor],
    pub meta: FileMeta,
    pub parts: &'a [&'a [u8]],
}

/// One object to read from `replica` into `parts`, in order (their lengths add up to the
/// object size).
pub(crate) struct ReadObject<'a> {
    pub replica: &'a ReplicaDescriptor,
    pub parts: Vec<&'a mut [u8]>,
}

/// A transfer that is not a network range: a local copy or a disk file.
type Side<'a> = (
    usize,
    std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>,
);

/// Transfer settings and the connection pool shared by a store's clones.
pub(crate) struct Transfer {
    pool: ConnectionPool,
    chunk_size: usize,
    lanes: usize,
    timeout: Duration,
    local: Option<LocalSegments>,
    /// Bytes moved so far, for progress displays.
    progress: Option<Arc<AtomicU64>>,
    /// Writes whose deadline passed while the node may still be applying them, by replica.
    fences: Mutex<HashMap<ReplicaId, Vec<Fence>>>,
    /// Tasks started by [`Transfer::spawn_background`] that have not finished.
    background: Arc<AtomicUsize>,
    /// Writes of the store (and its clones) between their Start and their End.
    pub(crate) in_flight: Arc<super::InFlight>,
    /// Calls of this store now waiting for long same-host copies ([`Transfer::quiet_wait`]).
    quiet: AtomicUsize,
}

/// Counts one call among those waiting for long same-host copies while it lives.
pub(crate) struct QuietWait<'a>(&'a AtomicUsize);

impl Drop for QuietWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// How a store moves bytes (from `StoreConfig`).
pub(crate) struct TransferConfig {
    pub chunk_size: usize,
    pub lanes: usize,
    pub connections_per_node: usize,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub local: Option<LocalSegments>,
    pub progress: Option<Arc<AtomicU64>>,
    pub secret: Option<Secret>,
    pub same_host: bool,
    /// Where started writes are listed (shared by sibling stores).
    pub in_flight: Arc<super::InFlight>,
}

impl Transfer {
    pub fn new(config: TransferConfig) -> Self {
        Self {
            pool: ConnectionPool::new(
                config.connections_per_node,
                config.connect_timeout,
                config.secret,
            )
            .with_same_host(config.same_host),
            chunk_size: config.chunk_size.max(4096),
            lanes: config.lanes.max(1),
            timeout: config.timeout,
            local: config.local,
            progress: config.progress,
            fences: Mutex::default(),
            background: Arc::default(),
            in_flight: config.in_flight,
            quiet: AtomicUsize::new(0),
        }
    }

    /// Marks a call as waiting for long same-host copies until the guard drops.
    pub(crate) fn quiet_wait(&self) -> QuietWait<'_> {
        self.quiet.fetch_add(1, Ordering::Acquire);
        QuietWait(&self.quiet)
    }

    /// A quiet wait for a write whose same-host bytes (`len` into each memory replica of
    /// `replicas` that a node on this machine copies) reach [`QUIET_BYTES`], held from its data
    /// through its End: the End of a long write is when the master tells the node about the
    /// commit and the node's copies finish, so a caller polling then only takes a CPU from
    /// them (`docs/benchmarks.md`, *Shared pools and quiet writes*).
    ///
    /// [`QUIET_BYTES`]: super::lanes::QUIET_BYTES
    pub(crate) fn quiet_write<'r>(
        &self,
        writes: impl IntoIterator<Item = (&'r [ReplicaDescriptor], usize)>,
    ) -> Option<QuietWait<'_>> {
        long_same_host_write(writes, |endpoint| self.pool.same_host(endpoint))
            .then(|| self.quiet_wait())
    }

    /// Whether some call of this store waits for long same-host copies right now.
    pub(crate) fn waits_quietly(&self) -> bool {
        self.quiet.load(Ordering::Acquire) > 0
    }

    /// Runs `task` in the current runtime, counted by [`Transfer::background_tasks`] until it
    /// ends.
    pub(crate) fn spawn_background(&self, task: impl Future<Output = ()> + Send + 'static) {
        struct Done(Arc<AtomicUsize>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.background.fetch_add(1, Ordering::AcqRel);
        let done = Done(self.background.clone());
        tokio::spawn(async move {
            let _done = done;
            task.await
        });
    }

    /// Background tasks (settling fences, deferred revokes) still running.
    pub fn background_tasks(&self) -> usize {
        self.background.load(Ordering::Acquire)
    }

    /// New data-plane connections use TLS with these settings.
    pub fn with_tls(mut self, tls: Option<moonkv_dataplane::stream::TlsConnector>) -> Self {
        self.pool = self.pool.with_tls(tls);
        self
    }

    pub(crate) fn pool(&self) -> &ConnectionPool {
        &self.pool
    }

    /// Most bytes of one data-plane request.
    /// Bytes per request to the node at `endpoint`: larger for a node on this machine that
    /// copies straight to and from this process (`moonkv_dataplane::same_host::SAME_HOST_CHUNK`).
    pub(crate) fn chunk_for(&self, endpoint: &str) -> usize {
        if self.pool.same_host(endpoint) {
            self.chunk_size
                .max(moonkv_dataplane::same_host::SAME_HOST_CHUNK)
        } else {
            self.chunk_size
        }
    }

    pub(crate) fn pool_cap(&self) -> usize {
        self.pool.cap()
    }

    /// Data-plane connections opened and open now.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Deadline for the node to make progress on a burst (one chunk's worth).
    pub(crate) fn step_timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn advance(&self, bytes: usize) {
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
        let fences: Vec<Fence> = {
            let mut all = self.fences.lock();
            ids.iter()
                .filter_map(|id| all.remove(id))
                .flatten()
                .collect()
        };
        if fences.is_empty() {
            return None;
        }
        Some(async move { join_all(fences).await.into_iter().all(|settled| settled) })
    }

    /// Settles `conn` in the background; writes into `replicas` count as unsettled until then.
    pub(crate) fn fence(&self, replicas: Vec<ReplicaId>, conn: DataConnection) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.spawn_background(async move {
            let _ = tx.send(conn.fence(FENCE_LIMIT).await);
        });
        let fence: Fence = async move { rx.await.unwrap_or(false) }.boxed().shared();
        let mut all = self.fences.lock();
        for id in replicas {
            all.entry(id).or_default().push(fence.clone());
        }
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
        let object = ReadObject {
            replica,
            parts: vec![buf],
        };
        first(self.read_objects(&mut [object]).await)
    }

    /// Writes `data` (the whole object) into every replica of `replicas`.
    pub async fn write_replicas(
        &self,
        replicas: &[ReplicaDescriptor],
        meta: FileMeta,
        data: &[u8],
    ) -> Result<()> {
        let parts = [data];
        let object = WriteObject {
            replicas,
            meta,
            parts: &parts,
        };
        first(self.write_objects(&[object]).await)
    }

    /// Writes every object into each of its replicas; one result per object (the first failure
    /// among its replicas).
    pub async fn write_objects(&self, objects: &[WriteObject<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = (0..objects.len()).map(|_| Ok(())).collect();
        let mut jobs = Vec::new();
        let mut side: Vec<Side<'_>> = Vec::new();
        for (i, object) in objects.iter().enumerate() {
            let len: usize = object.parts.iter().map(|p| p.len()).sum();
            for replica in object.replicas {
                if replica.kind == ReplicaKind::LocalDisk {
                    side.push((
                        i,
                        Box::pin(self.write_file(replica, &object.meta, object.parts)),
                    ));
                    continue;
                }
                if let Err(e) = check_memory(replica, len) {
                    results[i] = Err(e);
                    continue;
                }
                if let Some(memory) = self.local(replica) {
                    side.push((i, Box::pin(self.copy_in(memory, replica, object.parts))));
                    continue;
                }
                let mut offset = 0;
                for part in object.parts {
                    let io = JobIo::Write(part);
                    let chunk = self.chunk_for(&replica.endpoint);
                    Job::ranges(i, replica, offset, io, chunk, &mut jobs);
                    offset += part.len() as u64;
                }
            }
        }
        self.finish(results, jobs, side).await
    }

    /// Reads every object from its replica; one result per object.
    pub async fn read_objects(&self, objects: &mut [ReadObject<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = (0..objects.len()).map(|_| Ok(())).collect();
        let mut jobs = Vec::new();
        let mut side: Vec<Side<'_>> = Vec::new();
        for (i, object) in objects.iter_mut().enumerate() {
            let replica = object.replica;
            let parts: Vec<&mut [u8]> = object.parts.iter_mut().map(|p| &mut **p).collect();
            if replica.kind == ReplicaKind::LocalDisk {
                side.push((i, Box::pin(self.read_file(replica, parts))));
                continue;
            }
            let len: usize = parts.iter().map(|p| p.len()).sum();
            if let Err(e) = check_memory(replica, len) {
                results[i] = Err(e);
                continue;
            }
            if let Some(memory) = self.local(replica) {
                side.push((i, Box::pin(self.copy_out(memory, replica, parts))));
                continue;
            }
            // Same-host reads keep their requests: two of them are copied on two threads.
            let alone = !self.pool.same_host(&replica.endpoint)
                && SOCKET_CALLS.load(Ordering::Acquire) == 0;
            let chunk = read_chunk(self.chunk_for(&replica.endpoint), len, alone);
            let mut offset = 0;
            for part in parts {
                let part_len = part.len() as u64;
                Job::ranges(i, replica, offset, JobIo::Read(part), chunk, &mut jobs);
                offset += part_len;
            }
        }
        self.finish(results, jobs, side).await
    }

    /// Runs network ranges and side transfers together and folds them into `results`.
    async fn finish(
        &self,
        mut results: Vec<Result<()>>,
        jobs: Vec<Job<'_>>,
        side: Vec<Side<'_>>,
    ) -> Vec<Result<()>> {
        let (indices, futures): (Vec<usize>, Vec<_>) = side.into_iter().unzip();
        // Everything borrows the caller's buffers, so it runs concurrently on this task rather
        // than as spawned tasks; for socket I/O that is as fast.
        let (network, side) = tokio::join!(
            self.run_jobs(jobs, results.len(), self.lanes),
            join_all(futures)
        );
        let outcomes = network
            .into_iter()
            .enumerate()
            .chain(indices.into_iter().zip(side));
        for (i, outcome) in outcomes {
            if let (Err(e), Ok(())) = (outcome, &results[i]) {
                results[i] = Err(e);
            }
        }
        results
    }

    async fn copy_in(
        &self,
        memory: Arc<dyn LocalSegment>,
        replica: &ReplicaDescriptor,
        parts: &[&[u8]],
    ) -> Result<()> {
        let mut address = replica.address;
        for part in parts {
            memory
                .write_from(address, part, grant_of(replica))
                .await
                .map_err(|s| local_refusal(replica, s))?;
            address += part.len() as u64;
            self.advance(part.len());
        }
        Ok(())
    }

    async fn copy_out(
        &self,
        memory: Arc<dyn LocalSegment>,
        replica: &ReplicaDescriptor,
        parts: Vec<&mut [u8]>,
    ) -> Result<()> {
        let mut address = replica.address;
        for part in parts {
            memory
                .read_into(address, part, grant_of(replica))
                .await
                .map_err(|s| local_refusal(replica, s))?;
            address += part.len() as u64;
            self.advance(part.len());
        }
        Ok(())
    }

    /// Deadline of a whole-file request: the chunk deadline per chunk-sized share.
    fn file_timeout(&self, len: usize) -> Duration {
        let chunks = len.div_ceil(self.chunk_size).max(1) as u32;
        self.timeout.saturating_mul(chunks)
    }

    async fn read_file(
        &self,
        replica: &ReplicaDescriptor,
        mut parts: Vec<&mut [u8]>,
    ) -> Result<()> {
        if parts.len() == 1 {
            return self
                .file_request(replica, FileOp::Read(&mut *parts[0]))
                .await;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut gathered = vec![0u8; len];
        self.file_request(replica, FileOp::Read(&mut gathered))
            .await?;
        let mut rest = &gathered[..];
        for part in parts {
            let (head, tail) = rest.split_at(part.len());
            part.copy_from_slice(head);
            rest = tail;
        }
        Ok(())
    }

    async fn write_file(
        &self,
        replica: &ReplicaDescriptor,
        meta: &FileMeta,
        parts: &[&[u8]],
    ) -> Result<()> {
        self.file_request(replica, FileOp::Write(meta, parts)).await
    }

    /// One whole-file request, retried once on a new connection when a connection from the idle
    /// list fails (the node may have closed it).
    async fn file_request(&self, replica: &ReplicaDescriptor, mut op: FileOp<'_>) -> Result<()> {
        let len = op.len();
        let timeout = self.file_timeout(len);
        let (mut conn, mut reused) = self.pool.checkout(&replica.endpoint).await?;
        let (disk, file, grant) = (replica.segment_id, replica.address, grant_of(replica));
        loop {
            let attempt = match &mut op {
                FileOp::Read(buf) => {
                    tokio::time::timeout(timeout, conn.read_file(disk, file, buf, grant)).await
                }
                FileOp::Write(meta, parts) => {
                    tokio::time::timeout(timeout, conn.write_file(disk, file, meta, parts, grant))
                        .await
                }
            };
            match attempt {
                Ok(Ok(())) => break,
                Ok(Err(e)) if reused && e.code == ErrorCode::TRANSFER_FAIL => {
                    reused = false;
                    self.pool.redial(&mut conn).await?;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!(
                            "data transfer with node {} took longer than {timeout:?}",
                            replica.endpoint
                        ),
                    ))
                }
            }
        }
        self.pool.checkin(conn);
        self.advance(len);
        Ok(())
    }
}

/// A whole-file request.
enum FileOp<'a> {
    Read(&'a mut [u8]),
    Write(&'a FileMeta, &'a [&'a [u8]]),
}

impl FileOp<'_> {
    fn len(&self) -> usize {
        match self {
            FileOp::Read(buf) => buf.len(),
            FileOp::Write(_, parts) => parts.iter().map(|p| p.len()).sum(),
        }
    }
}

/// Whether writing `len` bytes into each of these replicas makes the nodes on this machine
/// (`same_host`) copy at least [`super::lanes::QUIET_BYTES`].
fn long_same_host_write<'r>(
    writes: impl IntoIterator<Item = (&'r [ReplicaDescriptor], usize)>,
    same_host: impl Fn(&str) -> bool,
) -> bool {
    let mut bytes = 0usize;
    for (replicas, len) in writes {
        for replica in replicas {
            if replica.kind == ReplicaKind::Memory && same_host(&replica.endpoint) {
                bytes = bytes.saturating_add(len);
            }
        }
        if bytes >= super::lanes::QUIET_BYTES {
            return true;
        }
    }
    false
}

/// A read over a socket of an object of up to this many requests' worth of bytes (the
/// store's `chunk_size`) travels as one request while no other call of the process moves
/// bytes over sockets. On the two-vCPU machine of `docs/benchmarks.md`, with 512 KiB requests, a lone
/// 1 MiB get over loopback as two requests on two connections ran at 2.3–2.7 GB/s (p50
/// 372–471 µs), and at 3.2–3.8 as one request (p50 301–340 µs): the node's two threads and
/// the caller fight over two CPUs for no gain. With four threads getting at once, the split
/// requests were as fast or faster, so they stay split then. Longer reads are always split
/// (a 4 MiB get in 512 KiB requests over four connections beat 1 MiB requests), and so are
/// writes (a 1 MiB put ran faster in two).
pub(crate) const WHOLE_READ_CHUNKS: usize = 2;

/// Calls of this process moving bytes over sockets right now ([`SocketCall`]).
static SOCKET_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Whether no call of this process moves bytes over sockets right now.
pub(crate) fn no_socket_calls() -> bool {
    SOCKET_CALLS.load(Ordering::Acquire) == 0
}

/// Counts one call among those moving bytes over sockets while it lives.
pub(crate) struct SocketCall;

impl SocketCall {
    pub(crate) fn start() -> SocketCall {
        SOCKET_CALLS.fetch_add(1, Ordering::AcqRel);
        SocketCall
    }
}

impl Drop for SocketCall {
    fn drop(&mut self) {
        SOCKET_CALLS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes per request of a read of `len` bytes whose node takes `chunk` per request;
/// `alone`: no other call of the process moves bytes over sockets.
fn read_chunk(chunk: usize, len: usize, alone: bool) -> usize {
    if alone && len <= chunk.saturating_mul(WHOLE_READ_CHUNKS) {
        chunk.max(len)
    } else {
        chunk
    }
}

/// The only result of a one-object call.
pub(crate) fn first(results: Vec<Result<()>>) -> Result<()> {
    results
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(Error::new(ErrorCode::INTERNAL_ERROR, "no transfer result")))
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

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_proto::types::ReplicaStatus;
    use moonkv_proto::SegmentId;

    #[test]
    fn lone_reads_of_up_to_two_requests_are_one_and_others_are_split() {
        let chunk = 512 << 10;
        assert_eq!(read_chunk(chunk, 4096, true), chunk);
        assert_eq!(read_chunk(chunk, 768 << 10, true), 768 << 10);
        assert_eq!(read_chunk(chunk, 1 << 20, true), 1 << 20);
        assert_eq!(read_chunk(chunk, (1 << 20) + 1, true), chunk);
        assert_eq!(read_chunk(chunk, 1 << 20, false), chunk, "not alone");
        // A store configured for small requests keeps them small.
        assert_eq!(read_chunk(64 << 10, 128 << 10, true), 128 << 10);
        assert_eq!(read_chunk(64 << 10, 150_000, true), 64 << 10);
    }

    fn replica(kind: ReplicaKind, endpoint: &str) -> ReplicaDescriptor {
        ReplicaDescriptor {
            id: ReplicaId(1),
            kind,
            status: ReplicaStatus::Processing,
            size: 0,
            segment_id: SegmentId::new(1, 1),
            segment_name: "seg".into(),
            endpoint: endpoint.into(),
            address: 0,
            grant: None,
        }
    }

    #[test]
    fn only_long_copies_by_nodes_on_this_machine_make_a_write_quiet() {
        let here = |e: &str| e == "here:1";
        let local = [replica(ReplicaKind::Memory, "here:1")];
        let remote = [replica(ReplicaKind::Memory, "there:1")];
        let disk = [replica(ReplicaKind::LocalDisk, "here:1")];
        let both = [
            replica(ReplicaKind::Memory, "here:1"),
            replica(ReplicaKind::Memory, "here:1"),
        ];
        let mib = 1 << 20;
        assert!(long_same_host_write([(&local[..], 2 * mib)], here));
        assert!(!long_same_host_write([(&local[..], 2 * mib - 1)], here));
        // A node elsewhere, or a disk file, is not copied by this machine's node.
        assert!(!long_same_host_write([(&remote[..], 64 * mib)], here));
        assert!(!long_same_host_write([(&disk[..], 64 * mib)], here));
        // Bytes add up over replicas and over the objects of a batch.
        assert!(long_same_host_write([(&both[..], mib)], here));
        let batch = (0..16).map(|_| (&local[..], 128 << 10));
        assert!(long_same_host_write(batch, here));
        let short = (0..15).map(|_| (&local[..], 128 << 10));
        assert!(!long_same_host_write(short, here));
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
            assert_eq!(
                futures_util::future::join_all(futures).await,
                (0..n).collect::<Vec<_>>()
            );
        }
    }
}
