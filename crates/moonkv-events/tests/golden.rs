//! Byte-for-byte checks of the encoder against vectors produced independently by
//! `tests/peer/gen_event_golden.py` (Python `msgpack`, maps built from the documented
//! field table).

use std::path::PathBuf;

use moonkv_events::{sequence_frame, Encoder, EventConfig, KvEvent, Medium, StampedEvent};

const TS: i64 = 1_739_145_600_000;

fn golden(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.hex"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digits: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.chars())
        .filter(|c| !c.is_whitespace())
        .collect();
    assert_eq!(digits.len() % 2, 0, "{name}: odd number of hex digits");
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16).unwrap_or_else(|_| panic!("{name}: bad hex"))
        })
        .collect()
}

fn cfg_a(legacy: bool, key: bool) -> EventConfig {
    EventConfig {
        model_name: Some("m".into()),
        block_size: 16,
        emit_legacy_compat: legacy,
        emit_object_key: key,
        ..EventConfig::new("b1", "tcp://127.0.0.1:0")
    }
}

fn encode(cfg: &EventConfig, events: Vec<StampedEvent>) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(cfg).encode_batch(&mut out, TS, &events);
    out
}

fn first(event: KvEvent) -> Vec<StampedEvent> {
    vec![StampedEvent {
        event_id: 1,
        timestamp_ms: TS,
        event,
    }]
}

fn assert_bytes(name: &str, got: &[u8]) {
    let want = golden(name);
    if got != want {
        let at = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{name}: first difference at byte {at} (got {} bytes, want {})",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn per_object_events_for_every_option_combination() {
    for legacy in [true, false] {
        for key in [true, false] {
            let suffix = format!("legacy-{}_key-{}", on(legacy), on(key));
            let cfg = cfg_a(legacy, key);
            let stored = KvEvent::stored("default", "42", Medium::Disk).with_group("g1");
            assert_bytes(&format!("stored_{suffix}"), &encode(&cfg, first(stored)));
            let removed = KvEvent::removed("default", "42", Medium::Cpu);
            assert_bytes(&format!("removed_{suffix}"), &encode(&cfg, first(removed)));
        }
    }
}

#[test]
fn cleared_with_and_without_legacy_fields() {
    for legacy in [true, false] {
        // object_key emission does not change a cleared event
        for key in [true, false] {
            let got = encode(&cfg_a(legacy, key), first(KvEvent::cleared("default")));
            assert_bytes(&format!("cleared_legacy-{}", on(legacy)), &got);
        }
    }
}

#[test]
fn mixed_batch_with_large_ids_long_and_non_ascii_strings() {
    let cfg = EventConfig {
        block_size: 300,
        additional_salt: Some("salt".into()),
        lora_name: Some("lora-7".into()),
        dp_rank: 2,
        ..EventConfig::new("store-1", "tcp://127.0.0.1:0")
    };
    let tenant = "tenant-\u{e4}";
    let base = 1u64 << 32;
    let events = vec![
        StampedEvent {
            event_id: base + 1,
            timestamp_ms: TS + 1,
            event: KvEvent::stored(tenant, "k".repeat(40), Medium::Cpu).with_group("7"),
        },
        StampedEvent {
            event_id: base + 2,
            timestamp_ms: TS + 2,
            event: KvEvent::removed(tenant, "x\u{ff}\u{6f22}", Medium::Disk),
        },
        // a cleared event ignores any key, group or medium it was given
        StampedEvent {
            event_id: base + 3,
            timestamp_ms: TS + 3,
            event: KvEvent {
                object_key: Some("ignored".into()),
                group_id: Some("ignored".into()),
                medium: Some(Medium::Cpu),
                ..KvEvent::cleared(tenant)
            },
        },
    ];
    assert_bytes("batch_mixed", &encode(&cfg, events));
}

#[test]
fn matches_the_reference_example_except_for_the_empty_hashes() {
    // The reference's upstream removed event carries seq_hashes/block_hashes [42] (91 2a);
    // moonkv never parses keys, so both are empty (90). Everything else is identical.
    let reference =
        "93 cf 00 00 01 94 ed 27 dc 00 91 de 00 11 a8 65 76 65 6e 74 5f 69 64 01 a9 74 69 6d
        65 73 74 61 6d 70 cf 00 00 01 94 ed 27 dc 00 aa 65 76 65 6e 74 5f 74 79 70 65 a7 72
        65 6d 6f 76 65 64 a4 74 79 70 65 ac 42 6c 6f 63 6b 52 65 6d 6f 76 65 64 aa 6d 6f 64
        65 6c 5f 6e 61 6d 65 a1 6d aa 62 6c 6f 63 6b 5f 73 69 7a 65 10 af 61 64 64 69 74 69
        6f 6e 61 6c 5f 73 61 6c 74 c0 a9 6c 6f 72 61 5f 6e 61 6d 65 c0 a9 74 65 6e 61 6e 74
        5f 69 64 a7 64 65 66 61 75 6c 74 aa 62 61 63 6b 65 6e 64 5f 69 64 a2 62 31 a6 6d 65
        64 69 75 6d a3 63 70 75 a7 64 70 5f 72 61 6e 6b 00 a8 67 72 6f 75 70 5f 69 64 c0 aa
        6f 62 6a 65 63 74 5f 6b 65 79 a2 34 32 aa 73 65 71 5f 68 61 73 68 65 73 91 2a ac 62
        6c 6f 63 6b 5f 68 61 73 68 65 73 91 2a ae 62 61 73 65 5f 62 6c 6f 63 6b 5f 69 64 78
        c0 00";
    let flat: String = reference.split_whitespace().collect::<Vec<_>>().join(" ");
    let ours_hex = flat.replace("91 2a", "90");
    let want: Vec<u8> = ours_hex
        .split(' ')
        .map(|b| u8::from_str_radix(b, 16).expect("hex literal"))
        .collect();
    let got = encode(
        &cfg_a(true, true),
        first(KvEvent::removed("default", "42", Medium::Cpu)),
    );
    assert_eq!(got, want);
    assert_eq!(got.len(), 252);
}

#[test]
fn sequence_frame_is_big_endian() {
    assert_eq!(sequence_frame(1), [0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(
        sequence_frame(0x0102_0304_0506_0708),
        [1, 2, 3, 4, 5, 6, 7, 8]
    );
}

fn on(flag: bool) -> &'static str {
    if flag {
        "on"
    } else {
        "off"
    }
}
