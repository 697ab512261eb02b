//! A cluster spread over hosts in network namespaces (`moonkv_testkit::hosts`): a master host,
//! two node hosts, and the test process as the client host. Replicas go to distinct hosts, and
//! a node host whose link is cut costs neither reads nor writes; when the link heals, its node
//! serves again.

use moonkv_client::store::{Store, StoreConfig};
use moonkv_proto::ReplicateConfig;
use moonkv_testkit::cluster::runtime;
use moonkv_testkit::hosts::{self, Hosts};
use moonkv_testkit::{Moonkv, Proc};
use std::time::{Duration, Instant};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));

fn start_in(hosts: &Hosts, host: usize, args: &[&str]) -> Proc {
    let mut cmd = hosts.command(host, MOONKV.path());
    cmd.args(args)
        .env_remove("MOONKV_AUTH_SECRET")
        .env_remove("MOONKV_AUTH_SECRET_FILE");
    Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// A master on host 0's address with ephemeral ports, plus `extra` flags.
fn start_master(hosts: &Hosts, extra: &[&str]) -> Proc {
    let m = hosts.address(0).to_string();
    let mut args = vec![
        "master",
        "--rpc-address",
        &m,
        "--rpc-port",
        "0",
        "--metrics-host",
        &m,
        "--metrics-port",
        "0",
    ];
    args.extend_from_slice(extra);
    start_in(hosts, 0, &args)
}

fn value(i: u32) -> Vec<u8> {
    (0..64u32 << 10).map(|b| (b * 7 + i) as u8).collect()
}

/// The segments the master lists: (host_id, status, suspect).
fn segments(admin: &str) -> Vec<(String, String, bool)> {
    let Some(body) = moonkv_testkit::http_get(admin, "/get_segments_detail") else {
        return Vec::new();
    };
    let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    parsed["segments"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|s| {
                    (
                        s["host_id"].as_str().unwrap_or("").to_string(),
                        s["status"].as_str().unwrap_or("").to_string(),
                        s["suspect"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_node_host_cut_off_costs_no_read_or_write_and_serves_again_when_its_link_heals() {
    let Some(hosts) = hosts::for_test(3) else {
        return;
    };
    let (a, b) = (hosts.address(1), hosts.address(2));
    let master = start_master(
        &hosts,
        &[
            // A cut node is unmounted quickly, and re-mounts once its link heals.
            "--client-live-ttl-sec",
            "3",
        ],
    );
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let node = |host: usize, id: &str, address: std::net::Ipv4Addr| {
        start_in(
            &hosts,
            host,
            &[
                "node",
                "--master",
                &rpc,
                "--segment-size",
                "32MiB",
                "--host-id",
                id,
                "--data-bind",
                &format!("{address}:0"),
            ],
        )
    };
    let _node_a = node(1, "host-a", a);
    let _node_b = node(2, "host-b", b);
    moonkv_testkit::wait_for(Duration::from_secs(20), "both node hosts mounted", || {
        (segments(&admin).len() == 2).then_some(())
    });
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    runtime().block_on(async {
        let mut config = StoreConfig::new(rpc.clone());
        config.connect_timeout = Duration::from_millis(500);
        config.transfer_timeout = Duration::from_secs(2);
        let store = Store::connect(config).await.unwrap();
        for i in 0..20 {
            store.put(&format!("k{i}"), &value(i), &two).await.unwrap();
        }
        // Each object has one replica on each host.
        for i in 0..20 {
            let listed = store.list(&format!("^k{i}$")).await.unwrap().remove(0);
            let mut endpoints: Vec<String> = listed
                .replicas
                .iter()
                .map(|r| r.endpoint.split(':').next().unwrap().to_string())
                .collect();
            endpoints.sort();
            assert_eq!(endpoints, [a.to_string(), b.to_string()], "k{i}");
        }

        hosts.cut(1).unwrap();
        let cut_at = Instant::now();
        // Reads fail over to host b, writes land there.
        for i in 0..20 {
            assert_eq!(store.get(&format!("k{i}")).await.unwrap(), value(i), "k{i}");
        }
        for i in 20..30 {
            store
                .put(&format!("k{i}"), &value(i), &ReplicateConfig::default())
                .await
                .unwrap_or_else(|e| panic!("put k{i} during the cut: {e}"));
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(15),
            "reads and writes during the cut took {:?}",
            cut_at.elapsed()
        );
        // The heartbeat deadline unmounts host a.
        moonkv_testkit::wait_for(Duration::from_secs(20), "host a unmounted", || {
            segments(&admin)
                .iter()
                .all(|(host, _, _)| host != "host-a")
                .then_some(())
        });

        hosts.heal(1).unwrap();
        // Host a mounts again and takes writes: a two-replica put reaches both hosts.
        moonkv_testkit::wait_for(Duration::from_secs(30), "host a mounted again", || {
            segments(&admin)
                .iter()
                .any(|(host, status, suspect)| host == "host-a" && status == "OK" && !suspect)
                .then_some(())
        });
        let until = Instant::now() + Duration::from_secs(30);
        let mut round = 0;
        loop {
            round += 1;
            let key = format!("after-{round}");
            if store.put(&key, &value(99), &two).await.is_ok() {
                let listed = store.list(&format!("^{key}$")).await.unwrap();
                if listed[0]
                    .replicas
                    .iter()
                    .any(|r| r.endpoint.starts_with(&format!("{a}:")))
                {
                    break;
                }
            }
            assert!(
                Instant::now() < until,
                "no put reached host a after the heal"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Nothing acknowledged was lost, and host a re-adopted what it held: every object
        // written with a replica there before the cut has it back.
        for i in 20..30 {
            assert_eq!(store.get(&format!("k{i}")).await.unwrap(), value(i), "k{i}");
        }
        for i in 0..20 {
            let key = format!("k{i}");
            assert_eq!(store.get(&key).await.unwrap(), value(i), "{key}");
            let until = Instant::now() + Duration::from_secs(30);
            loop {
                let listed = store.list(&format!("^{key}$")).await.unwrap();
                let on_a = listed[0]
                    .replicas
                    .iter()
                    .any(|r| r.endpoint.starts_with(&format!("{a}:")));
                if on_a && listed[0].replicas.len() == 2 {
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "{key} never got its replica on host a back: {:?}",
                    listed[0].replicas
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // And the re-adopted replica reads back exactly.
        for i in 0..30 {
            assert_eq!(store.get(&format!("k{i}")).await.unwrap(), value(i), "k{i}");
        }
    });
}

#[test]
fn a_client_host_cut_mid_put_leaves_nothing_torn_and_its_key_is_reclaimed() {
    let Some(hosts) = hosts::for_test(3) else {
        return;
    };
    let n = hosts.address(1);
    let master = start_master(
        &hosts,
        &[
            "--put-start-discard-timeout-sec",
            "2",
            "--put-start-release-timeout-sec",
            "4",
        ],
    );
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    // The node holds half of the write's payload for 3 s: the client host is cut meanwhile.
    let mut cmd = hosts.command(1, MOONKV.path());
    cmd.args([
        "node",
        "--master",
        &rpc,
        "--segment-size",
        "64MiB",
        "--data-bind",
        &format!("{n}:0"),
        "--data-io-timeout",
        "2s",
    ])
    .env(
        "FAILPOINTS",
        format!(
            "{}=1*sleep(3000)",
            moonkv_node::failpoints::WRITE_MID_PAYLOAD
        ),
    );
    let _node = Proc::start(cmd).unwrap_or_else(|e| panic!("{e}"));
    moonkv_testkit::wait_for(Duration::from_secs(20), "the node mounted", || {
        (segments(&admin).len() == 1).then_some(())
    });
    let dir = std::env::temp_dir().join(format!("moonkv-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("value");
    std::fs::write(&file, vec![0xEEu8; 16 << 20]).unwrap();
    let mut writer = hosts.command(2, MOONKV.path());
    writer
        .args(["put", "torn", file.to_str().unwrap(), "--master", &rpc])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut writer = writer.spawn().unwrap();
    // Once the write is under way (the key exists, not readable), the client host goes dark.
    runtime().block_on(async {
        let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
        moonkv_testkit::wait_for(Duration::from_secs(20), "the writer's PutStart", || {
            let text = moonkv_testkit::http_get(&admin, "/metrics")?;
            text.lines()
                .find_map(|l| l.strip_prefix("master_put_start_requests_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|n| *n >= 1.0)
        });
        hosts.cut(2).unwrap();
        // Until the write is reclaimed, nothing of it is readable, never torn bytes.
        let until = Instant::now() + Duration::from_secs(30);
        let fresh = value(5);
        loop {
            if let Ok(bytes) = store.get("torn").await {
                panic!("a half-written object was readable ({} bytes)", bytes.len());
            }
            // The key is taken over after the discard timeout, and the new value reads back.
            if store
                .put("torn", &fresh, &ReplicateConfig::default())
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                Instant::now() < until,
                "the abandoned write was never reclaimed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(store.get("torn").await.unwrap(), fresh);
    });
    let _ = writer.kill();
    let _ = writer.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A subscriber host cut off while objects are stored and removed ends with exactly the
/// master's state once its link heals. A cut of a second or two is absorbed by TCP
/// retransmission (the publisher's queue holds the events); losses beyond its queue go through
/// the snapshot, which `events_stream.rs` covers on one host.
#[test]
fn a_subscriber_host_that_loses_its_link_ends_with_the_exact_index() {
    use std::io::BufRead;
    let Some(hosts) = hosts::for_test(3) else {
        return;
    };
    let n = hosts.address(1);
    let master = start_master(
        &hosts,
        &[
            "--enable-kv-events",
            "true",
            "--kv-events-bind-endpoint",
            &format!("tcp://{}:0", hosts.address(0)),
            "--kv-events-backend-id",
            "hosts-test",
        ],
    );
    let (rpc, admin, events) = (
        master.field("rpc"),
        master.field("admin"),
        master.field("kv_events"),
    );
    let _node = start_in(
        &hosts,
        1,
        &[
            "node",
            "--master",
            &rpc,
            "--segment-size",
            "64MiB",
            "--data-bind",
            &format!("{n}:0"),
        ],
    );
    moonkv_testkit::wait_for(Duration::from_secs(20), "the node mounted", || {
        (segments(&admin).len() == 1).then_some(())
    });
    // The subscriber on its own host prints its index's status every 100 ms.
    let mut subscriber = hosts
        .command(2, MOONKV.path())
        .args([
            "events",
            "index",
            "--endpoint",
            &events,
            "--admin",
            &admin,
            "--interval",
            "100ms",
            "--json",
            "--timeout",
            "120s",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, status) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = subscriber.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(value) = serde_json::from_str(&line) {
                if tx.send(value).is_err() {
                    return;
                }
            }
        }
    });
    // Waits for a status line that is live with `objects` objects.
    let reach = |objects: u64, what: &str| -> serde_json::Value {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = status
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the subscriber never reached {what}"));
            if line["live"] == true && line["objects"] == objects {
                return line;
            }
        }
    };
    runtime().block_on(async {
        let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
        let small = vec![3u8; 1024];
        let cfg = ReplicateConfig::default();
        for i in 0..200 {
            store.put(&format!("e{i}"), &small, &cfg).await.unwrap();
        }
        reach(200, "the first 200 objects");
        hosts.cut(2).unwrap();
        for i in 200..500 {
            store.put(&format!("e{i}"), &small, &cfg).await.unwrap();
        }
        for i in 0..50 {
            store.remove(&format!("e{i}"), true).await.unwrap();
        }
        hosts.heal(2).unwrap();
    });
    let last = reach(450, "the 450 objects left after the cut");
    assert_eq!(last["cpu"], 450);
    let _ = subscriber.kill();
    let _ = subscriber.wait();
}

/// Puts and gets across hosts on a link of 1 ms round trip, then the same link losing 0.5% of
/// its segments (each loss costs a 200 ms retransmission): every value reads back byte-exact,
/// singles and batches, from 4 KiB to 8 MiB.
#[test]
fn puts_and_gets_across_a_slow_and_a_lossy_link_read_back_exactly() {
    use moonkv_testkit::relay::{Relay, Shape};
    let Some(hosts) = hosts::for_test(2) else {
        return;
    };
    let n = hosts.address(1);
    let master = start_master(&hosts, &[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    // The node listens on its host at `port`; clients reach it through a relay on the test's
    // own address, same port, which shapes the link.
    let port = std::net::TcpListener::bind((hosts.own_address(), 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay = Relay::start(
        &format!("{}:{port}", hosts.own_address()),
        std::net::SocketAddr::from((n, port)),
        Shape::rtt(Duration::from_millis(1)),
    )
    .unwrap();
    let _node = start_in(
        &hosts,
        1,
        &[
            "node",
            "--master",
            &rpc,
            "--segment-size",
            "128MiB",
            "--data-bind",
            &format!("0.0.0.0:{port}"),
            "--advertise-host",
            &hosts.own_address().to_string(),
        ],
    );
    moonkv_testkit::wait_for(Duration::from_secs(20), "the node mounted", || {
        (segments(&admin).len() == 1).then_some(())
    });
    let sizes = [4usize << 10, 128 << 10, 1 << 20, 8 << 20];
    let payload =
        |i: usize, size: usize| -> Vec<u8> { (0..size).map(|b| (b * 31 + i * 7) as u8).collect() };
    runtime().block_on(async {
        let store = Store::connect(StoreConfig::new(rpc.clone())).await.unwrap();
        let cfg = ReplicateConfig::default();
        for (round, shape) in [
            Shape::rtt(Duration::from_millis(1)),
            Shape::rtt(Duration::from_millis(1)).with_loss(0.005),
        ]
        .into_iter()
        .enumerate()
        {
            relay.set_shape(shape);
            for (i, &size) in sizes.iter().enumerate() {
                let key = format!("r{round}-{i}");
                store.put(&key, &payload(i, size), &cfg).await.unwrap();
                assert_eq!(store.get(&key).await.unwrap(), payload(i, size), "{key}");
            }
            let keys: Vec<String> = (0..128).map(|i| format!("b{round}-{i}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let values: Vec<Vec<u8>> = (0..128).map(|i| payload(i, 4 << 10)).collect();
            let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            for r in store.batch_put_from(&refs, &value_refs, &cfg).await {
                r.unwrap();
            }
            for (i, got) in store.batch_get(&refs).await.into_iter().enumerate() {
                assert_eq!(got.unwrap(), values[i], "{}", keys[i]);
            }
        }
        // Every byte went through the relay: the node is reachable only there.
        let listed = store.list("^r0-0$").await.unwrap();
        assert_eq!(
            listed[0].replicas[0].endpoint,
            format!("{}:{port}", hosts.own_address()).into()
        );
    });
}

/// How long the node host stays cut off: longer than the master's default heartbeat deadline
/// (10 s) several times over.
const LONG_CUT: Duration = Duration::from_secs(30);

/// A 1,000-key batch put and a get-heavy reader run while one node host is cut off for 30 s,
/// past the (default) heartbeat deadline: every batch key is stored (on the host that answers),
/// every get returns the exact value from the other replica, and the cut host serves again
/// after.
#[test]
fn a_node_host_cut_during_batch_puts_and_heavy_gets_loses_and_tears_nothing() {
    let Some(hosts) = hosts::for_test(3) else {
        return;
    };
    let (a, b) = (hosts.address(1), hosts.address(2));
    let master = start_master(&hosts, &[]);
    let (rpc, admin) = (master.field("rpc"), master.field("admin"));
    let node = |host: usize, id: &str, address: std::net::Ipv4Addr| {
        start_in(
            &hosts,
            host,
            &[
                "node",
                "--master",
                &rpc,
                "--segment-size",
                "64MiB",
                "--host-id",
                id,
                "--data-bind",
                &format!("{address}:0"),
            ],
        )
    };
    let _node_a = node(1, "host-a", a);
    let _node_b = node(2, "host-b", b);
    moonkv_testkit::wait_for(Duration::from_secs(20), "both node hosts mounted", || {
        (segments(&admin).len() == 2).then_some(())
    });
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let small = |i: u32| -> Vec<u8> { (0..4096u32).map(|b| (b * 3 + i) as u8).collect() };
    runtime().block_on(async {
        let mut config = StoreConfig::new(rpc.clone());
        config.connect_timeout = Duration::from_millis(500);
        // Room for the failover's re-placements on a loaded machine.
        config.transfer_timeout = Duration::from_secs(6);
        let store = Store::connect(config).await.unwrap();
        // What the reader reads: 100 objects with a replica on each host.
        for i in 0..100 {
            store.put(&format!("g{i}"), &small(i), &two).await.unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let keys: Vec<String> = (0..100).map(|i| format!("g{i}")).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let mut rounds = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, got) in store.batch_get(&refs).await.into_iter().enumerate() {
                        let got = got.unwrap_or_else(|e| panic!("get g{i} during the cut: {e}"));
                        assert_eq!(got, small(i as u32), "g{i}");
                    }
                    rounds += 1;
                }
                rounds
            })
        };
        hosts.cut(1).unwrap();
        let cut_at = Instant::now();
        // 1,000 keys in batches of 100 while host a is dark (and then unmounted).
        let mut stored = 0;
        for batch in 0..10u32 {
            let keys: Vec<String> = (0..100).map(|i| format!("p{batch}-{i}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let values: Vec<Vec<u8>> = (0..100).map(|i| small(batch * 100 + i)).collect();
            let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            for (k, r) in keys
                .iter()
                .zip(store.batch_put_from(&refs, &value_refs, &two).await)
            {
                r.unwrap_or_else(|e| panic!("batch put {k} during the cut: {e}"));
                stored += 1;
            }
        }
        assert_eq!(stored, 1000);
        // The heartbeat deadline unmounts the cut host; the cut (and the reader) go on.
        moonkv_testkit::wait_for(Duration::from_secs(25), "host a unmounted", || {
            segments(&admin)
                .iter()
                .all(|(host, _, _)| host != "host-a")
                .then_some(())
        });
        while cut_at.elapsed() < LONG_CUT {
            assert!(!reader.is_finished(), "the reader stopped during the cut");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cut_for = cut_at.elapsed();
        hosts.heal(1).unwrap();
        moonkv_testkit::wait_for(Duration::from_secs(30), "host a mounted again", || {
            segments(&admin)
                .iter()
                .any(|(host, status, suspect)| host == "host-a" && status == "OK" && !suspect)
                .then_some(())
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds = reader.await.unwrap();
        assert!(rounds > 0, "the reader ran during the {cut_for:?} cut");
        // Every key of the batches reads back exactly.
        for batch in 0..10u32 {
            for i in 0..100u32 {
                let key = format!("p{batch}-{i}");
                assert_eq!(
                    store.get(&key).await.unwrap(),
                    small(batch * 100 + i),
                    "{key}"
                );
            }
        }
    });
}
