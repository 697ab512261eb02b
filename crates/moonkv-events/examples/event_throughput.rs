//! Measures encoder, decoder and loopback publisher → subscriber rates.
//!
//! `cargo run --release -p moonkv-events --example event_throughput [events]`

use std::time::Instant;

use moonkv_events::subscriber::decode_payload;
use moonkv_events::{
    run_loopback, Encoder, EventConfig, KvEvent, LoopbackOptions, Medium, StampedEvent,
};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let cfg = EventConfig::new("bench", "tcp://127.0.0.1:0");
    let encoder = Encoder::new(&cfg);
    let batch: Vec<StampedEvent> = (0..64u64)
        .map(|i| StampedEvent {
            event_id: i + 1,
            timestamp_ms: 1_739_145_600_000,
            event: KvEvent::stored("default", format!("{i:0>32}"), Medium::Cpu),
        })
        .collect();

    let mut buf = Vec::with_capacity(64 * 400);
    let start = Instant::now();
    let batches = n / 64;
    for _ in 0..batches {
        buf.clear();
        encoder.encode_batch(&mut buf, 1_739_145_600_000, &batch);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "encode: {:.2} M events/s ({} bytes per 64-event batch)",
        (batches * 64) as f64 / secs / 1e6,
        buf.len()
    );

    let start = Instant::now();
    let mut decoded = 0usize;
    for _ in 0..batches {
        decoded += decode_payload(&buf).map(|m| m.events.len()).unwrap_or(0);
    }
    let secs = start.elapsed().as_secs_f64();
    println!("decode: {:.2} M events/s", decoded as f64 / secs / 1e6);

    match run_loopback(&LoopbackOptions { events: n, ..LoopbackOptions::default() }) {
        Ok(r) => println!(
            "loopback: {:.2} M events/s end to end, publish {:.2} M/s, received {}/{}, dropped {}, missed seq {}",
            r.events_per_second / 1e6,
            r.published as f64 / r.publish_seconds / 1e6,
            r.received,
            r.published,
            r.dropped,
            r.missed_sequences
        ),
        Err(e) => eprintln!("loopback failed: {e}"),
    }
    match run_loopback(&LoopbackOptions {
        events: n,
        ..LoopbackOptions::default()
    }) {
        Ok(r) => println!("{r:?}"),
        Err(e) => eprintln!("loopback failed: {e}"),
    }
}
