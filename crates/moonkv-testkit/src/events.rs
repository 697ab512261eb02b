//! The event stream end to end: a real master with events on, a model of what it should hold,
//! placements in one comparable shape, and `moonkv events` child processes.

use crate::admin::http;
use crate::proc::{Moonkv, Proc};
use crate::wire::{self, fake_segment, put_meta, Connection};
use moonkv_events::{PlacementIndex, PublisherStatus, Snapshot, Subscriber};
use moonkv_proto::msg::*;
use moonkv_proto::types::{ItemResult, ReplicaDescriptor, ReplicaType, ReplicateConfig};
use moonkv_proto::ClientId;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Backend id the masters publish under.
pub const BACKEND: &str = "b0";
/// Tenant of the throw-away probe keys.
pub const PROBE_TENANT: &str = "probe";

/// Bound of every wait; generous because a loaded 2-core machine can be very slow.
pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

/// (tenant, key, media) for every readable object, the shape all placements are compared in.
pub type Placement = BTreeSet<(String, String, Vec<String>)>;

/// The placement a master's snapshot describes.
pub fn placement_of_snapshot(snapshot: &Snapshot) -> Placement {
    snapshot
        .objects
        .iter()
        .map(|o| {
            let mut media: Vec<String> = o.media.iter().map(|m| m.as_str().to_string()).collect();
            media.sort();
            (o.tenant_id.clone(), o.object_key.clone(), media)
        })
        .collect()
}

/// The placement a subscriber's index holds (all of it under [`BACKEND`]).
pub fn placement_of_index(index: &PlacementIndex) -> Placement {
    index
        .entries()
        .into_iter()
        .map(|e| {
            assert_eq!(e.backend_id, BACKEND);
            let mut media: Vec<String> = e.media.iter().map(|m| m.as_str().to_string()).collect();
            media.sort();
            (e.tenant_id, e.object_key, media)
        })
        .collect()
}

/// The placement in a `moonkv events follow` dump (all of it under [`BACKEND`]).
pub fn placement_of_dump(dump: &serde_json::Value) -> Placement {
    dump["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("dump without entries: {dump}"))
        .iter()
        .map(|e| {
            assert_eq!(e["backend_id"], BACKEND, "{e}");
            let mut media: Vec<String> = e["media"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_str().unwrap().to_string())
                .collect();
            media.sort();
            let text = |f: &str| e[f].as_str().unwrap().to_string();
            (text("tenant_id"), text("object_key"), media)
        })
        .collect()
}

/// Starts a master with events on; `ports` pins rpc/admin/events, else all are ephemeral.
/// `Err` says why it did not come up (for example a port still held by a dying process).
fn start_master(
    moonkv: Moonkv,
    ports: Option<[u16; 3]>,
    extra: &[&str],
) -> Result<Proc, crate::KitError> {
    let (rpc, admin, events) = match ports {
        Some([r, a, e]) => (r.to_string(), a.to_string(), format!("tcp://127.0.0.1:{e}")),
        None => ("0".into(), "0".into(), "tcp://127.0.0.1:0".into()),
    };
    let mut args = vec![
        "master",
        "--rpc-port",
        &rpc,
        "--metrics-port",
        &admin,
        "--enable-kv-events",
        "true",
        "--kv-events-bind-endpoint",
        &events,
        "--kv-events-backend-id",
        BACKEND,
        // The test's connection never pings; without this a slow run would see its segment
        // unmounted (and its objects removed) after the default 10 s.
        "--client-live-ttl-sec",
        "86400",
    ];
    args.extend_from_slice(extra);
    Proc::start(moonkv.command(&args))
}

/// A master with events on plus a connection that writes through it, and a model of which
/// keys should be readable.
pub struct EventsMaster {
    master: Proc,
    client: Connection,
    me: ClientId,
    probes: u64,
    model: BTreeSet<(String, String)>,
}

impl EventsMaster {
    /// A master on ephemeral ports with `extra` flags.
    pub fn start(moonkv: Moonkv, extra: &[&str]) -> EventsMaster {
        let master = start_master(moonkv, None, extra).unwrap_or_else(|e| panic!("{e}"));
        EventsMaster::attach(master)
    }

    /// Starts on fixed ports, retrying while a previous master's ports are released.
    pub fn start_on(moonkv: Moonkv, ports: [u16; 3]) -> EventsMaster {
        let until = deadline();
        loop {
            match start_master(moonkv, Some(ports), &[]) {
                Ok(master) => return EventsMaster::attach(master),
                Err(e) => assert!(
                    Instant::now() < until,
                    "master never came up on {ports:?}: {e}"
                ),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn attach(master: Proc) -> EventsMaster {
        let endpoint = master.field("kv_events");
        assert!(
            endpoint.starts_with("tcp://127.0.0.1:") && !endpoint.ends_with(":0"),
            "ready line must carry the bound endpoint: {}",
            master.ready
        );
        let client = wire::connect(&master.field("rpc"));
        let me = ClientId::new(7, 7);
        client
            .request::<()>(&Request::MountSegment(MountSegmentRequest {
                segment: fake_segment(1),
                client_id: me,
                keeps_catalog: false,
            }))
            .expect("mount");
        EventsMaster {
            master,
            client,
            me,
            probes: 0,
            model: BTreeSet::new(),
        }
    }

    /// The bound event endpoint, `tcp://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        self.master.field("kv_events")
    }

    /// The admin HTTP address.
    pub fn admin(&self) -> String {
        self.master.field("admin")
    }

    /// Puts `key` (metadata only) and records it in the model.
    pub fn put(&mut self, tenant: &str, key: &str) {
        put_meta(&self.client, self.me, tenant, key, 1024);
        self.model.insert((tenant.into(), key.into()));
    }

    /// A put of a fresh key that no assertion cares about: wakes slow joiners and makes a
    /// trailing loss visible.
    pub fn probe(&mut self) {
        self.probes += 1;
        let key = format!("p{}", self.probes);
        self.put(PROBE_TENANT, &key);
    }

    /// Removes `key` (forced) and forgets it in the model.
    pub fn remove(&mut self, tenant: &str, key: &str) {
        self.client
            .request::<()>(&Request::Remove(RemoveRequest {
                tenant: tenant.into(),
                key: key.into(),
                force: true,
            }))
            .expect("remove");
        self.model.remove(&(tenant.to_string(), key.to_string()));
    }

    /// Puts `keys` with one BatchPutEnd, so their events are enqueued back to back.
    pub fn batch_put(&mut self, tenant: &str, keys: &[String]) {
        let start = BatchPutStartRequest {
            client_id: self.me,
            tenant: tenant.into(),
            keys: keys.to_vec(),
            sizes: vec![1024; keys.len()],
            config: ReplicateConfig::default(),
        };
        let started: Vec<ItemResult<Vec<ReplicaDescriptor>>> = self
            .client
            .request(&Request::BatchPutStart(start))
            .expect("batch put start");
        let items = keys
            .iter()
            .zip(started)
            .map(|(key, r)| EndItem {
                key: key.clone(),
                replica_ids: r.0.expect("replicas").iter().map(|d| d.id).collect(),
                checksum: None,
            })
            .collect();
        let end = BatchEndRequest {
            client_id: self.me,
            tenant: tenant.into(),
            replica_type: ReplicaType::All,
            items,
        };
        let ended: Vec<ItemResult<()>> = self
            .client
            .request(&Request::BatchPutEnd(end))
            .expect("batch put end");
        assert!(ended.iter().all(|r| r.0.is_ok()), "batch put end failed");
        for key in keys {
            self.model.insert((tenant.into(), key.clone()));
        }
    }

    /// Removes `keys` with one BatchRemove.
    pub fn batch_remove(&mut self, tenant: &str, keys: &[String]) {
        let removed: Vec<ItemResult<()>> = self
            .client
            .request(&Request::BatchRemove(BatchRemoveRequest {
                tenant: tenant.into(),
                keys: keys.to_vec(),
                force: true,
            }))
            .expect("batch remove");
        assert!(removed.iter().all(|r| r.0.is_ok()), "batch remove failed");
        for key in keys {
            self.model.remove(&(tenant.to_string(), key.clone()));
        }
    }

    /// RemoveAll of one tenant through the admin API (per-object removed, then cleared).
    pub fn remove_all(&mut self, tenant: &str) {
        let path = format!("/api/v1/remove_all?tenant_id={tenant}&force=true");
        let (status, body) = http(&self.admin(), "POST", &path, "");
        assert_eq!(status, 200, "{body}");
        self.model.retain(|(t, _)| t != tenant);
    }

    /// `/kv_events/status`.
    pub fn status(&self) -> PublisherStatus {
        let (code, body) = http(&self.admin(), "GET", "/kv_events/status", "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("bad status {body}: {e}"))
    }

    /// `/kv_events/snapshot`, of one tenant or all.
    pub fn snapshot(&self, tenant: Option<&str>) -> Snapshot {
        let path = match tenant {
            Some(t) => format!("/kv_events/snapshot?tenant_id={t}"),
            None => "/kv_events/snapshot".into(),
        };
        let (code, body) = http(&self.admin(), "GET", &path, "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("bad snapshot {body}: {e}"))
    }

    /// The test's own idea of the placement: every key in memory only.
    pub fn model_placement(&self) -> Placement {
        self.model
            .iter()
            .map(|(t, k)| (t.clone(), k.clone(), vec!["cpu".to_string()]))
            .collect()
    }
}

/// Polls `sub` until it has received every message the master sent and the publisher's
/// queue is empty, probing whenever it stalls. Returns the master's status at that point.
pub fn catch_up(
    sub: &mut Subscriber,
    cluster: &mut EventsMaster,
    until: Instant,
) -> PublisherStatus {
    loop {
        assert!(
            Instant::now() < until,
            "subscriber never caught up: {:?} vs {:?}",
            sub.counters(),
            cluster.status()
        );
        let status = cluster.status();
        let caught_up =
            |sub: &Subscriber| sub.counters().last_sequence == Some(status.last_sequence);
        let stall = Instant::now() + Duration::from_secs(1);
        while !caught_up(sub) && Instant::now() < stall {
            sub.poll().expect("poll");
        }
        if caught_up(sub) && status.queue_len == 0 {
            return status;
        }
        if !caught_up(sub) {
            cluster.probe();
        }
    }
}

/// Polls an index-keeping subscriber, probing, until it is live and equals the master's
/// placement (which must also equal the test's model).
pub fn converge(sub: &mut Subscriber, cluster: &mut EventsMaster, until: Instant) {
    loop {
        catch_up(sub, cluster, until);
        let snapshot = cluster.snapshot(None);
        let sync = sub.sync().expect("index");
        if sync.is_live() && placement_of_index(sync.index()) == placement_of_snapshot(&snapshot) {
            assert_eq!(placement_of_snapshot(&snapshot), cluster.model_placement());
            return;
        }
        assert!(
            Instant::now() < until,
            "index never matched the master: {sync:?}"
        );
        cluster.probe();
    }
}

/// A `moonkv events ...` process with its output read line by line on helper threads.
pub struct Cli {
    /// The process.
    pub child: Child,
    /// Its stdout, line by line.
    pub stdout: mpsc::Receiver<String>,
    /// Its stderr, line by line.
    pub stderr: mpsc::Receiver<String>,
}

fn lines_of(reader: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Cli {
    /// Starts `moonkv events <args>`.
    pub fn spawn(moonkv: Moonkv, args: &[&str]) -> Cli {
        let mut child = moonkv
            .command(&["events"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn moonkv events");
        let stdout = lines_of(child.stdout.take().expect("stdout"));
        let stderr = lines_of(child.stderr.take().expect("stderr"));
        Cli {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the process to end by itself; true if it exited successfully.
    pub fn wait_exit(&mut self, until: Instant) -> bool {
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.success();
            }
            assert!(Instant::now() < until, "moonkv events did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every stdout line so far (after exit: all of them).
    pub fn drain_stdout(&self, wait: Duration) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(line) = self.stdout.recv_timeout(wait) {
            lines.push(line);
        }
        lines
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
