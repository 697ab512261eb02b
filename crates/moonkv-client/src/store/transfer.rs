//! Moving one replica's bytes: split into chunks spread over several connections, or copied
//! directly when the replica's segment lives in this process.

use crate::data_plane::{ConnectionPool, DataConnection};
use crate::node::segment::{lookup_local, SegmentMemory};
use moonkv_proto::types::{ReplicaDescriptor, ReplicaKind};
use moonkv_proto::{Error, ErrorCode, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// Transfer settings and the connection pool shared by a store's clones.
pub(crate) struct Transfer {
    pool: ConnectionPool,
    chunk_size: usize,
    lanes: usize,
    timeout: Duration,
    local_copy: bool,
}

impl Transfer {
    pub fn new(
        chunk_size: usize,
        lanes: usize,
        timeout: Duration,
        connect_timeout: Duration,
        local_copy: bool,
    ) -> Self {
        let lanes = lanes.max(1);
        Self {
            pool: ConnectionPool::new(lanes * 2, connect_timeout),
            chunk_size: chunk_size.max(4096),
            lanes,
            timeout,
            local_copy,
        }
    }

    /// Whether reading `replica` needs no network (its segment is served by this process).
    pub fn is_local(&self, replica: &ReplicaDescriptor) -> bool {
        self.local(replica).is_some()
    }

    fn local(&self, replica: &ReplicaDescriptor) -> Option<Arc<SegmentMemory>> {
        if self.local_copy && replica.kind == ReplicaKind::Memory {
            lookup_local(replica.segment_id)
        } else {
            None
        }
    }

    /// Reads a whole replica into `buf` (exactly the object size).
    pub async fn read(&self, replica: &ReplicaDescriptor, buf: &mut [u8]) -> Result<()> {
        check_memory(replica)?;
        if let Some(memory) = self.local(replica) {
            let view = memory
                .read_view(replica.address, buf.len() as u64)
                .await
                .map_err(|s| local_refusal(replica, s))?;
            buf.copy_from_slice(&view);
            return Ok(());
        }
        let lanes = spread(buf.chunks_mut(self.chunk_size), self.lanes, self.chunk_size);
        let work = lanes
            .into_iter()
            .map(|items| self.read_lane(replica, items));
        join_all(work.collect()).await.into_iter().collect()
    }

    /// Writes `data` (the whole object) into a replica.
    pub async fn write(&self, replica: &ReplicaDescriptor, data: &[u8]) -> Result<()> {
        check_memory(replica)?;
        if let Some(memory) = self.local(replica) {
            let mut view = memory
                .write_view(replica.address, data.len() as u64)
                .await
                .map_err(|s| local_refusal(replica, s))?;
            view.copy_from_slice(data);
            return Ok(());
        }
        let lanes = spread(data.chunks(self.chunk_size), self.lanes, self.chunk_size);
        let work = lanes
            .into_iter()
            .map(|items| self.write_lane(replica, items));
        join_all(work.collect()).await.into_iter().collect()
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
                    lane.conn.read(replica.segment_id, address, chunk),
                )
                .await;
                if lane.settle(self, attempt).await? {
                    break;
                }
            }
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
                    lane.conn.write(replica.segment_id, address, chunk),
                )
                .await;
                if lane.settle(self, attempt).await? {
                    break;
                }
            }
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
            Err(_) => Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!(
                    "data transfer with node {} took longer than {:?}",
                    self.conn.endpoint(),
                    transfer.timeout
                ),
            )),
        }
    }
}

fn check_memory(replica: &ReplicaDescriptor) -> Result<()> {
    if replica.kind != ReplicaKind::Memory {
        return Err(Error::new(
            ErrorCode::NOT_SUPPORTED,
            format!(
                "replica {} is a {:?} replica; this client moves memory replicas only",
                replica.id, replica.kind
            ),
        ));
    }
    Ok(())
}

fn local_refusal(replica: &ReplicaDescriptor, status: crate::data_plane::DataStatus) -> Error {
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

/// Polls every future concurrently on the current task and returns their outputs in order.
/// (Borrowed buffers cannot move into spawned tasks; concurrency on one task is enough for I/O.)
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    let mut left = pending.len();
    std::future::poll_fn(|cx| {
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                if let Poll::Ready(value) = future.as_mut().poll(cx) {
                    *output = Some(value);
                    *slot = None;
                    left -= 1;
                }
            }
        }
        if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
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
    async fn join_all_keeps_order() {
        let futures = (0..5u64).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(10 * (5 - i))).await;
            i
        });
        assert_eq!(join_all(futures.collect()).await, vec![0, 1, 2, 3, 4]);
    }
}
