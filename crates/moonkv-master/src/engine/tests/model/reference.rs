//! The reference model the engine is compared with, operation by operation.
//!
//! It covers one client in the default tenant, two segment names, no pins, groups or disks,
//! and is written from the documented rules rather than from the engine's structure: no shards,
//! allocators, lazy cleanup or in-flight bookkeeping, just a map of objects with their copies.
//! Replica ids are random in the engine, so the model takes them from each Start's answer (after
//! the harness checked they are new) and predicts everything else.

use moonkv_proto::{ErrorCode, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};

/// The timing rules the model applies, in ms.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    pub(super) lease_ms: u64,
    pub(super) discard_ms: u64,
    pub(super) release_ms: u64,
}

/// What one operation answered, in a form both the engine and the model can produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reply {
    /// A Start: (segment, size, complete) per replica, sorted by segment.
    Placed(Vec<(String, u64, bool)>),
    /// A Get: the lease it granted and (id, segment, size) per readable replica, sorted by id.
    Replicas {
        lease_ms: u64,
        copies: Vec<(ReplicaId, String, u64)>,
    },
    Exists(bool),
    Count(u64),
    Evicted {
        keys: u64,
        bytes: u64,
        released: u64,
    },
    Done,
}

pub(super) type Outcome = Result<Reply, ErrorCode>;

/// One copy of an object: where it is and whether its writer's End arrived.
#[derive(Clone, Debug)]
struct ModelReplica {
    id: ReplicaId,
    segment: String,
    complete: bool,
}

#[derive(Clone, Debug)]
struct Object {
    size: u64,
    copies: Vec<ModelReplica>,
    put_start_ms: u64,
    lease_until_ms: u64,
}

impl Object {
    fn readable(&self) -> bool {
        self.copies.iter().any(|c| c.complete)
    }

    fn writing(&self) -> bool {
        self.copies.iter().any(|c| !c.complete)
    }

    fn leased(&self, now: u64) -> bool {
        now < self.lease_until_ms
    }

    fn ids(&self, complete: bool) -> BTreeSet<ReplicaId> {
        self.copies
            .iter()
            .filter(|c| c.complete == complete)
            .map(|c| c.id)
            .collect()
    }
}

/// True iff `given` names exactly `expected`, each id once.
fn names_exactly(given: &[ReplicaId], expected: &BTreeSet<ReplicaId>) -> bool {
    given.len() == expected.len() && given.iter().copied().collect::<BTreeSet<_>>() == *expected
}

/// The whole master as the model sees it.
#[derive(Debug)]
pub(super) struct Model {
    timing: Timing,
    now: u64,
    objects: BTreeMap<String, Object>,
    /// Release deadlines of buffers taken from replaced or abandoned writes: a slow writer may
    /// still be writing into them until then.
    parked: Vec<u64>,
    mounted: BTreeSet<String>,
}

impl Model {
    pub(super) fn new(timing: Timing, now: u64, mounted: &[&str]) -> Self {
        Self {
            timing,
            now,
            objects: BTreeMap::new(),
            parked: Vec::new(),
            mounted: mounted.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub(super) fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    /// PutStart (or UpsertStart): placement follows `prefer`, one copy per mounted name.
    pub(super) fn start(
        &mut self,
        key: &str,
        size: u64,
        replicas: usize,
        prefer: &[&str],
        upsert: bool,
    ) -> Outcome {
        if upsert {
            if let Some(rewritten) = self.upsert_existing(key, size) {
                return Ok(rewritten);
            }
        } else {
            self.take_over_abandoned(key)?;
        }
        let copies: Vec<ModelReplica> = prefer
            .iter()
            .filter(|s| self.mounted.contains(**s))
            .take(replicas)
            .map(|s| ModelReplica {
                id: ReplicaId(0),
                segment: s.to_string(),
                complete: false,
            })
            .collect();
        if copies.is_empty() {
            return Err(ErrorCode::NO_AVAILABLE_HANDLE);
        }
        let obj = Object {
            size,
            copies,
            put_start_ms: self.now,
            lease_until_ms: 0,
        };
        let reply = Self::placed(&obj);
        self.objects.insert(key.to_string(), obj);
        Ok(reply)
    }

    /// A Put finds the key taken unless the object there is an abandoned write: nothing
    /// readable, started more than the discard timeout ago. Its buffers stay parked until its
    /// writer's release deadline, as that writer may still be writing into them.
    fn take_over_abandoned(&mut self, key: &str) -> Result<(), ErrorCode> {
        let Some(obj) = self.objects.get(key) else {
            return Ok(());
        };
        if obj.readable() || self.now <= obj.put_start_ms + self.timing.discard_ms {
            return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
        }
        let (buffers, until) = (obj.copies.len(), obj.put_start_ms + self.timing.release_ms);
        self.objects.remove(key);
        self.park(buffers, until);
        Ok(())
    }

    /// An upsert preempts a write in flight at once (its buffers parked for the release
    /// timeout), then rewrites a same-size object without a lease in place (the answer), or
    /// replaces it: readers may copy the old bytes until their lease ends, so they stay parked
    /// until then.
    fn upsert_existing(&mut self, key: &str, size: u64) -> Option<Reply> {
        let now = self.now;
        let obj = self.objects.get_mut(key)?;
        let writing = obj.copies.iter().filter(|c| !c.complete).count();
        obj.copies.retain(|c| c.complete);
        if !obj.copies.is_empty() && obj.size == size && !obj.leased(now) {
            let rewritten = Self::rewrite_in_place(obj, now);
            self.park(writing, now + self.timing.release_ms);
            return Some(rewritten);
        }
        let (buffers, until) = (obj.copies.len(), obj.lease_until_ms.max(now));
        self.objects.remove(key);
        self.park(writing, now + self.timing.release_ms);
        self.park(buffers, until);
        None
    }

    fn rewrite_in_place(obj: &mut Object, now: u64) -> Reply {
        obj.put_start_ms = now;
        for c in &mut obj.copies {
            // New ids: a reader revalidating the old ones must learn the bytes changed.
            c.id = ReplicaId(0);
            c.complete = false;
        }
        Self::placed(obj)
    }

    fn placed(obj: &Object) -> Reply {
        let mut copies: Vec<_> = obj
            .copies
            .iter()
            .map(|c| (c.segment.clone(), obj.size, c.complete))
            .collect();
        copies.sort();
        Reply::Placed(copies)
    }

    /// Takes the ids the engine issued for the copies the last Start of `key` placed.
    pub(super) fn name_copies(&mut self, key: &str, issued: &[(String, ReplicaId)]) {
        let obj = self
            .objects
            .get_mut(key)
            .expect("named right after a Start");
        for (segment, id) in issued {
            if let Some(c) = obj.copies.iter_mut().find(|c| c.segment == *segment) {
                c.id = *id;
            }
        }
    }

    /// PutEnd: completes exactly the write in flight; a retry of a finished one is fine.
    pub(super) fn end(&mut self, key: &str, ids: &[ReplicaId]) -> Outcome {
        let now = self.now;
        let obj = self
            .objects
            .get_mut(key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !obj.writing() {
            let all: BTreeSet<ReplicaId> = obj.copies.iter().map(|c| c.id).collect();
            return if names_exactly(ids, &all) {
                Ok(Reply::Done)
            } else {
                Err(ErrorCode::INVALID_WRITE)
            };
        }
        if !names_exactly(ids, &obj.ids(false)) {
            return Err(ErrorCode::INVALID_WRITE);
        }
        for c in &mut obj.copies {
            c.complete = true;
        }
        // A zero lease: a fresh object is removable and evictable at once.
        obj.lease_until_ms = obj.lease_until_ms.max(now);
        Ok(Reply::Done)
    }

    /// PutRevoke: abandons exactly the write in flight; its buffers are freed at once.
    pub(super) fn revoke(&mut self, key: &str, ids: &[ReplicaId]) -> Outcome {
        let obj = self.objects.get(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !obj.writing() || obj.readable() || !names_exactly(ids, &obj.ids(false)) {
            return Err(ErrorCode::INVALID_WRITE);
        }
        self.objects.remove(key);
        Ok(Reply::Done)
    }

    fn removal_blocker(obj: &Object, force: bool, now: u64) -> Option<ErrorCode> {
        if !force && obj.leased(now) {
            Some(ErrorCode::OBJECT_HAS_LEASE)
        } else if obj.writing() {
            Some(ErrorCode::REPLICA_IS_NOT_READY)
        } else {
            None
        }
    }

    pub(super) fn remove(&mut self, key: &str, force: bool) -> Outcome {
        let obj = self.objects.get(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if let Some(code) = Self::removal_blocker(obj, force, self.now) {
            return Err(code);
        }
        self.objects.remove(key);
        Ok(Reply::Done)
    }

    pub(super) fn remove_all(&mut self, force: bool) -> Outcome {
        let now = self.now;
        let before = self.objects.len();
        self.objects
            .retain(|_, obj| Self::removal_blocker(obj, force, now).is_some());
        Ok(Reply::Count((before - self.objects.len()) as u64))
    }

    /// GetReplicaList: the complete copies, and a read lease.
    pub(super) fn get(&mut self, key: &str) -> Outcome {
        let (now, lease_ms) = (self.now, self.timing.lease_ms);
        let obj = self
            .objects
            .get_mut(key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !obj.readable() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY);
        }
        obj.lease_until_ms = obj.lease_until_ms.max(now + lease_ms);
        let mut copies: Vec<_> = obj
            .copies
            .iter()
            .filter(|c| c.complete)
            .map(|c| (c.id, c.segment.clone(), obj.size))
            .collect();
        copies.sort();
        Ok(Reply::Replicas { lease_ms, copies })
    }

    /// ExistKey: readable or not; a readable object gets a read lease.
    pub(super) fn exists(&mut self, key: &str) -> Outcome {
        let (now, lease_ms) = (self.now, self.timing.lease_ms);
        let readable = match self.objects.get_mut(key) {
            Some(obj) if obj.readable() => {
                obj.lease_until_ms = obj.lease_until_ms.max(now + lease_ms);
                true
            }
            _ => false,
        };
        Ok(Reply::Exists(readable))
    }

    /// RevalidateReplicas of ids a reader got earlier.
    pub(super) fn revalidate(&self, key: &str, ids: &[ReplicaId]) -> Outcome {
        if ids.is_empty() {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let obj = self.objects.get(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let readable = obj.ids(true);
        if ids.iter().all(|id| readable.contains(id)) {
            Ok(Reply::Done)
        } else {
            Err(ErrorCode::INVALID_REPLICA)
        }
    }

    /// One eviction round under the harness's settings (high watermark 0, ratio 1): every
    /// readable object without a lease loses its copies. A round with nothing readable does not
    /// run, so it releases no parked buffer either.
    pub(super) fn evict(&mut self) -> Outcome {
        let now = self.now;
        if !self.objects.values().any(Object::readable) {
            return Ok(Reply::Evicted {
                keys: 0,
                bytes: 0,
                released: 0,
            });
        }
        let (mut keys, mut bytes) = (0, 0);
        self.objects.retain(|_, obj| {
            if !obj.readable() || obj.leased(now) {
                return true;
            }
            let dropped = obj.copies.iter().filter(|c| c.complete).count() as u64;
            obj.copies.retain(|c| !c.complete);
            keys += 1;
            bytes += obj.size * dropped;
            !obj.copies.is_empty()
        });
        let released = self.release_parked();
        Ok(Reply::Evicted {
            keys,
            bytes,
            released,
        })
    }

    /// The stalled-write sweep: writes older than the release timeout are dropped, parked
    /// buffers past their deadline released. Answers the sum of both.
    pub(super) fn sweep(&mut self) -> Outcome {
        let now = self.now;
        let release_ms = self.timing.release_ms;
        let mut reclaimed = 0;
        self.objects.retain(|_, obj| {
            if !obj.writing() || obj.put_start_ms + release_ms >= now {
                return true;
            }
            reclaimed += 1;
            obj.copies.retain(|c| c.complete);
            !obj.copies.is_empty()
        });
        Ok(Reply::Count(reclaimed + self.release_parked()))
    }

    /// A segment went away (and one of the same name came back): its copies are gone.
    pub(super) fn lose_segment(&mut self, segment: &str) {
        self.objects.retain(|_, obj| {
            obj.copies.retain(|c| c.segment != segment);
            !obj.copies.is_empty()
        });
    }

    /// The master restarted. Nothing is persisted yet, so the model forgets everything too;
    /// when the master gains persistence this is where the model keeps what survives.
    pub(super) fn restart(&mut self) {
        self.objects.clear();
        self.parked.clear();
    }

    /// Keys a reader can find.
    pub(super) fn readable_keys(&self) -> BTreeSet<String> {
        self.objects
            .iter()
            .filter(|(_, o)| o.readable())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Objects in any state.
    pub(super) fn object_count(&self) -> u64 {
        self.objects.len() as u64
    }

    fn park(&mut self, buffers: usize, until_ms: u64) {
        self.parked.resize(self.parked.len() + buffers, until_ms);
    }

    fn release_parked(&mut self) -> u64 {
        let now = self.now;
        let before = self.parked.len();
        self.parked.retain(|until| *until > now);
        (before - self.parked.len()) as u64
    }
}
