//! Publisher → subscriber over loopback TCP with ephemeral ports. Every wait is a bounded
//! loop of short receive timeouts; nothing sleeps for a fixed time to "let things settle".

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moonkv_events::{
    DecodedEvent, Delivery, EventConfig, EventKind, EventsError, HttpSnapshotSource, IndexSync,
    KvEvent, Medium, Publisher, SequenceVerdict, Snapshot, SnapshotObject, Subscriber,
};

const PROBE: &str = "__probe__";
const POLL: Duration = Duration::from_millis(20);

fn start(cfg: EventConfig) -> Publisher {
    Publisher::start(cfg).expect("publisher starts on an ephemeral port")
}

fn ephemeral(backend: &str) -> EventConfig {
    EventConfig::new(backend, "tcp://127.0.0.1:0")
}

/// Publishes probe events until the subscriber has seen one (slow joiner), then drains
/// the probes still in flight.
fn join(publisher: &Publisher, sub: &mut Subscriber) {
    let mut joined = false;
    for _ in 0..300 {
        publisher.publish(KvEvent::cleared(PROBE));
        if let Delivery::Message { .. } = sub.poll().expect("poll") {
            joined = true;
            break;
        }
    }
    assert!(joined, "subscriber never joined");
    while sub.poll().expect("poll") != Delivery::Idle {}
}

/// Collects events (probes excluded) until `n` arrived, giving up after `max_polls` polls.
fn collect(sub: &mut Subscriber, n: usize, max_polls: usize) -> (Vec<DecodedEvent>, Vec<u64>) {
    let mut events = Vec::new();
    let mut seqs = Vec::new();
    for _ in 0..max_polls {
        if events.len() >= n {
            break;
        }
        if let Delivery::Message { message, .. } = sub.poll().expect("poll") {
            seqs.push(message.sequence);
            events.extend(
                message
                    .events
                    .into_iter()
                    .filter(|e| e.tenant_id.as_deref() != Some(PROBE)),
            );
        }
    }
    (events, seqs)
}

#[test]
fn events_arrive_in_order_with_their_fields() {
    let cfg = EventConfig {
        model_name: Some("llama".into()),
        block_size: 16,
        dp_rank: 1,
        ..ephemeral("b1")
    };
    let publisher = start(cfg);
    assert!(publisher.endpoint().starts_with("tcp://127.0.0.1:"));
    assert!(!publisher.endpoint().ends_with(":0"));
    let mut sub = Subscriber::connect(publisher.endpoint(), POLL).expect("connect");
    join(&publisher, &mut sub);

    let mut ids = Vec::new();
    for i in 0..300u32 {
        let ev = match i % 3 {
            0 => KvEvent::stored("t", format!("k{i}"), Medium::Cpu).with_group("g"),
            1 => KvEvent::removed("t", format!("k{i}"), Medium::Disk),
            _ => KvEvent::cleared("t"),
        };
        ids.push(publisher.publish(ev));
    }
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(publisher.last_event_id(), *ids.last().expect("ids"));

    let (events, seqs) = collect(&mut sub, 300, 500);
    assert_eq!(events.len(), 300);
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "sequence without gaps: {seqs:?}"
    );
    let got_ids: Vec<u64> = events.iter().filter_map(|e| e.event_id).collect();
    assert_eq!(got_ids, ids);
    let e0 = &events[0];
    assert_eq!(
        (e0.kind, e0.object_key.as_deref(), e0.medium.as_deref()),
        (EventKind::Stored, Some("k0"), Some("cpu"))
    );
    assert_eq!(
        (e0.model_name.as_deref(), e0.block_size, e0.dp_rank),
        (Some("llama"), Some(16), Some(1))
    );
    assert_eq!(
        (e0.backend_id.as_deref(), e0.group_id.as_deref()),
        (Some("b1"), Some("g"))
    );
    assert_eq!(events[2].kind, EventKind::Cleared);
    assert_eq!(events[2].object_key, None);

    let status = publisher.status();
    assert!(status.enabled);
    assert_eq!(status.dropped_events, 0);
    assert_eq!(status.last_event_id, publisher.last_event_id());
    let json = serde_json::to_value(&status).expect("serializable");
    for field in [
        "enabled",
        "published_batches",
        "published_events",
        "dropped_events",
        "skipped_keyless_events",
    ] {
        assert!(json.get(field).is_some(), "{field}");
    }
    assert_eq!(sub.counters().gaps, 0);
    publisher.shutdown();
}

#[test]
fn keyless_mode_sends_only_cleared() {
    let publisher = start(EventConfig {
        emit_object_key: false,
        ..ephemeral("b")
    });
    let mut sub = Subscriber::connect(publisher.endpoint(), POLL).expect("connect");
    join(&publisher, &mut sub);
    assert_eq!(publisher.publish(KvEvent::stored("t", "k", Medium::Cpu)), 0);
    assert_eq!(
        publisher.publish(KvEvent::removed("t", "k", Medium::Cpu)),
        0
    );
    let id = publisher.publish(KvEvent::cleared("t"));
    assert_eq!(id, publisher.last_event_id());
    let (events, _) = collect(&mut sub, 1, 200);
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].kind, events[0].event_id),
        (EventKind::Cleared, Some(id))
    );
    assert_eq!(publisher.status().skipped_keyless_events, 2);
}

#[test]
fn shutdown_drains_the_queue() {
    let publisher = start(ephemeral("b"));
    let mut sub = Subscriber::connect(publisher.endpoint(), POLL).expect("connect");
    join(&publisher, &mut sub);
    for i in 0..2000 {
        publisher.publish(KvEvent::stored("t", format!("k{i}"), Medium::Cpu));
    }
    publisher.shutdown();
    let (events, _) = collect(&mut sub, 2000, 500);
    assert_eq!(events.len(), 2000);
}

#[test]
fn bind_failures_are_clean_errors() {
    let first = start(ephemeral("b"));
    let taken = Publisher::start(EventConfig::new("b", first.endpoint()));
    assert!(matches!(taken, Err(EventsError::Bind { .. })), "{taken:?}");
    for bad in [
        "nonsense",
        "tcp://",
        "tcp://127.0.0.1:notaport",
        "bogus://x:1",
    ] {
        let r = Publisher::start(EventConfig::new("b", bad));
        assert!(matches!(r, Err(EventsError::Bind { .. })), "{bad}: {r:?}");
    }
    assert!(matches!(
        Publisher::start(ephemeral("")),
        Err(EventsError::Config(_))
    ));
}

#[test]
fn publisher_restart_is_seen_as_the_sequence_moving_backwards() {
    let first = start(ephemeral("b"));
    let endpoint = first.endpoint().to_owned();
    let mut sub = Subscriber::connect(&endpoint, POLL).expect("connect");
    join(&first, &mut sub);
    // One event per message, so the old sequence is well ahead of what the new process
    // can reach before the subscriber reconnects (otherwise a restart looks like a gap).
    for i in 0..200 {
        first.publish(KvEvent::stored("t", format!("k{i}"), Medium::Cpu));
        let (events, _) = collect(&mut sub, 1, 50);
        assert_eq!(events.len(), 1);
    }
    let before = sub.counters().last_sequence.expect("saw messages");
    assert!(before > 200);
    first.shutdown();

    let second = start(EventConfig::new("b", endpoint));
    let mut saw_restart = false;
    for _ in 0..300 {
        second.publish(KvEvent::cleared(PROBE));
        if let Delivery::Message { verdict, message } = sub.poll().expect("poll") {
            saw_restart =
                matches!(verdict, SequenceVerdict::Restart { previous } if previous == before);
            // the new process numbers its events from 1 again
            assert!(message.events[0].event_id <= second.last_event_id().into());
            break;
        }
    }
    assert!(saw_restart, "counters: {:?}", sub.counters());
    assert_eq!(sub.counters().restarts, 1);
}

/// A minimal admin endpoint serving snapshots of a shared placement, the way the master
/// does: placement and watermark read under one lock.
fn serve_snapshots(state: Arc<Mutex<(Vec<SnapshotObject>, u64)>>, epoch: u64) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind admin");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let snapshot = {
                let guard = state.lock().expect("state lock");
                Snapshot {
                    backend_id: "b".into(),
                    publisher_epoch: epoch,
                    watermark_event_id: guard.1,
                    objects: guard.0.clone(),
                }
            };
            let body = serde_json::to_string(&snapshot).expect("json");
            let head = if request.starts_with("GET /kv_events/snapshot") {
                format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len())
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned()
            };
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
    });
    addr
}

#[test]
fn index_recovers_through_the_http_snapshot() {
    let publisher = start(ephemeral("b"));
    // Objects stored before the subscriber existed: only the snapshot can tell it.
    let state = Arc::new(Mutex::new((Vec::new(), 0u64)));
    for i in 0..10 {
        let guard = &mut *state.lock().expect("state lock");
        guard.0.push(SnapshotObject {
            tenant_id: "t".into(),
            object_key: format!("early{i}"),
            media: vec![Medium::Cpu],
        });
        guard.1 = publisher.publish(KvEvent::stored("t", format!("early{i}"), Medium::Cpu));
    }
    let admin = serve_snapshots(Arc::clone(&state), publisher.epoch());
    let source = HttpSnapshotSource::new(&admin)
        .expect("admin address")
        .with_timeout(Duration::from_secs(5));
    let sync = IndexSync::new(Some(Box::new(source)), None);
    let mut sub = Subscriber::connect(publisher.endpoint(), POLL)
        .expect("connect")
        .with_index(sync);

    for i in 0..20 {
        {
            let guard = &mut *state.lock().expect("state lock");
            guard.0.push(SnapshotObject {
                tenant_id: "t".into(),
                object_key: format!("late{i}"),
                media: vec![Medium::Disk],
            });
            guard.1 = publisher.publish(KvEvent::stored("t", format!("late{i}"), Medium::Disk));
        }
        sub.poll().expect("poll");
    }
    let mut live = false;
    for _ in 0..300 {
        sub.poll().expect("poll");
        let sync = sub.sync().expect("index attached");
        if sync.is_live() && sync.index().len() == 30 {
            live = true;
            break;
        }
        // Until the subscription reaches the publisher, only a later event can reveal
        // that the snapshot's successors were missed; keep the stream moving.
        publisher.publish(KvEvent::cleared("unrelated"));
    }
    assert!(live, "index never caught up: {:?}", sub.sync());
    let index = sub.index().expect("index");
    assert!(index.media("b", "t", "early0").contains(Medium::Cpu));
    assert_eq!(sub.counters().recoveries, 1);
    assert_eq!(
        sub.sync().and_then(IndexSync::snapshot_epoch),
        Some(publisher.epoch())
    );
}

#[test]
fn concurrent_publishers_get_unique_consecutive_ids() {
    let publisher = Arc::new(start(ephemeral("b")));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let p = Arc::clone(&publisher);
            std::thread::spawn(move || {
                (0..5000)
                    .map(|i| p.publish(KvEvent::stored("t", format!("{t}-{i}"), Medium::Cpu)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut ids: Vec<u64> = threads
        .into_iter()
        .flat_map(|h| h.join().expect("publisher thread"))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=20_000).collect::<Vec<_>>());
    assert_eq!(publisher.last_event_id(), 20_000);
    let status = publisher.status();
    assert_eq!(
        status.published_events + status.queue_len + status.dropped_events,
        20_000
    );
}

#[test]
fn events_sent_inline_and_by_the_socket_thread_arrive_in_sequence_order() {
    let publisher = Arc::new(start(ephemeral("b")));
    let mut sub = Subscriber::connect(publisher.endpoint(), POLL).expect("connect");
    join(&publisher, &mut sub);
    // Four threads publish bursts: two send theirs inline, two leave them to the socket thread.
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let p = Arc::clone(&publisher);
            std::thread::spawn(move || {
                for burst in 0..50 {
                    let publish = || {
                        for i in 0..20 {
                            p.publish(KvEvent::stored(
                                "t",
                                format!("{t}-{burst}-{i}"),
                                Medium::Cpu,
                            ));
                        }
                    };
                    if t % 2 == 0 {
                        p.inline().scope(publish);
                    } else {
                        publish();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("publishing thread");
    }
    let (events, seqs) = collect(&mut sub, 4000, 5000);
    assert_eq!(events.len(), 4000, "every event arrives");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "messages arrive in sequence order without gaps"
    );
    let ids: Vec<u64> = events.iter().filter_map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 4000, "every event carries its id");
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "events arrive in id order"
    );
    assert_eq!(publisher.status().dropped_events, 0);
}

#[test]
fn handles_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Publisher>();
    send::<Subscriber>();
    send::<IndexSync>();
}
