//! What the load drives: a master over the wire ([`Connection`]) or the [`Engine`] directly,
//! behind one trait, and the fake segments both are given.

use super::load::LoadSettings;
use moonkv_client::master_client::blocking::Connection;
use moonkv_master::engine::Engine;
use moonkv_proto::msg::*;
use moonkv_proto::{
    ClientId, GetReplicaListResponse, ItemResult, PingResponse, ReplicaDescriptor, Result, Segment,
    SegmentId,
};

/// The operations the load needs, over the wire or straight into the engine; each method is
/// the RPC of the same name (`docs/protocol.md` §4).
pub trait MetaTarget: Send + Sync {
    fn put_start(&self, r: &PutStartRequest) -> Result<Vec<ReplicaDescriptor>>;
    fn put_end(&self, r: &EndRequest) -> Result<()>;
    fn get_replica_list(&self, r: &KeyRequest) -> Result<GetReplicaListResponse>;
    fn batch_put_start(
        &self,
        r: &BatchPutStartRequest,
    ) -> Result<Vec<ItemResult<Vec<ReplicaDescriptor>>>>;
    fn batch_put_end(&self, r: &BatchEndRequest) -> Result<Vec<ItemResult<()>>>;
    fn batch_get_replica_list(
        &self,
        r: &KeysRequest,
    ) -> Result<Vec<ItemResult<GetReplicaListResponse>>>;
    fn batch_remove(&self, r: &BatchRemoveRequest) -> Result<Vec<ItemResult<()>>>;
    fn mount_segment(&self, r: &MountSegmentRequest) -> Result<()>;
    fn unmount_segment(&self, r: &UnmountSegmentRequest) -> Result<()>;
    fn ping(&self, r: &PingRequest) -> Result<PingResponse>;
}

macro_rules! targets {
    ($($method:ident($req:ty) -> $resp:ty = $op:ident;)*) => {
        impl MetaTarget for Engine {
            $(fn $method(&self, r: &$req) -> Result<$resp> {
                Engine::$method(self, r)
            })*
        }

        impl MetaTarget for Connection {
            $(fn $method(&self, r: &$req) -> Result<$resp> {
                self.call(Op::$op, r)
            })*
        }
    };
}

targets! {
    put_start(PutStartRequest) -> Vec<ReplicaDescriptor> = PutStart;
    put_end(EndRequest) -> () = PutEnd;
    get_replica_list(KeyRequest) -> GetReplicaListResponse = GetReplicaList;
    batch_put_start(BatchPutStartRequest) -> Vec<ItemResult<Vec<ReplicaDescriptor>>> = BatchPutStart;
    batch_put_end(BatchEndRequest) -> Vec<ItemResult<()>> = BatchPutEnd;
    batch_get_replica_list(KeysRequest) -> Vec<ItemResult<GetReplicaListResponse>> = BatchGetReplicaList;
    batch_remove(BatchRemoveRequest) -> Vec<ItemResult<()>> = BatchRemove;
    mount_segment(MountSegmentRequest) -> () = MountSegment;
    unmount_segment(UnmountSegmentRequest) -> () = UnmountSegment;
    ping(PingRequest) -> PingResponse = Ping;
}

/// The fake segments of a run: distinct ids, names and address ranges, nothing behind them.
pub fn fake_segments(nonce: u64, settings: &LoadSettings) -> Vec<Segment> {
    (0..settings.segments)
        .map(|i| Segment {
            id: SegmentId::new(nonce, i),
            name: format!("bench-{nonce:016x}-{i:04}").into(),
            base: (i + 1) << 44,
            size: settings.segment_size,
            endpoint: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            host_id: "moonkv-bench".into(),
        })
        .collect()
}

/// Mounts `segments` for `owner`.
pub fn mount_all(target: &dyn MetaTarget, owner: ClientId, segments: &[Segment]) -> Result<()> {
    for segment in segments {
        target.mount_segment(&MountSegmentRequest {
            segment: segment.clone(),
            client_id: owner,
            keeps_catalog: false,
        })?;
    }
    Ok(())
}
