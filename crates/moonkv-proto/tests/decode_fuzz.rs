//! Every request body the master decodes, from random bytes and from mutated valid encodings:
//! decoding returns a value or a clean error, never panics.

use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{Op, Request};
use proptest::prelude::*;

/// A valid body per operation, written as plain MessagePack arrays (the wire shape of
/// docs/protocol.md), so mutations start from something the decoder accepts.
fn seed(op: Op) -> Option<Vec<u8>> {
    let id = (7u64, 9u64);
    let seg = (id, "seg", 0x1000u64, 4096u64, "127.0.0.1:1", "tcp", "h");
    let cfg = (
        2u32,
        1u8,
        Some(60_000u64),
        false,
        vec!["seg"],
        Some(vec!["g"]),
    );
    let ids = vec![11u64, 12];
    let enc = |v: &dyn erased::Encode| v.encode();
    let body = match op {
        Op::Ping => enc(&(id,)),
        Op::MountSegment => enc(&(seg, id)),
        Op::ReMountSegment => enc(&(vec![seg], id)),
        Op::UnmountSegment => enc(&(id, id)),
        Op::GracefulUnmountSegment => enc(&(id, id, 500u64)),
        Op::QuerySegmentStatus => enc(&("seg",)),
        Op::QuerySegmentStatusById => enc(&(id,)),
        Op::ServiceReady => enc(&Vec::<u8>::new()),
        Op::ExistKey | Op::GetReplicaList => enc(&("t", "k")),
        Op::BatchExistKey | Op::BatchGetReplicaList => enc(&("t", vec!["a", "b"])),
        Op::GetReplicaListByRegex => enc(&("t", "^a.*")),
        Op::RevalidateReplicas => enc(&("t", vec![("k", ids.clone())])),
        Op::PutStart | Op::UpsertStart => enc(&(id, "t", "k", 4096u64, cfg.clone())),
        Op::PutEnd | Op::UpsertEnd => enc(&(id, "t", "k", 4u8, ids.clone(), Some(5u64))),
        Op::PutRevoke | Op::UpsertRevoke => enc(&(id, "t", "k", 0u8, ids.clone())),
        Op::BatchPutStart | Op::BatchUpsertStart => {
            enc(&(id, "t", vec!["a", "b"], vec![1u64, 2], cfg.clone()))
        }
        Op::BatchPutEnd | Op::BatchUpsertEnd => {
            enc(&(id, "t", 0u8, vec![("a", ids.clone(), None::<u64>)]))
        }
        Op::BatchPutRevoke | Op::BatchUpsertRevoke => {
            enc(&(id, "t", 0u8, vec![("a", ids.clone())]))
        }
        Op::Remove => enc(&("t", "k", true)),
        Op::BatchRemove => enc(&("t", vec!["a"], false)),
        Op::RemoveByRegex => enc(&("t", "a+", true)),
        Op::RemoveAll => enc(&("t", false)),
        Op::BatchReplicaClear => enc(&(id, "t", vec!["a", "b"], "seg")),
        #[allow(unreachable_patterns)]
        _ => return None,
    };
    Some(body)
}

mod erased {
    /// Object-safe MessagePack encoding for the seed table.
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            rmp_serde::to_vec(self).expect("seed encodes")
        }
    }
}

#[test]
fn every_seed_decodes() {
    for op in Op::ALL {
        if let Some(body) = seed(*op) {
            Request::decode(*op, &body).unwrap_or_else(|e| panic!("{op:?} seed: {e}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_bodies_of_every_op(op in proptest::sample::select(Op::ALL.to_vec()),
                                 body in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Request::decode(op, &body);
    }

    #[test]
    fn mutated_valid_bodies_of_every_op(op in proptest::sample::select(Op::ALL.to_vec()),
                                        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                                        cut in any::<prop::sample::Index>()) {
        let Some(mut body) = seed(op) else { return Ok(()) };
        for (at, byte) in edits {
            let i = at.index(body.len());
            body[i] = byte;
        }
        body.truncate(cut.index(body.len() + 1));
        if let Ok(request) = Request::decode(op, &body) {
            // Whatever decodes re-encodes into a frame that decodes to the same request.
            let mut out = Vec::new();
            frame::encode_request(&mut out, 1, &request).unwrap();
            let (f, _) = frame::decode(&out, u32::MAX).unwrap().unwrap();
            prop_assert_eq!(frame::decode_request(&f).unwrap(), request);
        }
    }

    #[test]
    fn random_frames_with_valid_headers(opcode in 0i32..64, kind in 1u8..=3,
                                        body in proptest::collection::vec(any::<u8>(), 0..96)) {
        let mut out = Vec::new();
        out.extend_from_slice(&((13 + body.len()) as u32).to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&1u64.to_be_bytes());
        out.extend_from_slice(&opcode.to_be_bytes());
        out.extend_from_slice(&body);
        let (f, used) = frame::decode(&out, 1 << 16).unwrap().unwrap();
        prop_assert_eq!(used, out.len());
        if f.kind == FrameKind::Request {
            let _ = frame::decode_request(&f);
        }
        let _ = frame::decode_response::<Vec<moonkv_proto::ReplicaDescriptor>>(&f);
        let _ = rmp_serde::from_slice::<moonkv_proto::msg::Hello>(f.body);
    }
}
