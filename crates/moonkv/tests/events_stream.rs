//! The KV event stream end to end: a real `moonkv master` publishes, and subscribers (the
//! `moonkv-events` library and the `moonkv events` commands) follow it through queue
//! overruns, a master restart and a subscriber that was away.
//!
//! Every wait is bounded by a generous deadline and nothing asserts on timing. ZMQ's slow
//! joiner (a SUB socket receives nothing until its subscription reaches the publisher) is
//! handled by probing: a put of a throw-away key is issued whenever a subscriber stalls,
//! which also makes a loss at the very end of the stream visible as a gap.

use moonkv_events::{HttpSnapshotSource, IndexSync, Subscriber};
use moonkv_testkit::events::*;
use moonkv_testkit::{free_ports, Moonkv};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

/// The queue drops its oldest events when full and reserves a sequence number for each, so
/// the sequence numbers a connected subscriber never saw add up to `dropped_events`.
#[test]
fn gaps_seen_by_a_subscriber_add_up_to_dropped_events() {
    let mut cluster = EventsMaster::start(MOONKV, &["--kv-events-queue-capacity", "2"]);
    let until = deadline();
    let mut sub = Subscriber::connect(&cluster.endpoint(), Duration::from_millis(50)).unwrap();
    let before = catch_up(&mut sub, &mut cluster, until);
    let missed_before = sub.counters().missed_sequences;

    // One BatchPutEnd or BatchRemove enqueues hundreds of events while holding the engine's
    // locks, far faster than the socket thread sends them, so a queue of 2 overruns; several
    // rounds make sure it did at least once even on a machine where the sender is quick.
    let mut after = before.clone();
    for round in 0..8 {
        let keys: Vec<String> = (0..300).map(|i| format!("r{round}-{i}")).collect();
        cluster.batch_put("burst", &keys);
        cluster.batch_remove("burst", &keys);
        after = catch_up(&mut sub, &mut cluster, until);
        let dropped = after.dropped_events - before.dropped_events;
        let missed = sub.counters().missed_sequences - missed_before;
        assert_eq!(
            missed,
            dropped,
            "round {round}: missed sequence numbers must equal dropped events ({:?})",
            sub.counters()
        );
        if dropped > 0 {
            break;
        }
    }
    let dropped = after.dropped_events - before.dropped_events;
    assert!(
        dropped > 0,
        "bursts of 300 events never overran a queue of 2: {after:?}"
    );
    let c = sub.counters();
    assert!(c.gaps > 0 && c.restarts == 0 && c.malformed == 0, "{c:?}");
    // every event is either published or dropped; nothing else is lost
    assert_eq!(
        after.published_events + after.dropped_events,
        after.last_event_id,
        "{after:?}"
    );
}

/// A killed and restarted master begins again at sequence 1 with a new epoch; a subscriber
/// that keeps its socket sees the sequence go backwards and rebuilds its index from the new
/// master's snapshot, dropping everything the old master held.
#[test]
fn a_restarted_master_starts_again_at_sequence_one_and_the_index_follows() {
    let ports = free_ports();
    let until = deadline();
    let mut cluster = EventsMaster::start_on(MOONKV, ports);
    let endpoint = cluster.endpoint();
    assert_eq!(endpoint, format!("tcp://127.0.0.1:{}", ports[2]));
    let source = HttpSnapshotSource::new(&cluster.admin()).unwrap();
    let sync = IndexSync::new(Some(Box::new(source)), None)
        .with_retry_interval(Duration::from_millis(200));
    let mut sub = Subscriber::connect(&endpoint, Duration::from_millis(50))
        .unwrap()
        .with_index(sync);
    let tail = Cli::spawn(
        MOONKV,
        &["tail", "--endpoint", &endpoint, "--timeout", "300"],
    );

    // Many messages, so the new master's first sequences are below the old master's last
    // and read as a restart rather than a gap, even by a subscriber that reconnects late.
    let mut i = 0;
    while i < 10 || cluster.status().last_sequence < 30 {
        assert!(
            Instant::now() < until,
            "the old master sent too few messages"
        );
        cluster.put("t", &format!("old-{i}"));
        i += 1;
    }
    converge(&mut sub, &mut cluster, until);
    while tail
        .stdout
        .recv_timeout(Duration::from_millis(300))
        .is_err()
    {
        assert!(Instant::now() < until, "the tail never received an event");
        cluster.probe();
    }
    let old = cluster.status();
    let restarts_before = sub.counters().restarts;

    drop(cluster);
    let mut cluster = EventsMaster::start_on(MOONKV, ports);
    assert_eq!(cluster.endpoint(), endpoint);
    let fresh = cluster.status();
    assert_eq!((fresh.last_sequence, fresh.last_event_id), (0, 0));
    assert_ne!(fresh.publisher_epoch, old.publisher_epoch);

    cluster.put("t", "new-0");
    let first = loop {
        let s = cluster.status();
        if s.queue_len == 0 {
            break s;
        }
        assert!(Instant::now() < until, "first event never sent: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        (
            first.last_sequence,
            first.last_event_id,
            first.published_events
        ),
        (1, 1, 1),
        "the new master counts from 1"
    );
    for i in 1..5 {
        cluster.put("t", &format!("new-{i}"));
    }
    converge(&mut sub, &mut cluster, until);

    let c = sub.counters();
    assert!(c.restarts > restarts_before, "restart not detected: {c:?}");
    let sync = sub.sync().unwrap();
    assert_eq!(sync.snapshot_epoch(), Some(fresh.publisher_epoch));
    let keys: Vec<String> = sync
        .index()
        .entries()
        .into_iter()
        .map(|e| e.object_key)
        .collect();
    assert!(
        !keys.iter().any(|k| k.starts_with("old-")),
        "objects of the old master must be gone: {keys:?}"
    );
    assert!(keys.iter().any(|k| k == "new-4"), "{keys:?}");

    // The tail, on its own connection, reports the restart loudly on stderr.
    loop {
        match tail.stderr.recv_timeout(Duration::from_millis(500)) {
            Ok(line) if line.starts_with("!! publisher restart: sequence ") => break,
            Ok(_) => {}
            Err(_) => {
                assert!(Instant::now() < until, "tail never reported the restart");
                cluster.probe();
            }
        }
    }
}

/// A `moonkv events index` that was killed, and missed puts, removes and a tenant-wide
/// RemoveAll, comes back equal to the master's placement through the snapshot.
#[test]
fn an_index_that_missed_events_recovers_through_the_snapshot() {
    let until = deadline();
    let mut cluster = EventsMaster::start(MOONKV, &[]);
    let (endpoint, admin) = (cluster.endpoint(), cluster.admin());
    for i in 0..10 {
        cluster.put("t1", &format!("x{i}"));
    }
    for i in 0..5 {
        cluster.put("t2", &format!("y{i}"));
    }

    // First life: follows the stream (status lines every 0.2 s) until it matches.
    let follower = Cli::spawn(
        MOONKV,
        &[
            "index",
            "--endpoint",
            &endpoint,
            "--admin",
            &admin,
            "--interval",
            "0.2",
            "--json",
        ],
    );
    cluster.put("t1", "z0");
    loop {
        let status = cluster.status();
        let expected = cluster.snapshot(None).objects.len() as u64;
        let stall = Instant::now() + Duration::from_secs(2);
        let mut matched = false;
        while let Ok(line) = follower.stdout.recv_timeout(Duration::from_millis(500)) {
            let s: serde_json::Value = serde_json::from_str(&line).unwrap();
            matched = s["live"] == true
                && s["objects"] == expected
                && s["subscriber"]["last_sequence"] == status.last_sequence;
            if matched || Instant::now() > stall {
                break;
            }
        }
        if matched && status.queue_len == 0 {
            break;
        }
        assert!(Instant::now() < until, "the index never caught up");
        cluster.probe();
    }
    drop(follower);

    // While it is away: removes, new puts, and a RemoveAll that clears tenant t2.
    cluster.batch_remove("t1", &(0..5).map(|i| format!("x{i}")).collect::<Vec<_>>());
    cluster.remove("t1", "z0");
    for i in 0..5 {
        cluster.put("t1", &format!("w{i}"));
    }
    cluster.remove_all("t2");

    // Second life: exits as soon as it is live, printing the whole index.
    let dump = |extra: &[&str]| {
        let mut args = vec![
            "index",
            "--endpoint",
            &endpoint,
            "--admin",
            &admin,
            "--once-synced",
            "--dump-json",
            "--interval",
            "0",
            "--timeout",
            "120",
        ];
        args.extend_from_slice(extra);
        let mut cli = Cli::spawn(MOONKV, &args);
        assert!(cli.wait_exit(until), "index --once-synced failed");
        let lines = cli.drain_stdout(Duration::from_secs(5));
        assert_eq!(lines.len(), 1, "only the dump on stdout: {lines:?}");
        let dump: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(dump["live"], true, "{dump}");
        assert!(
            dump["subscriber"]["recoveries"].as_u64() >= Some(1),
            "{dump}"
        );
        dump
    };
    let all = dump(&[]);
    let master = placement_of_snapshot(&cluster.snapshot(None));
    assert_eq!(placement_of_dump(&all), master);
    assert_eq!(master, cluster.model_placement());
    assert!(master.iter().any(|(_, k, _)| k == "w4"));
    assert!(!master
        .iter()
        .any(|(t, k, _)| t == "t2" || k == "x0" || k == "z0"));
    assert_eq!(all["objects"], master.len());
    assert_eq!(all["cpu"], master.len());
    assert_eq!(all["disk"], 0);

    let scoped = dump(&["--tenant", "t1"]);
    assert_eq!(
        placement_of_dump(&scoped),
        placement_of_snapshot(&cluster.snapshot(Some("t1")))
    );
}

/// `moonkv events tail --count N` prints exactly N events and exits 0; with `--json` each
/// line is the decoded event plus its sequence; without, the readable one-line form.
#[test]
fn tail_prints_the_events_of_puts_and_removes() {
    const COUNT: usize = 30;
    let until = deadline();
    let mut cluster = EventsMaster::start(MOONKV, &[]);
    let endpoint = cluster.endpoint();
    let count = COUNT.to_string();
    let common = [
        "tail",
        "--endpoint",
        &endpoint,
        "--count",
        &count,
        "--timeout",
        "300",
    ];
    let mut json = Cli::spawn(MOONKV, &[&common[..], &["--json"][..]].concat());
    let mut text = Cli::spawn(MOONKV, &common);

    // Probe until both tails print something, keeping what they printed.
    let (mut json_lines, mut text_lines) = (Vec::new(), Vec::new());
    while json_lines.is_empty() || text_lines.is_empty() {
        assert!(Instant::now() < until, "the tails never received an event");
        cluster.probe();
        json_lines.extend(json.drain_stdout(Duration::from_millis(300)));
        text_lines.extend(text.drain_stdout(Duration::from_millis(300)));
    }
    assert!(
        json_lines.len() < COUNT - 5 && text_lines.len() < COUNT - 5,
        "probing took too many events: {json_lines:?}"
    );

    cluster.put("team", "alpha");
    cluster.put("team", "beta");
    cluster.remove("team", "alpha");
    cluster.remove_all("team"); // removed beta, then cleared

    // Fill up to --count so both exit by themselves.
    let mut fillers = 0;
    loop {
        let done_json = json.child.try_wait().unwrap().is_some();
        let done_text = text.child.try_wait().unwrap().is_some();
        if done_json && done_text {
            break;
        }
        assert!(
            Instant::now() < until && fillers < 200,
            "tails did not stop"
        );
        cluster.put("filler", &format!("f{fillers}"));
        fillers += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        json.wait_exit(until) && text.wait_exit(until),
        "tails failed"
    );
    json_lines.extend(json.drain_stdout(Duration::from_secs(5)));
    text_lines.extend(text.drain_stdout(Duration::from_secs(5)));
    assert_eq!(json_lines.len(), COUNT, "{json_lines:#?}");
    assert_eq!(text_lines.len(), COUNT, "{text_lines:#?}");

    let events: Vec<serde_json::Value> = json_lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    for pair in events.windows(2) {
        let id = |v: &serde_json::Value| v["event_id"].as_u64().unwrap();
        let seq = |v: &serde_json::Value| v["sequence"].as_u64().unwrap();
        assert_eq!(id(&pair[1]), id(&pair[0]) + 1, "no event missing");
        assert!(seq(&pair[1]) >= seq(&pair[0]));
    }
    let team: Vec<(String, Option<String>, Option<String>)> = events
        .iter()
        .filter(|e| e["tenant_id"] == "team")
        .map(|e| {
            assert_eq!(e["backend_id"], BACKEND);
            let text = |f: &str| e[f].as_str().map(str::to_string);
            (
                text("event_type").unwrap(),
                text("object_key"),
                text("medium"),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        team,
        vec![
            ("stored".into(), s("alpha"), s("cpu")),
            ("stored".into(), s("beta"), s("cpu")),
            ("removed".into(), s("alpha"), s("cpu")),
            ("removed".into(), s("beta"), s("cpu")),
            ("cleared".into(), None, None),
        ]
    );

    let team_text: Vec<&String> = text_lines
        .iter()
        .filter(|l| l.contains(" tenant=team"))
        .collect();
    let expected = [
        " stored backend=b0 tenant=team medium=cpu group=- key=\"alpha\"",
        " stored backend=b0 tenant=team medium=cpu group=- key=\"beta\"",
        " removed backend=b0 tenant=team medium=cpu group=- key=\"alpha\"",
        " removed backend=b0 tenant=team medium=cpu group=- key=\"beta\"",
        " cleared backend=b0 tenant=team",
    ];
    assert_eq!(team_text.len(), expected.len(), "{team_text:#?}");
    for (line, tail) in team_text.iter().zip(expected) {
        assert!(line.starts_with("id=") && line.ends_with(tail), "{line}");
    }
}
