use super::*;
use rmp::encode::ByteBuf;

use crate::codec::write::{appending, array_len, map_len, sint, str, uint};
use crate::codec::{sequence_frame, Encoder, EventConfig, KvEvent, Medium, StampedEvent};

/// A value in a hand-built event map.
enum V<'a> {
    S(&'a str),
    U(u64),
    I(i64),
    Nil,
    Raw(&'a [u8]),
}

fn map(pairs: &[(&str, V)]) -> Vec<u8> {
    let mut out = ByteBuf::new();
    map_len(&mut out, pairs.len() as u32);
    for (k, v) in pairs {
        str(&mut out, k);
        match v {
            V::S(s) => str(&mut out, s),
            V::U(u) => uint(&mut out, *u),
            V::I(i) => sint(&mut out, *i),
            V::Nil => out.as_mut_vec().push(0xc0),
            V::Raw(b) => out.as_mut_vec().extend_from_slice(b),
        }
    }
    out.into_vec()
}

fn batch(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = ByteBuf::new();
    array_len(&mut out, 3);
    uint(&mut out, 1_739_145_600_000);
    array_len(&mut out, events.len() as u32);
    let out = out.as_mut_vec();
    for e in events {
        out.extend_from_slice(e);
    }
    out.push(0x00);
    std::mem::take(out)
}

fn frames(payload: &[u8]) -> [&[u8]; 3] {
    [b"", &[0, 0, 0, 0, 0, 0, 0, 7], payload]
}

fn minimal(kind: &str) -> Vec<u8> {
    map(&[
        ("event_type", V::S(kind)),
        ("tenant_id", V::S("t")),
        ("backend_id", V::S("b")),
    ])
}

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap_or("zz"), 16).unwrap_or(0))
        .collect()
}

#[test]
fn our_encoder_round_trips_every_field() {
    let cfg = EventConfig {
        model_name: Some("m".into()),
        block_size: 16,
        additional_salt: Some("salt".into()),
        lora_name: Some("lora".into()),
        dp_rank: 3,
        ..EventConfig::new("b1", "tcp://*:1")
    };
    let ev = StampedEvent {
        event_id: 300,
        timestamp_ms: 1_739_145_600_123,
        event: KvEvent::stored("tenant-ä", "key\u{1F600}", Medium::Disk).with_group("g7"),
    };
    let mut payload = Vec::new();
    Encoder::new(&cfg).encode_batch(&mut payload, 99, &[ev]);
    let msg = decode_message_detailed(&[&b""[..], &sequence_frame(42), &payload]).expect("decodes");
    assert_eq!(
        (
            msg.sequence,
            msg.timestamp_ms,
            msg.dp_rank,
            msg.rejected_events
        ),
        (42, 99, Some(3), 0)
    );
    let want = DecodedEvent {
        event_id: Some(300),
        timestamp_ms: Some(1_739_145_600_123),
        kind: EventKind::Stored,
        tenant_id: Some("tenant-ä".into()),
        backend_id: Some("b1".into()),
        medium: Some("disk".into()),
        object_key: Some("key\u{1F600}".into()),
        group_id: Some("g7".into()),
        model_name: Some("m".into()),
        block_size: Some(16),
        additional_salt: Some("salt".into()),
        lora_name: Some("lora".into()),
        dp_rank: Some(3),
    };
    assert_eq!(msg.events, [want]);
}

#[test]
fn decodes_the_reference_byte_example() {
    // The upstream removed event of the reference's byte-level example, seq_hashes [42].
    let payload = hex(
        "93 cf 00 00 01 94 ed 27 dc 00 91 de 00 11 a8 65 76 65 6e 74 5f 69 64 01 a9 74 69 6d
        65 73 74 61 6d 70 cf 00 00 01 94 ed 27 dc 00 aa 65 76 65 6e 74 5f 74 79 70 65 a7 72
        65 6d 6f 76 65 64 a4 74 79 70 65 ac 42 6c 6f 63 6b 52 65 6d 6f 76 65 64 aa 6d 6f 64
        65 6c 5f 6e 61 6d 65 a1 6d aa 62 6c 6f 63 6b 5f 73 69 7a 65 10 af 61 64 64 69 74 69
        6f 6e 61 6c 5f 73 61 6c 74 c0 a9 6c 6f 72 61 5f 6e 61 6d 65 c0 a9 74 65 6e 61 6e 74
        5f 69 64 a7 64 65 66 61 75 6c 74 aa 62 61 63 6b 65 6e 64 5f 69 64 a2 62 31 a6 6d 65
        64 69 75 6d a3 63 70 75 a7 64 70 5f 72 61 6e 6b 00 a8 67 72 6f 75 70 5f 69 64 c0 aa
        6f 62 6a 65 63 74 5f 6b 65 79 a2 34 32 aa 73 65 71 5f 68 61 73 68 65 73 91 2a ac 62
        6c 6f 63 6b 5f 68 61 73 68 65 73 91 2a ae 62 61 73 65 5f 62 6c 6f 63 6b 5f 69 64 78
        c0 00",
    );
    assert_eq!(payload.len(), 254);
    let (seq, events) =
        decode_message(&[&b""[..], &[0, 0, 0, 0, 0, 0, 0, 1], &payload]).expect("decodes");
    assert_eq!(seq, 1);
    let ev = &events[0];
    assert_eq!(ev.kind, EventKind::Removed);
    assert_eq!(ev.object_key.as_deref(), Some("42"));
    assert_eq!(
        (ev.event_id, ev.timestamp_ms),
        (Some(1), Some(1_739_145_600_000))
    );
    assert_eq!(
        (ev.block_size, ev.dp_rank, ev.group_id.as_deref()),
        (Some(16), Some(0), None)
    );
}

#[test]
fn accepts_the_upstream_masters_variants() {
    // Upstream main: group_id before medium, dp_rank nil, base_block_idx 0 on stored,
    // seq_hashes unsigned, block_hashes signed, nil model/block size.
    let ev = map(&[
        ("event_id", V::U(9)),
        ("timestamp", V::U(1_739_145_600_000)),
        ("event_type", V::S("stored")),
        ("type", V::S("BlockStored")),
        ("model_name", V::Nil),
        ("block_size", V::Nil),
        ("additional_salt", V::Nil),
        ("lora_name", V::Nil),
        ("tenant_id", V::S("default")),
        ("backend_id", V::S("store-1")),
        ("group_id", V::S("grp")),
        ("medium", V::S("cpu")),
        ("dp_rank", V::Nil),
        ("object_key", V::S("0xffffffffffffff00")),
        (
            "seq_hashes",
            V::Raw(&[0x91, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]),
        ),
        ("block_hashes", V::Raw(&[0x91, 0xd1, 0xff, 0x00])),
        ("base_block_idx", V::U(0)),
        ("parent_hash", V::Nil),
        ("token_ids", V::Nil),
        ("parent_block_hash", V::Nil),
    ]);
    let (_, events) = decode_message(&frames(&batch(&[ev]))).expect("decodes");
    assert_eq!(events[0].dp_rank, None);
    assert_eq!(events[0].group_id.as_deref(), Some("grp"));
    assert_eq!(events[0].medium.as_deref(), Some("cpu"));
}

#[test]
fn tolerates_two_item_batches_float_timestamps_unknown_fields_and_legacy_only_tags() {
    let legacy_only = map(&[("type", V::S("AllBlocksCleared")), ("tenant_id", V::S("t"))]);
    let with_unknown = map(&[
        (
            "future_field",
            V::Raw(&[0x82, 0xa1, b'a', 0x91, 0x90, 0xa1, b'b', 0xc4, 0x01, 0xff]),
        ),
        ("event_type", V::S("removed")),
        ("group_id", V::U(3)),
        (
            "timestamp",
            V::Raw(&[0xcb, 0x42, 0x79, 0x4e, 0xd2, 0x7d, 0xc0, 0x00, 0x00]),
        ),
    ]);
    let mut payload = Vec::new();
    appending(&mut payload, |o| array_len(o, 2));
    payload.extend_from_slice(&[0xcb, 0x41, 0xd9, 0xea, 0x50, 0x60, 0x20, 0x00, 0x00]); // 1739145600.5 s
    appending(&mut payload, |o| array_len(o, 2));
    payload.extend_from_slice(&legacy_only);
    payload.extend_from_slice(&with_unknown);
    let msg = decode_message_detailed(&frames(&payload)).expect("decodes");
    assert_eq!(msg.timestamp_ms, 1_739_145_600_500);
    assert_eq!(msg.dp_rank, None);
    assert_eq!(msg.events[0].kind, EventKind::Cleared);
    assert_eq!(msg.events[1].kind, EventKind::Removed);
    assert_eq!(msg.events[1].group_id.as_deref(), Some("3"));
    assert_eq!(msg.events[1].timestamp_ms, Some(1_739_145_600_000));
}

#[test]
fn one_bad_event_does_not_cost_the_others() {
    let bad: Vec<Vec<u8>> = vec![
        map(&[("event_type", V::S("stored")), ("tenant_id", V::U(5))]),
        map(&[
            ("event_type", V::S("stored")),
            ("object_key", V::Raw(&[0xa2, 0xff, 0xfe])),
        ]),
        map(&[("event_type", V::S("stored")), ("event_id", V::I(-1))]),
        map(&[
            ("event_type", V::S("stored")),
            ("event_type", V::S("stored")),
        ]),
        map(&[
            ("event_type", V::S("stored")),
            ("type", V::S("BlockRemoved")),
        ]),
        map(&[("event_type", V::S("evicted"))]),
        map(&[("tenant_id", V::S("t"))]),
        map(&[("event_type", V::U(1))]),
        map(&[
            ("event_type", V::S("stored")),
            ("medium", V::Raw(&[0x91, 0xc0])),
        ]),
        vec![
            0x92, 0xab, b'B', b'l', b'o', b'c', b'k', b'S', b't', b'o', b'r', b'e', b'd', 0x90,
        ],
    ];
    let expected_errors = [
        DecodeError::UnexpectedType {
            field: "tenant_id",
            expected: "string or nil",
            found: "integer",
        },
        DecodeError::InvalidUtf8 {
            field: "object_key",
        },
        DecodeError::NegativeInteger { field: "event_id" },
        DecodeError::DuplicateField("event_type"),
        DecodeError::ConflictingEventType,
        DecodeError::UnknownEventType("evicted".into()),
        DecodeError::MissingEventType,
        DecodeError::UnexpectedType {
            field: "event_type",
            expected: "string",
            found: "integer",
        },
        DecodeError::UnexpectedType {
            field: "medium",
            expected: "scalar",
            found: "array",
        },
        DecodeError::UnexpectedType {
            field: "event",
            expected: "map",
            found: "array",
        },
    ];
    for (bad_event, want) in bad.iter().zip(expected_errors) {
        let payload = batch(&[minimal("stored"), bad_event.clone(), minimal("cleared")]);
        let msg = decode_message_detailed(&frames(&payload)).expect("envelope is fine");
        assert_eq!(msg.events.len(), 2);
        assert_eq!(msg.rejected_events, 1);
        assert_eq!(msg.first_rejection, Some(want));
    }
}

#[test]
fn envelope_errors_reject_the_message() {
    let good = batch(&[minimal("stored")]);
    assert_eq!(
        decode_message(&[&good[..]; 2]),
        Err(DecodeError::FrameCount(2))
    );
    assert_eq!(
        decode_message(&[&good[..]; 4]),
        Err(DecodeError::FrameCount(4))
    );
    assert_eq!(
        decode_message(&[&b""[..], &[0u8; 7], &good]),
        Err(DecodeError::SequenceLength(7))
    );
    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert_eq!(
        decode_message(&frames(&trailing)),
        Err(DecodeError::TrailingBytes(1))
    );
    assert_eq!(
        decode_message(&frames(&[0x94, 0, 0x90, 0, 0])),
        Err(DecodeError::BatchShape(4))
    );
    assert!(matches!(
        decode_message(&frames(&[0x80])),
        Err(DecodeError::UnexpectedType { .. })
    ));
    assert!(matches!(
        decode_message(&frames(&[0x93, 0xa1, b'x', 0x90, 0])),
        Err(DecodeError::UnexpectedType { .. })
    ));
    assert!(matches!(
        decode_message(&frames(&[0x93, 0, 0x80, 0])),
        Err(DecodeError::UnexpectedType { .. })
    ));
    assert!(matches!(
        decode_message(&frames(&[0x93, 0, 0x90, 0xa0])),
        Err(DecodeError::UnexpectedType { .. })
    ));
    assert_eq!(decode_message(&frames(&[])), Err(DecodeError::Truncated));
    assert_eq!(
        decode_message(&frames(&[0x93, 0xc1, 0x90, 0])),
        Err(DecodeError::InvalidMarker(0xc1))
    );
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let payload = batch(&[minimal("stored"), minimal("removed"), minimal("cleared")]);
    for cut in 0..payload.len() {
        assert!(
            decode_message(&frames(&payload[..cut])).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn huge_length_headers_are_rejected_before_allocation() {
    // events array claiming 2^32-1 entries
    let events32 = [0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0];
    assert!(matches!(
        decode_message(&frames(&events32)),
        Err(DecodeError::LengthOverrun { .. })
    ));
    // a string claiming 4 GiB inside an event
    let mut ev = Vec::new();
    appending(&mut ev, |o| {
        map_len(o, 1);
        str(o, "object_key");
    });
    ev.extend_from_slice(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a']);
    assert_eq!(
        decode_message(&frames(&batch(&[ev]))),
        Err(DecodeError::Truncated)
    );
    // a map claiming 65535 pairs
    let map16 = [0x93, 0x00, 0x91, 0xde, 0xff, 0xff, 0xc0, 0xc0, 0x00];
    assert!(matches!(
        decode_message(&frames(&map16)),
        Err(DecodeError::LengthOverrun { .. })
    ));
}

#[test]
fn event_lines_and_json() {
    let mut ev = DecodedEvent {
        event_id: Some(7),
        timestamp_ms: Some(1_739_145_600_000),
        kind: EventKind::Stored,
        tenant_id: Some("default".into()),
        backend_id: Some("b1".into()),
        medium: Some("cpu".into()),
        object_key: Some("k \"1\"\n".into()),
        group_id: None,
        model_name: None,
        block_size: None,
        additional_salt: None,
        lora_name: None,
        dp_rank: Some(0),
    };
    assert_eq!(
        format_event_line(&ev),
        r#"id=7 ts=1739145600000 stored backend=b1 tenant=default medium=cpu group=- key="k \"1\"\n""#
    );
    let json = serde_json::to_value(&ev).expect("serializable");
    assert_eq!(json["event_type"], "stored");
    assert_eq!(json["timestamp"], 1_739_145_600_000_i64);
    assert_eq!(json["group_id"], serde_json::Value::Null);
    ev.kind = EventKind::Cleared;
    ev.event_id = None;
    ev.timestamp_ms = None;
    assert_eq!(
        format_event_line(&ev),
        "id=- ts=- cleared backend=b1 tenant=default"
    );
}

#[test]
fn field_lookup_recognizes_exactly_the_known_names() {
    let names = [
        "event_id",
        "timestamp",
        "event_type",
        "type",
        "tenant_id",
        "backend_id",
        "medium",
        "object_key",
        "group_id",
        "model_name",
        "block_size",
        "additional_salt",
        "lora_name",
        "dp_rank",
    ];
    for name in names {
        assert_eq!(Field::from_key(name.as_bytes()).map(|(_, n)| n), Some(name));
    }
    for other in [
        "",
        "t",
        "event_ie",
        "timestamq",
        "seq_hashes",
        "block_hashes",
        "token_ids",
        "Type",
        "medium ",
    ] {
        assert!(Field::from_key(other.as_bytes()).is_none(), "{other}");
    }
}

#[test]
fn container_keys_are_skipped_whole() {
    // {[1, 2]: {"a": 1}, "event_type": "stored"}
    let mut ev = vec![0x82, 0x92, 0x01, 0x02, 0x81, 0xa1, b'a', 0x01];
    appending(&mut ev, |o| {
        str(o, "event_type");
        str(o, "stored");
    });
    let (_, events) = decode_message(&frames(&batch(&[ev, minimal("removed")]))).expect("decodes");
    assert_eq!(
        events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [EventKind::Stored, EventKind::Removed]
    );
}
