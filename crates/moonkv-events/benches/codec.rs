//! Event codec micro-benchmarks: encoding a full 64-event message (the publisher thread's
//! work per send) and decoding it again (a subscriber's work per receive).
//!
//! `cargo bench -p moonkv-events --bench codec -- --quick`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use moonkv_events::subscriber::decode_payload;
use moonkv_events::{
    decode_message, sequence_frame, Encoder, EventConfig, KvEvent, Medium, StampedEvent,
    MAX_EVENTS_PER_MESSAGE,
};

const TIMESTAMP_MS: i64 = 1_767_225_600_000;

fn batch() -> Vec<StampedEvent> {
    (0..MAX_EVENTS_PER_MESSAGE as u64)
        .map(|i| StampedEvent {
            event_id: 1_000 + i,
            timestamp_ms: TIMESTAMP_MS,
            event: KvEvent::stored("default", format!("{i:0>32}"), Medium::Cpu),
        })
        .collect()
}

fn codec(c: &mut Criterion) {
    let events = batch();
    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(events.len() as u64));
    for (name, legacy) in [("legacy_compat", true), ("compact", false)] {
        let cfg = EventConfig {
            emit_legacy_compat: legacy,
            ..EventConfig::new("bench", "tcp://127.0.0.1:0")
        };
        let encoder = Encoder::new(&cfg);
        let mut payload = Vec::with_capacity(64 * 1024);
        g.bench_function(format!("encode_batch64/{name}"), |b| {
            b.iter(|| {
                payload.clear();
                encoder.encode_batch(&mut payload, TIMESTAMP_MS, black_box(&events));
                payload.len()
            })
        });
        payload.clear();
        encoder.encode_batch(&mut payload, TIMESTAMP_MS, &events);
        g.bench_function(format!("decode_payload64/{name}"), |b| {
            b.iter(|| decode_payload(black_box(&payload)).unwrap().events.len())
        });
        let sequence = sequence_frame(7);
        let frames: [&[u8]; 3] = [b"", &sequence, &payload];
        g.bench_function(format!("decode_message64/{name}"), |b| {
            b.iter(|| decode_message(black_box(&frames)).unwrap().1.len())
        });
    }
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
