//! Publishes a fixed event sequence for the Python peer test (`tests/peer/events_peer.py`).
//!
//! Protocol on stdio: prints `endpoint <bound endpoint>`, publishes `cleared` probes for
//! tenant `__probe__` every 10 ms until a line arrives on stdin, then publishes the fixture
//! (130 events: stored/removed/cleared cycling over tenant `t`, then one `cleared` for
//! tenant `__end__`), shuts down (draining the queue) and prints `done <last_event_id>`.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moonkv_events::{EventConfig, KvEvent, Medium, Publisher};

fn main() {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://127.0.0.1:0".into());
    let legacy = std::env::args().nth(2).is_none_or(|a| a != "no-legacy");
    let cfg = EventConfig {
        model_name: Some("m".into()),
        block_size: 16,
        emit_legacy_compat: legacy,
        ..EventConfig::new("b1", endpoint)
    };
    let publisher = match Publisher::start(cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    println!("endpoint {}", publisher.endpoint());

    let go = Arc::new(AtomicBool::new(false));
    let stdin_go = Arc::clone(&go);
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        stdin_go.store(true, Ordering::Release);
    });
    for _ in 0..3000 {
        if go.load(Ordering::Acquire) {
            break;
        }
        publisher.publish(KvEvent::cleared("__probe__"));
        std::thread::sleep(Duration::from_millis(10));
    }

    for i in 0..130u32 {
        let key = format!("key-{i}-\u{e9}");
        let ev = match i % 3 {
            0 => KvEvent::stored("t", key, Medium::Cpu).with_group("g"),
            1 => KvEvent::removed("t", key, Medium::Disk),
            _ => KvEvent::cleared("t"),
        };
        publisher.publish(ev);
    }
    publisher.publish(KvEvent::cleared("__end__"));
    let last = publisher.last_event_id();
    publisher.shutdown();
    println!("done {last}");
}
