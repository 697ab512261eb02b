//! Per-object metadata and replicas, kept compact: a replica is an id, a status and a handle to
//! its segment buffer (no strings); an object is a small fixed record with its first replica
//! inline, and the rarely used fields (soft pin, group, checksum, pin intent, offload) behind one
//! optional box. `docs/benchmarks.md` (metadata memory) has the byte budget.

use super::disk::{DiskHandle, PendingOffload};
use super::replica_list::ReplicaList;
use super::segments::MemBuffer;
use super::sink::{MediaSet, Medium};
use moonkv_proto::{
    ClientId, ReplicaDescriptor, ReplicaId, ReplicaKind, ReplicaStatus, ReplicaType,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a replica's bytes are.
#[derive(Debug)]
pub(crate) enum Placement {
    /// A range of a mounted segment.
    Memory(MemBuffer),
    /// A file on a node's disk (`ReplicaKind::LocalDisk`, medium `disk`). Boxed so the common
    /// memory replica sets the size of every replica.
    Disk(Box<DiskHandle>),
}

/// One full copy of an object.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) id: ReplicaId,
    pub(crate) status: ReplicaStatus,
    pub(crate) placement: Placement,
}

impl Replica {
    pub(crate) fn kind(&self) -> ReplicaKind {
        match self.placement {
            Placement::Memory(_) => ReplicaKind::Memory,
            Placement::Disk(_) => ReplicaKind::LocalDisk,
        }
    }

    pub(crate) fn medium(&self) -> Medium {
        match self.placement {
            Placement::Memory(_) => Medium::Cpu,
            Placement::Disk(_) => Medium::Disk,
        }
    }

    /// Whether the storage behind the replica still exists (its segment is mounted; for disk:
    /// its disk is mounted or detached within its grace period).
    pub(crate) fn handle_valid(&self) -> bool {
        match &self.placement {
            Placement::Memory(buf) => buf.segment.is_alive(),
            Placement::Disk(file) => file.valid(),
        }
    }

    /// Whether the replica counts for its medium's availability (events): complete, and for
    /// disk, not detached.
    pub(crate) fn is_available(&self) -> bool {
        self.is_complete()
            && match &self.placement {
                Placement::Memory(_) => true,
                Placement::Disk(file) => file.attached,
            }
    }

    /// The disk file, for disk replicas.
    pub(crate) fn disk(&self) -> Option<&DiskHandle> {
        match &self.placement {
            Placement::Disk(file) => Some(&**file),
            Placement::Memory(_) => None,
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.status == ReplicaStatus::Complete
    }

    pub(crate) fn is_processing(&self) -> bool {
        self.status == ReplicaStatus::Processing
    }

    /// Complete and backed by live storage.
    pub(crate) fn is_readable(&self) -> bool {
        self.is_complete()
            && match &self.placement {
                Placement::Memory(buf) => buf.segment.is_alive(),
                Placement::Disk(file) => file.readable(),
            }
    }

    /// Whether an End/Revoke of `rtype` addresses this replica.
    pub(crate) fn matches(&self, rtype: ReplicaType) -> bool {
        match rtype {
            ReplicaType::All => true,
            ReplicaType::Memory => self.kind() == ReplicaKind::Memory,
            ReplicaType::LocalDisk => self.kind() == ReplicaKind::LocalDisk,
        }
    }

    /// Memory bytes this replica occupies (what tenant quotas charge).
    pub(crate) fn memory_bytes(&self, object_size: u64) -> u64 {
        match self.placement {
            Placement::Memory(_) => object_size,
            Placement::Disk(_) => 0,
        }
    }

    pub(crate) fn descriptor(&self, object_size: u64) -> ReplicaDescriptor {
        match &self.placement {
            Placement::Memory(buf) => ReplicaDescriptor {
                id: self.id,
                kind: ReplicaKind::Memory,
                status: self.status,
                size: object_size,
                segment_id: buf.segment.info.id,
                segment_name: buf.segment.info.name.clone(),
                endpoint: buf.segment.info.endpoint.clone(),
                address: buf.address,
                grant: None,
            },
            Placement::Disk(file) => ReplicaDescriptor {
                id: self.id,
                kind: ReplicaKind::LocalDisk,
                status: self.status,
                size: object_size,
                segment_id: file.slot.info.id,
                segment_name: file.slot.info.name.as_str().into(),
                endpoint: file.slot.info.endpoint.as_str().into(),
                address: file.file_id,
                grant: None,
            },
        }
    }
}

/// Soft pin requested by the write in flight, applied when it first makes the object readable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum PinIntent {
    /// Keep the committed state.
    #[default]
    Preserve,
    /// Pin for this many milliseconds (0 behaves as `Clear`).
    Enable(u64),
    /// Drop any pin.
    Clear,
}

/// The fields most objects never set, boxed together so an object without them pays one
/// pointer. Absent means every field at its default.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// Committed soft pin deadline; 0 = none.
    soft_pin_deadline_ms: u64,
    checksum: Option<u64>,
    group_id: Option<Box<str>>,
    pin_intent: PinIntent,
    /// An offload to disk in progress (eviction chose this object and its node has disk room).
    offload: Option<Box<PendingOffload>>,
    /// `(epoch, write)` of a value re-adopted from a node's catalog (committed by an earlier
    /// master); `None` = written here.
    adopted: Option<(u64, u64)>,
}

impl Extras {
    fn is_default(&self) -> bool {
        self.soft_pin_deadline_ms == 0
            && self.checksum.is_none()
            && self.group_id.is_none()
            && self.pin_intent == PinIntent::Preserve
            && self.offload.is_none()
            && self.adopted.is_none()
    }
}

/// Metadata of one (tenant, key). The maps hold it boxed: a table slot is then a key and a
/// pointer, whatever the record's size, and the half-empty slots after a table grows cost little.
#[derive(Debug)]
pub(crate) struct ObjectMeta {
    pub(crate) size: u64,
    /// Client of the write in flight (or of the last write).
    pub(crate) writer: ClientId,
    pub(crate) put_start_ms: u64,
    /// Read lease; expired iff `now >= lease_deadline_ms`. New objects start expired.
    pub(crate) lease_deadline_ms: u64,
    /// Tenant-quota bytes currently charged for this object (multi-tenant mode).
    pub(crate) charged_bytes: u64,
    pub(crate) replicas: ReplicaList,
    extras: Option<Box<Extras>>,
    pub(crate) hard_pinned: bool,
    /// A Put/Upsert is in progress (some replica is PROCESSING).
    pub(crate) in_flight: bool,
}

impl ObjectMeta {
    /// A record with no soft pin, checksum, group, pin intent or offload.
    pub(crate) fn new(
        size: u64,
        writer: ClientId,
        put_start_ms: u64,
        replicas: ReplicaList,
        in_flight: bool,
    ) -> Self {
        Self {
            size,
            writer,
            put_start_ms,
            lease_deadline_ms: 0,
            charged_bytes: 0,
            replicas,
            extras: None,
            hard_pinned: false,
            in_flight,
        }
    }

    /// `(epoch, write)` of the current value: as announced for a re-adopted value; for one
    /// written here `own_epoch` and the smallest replica id, the first id its write was given.
    pub(crate) fn version(&self, own_epoch: u64) -> (u64, u64) {
        if let Some(version) = self.extras.as_ref().and_then(|x| x.adopted) {
            return version;
        }
        let write = self.replicas.iter().map(|r| r.id.0).min().unwrap_or(0);
        (own_epoch, write)
    }

    /// Marks the value as re-adopted with this version (`None`: written here).
    pub(crate) fn set_adopted_version(&mut self, version: Option<(u64, u64)>) {
        if version.is_some() || self.extras.is_some() {
            self.update_extras(|x| x.adopted = version);
        }
    }

    /// Changes the rarely set fields, allocating them on first use and freeing them once all
    /// are back at their defaults.
    fn update_extras(&mut self, f: impl FnOnce(&mut Extras)) {
        let extras = self.extras.get_or_insert_with(Box::default);
        f(extras);
        if extras.is_default() {
            self.extras = None;
        }
    }

    /// Committed soft pin deadline; 0 = none.
    pub(crate) fn soft_pin_deadline_ms(&self) -> u64 {
        self.extras.as_ref().map_or(0, |e| e.soft_pin_deadline_ms)
    }

    pub(crate) fn set_soft_pin_deadline_ms(&mut self, deadline_ms: u64) {
        if deadline_ms != self.soft_pin_deadline_ms() {
            self.update_extras(|e| e.soft_pin_deadline_ms = deadline_ms);
        }
    }

    pub(crate) fn checksum(&self) -> Option<u64> {
        self.extras.as_ref().and_then(|e| e.checksum)
    }

    pub(crate) fn set_checksum(&mut self, checksum: Option<u64>) {
        if checksum != self.checksum() {
            self.update_extras(|e| e.checksum = checksum);
        }
    }

    pub(crate) fn group(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.group_id.as_deref())
    }

    pub(crate) fn take_group(&mut self) -> Option<Box<str>> {
        let mut group = None;
        if self.group().is_some() {
            self.update_extras(|e| group = e.group_id.take());
        }
        group
    }

    pub(crate) fn set_group(&mut self, group: Option<Box<str>>) {
        if group.is_some() || self.group().is_some() {
            self.update_extras(|e| e.group_id = group);
        }
    }

    /// Soft pin requested by the write in flight.
    pub(crate) fn pin_intent(&self) -> PinIntent {
        self.extras
            .as_ref()
            .map_or(PinIntent::Preserve, |e| e.pin_intent)
    }

    pub(crate) fn set_pin_intent(&mut self, intent: PinIntent) {
        if intent != self.pin_intent() {
            self.update_extras(|e| e.pin_intent = intent);
        }
    }

    /// The offload to disk in progress, if any.
    pub(crate) fn offload(&self) -> Option<&PendingOffload> {
        self.extras.as_ref().and_then(|e| e.offload.as_deref())
    }

    pub(crate) fn has_offload(&self) -> bool {
        self.offload().is_some()
    }

    pub(crate) fn take_offload(&mut self) -> Option<Box<PendingOffload>> {
        let mut offload = None;
        if self.has_offload() {
            self.update_extras(|e| offload = e.offload.take());
        }
        offload
    }

    pub(crate) fn set_offload(&mut self, offload: Box<PendingOffload>) {
        self.update_extras(|e| e.offload = Some(offload));
    }

    /// Media in which the object is (or, for a replica whose segment just died, was until this
    /// moment) available: media holding a COMPLETE replica that is not on a detached disk.
    /// Events are the diff of this set.
    pub(crate) fn media(&self) -> MediaSet {
        let mut set = MediaSet::EMPTY;
        for r in self.replicas.iter().filter(|r| r.is_available()) {
            set.insert(r.medium());
        }
        set
    }

    /// Whether a complete replica is available (a detached disk replica is not).
    pub(crate) fn has_available(&self) -> bool {
        self.replicas.iter().any(Replica::is_available)
    }

    /// Whether the object has any disk replica (complete, in flight or detached) or an offload.
    pub(crate) fn has_disk(&self) -> bool {
        self.has_offload() || self.replicas.iter().any(|r| r.disk().is_some())
    }

    pub(crate) fn has_readable(&self) -> bool {
        self.replicas.iter().any(Replica::is_readable)
    }

    pub(crate) fn has_complete(&self) -> bool {
        self.replicas.iter().any(Replica::is_complete)
    }

    pub(crate) fn all_complete(&self) -> bool {
        self.replicas.iter().all(Replica::is_complete)
    }

    pub(crate) fn has_dead_replica(&self) -> bool {
        self.replicas.iter().any(|r| !r.handle_valid())
    }

    pub(crate) fn lease_active(&self, now: u64) -> bool {
        now < self.lease_deadline_ms
    }

    /// Extends the read lease to at least `now + ttl`; never shortens it.
    pub(crate) fn grant_lease(&mut self, now: u64, ttl: u64) {
        self.lease_deadline_ms = self.lease_deadline_ms.max(now.saturating_add(ttl));
    }

    pub(crate) fn soft_pinned(&self, now: u64) -> bool {
        let deadline_ms = self.soft_pin_deadline_ms();
        deadline_ms != 0 && now < deadline_ms
    }

    /// COMPLETE, live memory replicas (what eviction may drop).
    pub(crate) fn has_evictable_memory(&self) -> bool {
        self.replicas
            .iter()
            .any(|r| r.kind() == ReplicaKind::Memory && r.is_readable())
    }

    /// Memory bytes held by the replicas (the quota charge once settled).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.replicas
            .iter()
            .map(|r| r.memory_bytes(self.size))
            .sum()
    }
}

/// How far past a re-adopted id the next issued id is moved: more ids than one master issues
/// in its life (2^40 is 35 years at a million replicas per second).
pub(crate) const READOPT_ID_GAP: u64 = 1 << 40;

/// Issuer of replica ids: seeded randomly so ids from a previous master process are not reissued
/// with high probability, then strictly sequential; 0 is never issued.
#[derive(Debug)]
pub(crate) struct ReplicaIdGen {
    next: AtomicU64,
}

impl ReplicaIdGen {
    /// A random start below 2^63, so the ids of one master's life never wrap around.
    pub(crate) fn new_random() -> Self {
        Self::starting_at((rand::random::<u64>() >> 1).max(1))
    }

    /// Moves past a re-adopted id by a wide gap: every id an earlier master issued after that
    /// one (held by nodes that have not re-mounted yet) stays below what this master issues.
    pub(crate) fn move_past(&self, id: ReplicaId) {
        let floor = id.0.saturating_add(READOPT_ID_GAP);
        self.next.fetch_max(floor, Ordering::Relaxed);
    }

    pub(crate) fn starting_at(seed: u64) -> Self {
        Self {
            next: AtomicU64::new(seed),
        }
    }

    pub(crate) fn next_id(&self) -> ReplicaId {
        loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return ReplicaId(id);
            }
        }
    }
}

/// True iff `given` and `expected` hold exactly the same ids (no duplicates, no extras).
/// Quadratic on purpose: replica lists are a handful long and this avoids allocating.
pub(crate) fn same_ids<'a, I>(given: &[ReplicaId], expected: I) -> bool
where
    I: Iterator<Item = ReplicaId> + Clone + 'a,
{
    let count = expected.clone().count();
    if count != given.len() {
        return false;
    }
    let no_dups = given
        .iter()
        .enumerate()
        .all(|(i, id)| !given[..i].contains(id));
    no_dups && expected.into_iter().all(|id| given.contains(&id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sizes_stay_within_budget() {
        use std::mem::size_of;
        // A boxed record of 104 bytes is a 112-byte malloc chunk; one byte more is 128. The
        // inline replica must not make the list bigger than the replica itself.
        assert!(size_of::<Replica>() <= 40, "{}", size_of::<Replica>());
        assert_eq!(size_of::<ReplicaList>(), size_of::<Replica>());
        assert!(
            size_of::<ObjectMeta>() <= 104,
            "{}",
            size_of::<ObjectMeta>()
        );
    }

    #[test]
    fn extras_are_allocated_only_while_set() {
        let mut obj = ObjectMeta::new(1, ClientId::new(1, 1), 0, ReplicaList::default(), false);
        obj.set_checksum(None);
        obj.set_pin_intent(PinIntent::Preserve);
        obj.set_soft_pin_deadline_ms(0);
        obj.set_group(None);
        assert!(obj.extras.is_none());
        obj.set_checksum(Some(7));
        obj.set_group(Some("g".into()));
        assert_eq!((obj.checksum(), obj.group()), (Some(7), Some("g")));
        obj.set_checksum(None);
        assert!(obj.extras.is_some());
        assert_eq!(obj.take_group().as_deref(), Some("g"));
        assert!(obj.extras.is_none());
        obj.set_soft_pin_deadline_ms(50);
        assert!(obj.soft_pinned(49) && !obj.soft_pinned(50));
        obj.set_soft_pin_deadline_ms(0);
        assert!(obj.extras.is_none() && !obj.soft_pinned(0));
    }

    #[test]
    fn replica_ids_skip_zero_on_wrap() {
        let gen = ReplicaIdGen::starting_at(u64::MAX);
        assert_eq!(gen.next_id(), ReplicaId(u64::MAX));
        assert_eq!(gen.next_id(), ReplicaId(1));
        assert_eq!(gen.next_id(), ReplicaId(2));
    }

    #[test]
    fn same_ids_is_set_equality() {
        let ids = [ReplicaId(1), ReplicaId(2)];
        assert!(same_ids(&[ReplicaId(2), ReplicaId(1)], ids.iter().copied()));
        assert!(!same_ids(&[ReplicaId(1)], ids.iter().copied()));
        assert!(!same_ids(
            &[ReplicaId(1), ReplicaId(1)],
            ids.iter().copied()
        ));
        assert!(!same_ids(
            &[ReplicaId(1), ReplicaId(3)],
            ids.iter().copied()
        ));
        assert!(same_ids(&[], std::iter::empty()));
    }
}
