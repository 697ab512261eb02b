//! The decoder must never panic, whatever the bytes.

use moonkv_events::subscriber::decode_payload;
use moonkv_events::{decode_message, Encoder, EventConfig, KvEvent, Medium, StampedEvent};
use proptest::prelude::*;

fn valid_payload() -> Vec<u8> {
    let cfg = EventConfig {
        model_name: Some("m".into()),
        block_size: 16,
        ..EventConfig::new("b", "tcp://*:1")
    };
    let events: Vec<StampedEvent> = [
        KvEvent::stored("t", "key-1", Medium::Cpu).with_group("g"),
        KvEvent::removed("t", "key-2", Medium::Disk),
        KvEvent::cleared("t"),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, event)| StampedEvent {
        event_id: i as u64 + 1,
        timestamp_ms: 1_739_145_600_000,
        event,
    })
    .collect();
    let mut out = Vec::new();
    Encoder::new(&cfg).encode_batch(&mut out, 1_739_145_600_000, &events);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_payload_bytes(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_message(&[&b""[..], &[0u8; 8], &payload]);
        let _ = decode_payload(&payload);
    }

    #[test]
    fn arbitrary_frames(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..5)) {
        let _ = decode_message(&frames);
    }

    #[test]
    fn mutated_valid_payload(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                             cut in any::<prop::sample::Index>()) {
        let mut payload = valid_payload();
        for (at, byte) in edits {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        let keep = cut.index(payload.len() + 1);
        payload.truncate(keep);
        if let Ok((_, events)) = decode_message(&[&b""[..], &[0u8; 8], &payload]) {
            prop_assert!(events.len() <= 3);
        }
    }
}
