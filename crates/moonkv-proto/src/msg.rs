//! One request struct per RPC, its response type and its opcode.
//!
//! [`for_each_op!`](crate::for_each_op) is the single table of operations; the [`Request`] enum,
//! the [`Rpc`] trait impls and the server's dispatcher are all generated from it, so adding an
//! operation is one line here plus its handler.

use crate::ids::{ClientId, ReplicaId, SegmentId};
use crate::types::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Invokes `$callback!` with the operation table: `opcode => Name(Request) -> Response, method;`.
#[macro_export]
macro_rules! for_each_op {
    ($callback:ident) => {
        $callback! {
            1 => Ping(PingRequest) -> PingResponse, ping;
            2 => MountSegment(MountSegmentRequest) -> (), mount_segment;
            3 => ReMountSegment(ReMountSegmentRequest) -> (), remount_segment;
            4 => UnmountSegment(UnmountSegmentRequest) -> (), unmount_segment;
            5 => GracefulUnmountSegment(GracefulUnmountSegmentRequest) -> (), graceful_unmount_segment;
            6 => QuerySegmentStatus(QuerySegmentStatusRequest) -> SegmentStatus, query_segment_status;
            7 => QuerySegmentStatusById(QuerySegmentStatusByIdRequest) -> SegmentStatus, query_segment_status_by_id;
            8 => ServiceReady(ServiceReadyRequest) -> String, service_ready;
            9 => ReportUnreachable(ReportUnreachableRequest) -> u32, report_unreachable;
            16 => ReleaseParked(ReleaseParkedRequest) -> u32, release_parked_replicas;
            10 => ExistKey(KeyRequest) -> bool, exist_key;
            11 => BatchExistKey(KeysRequest) -> Vec<ItemResult<bool>>, batch_exist_key;
            12 => GetReplicaList(KeyRequest) -> GetReplicaListResponse, get_replica_list;
            13 => BatchGetReplicaList(KeysRequest) -> Vec<ItemResult<GetReplicaListResponse>>, batch_get_replica_list;
            14 => GetReplicaListByRegex(RegexRequest) -> Vec<(String, Vec<ReplicaDescriptor>)>, get_replica_list_by_regex;
            15 => RevalidateReplicas(RevalidateRequest) -> Vec<ItemResult<()>>, revalidate_replicas;
            20 => PutStart(PutStartRequest) -> Vec<ReplicaDescriptor>, put_start;
            21 => PutEnd(EndRequest) -> (), put_end;
            22 => PutRevoke(RevokeRequest) -> (), put_revoke;
            23 => BatchPutStart(BatchPutStartRequest) -> Vec<ItemResult<Vec<ReplicaDescriptor>>>, batch_put_start;
            24 => BatchPutEnd(BatchEndRequest) -> Vec<ItemResult<()>>, batch_put_end;
            25 => BatchPutRevoke(BatchRevokeRequest) -> Vec<ItemResult<()>>, batch_put_revoke;
            26 => UpsertStart(PutStartRequest) -> Vec<ReplicaDescriptor>, upsert_start;
            27 => UpsertEnd(EndRequest) -> (), upsert_end;
            28 => UpsertRevoke(RevokeRequest) -> (), upsert_revoke;
            29 => BatchUpsertStart(BatchPutStartRequest) -> Vec<ItemResult<Vec<ReplicaDescriptor>>>, batch_upsert_start;
            30 => BatchUpsertEnd(BatchEndRequest) -> Vec<ItemResult<()>>, batch_upsert_end;
            31 => BatchUpsertRevoke(BatchRevokeRequest) -> Vec<ItemResult<()>>, batch_upsert_revoke;
            40 => Remove(RemoveRequest) -> (), remove;
            41 => BatchRemove(BatchRemoveRequest) -> Vec<ItemResult<()>>, batch_remove;
            42 => RemoveByRegex(RemoveByRegexRequest) -> i64, remove_by_regex;
            43 => RemoveAll(RemoveAllRequest) -> i64, remove_all;
            44 => BatchReplicaClear(BatchReplicaClearRequest) -> Vec<String>, batch_replica_clear;
            50 => MountDiskSegment(MountDiskSegmentRequest) -> MountDiskSegmentResponse, mount_disk_segment;
            51 => UnmountDiskSegment(UnmountDiskSegmentRequest) -> (), unmount_disk_segment;
            52 => OffloadHeartbeat(OffloadHeartbeatRequest) -> OffloadHeartbeatResponse, offload_heartbeat;
            53 => NotifyOffload(NotifyOffloadRequest) -> Vec<ItemResult<()>>, notify_offload;
            60 => SyncCatalog(SyncCatalogRequest) -> SyncCatalogResponse, sync_catalog;
            61 => AdoptReplicas(AdoptReplicasRequest) -> AdoptReplicasResponse, adopt_replicas;
        }
    };
}

/// Ties a request struct to its response type and opcode.
pub trait Rpc: Serialize + DeserializeOwned {
    /// Operation this request performs.
    const OP: Op;
    /// Value returned on success.
    type Response: Serialize + DeserializeOwned;
}

macro_rules! define_ops {
    ($($code:literal => $name:ident($req:ty) -> $resp:ty, $method:ident;)*) => {
        /// Operation codes (uint16 on the wire).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Op {
            $(
                #[doc = stringify!($name)]
                $name = $code,
            )*
        }

        impl Op {
            /// Every operation, in table order.
            pub const ALL: &'static [Op] = &[$(Op::$name,)*];

            /// Maps a wire opcode back to an operation.
            pub fn from_u16(code: u16) -> Option<Op> {
                match code {
                    $($code => Some(Op::$name),)*
                    _ => None,
                }
            }

            /// snake_case name used in metrics (`master_<name>_requests_total`).
            pub fn metric_name(self) -> &'static str {
                match self {
                    $(Op::$name => stringify!($method),)*
                }
            }
        }

        /// A decoded request of any operation.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Request {
            $(
                #[doc = stringify!($name)]
                $name($req),
            )*
        }

        impl Request {
            /// The operation of this request.
            pub fn op(&self) -> Op {
                match self {
                    $(Request::$name(_) => Op::$name,)*
                }
            }

            /// Decodes a request body for `op`.
            pub fn decode(op: Op, body: &[u8]) -> Result<Request, rmp_serde::decode::Error> {
                match op {
                    $(Op::$name => rmp_serde::from_slice::<$req>(body).map(Request::$name),)*
                }
            }

            /// Appends the MessagePack body of this request to `out`.
            pub fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error> {
                match self {
                    $(Request::$name(r) => rmp_serde::encode::write(out, r),)*
                }
            }
        }
    };
}

for_each_op!(define_ops);

macro_rules! rpc {
    ($req:ty => $op:ident, $resp:ty) => {
        impl Rpc for $req {
            const OP: Op = Op::$op;
            type Response = $resp;
        }
    };
}

// Request structs shared by two operations (Put/Upsert) implement `Rpc` for the Put form; the
// client sends the Upsert form through [`Request`] directly.
rpc!(PingRequest => Ping, PingResponse);
rpc!(ReportUnreachableRequest => ReportUnreachable, u32);
rpc!(ReleaseParkedRequest => ReleaseParked, u32);
rpc!(MountSegmentRequest => MountSegment, ());
rpc!(ReMountSegmentRequest => ReMountSegment, ());
rpc!(SyncCatalogRequest => SyncCatalog, SyncCatalogResponse);
rpc!(AdoptReplicasRequest => AdoptReplicas, AdoptReplicasResponse);
rpc!(UnmountSegmentRequest => UnmountSegment, ());
rpc!(GracefulUnmountSegmentRequest => GracefulUnmountSegment, ());
rpc!(QuerySegmentStatusRequest => QuerySegmentStatus, SegmentStatus);
rpc!(QuerySegmentStatusByIdRequest => QuerySegmentStatusById, SegmentStatus);
rpc!(ServiceReadyRequest => ServiceReady, String);
rpc!(RevalidateRequest => RevalidateReplicas, Vec<ItemResult<()>>);
rpc!(RegexRequest => GetReplicaListByRegex, Vec<(String, Vec<ReplicaDescriptor>)>);
rpc!(RemoveRequest => Remove, ());
rpc!(BatchRemoveRequest => BatchRemove, Vec<ItemResult<()>>);
rpc!(RemoveByRegexRequest => RemoveByRegex, i64);
rpc!(RemoveAllRequest => RemoveAll, i64);
rpc!(BatchReplicaClearRequest => BatchReplicaClear, Vec<String>);
rpc!(MountDiskSegmentRequest => MountDiskSegment, MountDiskSegmentResponse);
rpc!(UnmountDiskSegmentRequest => UnmountDiskSegment, ());
rpc!(OffloadHeartbeatRequest => OffloadHeartbeat, OffloadHeartbeatResponse);
rpc!(NotifyOffloadRequest => NotifyOffload, Vec<ItemResult<()>>);

/// Ping: heartbeat of a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingRequest {
    /// The pinging client.
    pub client_id: ClientId,
    /// Memory segments the client has mounted, as far as it knows; a master that holds fewer
    /// of them (someone unmounted one) answers `NEED_REMOUNT`, so the owner re-registers them.
    /// Absent (0) from older clients.
    #[serde(default)]
    pub mounted_segments: u32,
}

/// ReportUnreachable: a client could not reach these data-plane endpoints (connection refused
/// or timed out). The master stops placing new replicas in their segments until each node's
/// next heartbeat; the answer counts the segments taken out of placement by this report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportUnreachableRequest {
    /// The reporting client.
    pub client_id: ClientId,
    /// Data-plane endpoints (`host:port`) that did not answer; at most
    /// [`MAX_REPORTED_ENDPOINTS`].
    pub endpoints: Vec<String>,
}

/// ReleaseParked: the writer of revoked replicas that were parked as *unsettled* (see
/// [`RevokeRequest::unsettled`]) now knows no node can still write into them; their space is
/// freed at once instead of at `put_start_release_timeout`. Ids this client did not park, or
/// that were freed already, are ignored; the answer counts the buffers freed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseParkedRequest {
    /// The writer that revoked them.
    pub client_id: ClientId,
    /// Replica ids from the revoked write's Start.
    pub replica_ids: Vec<ReplicaId>,
}

/// Most replica ids one [`ReleaseParkedRequest`] may name.
pub const MAX_RELEASED_REPLICAS: usize = 65_536;

/// Most endpoints one [`ReportUnreachableRequest`] may name.
pub const MAX_REPORTED_ENDPOINTS: usize = 256;

/// MountSegment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSegmentRequest {
    /// Segment to mount.
    pub segment: Segment,
    /// Owner.
    pub client_id: ClientId,
    /// The owner keeps a catalog of its committed replicas (it polls `SyncCatalog`): the
    /// master queues commit and drop notices for it from this mount on. Absent (false) from
    /// older clients and from owners that keep none, for which the master queues nothing.
    #[serde(default)]
    pub keeps_catalog: bool,
}

/// ReMountSegment: re-register all of a client's segments after `NEED_REMOUNT`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReMountSegmentRequest {
    /// Every segment the client owns.
    pub segments: Vec<Segment>,
    /// Owner.
    pub client_id: ClientId,
    /// The owner keeps a catalog of its committed replicas and will announce it with
    /// `AdoptReplicas`: segments this remount adds are mounted frozen (nothing is allocated in
    /// them) until the announcement ends or `adopt_timeout_ms` passes. Absent (false) from
    /// older clients.
    #[serde(default)]
    pub adopt: bool,
}

/// SyncCatalog: a node's long poll for the commit and drop notices of its replicas
/// (`docs/operations.md`, "Restart and re-adoption").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncCatalogRequest {
    /// The node.
    pub client_id: ClientId,
    /// Master epoch the node's `acked` refers to (0: none yet).
    pub epoch: u64,
    /// Highest notice sequence the node has applied; the master forgets those.
    pub acked: u64,
    /// How long the master may hold the request when no notice is pending (capped by it).
    pub wait_ms: u32,
}

/// What a node's catalog learns about one of its memory replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatalogNotice {
    /// The replica was committed (PutEnd/UpsertEnd acknowledged): the node keeps this entry.
    Commit(CatalogEntry),
    /// The replica left its object (removed, replaced, evicted, unmounted): forget every
    /// entry overlapping `[address, address + len)` of the segment.
    Drop {
        /// Segment of the range.
        segment_id: SegmentId,
        /// Start of the range.
        address: u64,
        /// Length of the range.
        len: u64,
    },
}

/// A committed memory replica, as a node keeps it and announces it to a master that does not
/// know it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// Segment holding the bytes.
    pub segment_id: SegmentId,
    /// Address of the replica's buffer.
    pub address: u64,
    /// Length of the buffer (the object size rounded up to the allocation granularity).
    pub len: u64,
    /// Replica id (preserved by re-adoption).
    pub replica_id: ReplicaId,
    /// Version of the write, part 1: the epoch of the master that committed it.
    pub epoch: u64,
    /// Version of the write, part 2: the write's id within that master's life.
    pub write: u64,
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// Object size in bytes.
    pub size: u64,
    /// Checksum given at PutEnd, if any.
    pub checksum: Option<u64>,
}

/// Answer to SyncCatalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncCatalogResponse {
    /// Epoch of this master (changes when the master restarts or a new leader takes over).
    pub epoch: u64,
    /// Sequence of the last notice in `notices` (or the last acknowledged one when empty).
    pub last: u64,
    /// The node's catalog is no longer trustworthy (its notices overflowed, or the node was
    /// expired): forget every entry before applying `notices`.
    pub reset: bool,
    /// Notices in order.
    pub notices: Vec<CatalogNotice>,
}

/// AdoptReplicas: a node announces the committed replicas of one of its segments to a master
/// that mounted the segment anew (after a restart or failover), in chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptReplicasRequest {
    /// The node (owner of the segment).
    pub client_id: ClientId,
    /// The segment.
    pub segment_id: SegmentId,
    /// Entries of this chunk.
    pub entries: Vec<CatalogEntry>,
    /// Last chunk: the segment leaves its frozen state and takes new writes.
    pub done: bool,
}

/// Answer to AdoptReplicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptReplicasResponse {
    /// Addresses of the entries the master did not adopt (a newer version exists, the range
    /// is taken, or the entry is invalid): the node forgets them.
    pub rejected: Vec<u64>,
    /// Entries adopted by this chunk.
    pub adopted: u64,
}

/// UnmountSegment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmountSegmentRequest {
    /// Segment to unmount.
    pub segment_id: SegmentId,
    /// Caller; must own the segment.
    pub client_id: ClientId,
}

/// GracefulUnmountSegment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GracefulUnmountSegmentRequest {
    /// Segment to drain then unmount.
    pub segment_id: SegmentId,
    /// Caller; must own the segment.
    pub client_id: ClientId,
    /// Milliseconds the segment stays readable.
    pub grace_period_ms: u64,
}

/// QuerySegmentStatus by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuerySegmentStatusRequest {
    /// Segment name.
    pub segment_name: String,
}

/// QuerySegmentStatusById.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuerySegmentStatusByIdRequest {
    /// Segment id.
    pub segment_id: SegmentId,
}

/// ServiceReady: liveness probe; answers the master version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceReadyRequest {}

/// A read of one key (ExistKey, GetReplicaList).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object key.
    pub key: String,
}

/// A read of many keys (BatchExistKey, BatchGetReplicaList).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object keys; results come back in this order.
    pub keys: Vec<String>,
}

/// GetReplicaListByRegex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegexRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Regular expression, matched anywhere in the key (search semantics).
    pub regex: String,
}

/// Replica ids a reader holds for one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevalidateItem {
    /// Object key.
    pub key: String,
    /// Ids from the reader's GetReplicaList.
    pub replica_ids: Vec<ReplicaId>,
}

/// RevalidateReplicas: are these replicas still the object's complete replicas?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevalidateRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// One entry per key.
    pub items: Vec<RevalidateItem>,
}

/// PutStart / UpsertStart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutStartRequest {
    /// Writer.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object key (non-empty).
    pub key: String,
    /// Object size in bytes (non-zero).
    pub size: u64,
    /// Placement and pins.
    pub config: ReplicateConfig,
}

/// PutEnd / UpsertEnd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRequest {
    /// Writer; must match the Start.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// Which replicas are done.
    pub replica_type: ReplicaType,
    /// Ids returned by the writer's own Start for this type (must match exactly).
    pub replica_ids: Vec<ReplicaId>,
    /// Optional checksum stored with the object.
    pub checksum: Option<u64>,
}

/// PutRevoke / UpsertRevoke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeRequest {
    /// Writer; must match the Start.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// Which replicas to abandon.
    pub replica_type: ReplicaType,
    /// Ids returned by the writer's own Start for this type (must match exactly).
    pub replica_ids: Vec<ReplicaId>,
    /// The writer cannot tell whether a node is still writing into these replicas (a transfer
    /// timed out or was cancelled). The key is freed at once all the same, but the replicas'
    /// space is parked until `put_start_release_timeout` or a [`ReleaseParkedRequest`], so a
    /// late write cannot land in space handed to another object. Absent (false) from older
    /// clients, and not sent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
}

/// BatchPutStart / BatchUpsertStart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPutStartRequest {
    /// Writer.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Keys.
    pub keys: Vec<String>,
    /// One size per key.
    pub sizes: Vec<u64>,
    /// Placement and pins (group_ids, if any, one per key).
    pub config: ReplicateConfig,
}

/// One key of a batch End.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndItem {
    /// Object key.
    pub key: String,
    /// Ids from the Start (one inline: most objects have one replica, and a batch of them
    /// then allocates nothing per key for its ids).
    pub replica_ids: ReplicaIds,
    /// Optional checksum.
    pub checksum: Option<u64>,
}

/// The replica ids of one key of a batch End or Revoke: encoded as a list, like a `Vec`.
pub type ReplicaIds = smallvec::SmallVec<[ReplicaId; 1]>;

/// BatchPutEnd / BatchUpsertEnd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchEndRequest {
    /// Writer.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Which replicas are done.
    pub replica_type: ReplicaType,
    /// One entry per key.
    pub items: Vec<EndItem>,
}

/// One key of a batch Revoke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeItem {
    /// Object key.
    pub key: String,
    /// Ids from the Start.
    pub replica_ids: ReplicaIds,
    /// As [`RevokeRequest::unsettled`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
}

/// BatchPutRevoke / BatchUpsertRevoke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRevokeRequest {
    /// Writer.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Which replicas to abandon.
    pub replica_type: ReplicaType,
    /// One entry per key.
    pub items: Vec<RevokeItem>,
}

/// Remove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// Ignore read leases.
    pub force: bool,
}

/// BatchRemove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRemoveRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object keys.
    pub keys: Vec<String>,
    /// Ignore read leases.
    pub force: bool,
}

/// RemoveByRegex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveByRegexRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Regular expression, matched anywhere in the key.
    pub regex: String,
    /// Ignore read leases.
    pub force: bool,
}

/// RemoveAll of one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveAllRequest {
    /// Tenant ("" = default).
    pub tenant: String,
    /// Ignore read leases.
    pub force: bool,
}

/// BatchReplicaClear: the caller drops the committed replicas of objects it wrote whose read
/// leases have run out: every replica (the object goes) when `segment_name` is empty, else only
/// those held by the memory or disk segment of that name (the object goes with its last one).
/// Answers the keys it cleared, in request order; a key it does not clear is left as it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReplicaClearRequest {
    /// The caller: only objects it wrote last are cleared.
    pub client_id: ClientId,
    /// Tenant ("" = default).
    pub tenant: String,
    /// Object keys.
    pub keys: Vec<String>,
    /// The segment whose replicas go; "" = every segment.
    pub segment_name: String,
}

/// MountDiskSegment: a node registers its disk directory and the replica files found in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountDiskSegmentRequest {
    /// Owner (the node's client id).
    pub client_id: ClientId,
    /// The disk.
    pub disk: DiskSegment,
    /// Replica files already in the directory (after a restart), for the master to re-admit.
    pub existing: Vec<DiskFile>,
}

/// UnmountDiskSegment: the owner takes its disk offline (replicas are detached, see
/// `docs/disk-tier.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmountDiskSegmentRequest {
    /// Owner.
    pub client_id: ClientId,
    /// The disk to unmount.
    pub disk_id: SegmentId,
}

/// OffloadHeartbeat: a disk owner polls for offload tasks and file deletions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadHeartbeatRequest {
    /// Owner of a mounted disk.
    pub client_id: ClientId,
    /// File ids of earlier deletions the node has carried out (unlinked, directory synced);
    /// absent = none in older encodings.
    #[serde(default)]
    pub deleted: Vec<u64>,
}

/// NotifyOffload: outcomes of offload tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotifyOffloadRequest {
    /// Owner of the disk the tasks wrote to.
    pub client_id: ClientId,
    /// One entry per finished task.
    pub results: Vec<OffloadResult>,
}

/// Hello frame body sent by the client as its first frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always `"moonkv"`.
    pub magic: String,
    /// Protocol version the client speaks.
    pub protocol_version: u32,
    /// Free-form client name, for logs.
    pub client_name: String,
    /// Proof of the shared secret, sent in a second hello once the master issued a challenge.
    #[serde(default)]
    pub auth: Option<HelloAuth>,
}

/// A client's answer to the master's authentication challenge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAuth {
    /// 16 random bytes chosen by the client (MessagePack bin).
    #[serde(with = "serde_bytes")]
    pub client_nonce: Vec<u8>,
    /// `crate::auth::client_proof(secret, challenge, client_nonce)` (32 bytes, bin).
    #[serde(with = "serde_bytes")]
    pub proof: Vec<u8>,
}

/// Server answer to a hello.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAck {
    /// Protocol version the server speaks.
    pub protocol_version: u32,
    /// Server software version.
    pub server_version: String,
    /// Largest frame the server accepts, in bytes.
    pub max_frame_bytes: u32,
    /// Set when the master requires authentication and the client has not proven it yet:
    /// 16 random bytes to prove the shared secret against (MessagePack bin).
    #[serde(default, with = "serde_bytes")]
    pub challenge: Option<Vec<u8>>,
    /// The master's own proof once the client authenticated (`auth::server_proof`), so the
    /// client knows it talks to a master holding the same secret.
    #[serde(default, with = "serde_bytes")]
    pub server_proof: Option<Vec<u8>>,
    /// The master's admin HTTP address (`host:port`), so tools that start from the RPC address
    /// find `/metrics` and friends; absent from masters that do not announce it.
    #[serde(default)]
    pub admin_addr: Option<String>,
    /// The master's local socket (`crate::local_socket`, written `@moonkv-master-…`): callers
    /// on its machine may reconnect there and say hello again. Absent from masters that offer
    /// none (TLS, `rpc_local_socket` off, older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_socket: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_round_trips_its_code() {
        for op in Op::ALL {
            assert_eq!(Op::from_u16(*op as u16), Some(*op));
        }
        assert_eq!(Op::from_u16(0), None);
        assert_eq!(Op::from_u16(9999), None);
    }

    #[test]
    fn request_body_round_trips() {
        let req = Request::PutStart(PutStartRequest {
            client_id: ClientId::new(1, 2),
            tenant: "t".into(),
            key: "k".into(),
            size: 4096,
            config: ReplicateConfig {
                replica_num: 2,
                group_ids: Some(vec!["g".into()]),
                ..Default::default()
            },
        });
        let mut body = Vec::new();
        req.encode_body(&mut body).unwrap();
        assert_eq!(Request::decode(Op::PutStart, &body).unwrap(), req);
        assert!(Request::decode(Op::PutEnd, &body).is_err());
    }

    #[test]
    fn replicate_configs_without_the_disk_flag_still_decode() {
        // The six fields of protocol version 1 before the disk tier: [1, 0, nil, false, [], nil].
        let old = [0x96, 0x01, 0x00, 0xc0, 0xc2, 0x90, 0xc0];
        let config: ReplicateConfig = rmp_serde::from_slice(&old).unwrap();
        assert_eq!(config, ReplicateConfig::default());
        let new = ReplicateConfig {
            with_disk_replica: true,
            ..Default::default()
        };
        let bytes = rmp_serde::to_vec(&new).unwrap();
        assert_eq!(bytes[0], 0x97, "the flag travels as a seventh field");
        assert_eq!(
            rmp_serde::from_slice::<ReplicateConfig>(&bytes).unwrap(),
            new
        );
    }

    #[test]
    fn item_results_carry_code_and_message() {
        let items: Vec<ItemResult<bool>> = vec![
            ItemResult(Ok(true)),
            ItemResult(Err(crate::Error::new(
                crate::ErrorCode::OBJECT_NOT_FOUND,
                "no such key",
            ))),
        ];
        let bytes = rmp_serde::to_vec(&items).unwrap();
        let back: Vec<ItemResult<bool>> = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, items);
    }

    /// End and Revoke items hold their ids inline, but the ids travel as the plain list they
    /// always were: a peer built before that change reads them, and its items read back here.
    #[test]
    fn end_item_ids_travel_as_a_plain_list() {
        for ids in [vec![7u64], vec![7, 9, 11], vec![]] {
            let item = EndItem {
                key: "k".into(),
                replica_ids: ids.iter().map(|&id| ReplicaId(id)).collect(),
                checksum: Some(3),
            };
            let bytes = rmp_serde::to_vec(&item).unwrap();
            let as_vec = rmp_serde::to_vec(&("k", ids.clone(), Some(3u64))).unwrap();
            assert_eq!(bytes, as_vec, "ids {ids:?}");
            let back: EndItem = rmp_serde::from_slice(&as_vec).unwrap();
            assert_eq!(back, item);
            let revoke = RevokeItem {
                key: "k".into(),
                replica_ids: item.replica_ids.clone(),
                unsettled: false,
            };
            let as_vec = rmp_serde::to_vec(&("k", ids.clone())).unwrap();
            assert_eq!(rmp_serde::to_vec(&revoke).unwrap(), as_vec, "ids {ids:?}");
            let back: RevokeItem = rmp_serde::from_slice(&as_vec).unwrap();
            assert_eq!(back, revoke);
        }
    }

    /// Replica descriptors share their segment's strings, and still travel as strings.
    #[test]
    fn replica_descriptor_names_travel_as_strings() {
        let d = ReplicaDescriptor {
            id: ReplicaId(5),
            kind: ReplicaKind::Memory,
            status: ReplicaStatus::Complete,
            size: 10,
            segment_id: SegmentId::new(1, 2),
            segment_name: "seg".into(),
            endpoint: "127.0.0.1:9".into(),
            address: 64,
            grant: None,
        };
        let bytes = rmp_serde::to_vec(&d).unwrap();
        let plain = rmp_serde::to_vec(&(
            5u64,
            ReplicaKind::Memory,
            ReplicaStatus::Complete,
            10u64,
            SegmentId::new(1, 2),
            "seg".to_string(),
            "127.0.0.1:9".to_string(),
            64u64,
        ))
        .unwrap();
        assert_eq!(bytes, plain);
        let back: ReplicaDescriptor = rmp_serde::from_slice(&plain).unwrap();
        assert_eq!(back, d);
    }
}
