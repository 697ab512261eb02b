//! `moonkv indexer` with real processes: a moonkv master's stream (the pool's CPU tier), two
//! Python peers publishing vLLM-format events and one publishing SGLang-format events (pyzmq +
//! msgpack, `indexer_peer.py`). Every step compares the answer with a model of which source
//! holds which block in which tier, through stores, removals, clears, a lost batch repaired by
//! replay, a lost batch without replay, a publisher that goes away, and a restarted master, in
//! JSON and (from the Python peer) MessagePack with int32 token bins.
//!
//! Waits are bounded loops on the indexer's answers; nothing sleeps to let time pass.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use moonkv_indexer::hash::{hex, Chain, HashProfile};
use moonkv_testkit::events::{deadline, EventsMaster};
use moonkv_testkit::{free_ports, http, Moonkv, Proc};
use serde_json::{json, Value};

const MOONKV: Moonkv = Moonkv::at(env!("CARGO_BIN_EXE_moonkv"));
const BS: usize = 4;
const BLOCKS: usize = 6;

/// One Python engine peer.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    ready: Value,
}

impl Peer {
    fn start(format: &str) -> Peer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/indexer_peer.py");
        let mut child = Command::new("python3")
            .args([script, "--format", format, "--block-size", &BS.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with pyzmq and msgpack (pip install -r tests/peer/requirements.txt)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the peer never said ready (missing pyzmq or msgpack?)");
        let ready: Value = serde_json::from_str(&first).unwrap();
        Peer {
            child,
            stdin,
            lines,
            ready,
        }
    }

    fn endpoint(&self) -> &str {
        self.ready["endpoint"].as_str().unwrap()
    }

    fn replay(&self) -> &str {
        self.ready["replay"].as_str().unwrap()
    }

    fn send(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no answer to {cmd}"));
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which source holds which block (by index in `tokens`) in which tier, and the instance each
/// source reports for.
#[derive(Default)]
struct Model {
    held: BTreeSet<(&'static str, usize, &'static str)>,
    instance: BTreeMap<&'static str, &'static str>,
}

impl Model {
    fn set(
        &mut self,
        source: &'static str,
        blocks: impl IntoIterator<Item = usize>,
        tier: &'static str,
        on: bool,
    ) {
        for b in blocks {
            if on {
                self.held.insert((source, b, tier));
            } else {
                self.held.remove(&(source, b, tier));
            }
        }
    }

    fn drop_source(&mut self, source: &str) {
        self.held.retain(|(s, _, _)| *s != source);
    }

    /// The answer `/query` should give for the whole token sequence.
    fn expected(&self) -> Value {
        let mut out = serde_json::Map::new();
        let instances: BTreeSet<&str> = self.instance.values().copied().collect();
        for inst in instances {
            let has = |b: usize, tiers: &[&str]| {
                self.held.iter().any(|(s, blk, t)| {
                    self.instance.get(s) == Some(&inst) && *blk == b && tiers.contains(t)
                })
            };
            let run = |tiers: &[&str]| (0..BLOCKS).take_while(|&b| has(b, tiers)).count() * BS;
            let (gpu, cpu, disk) = (
                run(&["gpu"]),
                run(&["gpu", "cpu"]),
                run(&["gpu", "cpu", "disk"]),
            );
            if disk > 0 {
                out.insert(
                    inst.into(),
                    json!({"longest_matched": disk, "GPU": gpu, "CPU": cpu, "DISK": disk,
                           "DP": {"0": disk}}),
                );
            }
        }
        json!({ "default": out })
    }
}

struct Harness {
    indexer: Proc,
    url: String,
    tokens: Vec<u32>,
    /// vLLM block digests of `tokens` (seed 0), as the connector writes them into keys.
    digests: Vec<[u8; 32]>,
}

impl Harness {
    fn query_body(&self) -> Value {
        json!({"model": "m", "block_size": BS, "token_ids": self.tokens})
    }

    fn query(&self) -> Value {
        let (code, body) = http(&self.url, "POST", "/query", &self.query_body().to_string());
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Waits until the JSON answer equals the model, then checks the MessagePack one too.
    fn converge(&self, model: &Model, peer: &mut Peer, what: &str) {
        let want = model.expected();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.query();
            if got == want {
                break;
            }
            assert!(
                Instant::now() < until,
                "{what}: got {got}, want {want}\nsources: {}",
                self.sources()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let packed = peer.send(json!({"op": "query", "url": format!("http://{}", self.url), "body": self.query_body()}));
        assert_eq!(packed, want, "{what}: the MessagePack answer differs");
    }

    fn sources(&self) -> String {
        http(&self.url, "GET", "/sources", "").1
    }

    fn register(&self, body: Value) {
        let (code, text) = http(&self.url, "POST", "/register", &body.to_string());
        assert_eq!(code, 200, "{text}");
    }

    fn key(&self, block: usize) -> String {
        format!(
            "m@tp_rank:0@pcp0@dcp0@pp_rank:0@{}",
            hex(&self.digests[block])
        )
    }

    /// Waits until the store source has seen at least `messages` messages (and is live).
    fn wait_pool(&self, master: &mut EventsMaster, messages: u64) {
        let until = deadline();
        loop {
            let sources: Value = serde_json::from_str(&self.sources()).unwrap();
            let pool = sources
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["spec"]["type"] == "moonkv")
                .cloned()
                .unwrap();
            if pool["status"]["live"] == true
                && pool["status"]["messages"].as_u64() >= Some(messages)
            {
                return;
            }
            assert!(
                Instant::now() < until,
                "the pool source never caught up: {pool}"
            );
            master.probe();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Harness {
    /// Probes the new master until the store source has seen it restart and recovered.
    fn wait_restart(&self, master: &mut EventsMaster) {
        let until = deadline();
        loop {
            let sources: Value = serde_json::from_str(&self.sources()).unwrap();
            let pool = sources
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["spec"]["type"] == "moonkv")
                .cloned()
                .unwrap();
            if pool["status"]["restarts"].as_u64() >= Some(1) && pool["status"]["live"] == true {
                return;
            }
            assert!(Instant::now() < until, "the restart was never seen: {pool}");
            master.probe();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn start_indexer() -> Harness {
    let indexer = MOONKV.start(&["indexer", "--http-port", "0", "--host", "127.0.0.1"]);
    let url = indexer.field("http");
    let tokens: Vec<u32> = (0..(BS * BLOCKS) as u32).map(|i| 1000 + i * 7).collect();
    let profile = HashProfile::vllm("0");
    let mut chain = Chain::new(&profile, &tokens, BS, None, None);
    let mut digests = Vec::new();
    while let Some(d) = chain.next_digest() {
        digests.push(d);
    }
    Harness {
        indexer,
        url,
        tokens,
        digests,
    }
}

fn engine_body(peer: &Peer, kind: &str, instance: &str, replay: bool) -> Value {
    let mut b = json!({"type": kind, "endpoint": peer.endpoint(), "modelname": "m",
                       "instance_id": instance, "block_size": BS, "dp_rank": 0});
    if replay {
        b["replay_endpoint"] = json!(peer.replay());
    }
    b
}

/// Engine hashes are the peer's own (here: 100 * instance + block): the indexer recomputes.
fn store(peer: &mut Peer, h: &Harness, base: u64, blocks: std::ops::Range<usize>, medium: &str) {
    let parent = if blocks.start == 0 {
        Value::Null
    } else {
        json!(base + blocks.start as u64 - 1)
    };
    let hashes: Vec<u64> = blocks.clone().map(|b| base + b as u64).collect();
    let tokens = &h.tokens[blocks.start * BS..blocks.end * BS];
    peer.send(json!({"op": "store", "hashes": hashes, "parent": parent, "tokens": tokens, "medium": medium}));
}

fn remove(peer: &mut Peer, base: u64, blocks: std::ops::Range<usize>, medium: &str) {
    let hashes: Vec<u64> = blocks.map(|b| base + b as u64).collect();
    peer.send(json!({"op": "remove", "hashes": hashes, "medium": medium}));
}

#[test]
fn exact_longest_matches_per_instance_and_tier_through_every_change() {
    let h = start_indexer();
    let ports = free_ports();
    let mut master = EventsMaster::start_on(MOONKV, ports);
    let mut a = Peer::start("vllm");
    let mut b = Peer::start("vllm");
    let mut c = Peer::start("sglang");
    h.register(engine_body(&a, "vLLM", "a", true));
    h.register(engine_body(&b, "vLLM", "b", true));
    h.register(engine_body(&c, "SGLang", "c", false));
    h.register(
        json!({"type": "moonkv", "endpoint": master.endpoint(), "admin": master.admin(),
                      "modelname": "m", "instance_id": "a", "block_size": BS}),
    );
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(p.send(json!({"op": "wait_sub"})), json!({"ok": true}));
    }
    h.wait_pool(&mut master, 1);
    let mut model = Model {
        instance: [("A", "a"), ("B", "b"), ("C", "c"), ("pool", "a")].into(),
        ..Model::default()
    };

    // stores: a on GPU (4 blocks) plus the pool's CPU copies of all six; b GPU 2 + CPU 1;
    // c (SGLang) GPU 5
    store(&mut a, &h, 100, 0..4, "GPU");
    model.set("A", 0..4, "gpu", true);
    store(&mut b, &h, 200, 0..2, "GPU");
    store(&mut b, &h, 200, 2..3, "CPU");
    model.set("B", 0..2, "gpu", true);
    model.set("B", 2..3, "cpu", true);
    store(&mut c, &h, 300, 0..5, "GPU");
    model.set("C", 0..5, "gpu", true);
    for blk in 0..BLOCKS {
        master.put("default", &h.key(blk));
    }
    model.set("pool", 0..BLOCKS, "cpu", true);
    h.converge(&model, &mut a, "after the stores");

    // removals: a evicts block 1 from GPU; the pool loses block 3; b loses its CPU block
    remove(&mut a, 100, 1..2, "GPU");
    model.set("A", 1..2, "gpu", false);
    master.remove("default", &h.key(3));
    model.set("pool", 3..4, "cpu", false);
    remove(&mut b, 200, 2..3, "CPU");
    model.set("B", 2..3, "cpu", false);
    h.converge(&model, &mut a, "after the removals");

    // a lost batch with replay (b), and without (c: its blocks go, later ones count)
    b.send(json!({"op": "drop"}));
    store(&mut b, &h, 200, 2..4, "GPU");
    store(&mut b, &h, 200, 4..5, "GPU");
    model.set("B", 2..5, "gpu", true);
    c.send(json!({"op": "drop"}));
    store(&mut c, &h, 300, 5..6, "GPU");
    store(&mut c, &h, 400, 0..2, "GPU");
    model.drop_source("C");
    model.set("C", 0..2, "gpu", true);
    h.converge(&model, &mut a, "after the lost batches");
    let sources: Value = serde_json::from_str(&h.sources()).unwrap();
    let status = |inst: &str| {
        sources
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["spec"]["instance_id"] == inst && s["spec"]["type"] != "moonkv")
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status("b")["repaired_gaps"], 1, "{sources}");
    assert_eq!(status("c")["resets"], 1, "{sources}");

    // a clear (c), and a publisher that goes away (b): unregistering removes it
    c.send(json!({"op": "clear"}));
    model.drop_source("C");
    drop(b);
    let (code, body) = http(
        &h.url,
        "POST",
        "/unregister",
        &json!({"instance_id": "b"}).to_string(),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("b|default|0"), "{body}");
    model.drop_source("B");
    model.instance.remove("B");
    h.converge(&model, &mut a, "after the clear and the unregister");

    // the master restarts empty on the same ports: the pool's blocks go, then come back.
    // Enough messages first that the new master's sequence reads as a restart.
    while master.status().last_sequence < 30 {
        master.probe();
    }
    let sent = master.status().last_sequence;
    h.wait_pool(&mut master, sent);
    drop(master);
    let mut master = EventsMaster::start_on(MOONKV, ports);
    h.wait_restart(&mut master);
    model.drop_source("pool");
    h.converge(&model, &mut a, "after the master restarted");
    for blk in [0, 1, 2] {
        master.put("default", &h.key(blk));
    }
    model.set("pool", 0..3, "cpu", true);
    h.converge(&model, &mut a, "after puts on the new master");

    let (code, metrics) = http(&h.url, "GET", "/metrics", "");
    assert_eq!(code, 200);
    for needle in [
        "moonkv_indexer_sources{source_type=\"vLLM\"} 1",
        "moonkv_indexer_gaps_total",
        "moonkv_indexer_events_total{source_type=\"SGLang\",kind=\"cleared\"} 1",
        "moonkv_indexer_unrecognized_keys_total{reason=\"unrecognized\"}",
        "moonkv_indexer_query_seconds_count",
        "moonkv_indexer_queries_total{format=\"msgpack\"}",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    drop(h.indexer);
}

/// POST with exactly one Content-Type (the kit's helper always sends JSON's).
fn post_as(addr: &str, path: &str, ctype: &str, body: &[u8]) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut resp = agent
        .post(&format!("http://{addr}{path}"))
        .header("Content-Type", ctype)
        .send(body)
        .unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.body_mut().read_to_vec().unwrap();
    // a MessagePack refusal still carries its message as a plain string
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

#[test]
fn bad_requests_get_precise_errors_and_the_server_stays_up() {
    let h = start_indexer();
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("/query", "application/json", "{", 400, "invalid JSON body"),
        (
            "/query",
            "application/json",
            r#"{"model":"m","block_size":0,"token_ids":[]}"#,
            400,
            "block_size must be positive",
        ),
        (
            "/query",
            "application/json",
            r#"{"model":"m","block_size":4,"token_ids":[1,-2]}"#,
            400,
            "token_ids[1] = -2",
        ),
        (
            "/query",
            "application/msgpack",
            "\u{93}",
            400,
            "invalid MessagePack body",
        ),
        (
            "/query",
            "text/plain",
            "{}",
            415,
            "unsupported content type",
        ),
        (
            "/register",
            "application/json",
            r#"{"type":"vLLM","endpoint":"nowhere","modelname":"m","instance_id":"i","block_size":4}"#,
            400,
            "not a ZMQ address",
        ),
        (
            "/register",
            "application/json",
            r#"{"type":"TRT","endpoint":"tcp://127.0.0.1:1","modelname":"m","instance_id":"i","block_size":4}"#,
            400,
            "unknown source type",
        ),
        (
            "/register",
            "application/json",
            r#"{"type":"vLLM","endpoint":"tcp://127.0.0.1:1","modelname":"m","instance_id":"i","block_size":4,"hash_profile":{"name":"md5"}}"#,
            400,
            "unknown hash profile",
        ),
        (
            "/unregister",
            "application/json",
            r#"{"instance_id":"nobody"}"#,
            404,
            "no source of instance",
        ),
    ];
    for (path, ctype, body, status, text) in cases {
        let (code, answer) = post_as(&h.url, path, ctype, body.as_bytes());
        assert_eq!(code, *status, "{path} {body}: {answer}");
        assert!(answer.contains(text), "{path} {body}: {answer}");
    }
    // a second registration of one endpoint for one instance conflicts; profiles must agree
    let ok = json!({"type": "vLLM", "endpoint": "tcp://127.0.0.1:9", "modelname": "m",
                    "instance_id": "i", "block_size": 4});
    let (code, _) = http(&h.url, "POST", "/register", &ok.to_string());
    assert_eq!(code, 200);
    let (code, body) = http(&h.url, "POST", "/register", &ok.to_string());
    assert_eq!(
        (code, body.contains("already registered")),
        (409, true),
        "{body}"
    );
    let mut other = ok.clone();
    other["endpoint"] = json!("tcp://127.0.0.1:10");
    other["hash_profile"] = json!({"name": "vllm_sha256_cbor", "seed": "1"});
    let (code, body) = http(&h.url, "POST", "/register", &other.to_string());
    assert_eq!(code, 409, "{body}");
    let (code, body) = http(&h.url, "GET", "/health", "");
    assert_eq!(code, 200);
    assert!(body.contains("\"sources\":1"), "{body}");
}
