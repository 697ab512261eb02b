use std::sync::Arc;
use std::time::{Duration, Instant};

use rmp::encode as w;

use super::*;
use crate::api::{QueryRequest, SourceType, TokenIds, UnregisterRequest};
use crate::hash::Chain;
use crate::keys::KeyFormat;
use crate::state::Indexer;

const BS: u32 = 4;

fn spec(instance: &str, endpoint: &str, mode: EngineHashes) -> SourceSpec {
    SourceSpec {
        endpoint: endpoint.into(),
        replay_endpoint: None,
        source_type: SourceType::Vllm,
        modelname: "m".into(),
        lora_name: None,
        tenant_id: None,
        instance_id: instance.into(),
        block_size: BS,
        dp_rank: 0,
        additionalsalt: None,
        hash_profile: None,
        engine_hashes: mode,
        key_format: KeyFormat::Auto,
        admin: None,
    }
}

fn query(ix: &Indexer, tokens: &[u32]) -> Vec<(String, u64, u64, u64)> {
    let req = QueryRequest {
        model: "m".into(),
        block_size: BS,
        token_ids: TokenIds(tokens.to_vec()),
        tenant_id: None,
        instance_id: None,
        lora_name: None,
        cache_salt: None,
        additional_salt: None,
    };
    let answer = ix.query(&req).unwrap();
    answer["default"]
        .iter()
        .map(|(i, m)| (i.clone(), m.gpu, m.cpu, m.longest_matched))
        .collect()
}

fn stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    medium: Option<&str>,
) -> EngineEvent {
    EngineEvent::Stored(StoredBlocks {
        block_hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
        parent: parent.map(BlockHash),
        token_ids: tokens.to_vec(),
        block_size: Some(BS),
        lora_name: None,
        medium: medium.map(str::to_owned),
        extra_keys: None,
    })
}

fn removed(hashes: &[u64], medium: Option<&str>) -> EngineEvent {
    EngineEvent::Removed {
        block_hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
        medium: medium.map(str::to_owned),
    }
}

#[test]
fn recomputed_hashes_follow_parents_tiers_and_removals() {
    let ix = Indexer::new();
    let profile = HashProfile::vllm("0");
    let s = spec("e0", "tcp://127.0.0.1:1", EngineHashes::Recompute);
    let slot = ix.add(s.clone(), &profile).unwrap();
    let mut blocks = EngineBlocks::new(slot, s, profile);
    let index = ix.index();
    let tokens: Vec<u32> = (100..116).collect(); // 4 blocks
                                                 // engine hashes are arbitrary: the index recomputes its own
    blocks
        .apply(index, &stored(&[901, 902], None, &tokens[..8], None))
        .unwrap();
    blocks
        .apply(
            index,
            &stored(&[903], Some(902), &tokens[8..12], Some("CPU")),
        )
        .unwrap();
    assert_eq!(query(&ix, &tokens), vec![("e0".into(), 8, 12, 12)]);
    // a partial tail block never counts
    assert_eq!(query(&ix, &tokens[..11]), vec![("e0".into(), 8, 8, 8)]);
    // an orphan is refused, a wrong block size too, an unknown medium too
    assert_eq!(
        blocks.apply(index, &stored(&[905], Some(777), &tokens[12..], None)),
        Err("unknown_parent")
    );
    let mut wrong = stored(&[906], None, &tokens[..4], None);
    if let EngineEvent::Stored(st) = &mut wrong {
        st.block_size = Some(8);
    }
    assert_eq!(blocks.apply(index, &wrong), Err("block_size_mismatch"));
    assert_eq!(
        blocks.apply(index, &stored(&[907], None, &tokens[..4], Some("TAPE"))),
        Err("unknown_medium")
    );
    assert_eq!(
        blocks.apply(index, &stored(&[908], None, &tokens[..3], None)),
        Err("token_count_mismatch")
    );
    // evicting block 2 from GPU leaves the first block on GPU only
    blocks.apply(index, &removed(&[902], None)).unwrap();
    assert_eq!(query(&ix, &tokens), vec![("e0".into(), 4, 4, 4)]);
    blocks.apply(index, &EngineEvent::Cleared).unwrap();
    assert_eq!(query(&ix, &tokens), vec![]);
    assert_eq!(blocks.tracked(), 0);
}

#[test]
fn recomputed_hashes_equal_the_query_chain_with_lora() {
    let ix = Indexer::new();
    let profile = HashProfile::vllm("7");
    let mut s = spec("e0", "tcp://127.0.0.1:1", EngineHashes::Recompute);
    s.hash_profile = Some(profile.spec());
    let slot = ix.add(s.clone(), &profile).unwrap();
    let mut blocks = EngineBlocks::new(slot, s, profile.clone());
    let tokens: Vec<u32> = (0..8).collect();
    let mut ev = stored(&[1, 2], None, &tokens, None);
    if let EngineEvent::Stored(st) = &mut ev {
        st.lora_name = Some("sql".into());
    }
    blocks.apply(ix.index(), &ev).unwrap();
    let expected: Vec<BlockHash> = Chain::new(&profile, &tokens, 4, Some("sql"), None).collect();
    let key = crate::state::partition_of(
        &spec("e0", "x", EngineHashes::Recompute),
        "default",
        Some("sql"),
    );
    let part = ix.index().partition(&key).unwrap();
    for h in expected {
        assert!(part.read().holders(h).is_some());
    }
}

#[test]
fn trusted_hashes_are_indexed_as_sent() {
    let ix = Indexer::new();
    let profile = HashProfile::vllm("0");
    let s = spec("e1", "tcp://127.0.0.1:1", EngineHashes::Trust);
    let slot = ix.add(s.clone(), &profile).unwrap();
    let mut blocks = EngineBlocks::new(slot, s, profile.clone());
    let tokens: Vec<u32> = (0..8).collect();
    let chain: Vec<u64> = Chain::new(&profile, &tokens, 4, None, None)
        .map(|h| h.0)
        .collect();
    blocks
        .apply(ix.index(), &stored(&chain, None, &[], None))
        .unwrap();
    assert_eq!(query(&ix, &tokens), vec![("e1".into(), 8, 8, 8)]);
    blocks
        .apply(ix.index(), &removed(&chain[1..], None))
        .unwrap();
    assert_eq!(query(&ix, &tokens), vec![("e1".into(), 4, 4, 4)]);
}

// ---- the subscriber thread against an in-test publisher and replay ROUTER ----

struct Publisher {
    _ctx: zmq::Context,
    pub_sock: zmq::Socket,
    router: zmq::Socket,
    ring: Vec<(u64, Vec<u8>)>,
    endpoint: String,
    replay: String,
}

fn bound(ctx: &zmq::Context, kind: zmq::SocketType) -> (zmq::Socket, String) {
    let s = ctx.socket(kind).unwrap();
    s.set_linger(0).unwrap();
    s.bind("tcp://127.0.0.1:*").unwrap();
    let ep = s.get_last_endpoint().unwrap().unwrap();
    (s, ep)
}

fn payload(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    w::write_array_len(&mut out, 3).unwrap();
    w::write_f64(&mut out, 1.0).unwrap();
    w::write_array_len(&mut out, events.len() as u32).unwrap();
    for e in events {
        out.extend_from_slice(e);
    }
    w::write_uint(&mut out, 0).unwrap();
    out
}

/// A vLLM map-era BlockStored with engine hash `h` (parent `p`) for `tokens`.
fn stored_bytes(h: u64, p: Option<u64>, tokens: &[u32]) -> Vec<u8> {
    let mut e = Vec::new();
    w::write_map_len(&mut e, 5).unwrap();
    w::write_str(&mut e, "type").unwrap();
    w::write_str(&mut e, "BlockStored").unwrap();
    w::write_str(&mut e, "block_hashes").unwrap();
    w::write_array_len(&mut e, 1).unwrap();
    w::write_uint(&mut e, h).unwrap();
    w::write_str(&mut e, "parent_block_hash").unwrap();
    match p {
        Some(p) => w::write_uint(&mut e, p).map(|_| ()).unwrap(),
        None => w::write_nil(&mut e).unwrap(),
    }
    w::write_str(&mut e, "token_ids").unwrap();
    w::write_array_len(&mut e, tokens.len() as u32).unwrap();
    for &t in tokens {
        w::write_uint(&mut e, u64::from(t)).unwrap();
    }
    w::write_str(&mut e, "block_size").unwrap();
    w::write_uint(&mut e, u64::from(BS)).unwrap();
    e
}

impl Publisher {
    fn new() -> Publisher {
        let ctx = zmq::Context::new();
        let (pub_sock, endpoint) = bound(&ctx, zmq::PUB);
        let (router, replay) = bound(&ctx, zmq::ROUTER);
        router.set_rcvtimeo(20).unwrap();
        Publisher {
            _ctx: ctx,
            pub_sock,
            router,
            ring: Vec::new(),
            endpoint,
            replay,
        }
    }

    /// Records batch `seq`; sends it live unless `drop`.
    fn publish(&mut self, seq: u64, events: &[Vec<u8>], drop: bool) {
        let p = payload(events);
        if !drop {
            self.pub_sock
                .send_multipart([&b""[..], &seq.to_be_bytes()[..], &p[..]], 0)
                .unwrap();
        }
        self.ring.push((seq, p));
    }

    /// Answers pending replay requests, as vLLM 0.26+ does (4 frames, then the end marker).
    fn serve_replay(&self) {
        while let Ok(frames) = self.router.recv_multipart(0) {
            let start = u64::from_be_bytes(frames[2].as_slice().try_into().unwrap());
            for (seq, p) in self.ring.iter().filter(|(s, _)| *s >= start) {
                self.router
                    .send_multipart([&frames[0][..], b"", b"", &seq.to_be_bytes(), p], 0)
                    .unwrap();
            }
            self.router
                .send_multipart([&frames[0][..], b"", b"", &[0xff; 8], b""], 0)
                .unwrap();
        }
    }
}

fn wait(what: &str, mut done: impl FnMut() -> bool, mut tick: impl FnMut()) {
    let until = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tick();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn gaps_are_replayed_and_restarts_drop_the_source() {
    let ix = Arc::new(Indexer::new());
    let mut p = Publisher::new();
    let mut s = spec("e0", &p.endpoint, EngineHashes::Recompute);
    s.replay_endpoint = Some(p.replay.clone());
    ix.register(s).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let block = |i: usize| &tokens[i * 4..(i + 1) * 4];
    // slow joiner: send the first batch until the subscriber has it
    let status = |ix: &Indexer| ix.sources()[0].status.clone();
    wait(
        "the first batch",
        || status(&ix).last_sequence == Some(0),
        || {
            p.ring.clear();
            p.publish(0, &[stored_bytes(1, None, block(0))], false);
        },
    );
    // batch 1 is lost on the wire; batch 2 reveals the gap and replay fills it
    p.publish(1, &[stored_bytes(2, Some(1), block(1))], true);
    p.publish(2, &[stored_bytes(3, Some(2), block(2))], false);
    wait(
        "the replayed gap",
        || status(&ix).last_sequence == Some(2),
        || p.serve_replay(),
    );
    assert_eq!(query(&ix, &tokens), vec![("e0".into(), 12, 12, 12)]);
    let st = status(&ix);
    assert_eq!((st.gaps, st.repaired_gaps, st.resets), (1, 1, 0), "{st:?}");
    // the engine restarts: sequence 0 again, its old blocks are gone
    p.ring.clear();
    p.publish(0, &[stored_bytes(50, None, block(0))], false);
    wait("the restart", || status(&ix).restarts == 1, || {});
    assert_eq!(query(&ix, &tokens), vec![("e0".into(), 4, 4, 4)]);
    // a gap the ring cannot close (it starts later) drops the source's blocks
    p.ring.clear();
    p.publish(5, &[stored_bytes(51, None, block(0))], false);
    wait(
        "the lost history",
        || status(&ix).resets == 2,
        || p.serve_replay(),
    );
    wait(
        "the batch after the loss",
        || status(&ix).last_sequence == Some(5),
        || p.serve_replay(),
    );
    assert_eq!(query(&ix, &tokens), vec![("e0".into(), 4, 4, 4)]);
    // unregistering removes the instance
    let removed = ix
        .unregister(&UnregisterRequest {
            instance_id: "e0".into(),
            tenant_id: None,
            dp_rank: None,
            source_type: None,
            endpoint: None,
            modelname: None,
            lora_name: None,
            block_size: None,
        })
        .unwrap();
    assert_eq!(removed, vec!["e0|default|0".to_string()]);
    assert_eq!(query(&ix, &tokens), vec![]);
    assert_eq!(ix.index().blocks(), 0);
}
