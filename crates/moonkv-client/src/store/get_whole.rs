//! Gets taken whole by the node a store's writes land on (`docs/data-plane.md`, *Callers given
//! the master*), over the socket: the usual client of `moonkv up` on another host, or told
//! not to copy on this one.
//!
//! A get the usual way is two round trips: the replica list from the master, then the bytes
//! from the node. Once a store hands its puts to one node ([`super::put_whole`]) and that node
//! says in its STATS that it takes gets whole, small gets go to it as one GET_WHOLE: the node
//! asks its master (in its own process, in `moonkv up`) and sends the bytes after its answer.
//! A key the node does not hold, or larger than the call takes, comes back with its replica
//! list, and is read the usual way without asking the master again; so a cluster of several
//! nodes costs nothing extra.
//!
//! How much one call asks for: at most [`WHOLE_SOCKET_BYTES`], and more than one request's
//! worth (the store's `chunk_size`) only while no other call of the process moves bytes over
//! sockets, the rule lone reads follow (`transfer.rs`, `WHOLE_READ_CHUNKS`). A one-key get
//! asks for that much at most, whatever its buffer; a larger object comes back with its list.
//! A batch into the caller's buffers goes whole when they add up to no more; a batch into new
//! buffers asks for an even share per key. Anything that goes wrong before the bytes are in (a
//! refusal, a broken connection, an answer that does not add up, no answer within the
//! deadline) sends the call the usual way.

use super::put_whole::WHOLE_SOCKET_BYTES;
use super::transfer::{no_socket_calls, SocketCall, WHOLE_READ_CHUNKS};
use super::{zeroed, Store};
use moonkv_dataplane::header::GotWhole;
use moonkv_dataplane::DataConnection;
use moonkv_proto::types::GetReplicaListResponse;
use moonkv_proto::{Error, ItemResult};
use std::time::{Duration, Instant};

/// One key's outcome of a get the node took.
pub(crate) enum Took {
    /// Read into the key's buffer: this many bytes.
    Read(usize),
    /// Not read by the node: read it the usual way with this list, asked at `started`.
    Listed(GetReplicaListResponse),
    /// The master's answer for the key (not found, not ready, ...).
    Failed(Error),
}

/// Where a key's bytes go.
pub(crate) enum Sink<'a> {
    /// The caller's buffers, filled in order.
    Parts(Vec<&'a mut [u8]>),
    /// A new buffer of the object's size.
    Fresh(Option<Vec<u8>>),
}

impl<'a> Sink<'a> {
    /// The caller's buffers back (none for a fresh buffer).
    pub(crate) fn into_parts(self) -> Vec<&'a mut [u8]> {
        match self {
            Sink::Parts(parts) => parts,
            Sink::Fresh(_) => Vec::new(),
        }
    }

    fn capacity(&self, cap: u64) -> u64 {
        match self {
            Sink::Parts(parts) => parts.iter().map(|p| p.len() as u64).sum(),
            Sink::Fresh(_) => cap,
        }
    }
}

impl Store {
    /// The node this store's gets go to whole, and the most bytes one call asks it for.
    async fn whole_get_cap(&self) -> Option<(String, u64)> {
        let (endpoint, local, gets) = self.whole_route().await?;
        if local || !gets {
            return None;
        }
        let chunk = self.transfer.chunk_for(&endpoint) as u64;
        let cap = if no_socket_calls() {
            chunk * WHOLE_READ_CHUNKS as u64
        } else {
            chunk
        };
        Some((endpoint, cap.min(WHOLE_SOCKET_BYTES)))
    }

    /// Gets `keys` through the node into `sinks` (one per key), when this store has a node
    /// that takes them and the call is one it hands over. `None`: nothing was read, read every
    /// key the usual way. Keys must be valid (checked by the caller).
    pub(crate) async fn get_whole(
        &self,
        keys: &[&str],
        sinks: &mut [Sink<'_>],
    ) -> Option<(Instant, Vec<Took>)> {
        if keys.is_empty() || keys.len() != sinks.len() || keys.len() > super::MAX_KEYS_THROUGH_NODE
        {
            return None;
        }
        let (endpoint, cap) = self.whole_get_cap().await?;
        // One key takes at most `cap`: a larger object comes back with its list. The keys of
        // a batch take their buffers, and the call goes the usual way when they add up to more.
        let capacities: Vec<u64> = if let [sink] = &*sinks {
            vec![sink.capacity(cap).min(cap)]
        } else {
            let each = cap / keys.len() as u64;
            sinks.iter().map(|s| s.capacity(each)).collect()
        };
        if capacities.contains(&0) || capacities.iter().sum::<u64>() > cap {
            return None;
        }
        let started = Instant::now();
        let body = rmp_serde::to_vec(&(&self.tenant, keys, &capacities)).ok()?;
        let _moving = SocketCall::start();
        let wait = self.config.rpc_timeout + self.transfer.step_timeout() + Duration::from_secs(1);
        let call = self.get_whole_at(&endpoint, &body, &capacities, sinks);
        match tokio::time::timeout(wait, call).await {
            Ok(Some(took)) => Some((started, took)),
            // Anything that went wrong leaves the call to the usual way; the route is learnt
            // again (a node that keeps failing is given up).
            Ok(None) | Err(_) => {
                self.whole.forget();
                None
            }
        }
    }

    /// One GET_WHOLE to the node at `endpoint`, its bytes read into `sinks`.
    async fn get_whole_at(
        &self,
        endpoint: &str,
        body: &[u8],
        capacities: &[u64],
        sinks: &mut [Sink<'_>],
    ) -> Option<Vec<Took>> {
        let pool = self.transfer.pool();
        let capacity: u64 = capacities.iter().sum();
        let (mut conn, mut reused) = pool.checkout(endpoint).await.ok()?;
        let (answer, bytes) = loop {
            match conn.get_whole(body, capacity).await {
                Ok(Ok(answer)) => break answer,
                // An idle connection the node had already closed: again on a fresh one.
                Err(_) if reused => {
                    reused = false;
                    pool.redial(&mut conn).await.ok()?;
                }
                Err(_) => return None,
                Ok(Err(_refused)) => {
                    pool.checkin(conn);
                    return None;
                }
            }
        };
        let items: Vec<ItemResult<GotWhole>> = rmp_serde::from_slice(&answer).ok()?;
        if items.len() != sinks.len() {
            return None;
        }
        // The sizes must add up to what follows, each within what its key takes.
        let mut sum = 0u64;
        for (item, capacity) in items.iter().zip(capacities) {
            if let Ok(GotWhole::Bytes(size)) = &item.0 {
                if size > capacity {
                    return None;
                }
                sum += size;
            }
        }
        if sum != bytes {
            return None;
        }
        let mut left = bytes;
        let mut took = Vec::with_capacity(items.len());
        for (item, sink) in items.into_iter().zip(sinks.iter_mut()) {
            let size = match item.0 {
                Ok(GotWhole::Bytes(size)) => size,
                Ok(GotWhole::Elsewhere(list)) => {
                    took.push(Took::Listed(list));
                    continue;
                }
                Err(e) => {
                    took.push(Took::Failed(e));
                    continue;
                }
            };
            left -= size;
            read_into(&mut conn, sink, size, left == 0).await?;
            took.push(Took::Read(size as usize));
        }
        pool.checkin(conn);
        self.transfer.advance(bytes as usize);
        Some(took)
    }
}

/// Reads the next `size` bytes of `conn` into `sink`; `last`: the answer's last bytes.
async fn read_into(
    conn: &mut DataConnection,
    sink: &mut Sink<'_>,
    size: u64,
    last: bool,
) -> Option<()> {
    match sink {
        Sink::Fresh(buf) => {
            let mut fresh = zeroed(size as usize).ok()?;
            conn.read_whole_bytes(&mut fresh, last).await.ok()?;
            *buf = Some(fresh);
        }
        Sink::Parts(parts) => {
            let mut rest = size as usize;
            let n = parts.len();
            for (i, part) in parts.iter_mut().enumerate() {
                if rest == 0 {
                    break;
                }
                let take = rest.min(part.len());
                rest -= take;
                let final_part = rest == 0 || i + 1 == n;
                conn.read_whole_bytes(&mut part[..take], last && final_part)
                    .await
                    .ok()?;
            }
            if rest > 0 {
                return None;
            }
        }
    }
    Some(())
}
