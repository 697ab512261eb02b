//! Replica descriptors, segments, placement options and the small enums of the protocol.
//!
//! Enums travel as their number (uint8 unless noted). Structs travel as MessagePack arrays in
//! field declaration order; `docs/protocol.md` lists every field.

use crate::error::{Error, ErrorCode};
use crate::ids::{ReplicaId, SegmentId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A number on the wire that names no variant of the enum it should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} value {value}")]
pub struct UnknownWireValue {
    /// The enum's name.
    pub kind: &'static str,
    /// The number received.
    pub value: u8,
}

macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $value:literal,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(into = "u8", try_from = "u8")]
        pub enum $name {
            $($(#[$vdoc])* $variant = $value,)*
        }

        impl From<$name> for u8 {
            fn from(v: $name) -> u8 {
                v as u8
            }
        }

        impl TryFrom<u8> for $name {
            type Error = UnknownWireValue;
            fn try_from(v: u8) -> Result<Self, UnknownWireValue> {
                match v {
                    $($value => Ok($name::$variant),)*
                    other => Err(UnknownWireValue { kind: stringify!($name), value: other }),
                }
            }
        }
    };
}

wire_enum!(
    /// Lifecycle of one replica.
    ReplicaStatus {
        /// Allocated, bytes being written.
        Processing = 2,
        /// Readable.
        Complete = 3,
    }
);

wire_enum!(
    /// Where a replica lives.
    ReplicaKind {
        /// A byte range of a mounted memory segment (`cpu` in events).
        Memory = 0,
        /// A file in a node's disk directory (`disk` in events).
        LocalDisk = 2,
    }
);

/// The storage tier events report: `cpu` for memory replicas, `disk` for every other kind.
///
/// Serialized as its lowercase name (the event stream and admin JSON spell it that way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// A memory replica (a range of a mounted segment).
    Cpu,
    /// Any non-memory replica (a node's disk tier).
    Disk,
}

impl Medium {
    /// Every medium, in the order events for one object are emitted.
    pub const ALL: [Medium; 2] = [Medium::Cpu, Medium::Disk];

    /// The wire spelling: `cpu` or `disk`.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Cpu => "cpu",
            Medium::Disk => "disk",
        }
    }

    /// Parses a wire spelling, ignoring ASCII case; anything else is `None`.
    pub fn parse(s: &str) -> Option<Medium> {
        Medium::ALL
            .into_iter()
            .find(|m| s.eq_ignore_ascii_case(m.as_str()))
    }
}

impl std::fmt::Display for Medium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ReplicaKind> for Medium {
    fn from(kind: ReplicaKind) -> Medium {
        match kind {
            ReplicaKind::Memory => Medium::Cpu,
            ReplicaKind::LocalDisk => Medium::Disk,
        }
    }
}

wire_enum!(
    /// Which replicas an End/Revoke targets.
    ReplicaType {
        /// Memory replicas only.
        Memory = 0,
        /// Disk replicas only.
        LocalDisk = 2,
        /// Every replica of the write.
        All = 4,
    }
);

wire_enum!(
    /// Status of a mounted segment.
    SegmentStatus {
        /// Allocatable and readable.
        Ok = 1,
        /// Readable, not allocatable, unmounted when the grace period ends.
        GracefullyUnmounting = 4,
        /// Being unmounted.
        Unmounting = 5,
    }
);

wire_enum!(
    /// What Ping tells a client about itself.
    ClientStatus {
        /// The master knows the client and its segments.
        Ok = 1,
        /// The master lost (or never had) the client's segments: call ReMountSegment.
        NeedRemount = 2,
    }
);

/// Soft-pin request of a write. Unknown numbers are kept so validation can refuse them precisely.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u8", into = "u8")]
pub enum SoftPinAction {
    /// Keep whatever the object had.
    #[default]
    Preserve,
    /// Pin for `soft_pin_ttl_ms` (or the master default).
    Enable,
    /// Clear the pin.
    Disable,
    /// A number this version does not know; refused with `INVALID_PARAMS`.
    Unknown(u8),
}

impl From<u8> for SoftPinAction {
    fn from(v: u8) -> Self {
        match v {
            0 => Self::Preserve,
            1 => Self::Enable,
            2 => Self::Disable,
            other => Self::Unknown(other),
        }
    }
}

impl From<SoftPinAction> for u8 {
    fn from(v: SoftPinAction) -> u8 {
        match v {
            SoftPinAction::Preserve => 0,
            SoftPinAction::Enable => 1,
            SoftPinAction::Disable => 2,
            SoftPinAction::Unknown(other) => other,
        }
    }
}

/// Decoding the strings that every replica descriptor of a segment repeats (its name and its
/// node's endpoint) into shared copies: a decoded string equal to one of the last few decoded on
/// this thread is that one again, so a batch answer of many descriptors on a few segments
/// allocates nothing for them.
mod shared_str {
    use serde::de::{Deserializer, Error, Visitor};
    use std::cell::RefCell;
    use std::sync::Arc;

    /// How many distinct strings each thread keeps: a batch spreads over few segments.
    const RECENT: usize = 8;

    thread_local! {
        static SEEN: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
    }

    fn shared(s: &str) -> Arc<str> {
        SEEN.with(|seen| {
            let mut seen = seen.borrow_mut();
            if let Some(i) = seen.iter().position(|known| **known == *s) {
                let found = seen[i].clone();
                // Most recent first: the next lookup of a batch's segment finds it at once.
                seen[..=i].rotate_right(1);
                return found;
            }
            let made: Arc<str> = Arc::from(s);
            if seen.len() == RECENT {
                seen.pop();
            }
            seen.insert(0, made.clone());
            made
        })
    }

    struct SharedStr;

    impl Visitor<'_> for SharedStr {
        type Value = Arc<str>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<Arc<str>, E> {
            Ok(shared(v))
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Arc<str>, E> {
            std::str::from_utf8(v)
                .map(shared)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Bytes(v), &self))
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        d.deserialize_str(SharedStr)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn equal_strings_decoded_in_turn_share_one_copy_and_others_do_not() {
            let a1 = shared("127.0.0.1:7001");
            let b = shared("127.0.0.1:7002");
            let a2 = shared("127.0.0.1:7001");
            assert!(Arc::ptr_eq(&a1, &a2));
            assert!(!Arc::ptr_eq(&a1, &b));
            assert_eq!(&*b, "127.0.0.1:7002");
            // More distinct strings than are kept: the oldest is made anew, still equal.
            for i in 0..RECENT {
                shared(&format!("other-{i}"));
            }
            let a3 = shared("127.0.0.1:7001");
            assert_eq!(a3, a1);
            assert!(!Arc::ptr_eq(&a3, &a1));
        }
    }
}

/// A memory region a node contributes to the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Unique id chosen by the node.
    pub id: SegmentId,
    /// Name; replicas of one object land on distinct names. Shared: every replica descriptor
    /// on the segment carries it.
    pub name: Arc<str>,
    /// Base address of the region (non-zero); replica addresses are absolute.
    pub base: u64,
    /// Size in bytes (non-zero).
    pub size: u64,
    /// Data-plane endpoint `host:port` that serves this segment. Shared like the name.
    pub endpoint: Arc<str>,
    /// Transport name, `tcp`.
    pub protocol: String,
    /// Host identity of the node (informational).
    pub host_id: String,
}

/// One replica as handed to clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDescriptor {
    /// Non-zero identity, used by End/Revoke and by read revalidation.
    pub id: ReplicaId,
    /// Memory or disk.
    pub kind: ReplicaKind,
    /// Processing or complete.
    pub status: ReplicaStatus,
    /// Object size in bytes.
    pub size: u64,
    /// Segment (memory) or disk owner (disk) holding the bytes.
    pub segment_id: SegmentId,
    /// Segment name (memory) or disk name (disk); shared with the segment's record, so a
    /// descriptor costs no allocation for it (decoded, a name seen recently is shared too).
    #[serde(deserialize_with = "shared_str::deserialize")]
    pub segment_name: Arc<str>,
    /// Data-plane endpoint that serves the bytes; shared like the name.
    #[serde(deserialize_with = "shared_str::deserialize")]
    pub endpoint: Arc<str>,
    /// Absolute address inside the segment (memory) or file id (disk).
    pub address: u64,
    /// Capability grant for this replica ([`crate::grant`]), present when the master runs with
    /// a shared secret; the caller passes it with every data-plane request on the replica.
    /// Absent (not encoded) otherwise.
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub grant: Option<Vec<u8>>,
}

/// Placement and pinning options of one write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateConfig {
    /// Number of memory replicas wanted (≥ 1); fewer may be granted when segments are few.
    pub replica_num: u32,
    /// Soft pin request.
    pub soft_pin_action: SoftPinAction,
    /// Soft pin TTL; only with `Enable`.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict this object.
    pub with_hard_pin: bool,
    /// Segment names to try first, in order.
    pub preferred_segments: Vec<String>,
    /// Group id per key (length 1 for single-key calls, one per key in batches); `None` = ungrouped.
    pub group_ids: Option<Vec<String>>,
    /// Also write a disk replica (write-through); the Start fails with `NO_AVAILABLE_HANDLE` when
    /// no mounted disk has room. Absent in older encodings (false).
    #[serde(default)]
    pub with_disk_replica: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            group_ids: None,
            with_disk_replica: false,
        }
    }
}

/// A node's disk directory, mounted on the master like a memory segment but accounted as a
/// byte counter (files, not address ranges).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSegment {
    /// Identity of the directory; kept in the directory so a restarted node reuses it.
    pub id: SegmentId,
    /// Name shown in admin views.
    pub name: String,
    /// Data-plane endpoint `host:port` that serves the files.
    pub endpoint: String,
    /// Bytes the master may place on this disk (non-zero).
    pub capacity_bytes: u64,
}

/// A replica file a node found in its disk directory when it (re)mounted it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFile {
    /// Tenant of the object, as written in the file header.
    pub tenant: String,
    /// Object key, as written in the file header.
    pub key: String,
    /// Object size in bytes.
    pub size: u64,
    /// Replica id the file was written for (its file id).
    pub replica_id: ReplicaId,
}

/// Copy one object from a memory replica of the node into a new disk file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadTask {
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// The memory replica to copy from (a segment of the node itself).
    pub source: ReplicaDescriptor,
    /// Id of the PROCESSING disk replica, also the file id to write.
    pub disk_replica_id: ReplicaId,
}

/// Copy one object from a disk file of the node into a memory replica on one of its segments
/// (promotion on hit). Reported with NotifyOffload, naming the target's replica id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromotionTask {
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// The disk replica to read (a file of the node itself).
    pub source: ReplicaDescriptor,
    /// The PROCESSING memory replica to fill (a segment of the node itself).
    pub target: ReplicaDescriptor,
}

/// Outcome of one [`OffloadTask`] or [`PromotionTask`] (then `disk_replica_id` is the
/// target's replica id).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadResult {
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// The task's disk replica id.
    pub disk_replica_id: ReplicaId,
    /// Whether the file was written and synced.
    pub ok: bool,
}

/// Answer to OffloadHeartbeat: work for the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadHeartbeatResponse {
    /// Offloads to perform, then report with NotifyOffload.
    pub tasks: Vec<OffloadTask>,
    /// File ids whose replicas were removed: delete these files.
    pub deletions: Vec<u64>,
    /// Promotions to perform, then report with NotifyOffload; absent = none in older
    /// encodings.
    #[serde(default)]
    pub promotions: Vec<PromotionTask>,
}

/// Answer to MountDiskSegment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountDiskSegmentResponse {
    /// Files the master does not recognise (removed or replaced objects): delete them.
    pub rejected: Vec<ReplicaId>,
}

/// Answer to GetReplicaList.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReplicaListResponse {
    /// Readable replicas in placement order.
    pub replicas: Vec<ReplicaDescriptor>,
    /// The read lease granted, in milliseconds.
    pub lease_ttl_ms: u64,
    /// Checksum supplied at PutEnd, if any.
    pub object_checksum: Option<u64>,
}

/// Answer to Ping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResponse {
    /// Master view version (0: single master).
    pub view_version: i64,
    /// Whether the client must remount.
    pub client_status: ClientStatus,
    /// Epoch of this master: it changes when the master restarts or a new leader takes over,
    /// so a node can tell a new master (announce its catalog) from one that expired it
    /// (forget its catalog). Absent (0) from older masters.
    #[serde(default)]
    pub master_epoch: u64,
    /// This master takes back the catalog of a node it expired: announced to it, entries only
    /// return replicas to objects it still holds at the same version, and never re-create
    /// what it removed or replaced. A node then announces to the master that expired it too
    /// (it forgets its catalog instead for masters without this, which report false).
    #[serde(default)]
    pub merges_returning: bool,
}

/// Per-key result inside a batch response, on the wire `[code, value]`: `code` 0 with the value,
/// or a negative code with the error message (a string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemResult<T>(pub Result<T, Error>);

impl<T> From<Result<T, Error>> for ItemResult<T> {
    fn from(r: Result<T, Error>) -> Self {
        Self(r)
    }
}

impl<T: Serialize> Serialize for ItemResult<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(2)?;
        match &self.0 {
            Ok(v) => {
                t.serialize_element(&0i32)?;
                t.serialize_element(v)?;
            }
            Err(e) => {
                t.serialize_element(&e.code.as_i32())?;
                t.serialize_element(&*e.message)?;
            }
        }
        t.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ItemResult<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = ItemResult<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a [code, value] pair")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error as _;
                let code: i32 = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                if code == 0 {
                    let v: T = seq
                        .next_element()?
                        .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                    Ok(ItemResult(Ok(v)))
                } else {
                    let m: String = seq
                        .next_element()?
                        .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                    Ok(ItemResult(Err(Error::new(ErrorCode::from_i32(code), m))))
                }
            }
        }
        d.deserialize_tuple(2, V(std::marker::PhantomData))
    }
}
