//! Put and get sessions (`batch_put_session_*`, `batch_get_session_*` and the
//! `*_multi_buffer_ranges` calls between them): a batch started once and moved in byte ranges
//! over many calls, layer by layer, with no master request between its start and its end.
//!
//! What a session holds lives in its store's engine, so `close()` forgets every open session:
//! the master frees a put session's space at its discard timeout, as for any abandoned write.
//!
//! A put session whose range write failed in a way that may still land later (a timeout, a
//! cancelled transfer) cannot be ended, only revoked: ending it could commit bytes that change
//! afterwards. `batch_put_session_end` waits for the session's range writes in flight in other
//! threads, and no range write starts once an end or revoke has begun.

// Unsafe here: slices of registered memory, made only from ranges that `registry` checked to lie
// inside one registration, while the call holds that registration's lease; no two destinations
// of one read overlap (`check` refuses them).
#![allow(unsafe_code)]

use super::zero_copy::check;
use crate::engine::Engine;
use crate::errors::invalid;
use crate::registry::{self, Range};
use moonkv_client::store::{RangeRead, RangeWrite};
use moonkv_proto::types::{ReplicaDescriptor, ReplicateConfig};
use moonkv_proto::{Error, ErrorCode, ReplicaId};
use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The open sessions of one store.
#[derive(Default)]
pub(crate) struct Sessions {
    puts: Mutex<HashMap<String, PutSession>>,
    /// Signalled when a put session's range writes in flight drop to none.
    settled: Condvar,
    gets: Mutex<HashMap<String, GetSession>>,
}

impl Sessions {
    /// Opens a put session for `key` (its writes started with `replicas`, `size` bytes).
    fn open_put(&self, key: String, replicas: Vec<ReplicaDescriptor>, size: u64) {
        self.puts.lock().insert(
            key,
            PutSession {
                replicas,
                size,
                writable: true,
                in_flight: 0,
                unsettled: false,
            },
        );
    }

    /// A range write of `key` begins, if its session is open and not sealed: its replicas and
    /// size. Every `Some` is matched by one [`Sessions::write_done`].
    fn begin_write(&self, key: &str) -> Option<(Vec<ReplicaDescriptor>, u64)> {
        let mut open = self.puts.lock();
        let s = open.get_mut(key).filter(|s| s.writable)?;
        s.in_flight += 1;
        Some((s.replicas.clone(), s.size))
    }

    /// Range writes of `keys` ended; `unsettled[i]`: key i's write may still land.
    fn write_done(&self, keys: &[String], unsettled: &[bool]) {
        let mut open = self.puts.lock();
        for (key, &unsettled) in keys.iter().zip(unsettled) {
            if let Some(s) = open.get_mut(key) {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.unsettled |= unsettled;
            }
        }
        drop(open);
        self.settled.notify_all();
    }

    /// Seals the put sessions of `keys` against new range writes; per key its name when it has
    /// a session.
    fn seal(&self, keys: &[Result<String, Error>]) -> Vec<Option<String>> {
        let mut open = self.puts.lock();
        keys.iter()
            .map(|k| {
                let k = k.as_ref().ok()?;
                let s = open.get_mut(k)?;
                s.writable = false;
                Some(k.clone())
            })
            .collect()
    }

    /// Blocks until no range write of the sessions `names` is in flight.
    fn wait_writes(&self, names: &[Option<String>]) {
        let mut open = self.puts.lock();
        while names
            .iter()
            .flatten()
            .any(|k| open.get(k).is_some_and(|s| s.in_flight > 0))
        {
            self.settled.wait(&mut open);
        }
    }
}

struct PutSession {
    replicas: Vec<ReplicaDescriptor>,
    size: u64,
    /// False once an end or revoke began: no range write starts after.
    writable: bool,
    /// Range writes running now.
    in_flight: usize,
    /// A range write failed and may still land.
    unsettled: bool,
}

impl PutSession {
    fn ids(&self) -> Vec<ReplicaId> {
        self.replicas.iter().map(|r| r.id).collect()
    }
}

struct GetSession {
    replica: ReplicaDescriptor,
    started: Instant,
    lease: Duration,
}

impl GetSession {
    fn lease_expired(&self) -> bool {
        self.started.elapsed() >= self.lease
    }
}

fn no_session(kind: &str, key: &str) -> Error {
    invalid(format!("no {kind} session is open for '{key}'"))
}

/// Why `key` (as the caller gave it) has no put session to end or revoke.
fn no_put_session(key: &Result<String, Error>) -> Error {
    match key {
        Err(e) => e.clone(),
        Ok(k) => no_session("put", k),
    }
}

fn lease_expired(key: &str) -> Error {
    Error::new(
        ErrorCode::LEASE_EXPIRED,
        format!("the read lease of the get session of '{key}' ran out; start the session again"),
    )
}

/// The per-key ranges of a `*_multi_buffer_ranges` call: `(offset in the object, caller
/// memory)`, or why the key's lists cannot be used.
type KeyRanges = Vec<Result<Vec<(u64, Range)>, Error>>;

fn key_ranges(ptrs: &[Vec<usize>], sizes: &[Vec<usize>], offsets: &[Vec<usize>]) -> KeyRanges {
    ptrs.iter()
        .zip(sizes)
        .zip(offsets)
        .map(|((p, s), o)| {
            if p.len() != s.len() || p.len() != o.len() {
                return Err(invalid(
                    "one buffer size and one object offset per buffer pointer",
                ));
            }
            Ok(p.iter()
                .zip(s)
                .zip(o)
                .map(|((&ptr, &len), &offset)| (offset as u64, Range { ptr, len }))
                .collect())
        })
        .collect()
}

/// The lists of a `*_multi_buffer_ranges` call, refused as a whole when their lengths differ.
pub(super) struct RangeLists {
    pub keys: Vec<Result<String, Error>>,
    pub ptrs: Vec<Vec<usize>>,
    pub sizes: Vec<Vec<usize>>,
    pub offsets: Vec<Vec<usize>>,
}

impl RangeLists {
    fn split(self) -> Result<(Vec<Result<String, Error>>, KeyRanges), Error> {
        let n = self.keys.len();
        if self.ptrs.len() != n || self.sizes.len() != n || self.offsets.len() != n {
            return Err(invalid(
                "keys, all_buffer_ptrs, all_sizes and the offsets must have one entry per key",
            ));
        }
        let ranges = key_ranges(&self.ptrs, &self.sizes, &self.offsets);
        Ok((self.keys, ranges))
    }
}

/// Per key, the first error among its ranges (`errors` lists them in order).
fn first_errors(ranges: &KeyRanges, errors: Vec<Option<Error>>) -> Vec<Option<Error>> {
    let mut errors = errors.into_iter();
    ranges
        .iter()
        .map(|r| match r {
            Ok(rs) => errors.by_ref().take(rs.len()).flatten().next(),
            Err(_) => None,
        })
        .collect()
}

fn flat(ranges: &KeyRanges) -> Vec<Range> {
    ranges
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .flatten()
        .map(|(_, r)| *r)
        .collect()
}

/// A `*_multi_buffer_ranges` call after its checks: the registrations leased for it, each key's
/// ranges, a result per key (the error of each key that cannot be used) and the keys that can,
/// with their positions.
struct Checked {
    lease: registry::Lease,
    ranges: KeyRanges,
    results: Vec<Result<u64, Error>>,
    usable: Vec<(usize, String)>,
}

/// Checks the lists of a `*_multi_buffer_ranges` call and leases their memory (`writable`: it
/// is written into, so no two ranges may overlap); `Err` holds the answer of a call refused as
/// a whole.
fn checked(
    engine: &Engine,
    lists: RangeLists,
    writable: bool,
) -> Result<Checked, Vec<Result<u64, Error>>> {
    let n = lists.keys.len();
    let (keys, ranges) = lists
        .split()
        .map_err(|e| (0..n).map(|_| Err(e.clone())).collect::<Vec<_>>())?;
    let (lease, errors) = check(engine, &flat(&ranges), writable);
    let errors = first_errors(&ranges, errors);
    let mut results: Vec<Result<u64, Error>> = (0..n).map(|_| Ok(0)).collect();
    let mut usable = Vec::new();
    let mut seen = HashSet::new();
    for (i, key) in keys.iter().enumerate() {
        match (key, &ranges[i], &errors[i]) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Some(e)) => results[i] = Err(e.clone()),
            (Ok(key), Ok(_), None) if !seen.insert(key.as_str()) => {
                results[i] = Err(invalid(format!("'{key}' is named twice")));
            }
            (Ok(key), Ok(_), None) => usable.push((i, key.clone())),
        }
    }
    Ok(Checked {
        lease,
        ranges,
        results,
        usable,
    })
}

/// `batch_put_session_start`: per key, 0 or a code.
pub(super) fn put_start(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
    sizes: Vec<usize>,
    config: ReplicateConfig,
) -> Vec<Result<(), Error>> {
    let n = keys.len();
    if sizes.len() != n {
        let e = invalid("keys and sizes must have the same length");
        return (0..n).map(|_| Err(e.clone())).collect();
    }
    let mut results: Vec<Result<(), Error>> = (0..n).map(|_| Ok(())).collect();
    let mut starting: Vec<usize> = Vec::new();
    {
        let open = engine.sessions.puts.lock();
        let mut seen = HashSet::new();
        for (i, key) in keys.iter().enumerate() {
            match key {
                Err(e) => results[i] = Err(e.clone()),
                Ok(k) if open.contains_key(k) => {
                    results[i] = Err(invalid(format!("a put session is already open for '{k}'")))
                }
                Ok(k) if !seen.insert(k.as_str()) => {
                    results[i] = Err(invalid(format!("'{k}' is named twice")))
                }
                Ok(_) => starting.push(i),
            }
        }
    }
    if starting.is_empty() {
        return results;
    }
    let mut config = config;
    if let Some(groups) = &config.group_ids {
        if groups.len() != n {
            let e = invalid("group_ids must have one entry per key");
            return (0..n).map(|_| Err(e.clone())).collect();
        }
        config.group_ids = Some(starting.iter().map(|&i| groups[i].clone()).collect());
    }
    let names: Vec<&str> = starting
        .iter()
        .map(|&i| keys[i].as_deref().unwrap_or_default())
        .collect();
    let lens: Vec<u64> = starting.iter().map(|&i| sizes[i] as u64).collect();
    let (names, lens, config) = (&names, &lens, &config);
    let started = engine.run(py, |store| async move {
        store.start_writes(names, lens, config).await
    });
    for ((&i, name), outcome) in starting.iter().zip(names.iter()).zip(started) {
        match outcome {
            Ok(replicas) => engine
                .sessions
                .open_put(name.to_string(), replicas, sizes[i] as u64),
            Err(e) => results[i] = Err(e),
        }
    }
    results
}

/// `batch_put_from_multi_buffer_ranges`: per key, the bytes written or a code.
pub(super) fn put_ranges(
    py: Python<'_>,
    engine: &Engine,
    lists: RangeLists,
) -> Vec<Result<u64, Error>> {
    let Checked {
        lease,
        ranges,
        mut results,
        usable,
    } = match checked(engine, lists, false) {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    // Each key written: its position, name, replicas and size.
    let mut taken: Vec<(usize, String, Vec<ReplicaDescriptor>, u64)> = Vec::new();
    for (i, key) in usable {
        match engine.sessions.begin_write(&key) {
            Some((replicas, size)) => taken.push((i, key, replicas, size)),
            None => results[i] = Err(no_session("put", &key)),
        }
    }
    if taken.is_empty() {
        return results;
    }
    // Whatever happens below, the writes taken stop counting as in flight.
    struct InFlight<'e> {
        sessions: &'e Sessions,
        keys: Vec<String>,
        unsettled: Vec<bool>,
    }
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.unsettled.resize(self.keys.len(), false);
            self.sessions.write_done(&self.keys, &self.unsettled);
        }
    }
    let mut guard = InFlight {
        sessions: &engine.sessions,
        keys: taken.iter().map(|t| t.1.clone()).collect(),
        unsettled: Vec::new(),
    };
    let writes: Vec<RangeWrite<'_>> = taken
        .iter()
        .map(|(i, _, replicas, size)| RangeWrite {
            replicas,
            size: *size,
            pieces: ranges[*i]
                .as_ref()
                .map(|rs| {
                    rs.iter()
                        // SAFETY: `check` found every range of this key inside a registration
                        // that `lease` keeps registered for the call.
                        .map(|(offset, r)| (*offset, unsafe { registry::slice(*r, &lease) }))
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let writes = &writes;
    let written = engine.run(py, |store| async move { store.write_ranges(writes).await });
    for ((i, _, replicas, _), outcome) in taken.iter().zip(written) {
        let ids: Vec<ReplicaId> = replicas.iter().map(|r| r.id).collect();
        guard
            .unsettled
            .push(outcome.is_err() && engine.store.writes_unsettled(&ids));
        results[*i] = outcome;
    }
    drop(guard);
    results
}

/// Seals the put sessions of `keys` against new range writes and waits, without the GIL, until
/// none of theirs is in flight. Per key: its name when it has a session.
fn seal(py: Python<'_>, engine: &Engine, keys: &[Result<String, Error>]) -> Vec<Option<String>> {
    let sealed = engine.sessions.seal(keys);
    py.detach(|| engine.sessions.wait_writes(&sealed));
    sealed
}

/// `batch_put_session_end`: per key, 0 or a code. A key whose end failed keeps its (sealed)
/// session, so that it can still be revoked.
pub(super) fn put_end(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
) -> Vec<Result<(), Error>> {
    let sealed = seal(py, engine, &keys);
    let mut results: Vec<Result<(), Error>> = Vec::with_capacity(keys.len());
    let mut ending: Vec<(usize, String, Vec<ReplicaId>)> = Vec::new();
    {
        let mut open = engine.sessions.puts.lock();
        for (i, (key, name)) in keys.iter().zip(&sealed).enumerate() {
            let Some(name) = name else {
                results.push(Err(no_put_session(key)));
                continue;
            };
            let Some(s) = open.get_mut(name) else {
                results.push(Err(no_session("put", name)));
                continue;
            };
            let ids = s.ids();
            s.unsettled |= engine.store.writes_unsettled(&ids);
            if s.unsettled {
                results.push(Err(Error::new(
                    ErrorCode::TRANSFER_FAIL,
                    format!(
                        "a range write of '{name}' failed and may still land; revoke its session"
                    ),
                )));
                continue;
            }
            results.push(Ok(()));
            ending.push((i, name.clone(), ids));
        }
    }
    if ending.is_empty() {
        return results;
    }
    let items: Vec<(&str, Vec<ReplicaId>)> = ending
        .iter()
        .map(|(_, k, ids)| (k.as_str(), ids.clone()))
        .collect();
    let items = &items;
    let ended = engine.run(py, |store| async move { store.end_writes(items).await });
    let mut open = engine.sessions.puts.lock();
    for ((i, name, _), outcome) in ending.iter().zip(ended) {
        if outcome.is_ok() {
            open.remove(name);
        }
        results[*i] = outcome;
    }
    results
}

/// `batch_put_session_revoke`: per key, 0 or a code; the session is gone either way.
pub(super) fn put_revoke(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
) -> Vec<Result<(), Error>> {
    let sealed = seal(py, engine, &keys);
    let mut results: Vec<Result<(), Error>> = Vec::with_capacity(keys.len());
    let mut revoking: Vec<(usize, String, Vec<ReplicaId>, bool)> = Vec::new();
    {
        let mut open = engine.sessions.puts.lock();
        for (i, (key, name)) in keys.iter().zip(&sealed).enumerate() {
            let Some(s) = name.as_ref().and_then(|n| open.remove(n)) else {
                results.push(Err(no_put_session(key)));
                continue;
            };
            let ids = s.ids();
            let unsettled = s.unsettled || engine.store.writes_unsettled(&ids);
            results.push(Ok(()));
            revoking.push((i, name.clone().unwrap_or_default(), ids, unsettled));
        }
    }
    if revoking.is_empty() {
        return results;
    }
    let items: Vec<(&str, Vec<ReplicaId>, bool)> = revoking
        .iter()
        .map(|(_, k, ids, unsettled)| (k.as_str(), ids.clone(), *unsettled))
        .collect();
    let items = &items;
    let revoked = engine.run(py, |store| async move { store.revoke_writes(items).await });
    for ((i, ..), outcome) in revoking.iter().zip(revoked) {
        results[*i] = outcome;
    }
    results
}

/// `batch_get_session_start`: per key, 0 or a code (a key without a complete memory replica
/// gets `INVALID_REPLICA`).
pub(super) fn get_start(
    py: Python<'_>,
    engine: &Engine,
    keys: Vec<Result<String, Error>>,
) -> Vec<Result<(), Error>> {
    let names: Vec<&str> = keys.iter().map(|k| k.as_deref().unwrap_or("")).collect();
    let names = &names;
    let (started, lists) = engine.run(py, |store| async move { store.batch_lists(names).await });
    let mut open = engine.sessions.gets.lock();
    keys.iter()
        .zip(lists)
        .map(|(key, list)| {
            let key = key.as_ref().map_err(Clone::clone)?;
            open.remove(key);
            let list = list?;
            let replica = engine
                .store
                .session_replica(&list)
                .cloned()
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::INVALID_REPLICA,
                        format!("'{key}' has no complete memory replica to read in ranges"),
                    )
                })?;
            open.insert(
                key.clone(),
                GetSession {
                    replica,
                    started,
                    lease: Duration::from_millis(list.lease_ttl_ms),
                },
            );
            Ok(())
        })
        .collect()
}

/// `batch_get_into_multi_buffer_ranges`: per key, the bytes read or a code. A key whose lease
/// ran out, before or during the read, gets `LEASE_EXPIRED` and loses its session.
pub(super) fn get_ranges(
    py: Python<'_>,
    engine: &Engine,
    lists: RangeLists,
) -> Vec<Result<u64, Error>> {
    let Checked {
        lease,
        ranges,
        mut results,
        usable,
    } = match checked(engine, lists, true) {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    let mut taken: Vec<(usize, String, ReplicaDescriptor, Instant, Duration)> = Vec::new();
    {
        let mut open = engine.sessions.gets.lock();
        for (i, key) in usable {
            match open.get(&key) {
                Some(s) if s.lease_expired() => {
                    open.remove(&key);
                    results[i] = Err(lease_expired(&key));
                }
                Some(s) => taken.push((i, key, s.replica.clone(), s.started, s.lease)),
                None => results[i] = Err(no_session("get", &key)),
            }
        }
    }
    if taken.is_empty() {
        return results;
    }
    let mut reads: Vec<RangeRead<'_>> = taken
        .iter()
        .map(|(i, _, replica, ..)| RangeRead {
            replica,
            pieces: ranges[*i]
                .as_ref()
                .map(|rs| {
                    rs.iter()
                        // SAFETY: checked and leased as above, and no destination of this call
                        // overlaps another (`check` with `writable`).
                        .map(|(offset, r)| (*offset, unsafe { registry::slice_mut(*r, &lease) }))
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let reads_ref = &mut reads;
    let read = engine.run(
        py,
        |store| async move { store.read_ranges(reads_ref).await },
    );
    drop(reads);
    let mut open = engine.sessions.gets.lock();
    for ((i, key, _, started, ttl), outcome) in taken.iter().zip(read) {
        results[*i] = if started.elapsed() >= *ttl {
            open.remove(key);
            Err(lease_expired(key))
        } else {
            outcome
        };
    }
    results
}

/// `batch_get_session_end`: forgets the get sessions of `keys`.
pub(super) fn get_end(engine: &Engine, keys: &[Result<String, Error>]) {
    let mut open = engine.sessions.gets.lock();
    for key in keys.iter().flatten() {
        open.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_seal_waits_for_the_range_writes_in_flight_and_refuses_new_ones() {
        let sessions = Sessions::default();
        sessions.open_put("k".into(), Vec::new(), 64);
        sessions.open_put("other".into(), Vec::new(), 64);
        assert!(sessions.begin_write("k").is_some());
        let keys = vec![Ok("k".to_string()), Ok("none".to_string())];
        std::thread::scope(|scope| {
            let (done, sealed) = mpsc::channel();
            let sessions = &sessions;
            scope.spawn(move || {
                let names = sessions.seal(&keys);
                sessions.wait_writes(&names);
                done.send(names).unwrap();
            });
            // The seal cannot finish while the write is in flight.
            assert!(sealed.recv_timeout(Duration::from_millis(200)).is_err());
            assert!(sessions.begin_write("k").is_none(), "sealed: no new write");
            assert!(
                sessions.begin_write("other").is_some(),
                "other sessions are untouched"
            );
            sessions.write_done(&["other".into()], &[false]);
            sessions.write_done(&["k".into()], &[true]);
            let names = sealed.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(names, vec![Some("k".to_string()), None]);
        });
        let open = sessions.puts.lock();
        assert!(open["k"].unsettled && !open["k"].writable && open["k"].in_flight == 0);
        assert!(open["other"].writable && !open["other"].unsettled);
    }
}
