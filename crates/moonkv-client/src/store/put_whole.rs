//! Puts taken whole by the node a store's writes land on (`docs/data-plane.md`, *Puts through
//! the node*), for stores that were not pointed at a node: the usual client of `moonkv up`.
//!
//! A put the usual way is three round trips: the start at the master, the bytes to the node,
//! the end at the master. Once every replica of a store's writes has landed on one node, and
//! that node says in its STATS that it takes puts whole, the store hands it its later puts in
//! one request: PUT_LOCAL when the node is on this machine and copies from this process's
//! memory, else PUT_WHOLE with the bytes following the request on the socket. The node
//! starts and ends the write at its master in the store's name.
//!
//! The master still places every key. A key it places anywhere but that node comes back
//! `NOT_SUPPORTED`, revoked, and is written the usual way; when that happens to more than one
//! key in [`LEFT_LIMIT`], the store stops handing puts to the node (a cluster of several
//! nodes, where most keys land elsewhere). A node that cannot be reached, or a connection
//! that breaks, sends the store back to the usual path until its writes land on one node
//! again.

use super::node_call::{laid_end_to_end, left_to_caller};
use super::put_local::{node_takes, NodeAnswers};
use super::{Store, WriteKind, MAX_KEYS_THROUGH_NODE};
use moonkv_dataplane::header::MAX_LOCAL_RANGES;
use moonkv_proto::{Error, ErrorCode, ItemResult, ReplicaDescriptor, ReplicaKind, ReplicateConfig};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Most bytes one call hands the node over the socket: larger calls are faster split over
/// several connections the usual way (`docs/benchmarks.md`, *Small puts in one round trip*).
pub(crate) const WHOLE_SOCKET_BYTES: u64 = 1 << 20;

/// Keys left to the usual path tolerated per this many keys handed to the node.
pub(crate) const LEFT_LIMIT: u64 = 8;

/// Keys handed over before the share left to the usual path is judged.
const JUDGED_AFTER: u64 = 32;

/// Routes that broke in a row before a store stops learning one.
const BROKEN_LIMIT: u32 = 3;

/// Where a store's puts go whole, shared by the store, its clones and its siblings.
#[derive(Default)]
pub(crate) struct WholeRoute {
    state: Mutex<Route>,
    /// Routes that broke since a node last took a put.
    broken: std::sync::atomic::AtomicU32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Route {
    /// No write landed yet, or the last route broke.
    #[default]
    Unknown,
    /// Writes landed wholly on this node; its STATS are asked on the next put.
    Candidate(String),
    /// Puts go whole to this node (`local`: PUT_LOCAL, else PUT_WHOLE); `gets`: it takes
    /// gets whole the same way too (GET_LOCAL, else GET_WHOLE).
    Via {
        endpoint: String,
        local: bool,
        gets: bool,
        handed: u64,
        left: u64,
    },
    /// Not for this store: the node does not take whole puts, or the master places most keys
    /// elsewhere.
    Off,
}

impl WholeRoute {
    /// The route of a store built from `config`: off for good when the store must not hand
    /// puts over (`hand_puts_to_node` off) or copies its own node's replicas in process
    /// (`local_segments`), so its writes do not even note where they land.
    pub(crate) fn for_config(config: &super::StoreConfig) -> WholeRoute {
        let route = WholeRoute::default();
        if !config.hand_puts_to_node || config.local_segments.is_some() {
            *route.state.lock() = Route::Off;
        }
        route
    }

    /// Notes where the master placed a write's keys (each key's replicas): the node that holds
    /// every memory replica of all of them, if there is one, becomes the candidate.
    pub(crate) fn note<'a>(&self, placed: impl IntoIterator<Item = &'a [ReplicaDescriptor]>) {
        if *self.state.lock() != Route::Unknown {
            return;
        }
        let mut node: Option<&str> = None;
        for replicas in placed {
            for r in replicas {
                if r.kind != ReplicaKind::Memory || node.is_some_and(|n| n != &*r.endpoint) {
                    return;
                }
                node = Some(&r.endpoint);
            }
        }
        if let Some(node) = node {
            let mut state = self.state.lock();
            if *state == Route::Unknown {
                *state = Route::Candidate(node.to_string());
            }
        }
    }

    /// Counts how many of `handed` keys the node left to the usual path; turns the route off
    /// when too many were.
    fn count(&self, handed: u64, left: u64) {
        self.broken.store(0, Ordering::Relaxed);
        let mut state = self.state.lock();
        if let Route::Via {
            handed: h, left: l, ..
        } = &mut *state
        {
            *h += handed;
            *l += left;
            if *h >= JUDGED_AFTER && *l * LEFT_LIMIT > *h {
                tracing::debug!(
                    handed = *h,
                    left = *l,
                    "the master places most keys on other nodes; puts go the usual way"
                );
                *state = Route::Off;
            }
        }
    }

    /// Back to learning: the node could not be reached, refused the request, or its
    /// connection broke. After [`BROKEN_LIMIT`] such routes in a row, off for good (a node
    /// that refuses what its STATS promised).
    pub(crate) fn forget(&self) {
        let broken = self.broken.fetch_add(1, Ordering::Relaxed) + 1;
        let mut state = self.state.lock();
        if matches!(*state, Route::Via { .. } | Route::Candidate(_)) {
            *state = if broken >= BROKEN_LIMIT {
                Route::Off
            } else {
                Route::Unknown
            };
        }
    }

    #[cfg(test)]
    fn is_via(&self) -> bool {
        matches!(*self.state.lock(), Route::Via { .. })
    }

    #[cfg(test)]
    fn is_off(&self) -> bool {
        *self.state.lock() == Route::Off
    }
}

impl Store {
    /// Hands the put of `objects` under `keys` to the node this store's writes land on, when
    /// it has one ([`WholeRoute`]). `None`: nothing was done, write every key the usual way.
    /// Keys and sizes must be valid (checked by the caller).
    pub(crate) async fn put_whole(
        &self,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        config: &ReplicateConfig,
    ) -> Option<NodeAnswers> {
        if keys.is_empty() || keys.len() > MAX_KEYS_THROUGH_NODE {
            return None;
        }
        let (ranges, sizes) = laid_end_to_end(
            objects
                .iter()
                .map(|parts| parts.iter().map(|p| (p.as_ptr() as u64, p.len() as u64))),
        );
        let total: u64 = sizes.iter().sum();
        let (endpoint, local, _) = self.whole_route().await?;
        // PUT_LOCAL needs an attached connection in this store's own pool (a sibling's pool
        // starts empty); a node that attaches none takes the bytes over the socket.
        let local = local && self.attached_to(&endpoint).await;
        // Calls the node would not take go the usual way, and the route stays. So does a socket
        // call over one request's bytes: several lanes at once move it faster than one
        // connection, and faster than several PUT_WHOLE requests at once did
        // (`docs/benchmarks.md`, *Socket batches over 1 MiB the usual way again*).
        let answers = if local {
            if !node_takes(&sizes) || ranges.len() > MAX_LOCAL_RANGES {
                return None;
            }
            self.put_through_node_at(&endpoint, kind, keys, objects, config)
                .await
        } else if sizes.contains(&0) || total > WHOLE_SOCKET_BYTES {
            return None;
        } else {
            self.put_whole_over_socket(&endpoint, kind, keys, objects, sizes, config)
                .await
        };
        let Some(answers) = answers else {
            self.whole.forget();
            return None;
        };
        let left = answers.iter().filter(|a| a.is_none()).count() as u64;
        self.whole.count(keys.len() as u64, left);
        Some(answers)
    }

    /// Whether this store's pool copies straight to and from the node at `endpoint`, dialling
    /// it first when the pool holds no connection there yet.
    pub(crate) async fn attached_to(&self, endpoint: &str) -> bool {
        let pool = self.transfer.pool();
        if !pool.same_host(endpoint) {
            if let Ok((conn, _)) = pool.checkout(endpoint).await {
                pool.checkin(conn);
            }
        }
        pool.same_host(endpoint)
    }

    /// The node puts (and gets) are handed to, asking a candidate's STATS first: its
    /// endpoint, whether puts go to it as PUT_LOCAL, and whether it takes gets whole.
    pub(crate) async fn whole_route(&self) -> Option<(String, bool, bool)> {
        let candidate = match &*self.whole.state.lock() {
            Route::Via {
                endpoint,
                local,
                gets,
                ..
            } => return Some((endpoint.clone(), *local, *gets)),
            Route::Candidate(endpoint) => endpoint.clone(),
            Route::Unknown | Route::Off => return None,
        };
        let stats = self.node_stats(&candidate).await;
        let local = self.config.same_host && self.transfer.pool().same_host(&candidate);
        let next = match stats {
            Some(s) if (local && s.put_local) || s.put_whole => Route::Via {
                endpoint: candidate.clone(),
                local: local && s.put_local,
                // Gets go as the puts do: GET_LOCAL on this machine, else GET_WHOLE.
                gets: if local && s.put_local {
                    s.get_local
                } else {
                    s.get_whole
                },
                handed: 0,
                left: 0,
            },
            Some(_) => Route::Off,
            None => Route::Unknown,
        };
        let mut state = self.whole.state.lock();
        if *state == Route::Candidate(candidate) {
            *state = next;
        }
        match &*state {
            Route::Via {
                endpoint,
                local,
                gets,
                ..
            } => Some((endpoint.clone(), *local, *gets)),
            _ => None,
        }
    }

    /// The STATS of the node at `endpoint`, on a connection of this store's pool; `None` when
    /// it cannot be had.
    async fn node_stats(&self, endpoint: &str) -> Option<moonkv_dataplane::NodeStats> {
        let (mut conn, _) = self.transfer.pool().checkout(endpoint).await.ok()?;
        let stats = tokio::time::timeout(self.config.rpc_timeout, conn.stats()).await;
        match stats {
            Ok(Ok(stats)) => {
                self.transfer.pool().checkin(conn);
                Some(stats)
            }
            _ => None,
        }
    }

    /// One PUT_WHOLE to the node at `endpoint` (`sizes`: each object's bytes): one answer per key, `None` for a key the node
    /// left to the usual path. `None` as a whole: the node took nothing.
    async fn put_whole_over_socket(
        &self,
        endpoint: &str,
        kind: WriteKind,
        keys: &[&str],
        objects: &[&[&[u8]]],
        sizes: Vec<u64>,
        config: &ReplicateConfig,
    ) -> Option<NodeAnswers> {
        let total: u64 = sizes.iter().sum();
        let body = self.whole_put_body(kind, keys, sizes, config)?;
        let parts: Vec<&[u8]> = objects.iter().flat_map(|p| p.iter().copied()).collect();
        let failed = |e: Error| Some((0..keys.len()).map(|_| Some(Err(e.clone()))).collect());
        // The node's start, the bytes, its end.
        let wait =
            self.config.rpc_timeout * 2 + self.transfer.step_timeout() + Duration::from_secs(1);
        let (mut conn, mut reused) = self.transfer.pool().checkout(endpoint).await.ok()?;
        let answer = loop {
            match tokio::time::timeout(wait, conn.put_whole(&body, &parts)).await {
                Err(_) => {
                    return failed(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        format!("node {endpoint} did not answer a put within {wait:?}"),
                    ))
                }
                // An idle connection the node had already closed: it saw nothing of the
                // request, so it goes again on a fresh one.
                Ok(Err(_)) if reused => {
                    reused = false;
                    self.transfer.pool().redial(&mut conn).await.ok()?;
                }
                // The connection broke: what the node did is not known, so the keys fail (a
                // key it ended stays; one it did not is revoked by the node).
                Ok(Err(e)) => return failed(e),
                // Refused before anything was placed: the usual path does it all.
                Ok(Ok(Err(_status))) => {
                    self.transfer.pool().checkin(conn);
                    return None;
                }
                Ok(Ok(Ok(answer))) => break answer,
            }
        };
        self.transfer.pool().checkin(conn);
        self.transfer.advance(total as usize);
        let items: Vec<ItemResult<()>> = match rmp_serde::from_slice(&answer) {
            Ok(items) if Vec::len(&items) == keys.len() => items,
            _ => {
                return failed(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!(
                    "node {endpoint} answered a put with something else than one result per key"
                ),
                ))
            }
        };
        Some(
            items
                .into_iter()
                .map(|item| (!left_to_caller(&item.0)).then_some(item.0))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_proto::{ReplicaId, ReplicaStatus, SegmentId};

    fn at(endpoint: &str, kind: ReplicaKind) -> ReplicaDescriptor {
        ReplicaDescriptor {
            id: ReplicaId(1),
            kind,
            status: ReplicaStatus::Complete,
            size: 1,
            segment_id: SegmentId::new(0, 0),
            segment_name: "s".into(),
            endpoint: endpoint.into(),
            address: 0,
            grant: None,
        }
    }

    #[test]
    fn a_store_that_must_not_hand_puts_over_never_learns_a_route() {
        let mut config = super::super::StoreConfig::new("m:1");
        config.hand_puts_to_node = false;
        let route = WholeRoute::for_config(&config);
        route.note([&[at("a:1", ReplicaKind::Memory)][..]]);
        assert!(route.is_off());
        assert_eq!(
            *WholeRoute::for_config(&super::super::StoreConfig::new("m:1"))
                .state
                .lock(),
            Route::Unknown
        );
    }

    #[test]
    fn only_writes_wholly_on_one_node_make_it_the_candidate() {
        let route = WholeRoute::default();
        let a = [at("a:1", ReplicaKind::Memory)];
        let b = [at("b:1", ReplicaKind::Memory)];
        route.note([&a[..], &b[..]]);
        assert_eq!(*route.state.lock(), Route::Unknown, "two nodes");
        let disk = [at("a:1", ReplicaKind::LocalDisk)];
        route.note([&disk[..]]);
        assert_eq!(*route.state.lock(), Route::Unknown, "a disk replica");
        route.note([&a[..], &a[..]]);
        assert_eq!(*route.state.lock(), Route::Candidate("a:1".into()));
        route.note([&b[..]]);
        assert_eq!(*route.state.lock(), Route::Candidate("a:1".into()), "kept");
    }

    #[test]
    fn a_node_that_leaves_most_keys_to_the_usual_path_is_dropped() {
        let route = WholeRoute::default();
        *route.state.lock() = Route::Via {
            endpoint: "a:1".into(),
            local: false,
            gets: false,
            handed: 0,
            left: 0,
        };
        // One key in LEFT_LIMIT left over is tolerated.
        for _ in 0..20 {
            route.count(LEFT_LIMIT, 1);
        }
        assert!(route.is_via());
        route.count(JUDGED_AFTER, JUDGED_AFTER / 2);
        assert!(route.is_off());
        route.forget();
        assert!(route.is_off(), "off stays off");
    }

    #[test]
    fn a_broken_route_is_learnt_again() {
        let route = WholeRoute::default();
        *route.state.lock() = Route::Via {
            endpoint: "a:1".into(),
            local: true,
            gets: false,
            handed: 0,
            left: 0,
        };
        route.forget();
        assert_eq!(*route.state.lock(), Route::Unknown);
        let b = [at("b:1", ReplicaKind::Memory)];
        route.note([&b[..]]);
        assert_eq!(*route.state.lock(), Route::Candidate("b:1".into()));
    }

    #[test]
    fn a_route_that_keeps_breaking_is_given_up_and_one_that_works_is_not() {
        let route = WholeRoute::default();
        let a = [at("a:1", ReplicaKind::Memory)];
        let via = || Route::Via {
            endpoint: "a:1".into(),
            local: true,
            gets: false,
            handed: 0,
            left: 0,
        };
        for _ in 0..BROKEN_LIMIT - 1 {
            *route.state.lock() = via();
            route.forget();
            // A put in between that the node took resets the count.
            *route.state.lock() = via();
            route.count(1, 0);
            route.forget();
            assert_eq!(*route.state.lock(), Route::Unknown);
        }
        route.count(1, 0);
        for _ in 0..BROKEN_LIMIT - 1 {
            route.note([&a[..]]);
            route.forget();
            assert_eq!(*route.state.lock(), Route::Unknown);
        }
        route.note([&a[..]]);
        route.forget();
        assert!(route.is_off());
    }
}
