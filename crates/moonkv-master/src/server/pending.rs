//! RPC connections that have not finished their handshake, and the slots of those that have.
//!
//! A connection is *pending* from accept until its hello (and, with a secret, its proof) is
//! accepted. Pending connections:
//! - must finish within `handshake_timeout`, or are closed;
//! - have a cap of their own (`max_handshaking_connections`) and a cap per source address
//!   (`max_handshaking_per_source`). A new connection over either cap evicts the oldest pending
//!   connection (of its source when that source is over its cap) that has had at least
//!   [`MIN_AGE`] to say hello — a connection silent for [`SILENT_AGE`] goes first — so a flood
//!   of silent sockets cannot lock an honest client out,
//!   and a client that connects and says hello at once is never evicted by the sockets that
//!   follow it. Only when every candidate is younger than that (a burst faster than the cap
//!   per [`MIN_AGE`]) is the newcomer closed at once;
//! - never hold one of the `max_connections` slots: a connection takes its slot only when its
//!   handshake is accepted ([`Established`]), and is refused with an answer naming the cap if
//!   none is free.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The handshake limits of the RPC port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HandshakeLimits {
    /// Hello and proof must arrive within this long of accept.
    pub deadline: Duration,
    /// Connections in their handshake at once.
    pub max: usize,
    /// Connections in their handshake at once from one source address.
    pub max_per_source: usize,
}

type Labels = Vec<(&'static str, &'static str)>;

/// `master_rpc_connections{state}` and the counters of handshakes that did not finish.
#[derive(Clone, Default)]
pub(crate) struct ConnectionMetrics {
    open: Family<Labels, Gauge>,
    closed: Family<Labels, Counter>,
    local_opened: Counter,
}

impl ConnectionMetrics {
    pub(crate) fn register(registry: &mut Registry) -> ConnectionMetrics {
        let m = ConnectionMetrics::default();
        registry.register(
            "master_rpc_connections",
            "RPC connections open, by state: handshake (hello or proof not yet accepted) or established",
            m.open.clone(),
        );
        registry.register(
            "master_rpc_handshake_closed",
            "RPC connections closed before their handshake finished, by reason: deadline (handshake_timeout passed), evicted (a newer connection needed the handshake place) or refused (every place held by connections too young to evict)",
            m.closed.clone(),
        );
        registry.register(
            "master_rpc_local_connections_opened",
            "RPC connections accepted on the master's local socket (callers on this machine)",
            m.local_opened.clone(),
        );
        m
    }

    /// Counts a connection accepted on the local socket.
    pub(crate) fn local_opened(&self) {
        self.local_opened.inc();
    }

    fn open(&self, state: &'static str) -> Gauge {
        self.open.get_or_create(&vec![("state", state)]).clone()
    }

    pub(crate) fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&vec![("reason", reason)]).inc();
    }
}

/// A pending connection younger than this is not evicted: a client that sends its hello at
/// once has that long to get it read.
pub(crate) const MIN_AGE: Duration = Duration::from_millis(200);

/// A pending connection that has not sent a byte this long after accept goes first: an honest
/// client sends its hello at once.
pub(crate) const SILENT_AGE: Duration = Duration::from_millis(20);

struct Entry {
    source: IpAddr,
    opened: std::time::Instant,
    /// Set once the connection sent its first byte.
    spoke: Arc<std::sync::atomic::AtomicBool>,
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    /// By id, which is by age.
    entries: BTreeMap<u64, Entry>,
    per_source: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&entry.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&entry.source);
            }
        }
        Some(entry)
    }
}

/// The pending connections and the established slots of one RPC port.
pub(crate) struct Connections {
    limits: HandshakeLimits,
    table: parking_lot::Mutex<Table>,
    established: Arc<Semaphore>,
    max_established: usize,
    metrics: ConnectionMetrics,
    handshaking: Gauge,
    open: Gauge,
}

impl Connections {
    pub(crate) fn new(
        limits: HandshakeLimits,
        max_connections: usize,
        metrics: ConnectionMetrics,
    ) -> Arc<Connections> {
        Arc::new(Connections {
            limits,
            table: parking_lot::Mutex::new(Table::default()),
            established: Arc::new(Semaphore::new(max_connections)),
            max_established: max_connections,
            handshaking: metrics.open("handshake"),
            open: metrics.open("established"),
            metrics,
        })
    }

    pub(crate) fn deadline(&self) -> Duration {
        self.limits.deadline
    }

    pub(crate) fn max_established(&self) -> usize {
        self.max_established
    }

    pub(crate) fn metrics(&self) -> &ConnectionMetrics {
        &self.metrics
    }

    /// Registers a connection from `source` that starts its handshake, evicting the oldest
    /// pending connection old enough to go when a cap is reached; `None` (the newcomer is to be
    /// closed) when a cap is reached and every candidate is younger than [`MIN_AGE`].
    pub(crate) fn begin(self: &Arc<Self>, source: IpAddr) -> Option<Pending> {
        let now = std::time::Instant::now();
        let mut table = self.table.lock();
        let over_source =
            table.per_source.get(&source).copied().unwrap_or(0) >= self.limits.max_per_source;
        let over_all = table.entries.len() >= self.limits.max;
        if over_source || over_all {
            // Ids grow with age, so the first match is the oldest: first a connection that has
            // stayed silent since accept, then any old enough to have said hello.
            let candidate = |e: &&Entry| !over_source || e.source == source;
            let silent = |e: &&Entry| {
                !e.spoke.load(std::sync::atomic::Ordering::Acquire) && now - e.opened >= SILENT_AGE
            };
            let victim = table
                .entries
                .iter()
                .find(|(_, e)| candidate(e) && silent(e))
                .or_else(|| {
                    table
                        .entries
                        .iter()
                        .find(|(_, e)| candidate(e) && now - e.opened >= MIN_AGE)
                })
                .map(|(id, _)| *id);
            let Some(entry) = victim.and_then(|id| table.remove(id)) else {
                self.metrics.closed("refused");
                return None;
            };
            entry.evict.notify_one();
            self.handshaking.dec();
            self.metrics.closed("evicted");
        }
        let id = table.next_id;
        table.next_id += 1;
        let evict = Arc::new(Notify::new());
        let spoke = Arc::new(std::sync::atomic::AtomicBool::new(false));
        table.entries.insert(
            id,
            Entry {
                source,
                opened: now,
                spoke: spoke.clone(),
                evict: evict.clone(),
            },
        );
        *table.per_source.entry(source).or_insert(0) += 1;
        self.handshaking.inc();
        Some(Pending {
            connections: self.clone(),
            id,
            evict,
            spoke,
        })
    }

    /// A slot among `max_connections` for a connection whose handshake was accepted, if one is
    /// free.
    pub(crate) fn establish(self: &Arc<Self>) -> Option<Established> {
        let permit = self.established.clone().try_acquire_owned().ok()?;
        self.open.inc();
        Some(Established {
            _permit: permit,
            open: self.open.clone(),
        })
    }

    /// Connections in their handshake now.
    #[cfg(test)]
    fn handshaking(&self) -> usize {
        self.table.lock().entries.len()
    }
}

/// A connection in its handshake; dropping it (handshake done, or connection closed) frees its
/// place.
pub(crate) struct Pending {
    connections: Arc<Connections>,
    id: u64,
    evict: Arc<Notify>,
    spoke: Arc<std::sync::atomic::AtomicBool>,
}

impl Pending {
    /// Fires once when a newer connection evicted this one.
    pub(crate) fn eviction(&self) -> Arc<Notify> {
        self.evict.clone()
    }

    /// Records that the connection sent its first byte (it is no longer evicted as silent).
    pub(crate) fn spoke(&self) {
        self.spoke.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.connections.table.lock().remove(self.id).is_some() {
            self.connections.handshaking.dec();
        }
    }
}

/// One of the `max_connections` slots, held by an established connection.
pub(crate) struct Established {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Established {
    fn drop(&mut self) {
        self.open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connections(max: usize, per_source: usize, established: usize) -> Arc<Connections> {
        Connections::new(
            HandshakeLimits {
                deadline: Duration::from_secs(10),
                max,
                max_per_source: per_source,
            },
            established,
            ConnectionMetrics::default(),
        )
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    impl Connections {
        /// `begin`, as if every pending connection were already old enough to evict.
        fn begin_aged(self: &Arc<Self>, source: IpAddr) -> Pending {
            for entry in self.table.lock().entries.values_mut() {
                entry.opened -= MIN_AGE;
            }
            self.begin(source).expect("a place")
        }
    }

    #[test]
    fn a_young_pending_connection_is_not_evicted_and_the_newcomer_is_refused() {
        let c = connections(100, 2, 10);
        let _first = c.begin(ip(1)).expect("a place");
        let _second = c.begin(ip(1)).expect("a place");
        // Both are younger than MIN_AGE: the third from that source is refused, not them.
        assert!(c.begin(ip(1)).is_none());
        assert_eq!(c.handshaking(), 2);
        // Another source is unaffected.
        assert!(c.begin(ip(2)).is_some());
    }

    #[tokio::test]
    async fn a_source_over_its_cap_evicts_its_own_oldest_connection() {
        let c = connections(100, 2, 10);
        let first = c.begin_aged(ip(1));
        let other = c.begin_aged(ip(2));
        let second = c.begin_aged(ip(1));
        let third = c.begin_aged(ip(1));
        // The oldest of source 1 went, not source 2's older connection.
        tokio::time::timeout(Duration::from_secs(1), first.eviction().notified())
            .await
            .expect("the oldest of the source is evicted");
        assert_eq!(c.handshaking(), 3);
        drop((first, other, second, third));
        assert_eq!(c.handshaking(), 0);
    }

    #[tokio::test]
    async fn the_global_cap_evicts_the_oldest_pending_connection() {
        let c = connections(3, 3, 10);
        let held: Vec<Pending> = (1..=3).map(|i| c.begin_aged(ip(i))).collect();
        let newest = c.begin_aged(ip(9));
        tokio::time::timeout(Duration::from_secs(1), held[0].eviction().notified())
            .await
            .expect("the oldest overall is evicted");
        assert_eq!(c.handshaking(), 3);
        // The others were not.
        for p in &held[1..] {
            let n = p.eviction();
            assert!(
                tokio::time::timeout(Duration::from_millis(20), n.notified())
                    .await
                    .is_err()
            );
        }
        drop(newest);
        assert_eq!(c.handshaking(), 2);
    }

    #[test]
    fn established_slots_are_capped_and_come_back() {
        let c = connections(10, 10, 2);
        let a = c.establish().expect("slot 1");
        let _b = c.establish().expect("slot 2");
        assert!(c.establish().is_none(), "a third is refused");
        drop(a);
        assert!(c.establish().is_some(), "a freed slot is reused");
    }
}
