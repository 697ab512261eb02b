use proptest::prelude::*;
use rmp::encode as w;

use super::*;

fn s(out: &mut Vec<u8>, v: &str) {
    w::write_str(out, v).unwrap();
}

fn u(out: &mut Vec<u8>, v: u64) {
    w::write_uint(out, v).unwrap();
}

fn batch(events: &[Vec<u8>], dp_rank: Option<Option<u64>>) -> Vec<u8> {
    let mut out = Vec::new();
    w::write_array_len(&mut out, if dp_rank.is_some() { 3 } else { 2 }).unwrap();
    w::write_f64(&mut out, 1_739_145_600.5).unwrap();
    w::write_array_len(&mut out, events.len() as u32).unwrap();
    for e in events {
        out.extend_from_slice(e);
    }
    match dp_rank {
        Some(Some(r)) => u(&mut out, r),
        Some(None) => w::write_nil(&mut out).unwrap(),
        None => {}
    }
    out
}

/// vLLM's map layout (after 0.23): fields by name, unknown keys mixed in.
fn stored_map(hashes: &[u64], parent: Option<u64>, tokens: &[u32], lora: Option<&str>) -> Vec<u8> {
    let mut e = Vec::new();
    w::write_map_len(&mut e, 9).unwrap();
    s(&mut e, "type");
    s(&mut e, "BlockStored");
    s(&mut e, "block_hashes");
    w::write_array_len(&mut e, hashes.len() as u32).unwrap();
    for &h in hashes {
        u(&mut e, h);
    }
    s(&mut e, "parent_block_hash");
    match parent {
        Some(p) => u(&mut e, p),
        None => w::write_nil(&mut e).unwrap(),
    }
    s(&mut e, "token_ids");
    w::write_array_len(&mut e, tokens.len() as u32).unwrap();
    for &t in tokens {
        u(&mut e, u64::from(t));
    }
    s(&mut e, "block_size");
    u(&mut e, 2);
    s(&mut e, "lora_id");
    w::write_nil(&mut e).unwrap();
    s(&mut e, "medium");
    s(&mut e, "GPU");
    s(&mut e, "lora_name");
    match lora {
        Some(l) => s(&mut e, l),
        None => w::write_nil(&mut e).unwrap(),
    }
    s(&mut e, "kv_cache_spec_kind");
    s(&mut e, "full_attention");
    e
}

#[test]
fn map_events_decode_by_name() {
    let payload = batch(
        &[stored_map(
            &[7, u64::MAX],
            Some(3),
            &[1, 2, 3, 4],
            Some("a"),
        )],
        Some(Some(1)),
    );
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.dp_rank, Some(1));
    assert!(b.rejected.is_empty());
    assert_eq!(
        b.events,
        vec![EngineEvent::Stored(StoredBlocks {
            block_hashes: vec![BlockHash(7), BlockHash(u64::MAX)],
            parent: Some(BlockHash(3)),
            token_ids: vec![1, 2, 3, 4],
            block_size: Some(2),
            lora_name: Some("a".into()),
            medium: Some("GPU".into()),
            extra_keys: None,
        })]
    );
}

#[test]
fn sglang_short_arrays_signed_and_bin_hashes_and_two_item_batches() {
    // SGLang: ["BlockStored", hashes, parent, tokens, block_size, lora_id]
    let mut stored = Vec::new();
    w::write_array_len(&mut stored, 6).unwrap();
    s(&mut stored, "BlockStored");
    w::write_array_len(&mut stored, 2).unwrap();
    w::write_sint(&mut stored, -256).unwrap();
    w::write_bin(&mut stored, &[0xaa; 32]).unwrap();
    w::write_nil(&mut stored).unwrap();
    w::write_array_len(&mut stored, 2).unwrap();
    u(&mut stored, 70_000);
    u(&mut stored, 0);
    u(&mut stored, 1);
    w::write_nil(&mut stored).unwrap();
    let mut removed = Vec::new();
    w::write_array_len(&mut removed, 3).unwrap();
    s(&mut removed, "BlockRemoved");
    w::write_array_len(&mut removed, 1).unwrap();
    u(&mut removed, 9);
    s(&mut removed, "CPU_PINNED");
    let mut cleared = Vec::new();
    w::write_array_len(&mut cleared, 1).unwrap();
    s(&mut cleared, "AllBlocksCleared");
    let b = decode_batch(&batch(&[stored, removed, cleared], None)).unwrap();
    assert_eq!(b.dp_rank, None);
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        st.block_hashes,
        vec![
            BlockHash((-256i64) as u64),
            BlockHash(0xaaaa_aaaa_aaaa_aaaa)
        ]
    );
    assert_eq!(
        (st.parent, st.block_size, &st.token_ids[..]),
        (None, Some(1), &[70_000, 0][..])
    );
    assert_eq!(
        b.events[1],
        EngineEvent::Removed {
            block_hashes: vec![BlockHash(9)],
            medium: Some("CPU_PINNED".into())
        }
    );
    assert_eq!(b.events[2], EngineEvent::Cleared);
}

#[test]
fn extra_keys_are_read_per_block() {
    let mut e = Vec::new();
    w::write_array_len(&mut e, 9).unwrap();
    s(&mut e, "BlockStored");
    w::write_array_len(&mut e, 2).unwrap();
    u(&mut e, 1);
    u(&mut e, 2);
    w::write_nil(&mut e).unwrap();
    w::write_array_len(&mut e, 2).unwrap();
    u(&mut e, 5);
    u(&mut e, 6);
    u(&mut e, 1);
    w::write_nil(&mut e).unwrap();
    s(&mut e, "GPU");
    s(&mut e, "lora");
    w::write_array_len(&mut e, 2).unwrap();
    w::write_array_len(&mut e, 3).unwrap();
    s(&mut e, "lora");
    w::write_array_len(&mut e, 2).unwrap();
    s(&mut e, "img");
    w::write_sint(&mut e, -3).unwrap();
    s(&mut e, "salt");
    w::write_nil(&mut e).unwrap();
    let b = decode_batch(&batch(&[e], Some(None))).unwrap();
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        st.extra_keys,
        Some(vec![
            Some(vec![
                ExtraKey::Text("lora".into()),
                ExtraKey::Array(vec![ExtraKey::Text("img".into()), ExtraKey::Int(-3)]),
                ExtraKey::Text("salt".into()),
            ]),
            None,
        ])
    );
}

#[test]
fn a_bad_event_is_rejected_alone() {
    let mut bad = Vec::new();
    w::write_array_len(&mut bad, 2).unwrap();
    s(&mut bad, "BlockMoved");
    u(&mut bad, 1);
    let mut bad_tokens = Vec::new();
    w::write_map_len(&mut bad_tokens, 3).unwrap();
    s(&mut bad_tokens, "type");
    s(&mut bad_tokens, "BlockStored");
    s(&mut bad_tokens, "block_hashes");
    w::write_array_len(&mut bad_tokens, 1).unwrap();
    u(&mut bad_tokens, 1);
    s(&mut bad_tokens, "token_ids");
    w::write_array_len(&mut bad_tokens, 1).unwrap();
    w::write_f32(&mut bad_tokens, 1.5).unwrap();
    let good = stored_map(&[5], None, &[1, 2], None);
    let b = decode_batch(&batch(&[bad, bad_tokens, good], Some(Some(0)))).unwrap();
    assert_eq!(b.events.len(), 1);
    assert_eq!(b.rejected.len(), 2);
    assert_eq!(b.rejected[0], WireError::UnknownTag("BlockMoved".into()));
}

#[test]
fn envelope_errors_reject_the_message() {
    assert_eq!(decode_batch(&[]), Err(WireError::Truncated));
    assert_eq!(decode_batch(&[0x91, 0x00]), Err(WireError::BatchShape(1)));
    assert!(decode_batch(&[0x92, 0xa1, b'x', 0x90]).is_err());
    let mut p = batch(&[], Some(Some(0)));
    p.push(0);
    assert_eq!(decode_batch(&p), Err(WireError::Trailing(1)));
    // a huge declared array is refused without allocating it
    assert_eq!(
        decode_batch(&[0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff]),
        Err(WireError::Truncated)
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn corrupted_valid_payloads_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut p = batch(&[stored_map(&[1, 2], Some(3), &[1, 2, 3, 4], Some("l"))], Some(Some(0)));
        for (i, b) in flips {
            let i = i.index(p.len());
            p[i] = b;
        }
        let _ = decode_batch(&p);
    }
}
