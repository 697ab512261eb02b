//! The metadata load itself: shapes, the per-thread loop, and what a run measured.
//!
//! A shape is one operation run by `clients × threads` workers for a fixed time. Each worker
//! issues one call at a time and times it; a "call" is one loop iteration: PutStart + PutEnd
//! for `put`, BatchPutStart + BatchPutEnd for `batch-put`, one RPC for the two get forms
//! (the same unit the upstream master_bench reports its latency in).

use super::client::Connection;
use super::histogram::Histogram;
use moonkv_master::engine::Engine;
use moonkv_proto::msg::*;
use moonkv_proto::{
    ClientId, GetReplicaListResponse, ItemResult, PingResponse, ReplicaDescriptor, ReplicaType,
    ReplicateConfig, Result, Segment, SegmentId,
};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What a worker loops over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// PutStart + PutEnd of a new key.
    Put,
    /// GetReplicaList of a prefilled key.
    Get,
    /// BatchPutStart + BatchPutEnd of `batch` new keys.
    BatchPut,
    /// BatchGetReplicaList of `batch` prefilled keys.
    BatchGet,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Get => "get",
            Workload::BatchPut => "batch-put",
            Workload::BatchGet => "batch-get",
        }
    }

    fn is_batch(self) -> bool {
        matches!(self, Workload::BatchPut | Workload::BatchGet)
    }

    fn reads_prefilled_keys(self) -> bool {
        matches!(self, Workload::Get | Workload::BatchGet)
    }

    /// RPCs per call.
    fn rpcs(self) -> u64 {
        match self {
            Workload::Put | Workload::BatchPut => 2,
            Workload::Get | Workload::BatchGet => 1,
        }
    }
}

/// One benchmark shape, written `OP:CxT[:bB]` (e.g. `put:2x1`, `batch-get:2x1:b128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Operation.
    pub workload: Workload,
    /// Connections (wire) or worker groups (in-process).
    pub clients: usize,
    /// Threads per client.
    pub threads: usize,
    /// Keys per call (1 for the single-key forms).
    pub batch: usize,
}

impl Shape {
    /// Total worker threads.
    pub fn workers(&self) -> usize {
        self.clients * self.threads
    }

    /// The eight shapes of the upstream comparison.
    pub fn upstream_matrix() -> Vec<Shape> {
        [
            "put:1x1:b1",
            "put:2x1:b1",
            "get:1x1:b1",
            "get:2x1:b1",
            "batch-put:2x1:b8",
            "batch-put:2x1:b128",
            "batch-get:2x1:b8",
            "batch-get:2x1:b128",
        ]
        .iter()
        .map(|s| s.parse().expect("built-in shapes parse"))
        .collect()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}x{}:b{}",
            self.workload.name(),
            self.clients,
            self.threads,
            self.batch
        )
    }
}

impl FromStr for Shape {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Shape, String> {
        let usage = || {
            format!("bad shape `{text}`: expected OP:CxT[:bB], e.g. put:2x1 or batch-get:2x1:b128")
        };
        let mut parts = text.trim().split(':');
        let workload = match parts.next() {
            Some("put") => Workload::Put,
            Some("get") => Workload::Get,
            Some("batch-put") => Workload::BatchPut,
            Some("batch-get") => Workload::BatchGet,
            _ => return Err(usage()),
        };
        let (clients, threads) = parts
            .next()
            .and_then(|ct| ct.split_once('x'))
            .and_then(|(c, t)| Some((c.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
            .filter(|(c, t)| *c > 0 && *t > 0)
            .ok_or_else(usage)?;
        let batch = match parts.next() {
            None => {
                if workload.is_batch() {
                    return Err(format!(
                        "{}: batch shapes need a batch size, e.g. :b8",
                        usage()
                    ));
                }
                1
            }
            Some(b) => b
                .strip_prefix('b')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(usage)?,
        };
        if parts.next().is_some() || (!workload.is_batch() && batch != 1) {
            return Err(usage());
        }
        Ok(Shape {
            workload,
            clients,
            threads,
            batch,
        })
    }
}

/// Fixed parameters of a load.
#[derive(Clone, Debug)]
pub struct LoadSettings {
    /// Measured time per shape.
    pub duration: Duration,
    /// Fake segments to mount.
    pub segments: u64,
    /// Size of each fake segment in bytes (never touched: only a number to the master).
    pub segment_size: u64,
    /// Object size announced in PutStart.
    pub value_size: u64,
    /// Keys each worker writes before a get shape and then reads in a cycle.
    pub prefill: u64,
}

/// The operations the load needs, over the wire or straight into the engine.
pub trait MetaTarget: Send + Sync {
    fn put_start(&self, r: &PutStartRequest) -> Result<Vec<ReplicaDescriptor>>;
    fn put_end(&self, r: &EndRequest) -> Result<()>;
    fn get_replica_list(&self, r: &KeyRequest) -> Result<GetReplicaListResponse>;
    fn batch_put_start(
        &self,
        r: &BatchPutStartRequest,
    ) -> Result<Vec<ItemResult<Vec<ReplicaDescriptor>>>>;
    fn batch_put_end(&self, r: &BatchEndRequest) -> Result<Vec<ItemResult<()>>>;
    fn batch_get_replica_list(
        &self,
        r: &KeysRequest,
    ) -> Result<Vec<ItemResult<GetReplicaListResponse>>>;
    fn batch_remove(&self, r: &BatchRemoveRequest) -> Result<Vec<ItemResult<()>>>;
    fn mount_segment(&self, r: &MountSegmentRequest) -> Result<()>;
    fn unmount_segment(&self, r: &UnmountSegmentRequest) -> Result<()>;
    fn ping(&self, r: &PingRequest) -> Result<PingResponse>;
}

macro_rules! targets {
    ($($method:ident($req:ty) -> $resp:ty = $op:ident;)*) => {
        impl MetaTarget for Engine {
            $(fn $method(&self, r: &$req) -> Result<$resp> {
                Engine::$method(self, r)
            })*
        }

        impl MetaTarget for Connection {
            $(fn $method(&self, r: &$req) -> Result<$resp> {
                self.call(Op::$op, r)
            })*
        }
    };
}

targets! {
    put_start(PutStartRequest) -> Vec<ReplicaDescriptor> = PutStart;
    put_end(EndRequest) -> () = PutEnd;
    get_replica_list(KeyRequest) -> GetReplicaListResponse = GetReplicaList;
    batch_put_start(BatchPutStartRequest) -> Vec<ItemResult<Vec<ReplicaDescriptor>>> = BatchPutStart;
    batch_put_end(BatchEndRequest) -> Vec<ItemResult<()>> = BatchPutEnd;
    batch_get_replica_list(KeysRequest) -> Vec<ItemResult<GetReplicaListResponse>> = BatchGetReplicaList;
    batch_remove(BatchRemoveRequest) -> Vec<ItemResult<()>> = BatchRemove;
    mount_segment(MountSegmentRequest) -> () = MountSegment;
    unmount_segment(UnmountSegmentRequest) -> () = UnmountSegment;
    ping(PingRequest) -> PingResponse = Ping;
}

/// The fake segments of a run: distinct ids, names and address ranges, nothing behind them.
pub fn fake_segments(nonce: u64, settings: &LoadSettings) -> Vec<Segment> {
    (0..settings.segments)
        .map(|i| Segment {
            id: SegmentId::new(nonce, i),
            name: format!("bench-{nonce:016x}-{i:04}"),
            base: (i + 1) << 44,
            size: settings.segment_size,
            endpoint: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            host_id: "moonkv-bench".into(),
        })
        .collect()
}

/// Mounts `segments` for `owner`.
pub fn mount_all(target: &dyn MetaTarget, owner: ClientId, segments: &[Segment]) -> Result<()> {
    for segment in segments {
        target.mount_segment(&MountSegmentRequest {
            segment: segment.clone(),
            client_id: owner,
        })?;
    }
    Ok(())
}

/// Writes `prefix` followed by `n` as 12 zero-padded digits into `buf` (no allocation once
/// `buf` has grown).
pub fn set_key(buf: &mut String, prefix: &str, n: u64) {
    let mut digits = [b'0'; 12];
    let mut v = n;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    buf.clear();
    buf.push_str(prefix);
    buf.extend(digits.iter().map(|d| char::from(*d)));
}

/// Reused request buffers of one worker, so the loop allocates only what the call itself does.
pub struct Requests {
    prefix: String,
    start: PutStartRequest,
    end: EndRequest,
    get: KeyRequest,
    batch_start: BatchPutStartRequest,
    batch_end: BatchEndRequest,
    batch_get: KeysRequest,
}

/// Keys that succeeded and items that failed in one call.
#[derive(Clone, Copy, Default)]
struct Outcome {
    keys: u64,
    errors: u64,
}

impl Requests {
    /// Buffers for a writer `writer` whose keys start with `prefix`.
    pub fn new(writer: ClientId, prefix: String, value_size: u64) -> Self {
        let start = PutStartRequest {
            client_id: writer,
            tenant: String::new(),
            key: String::new(),
            size: value_size,
            config: ReplicateConfig::default(),
        };
        let end = EndRequest {
            client_id: writer,
            tenant: String::new(),
            key: String::new(),
            replica_type: ReplicaType::All,
            replica_ids: Vec::new(),
            checksum: None,
        };
        Requests {
            prefix,
            start,
            end,
            get: KeyRequest {
                tenant: String::new(),
                key: String::new(),
            },
            batch_start: BatchPutStartRequest {
                client_id: writer,
                tenant: String::new(),
                keys: Vec::new(),
                sizes: Vec::new(),
                config: ReplicateConfig::default(),
            },
            batch_end: BatchEndRequest {
                client_id: writer,
                tenant: String::new(),
                replica_type: ReplicaType::All,
                items: Vec::new(),
            },
            batch_get: KeysRequest {
                tenant: String::new(),
                keys: Vec::new(),
            },
        }
    }

    /// PutStart + PutEnd of key `n`.
    pub fn put<T: MetaTarget + ?Sized>(&mut self, target: &T, n: u64) -> Result<()> {
        set_key(&mut self.start.key, &self.prefix, n);
        let replicas = target.put_start(&self.start)?;
        self.end.key.clone_from(&self.start.key);
        self.end.replica_ids.clear();
        self.end.replica_ids.extend(replicas.iter().map(|r| r.id));
        target.put_end(&self.end)
    }

    fn get<T: MetaTarget + ?Sized>(&mut self, target: &T, n: u64) -> Outcome {
        set_key(&mut self.get.key, &self.prefix, n);
        match target.get_replica_list(&self.get) {
            Ok(_) => Outcome { keys: 1, errors: 0 },
            Err(_) => Outcome { keys: 0, errors: 1 },
        }
    }

    /// BatchPutStart + BatchPutEnd of keys `first..first + count`.
    fn batch_put<T: MetaTarget + ?Sized>(
        &mut self,
        target: &T,
        first: u64,
        count: usize,
    ) -> Outcome {
        let keys = &mut self.batch_start.keys;
        keys.resize_with(count, String::new);
        for (i, key) in keys.iter_mut().enumerate() {
            set_key(key, &self.prefix, first + i as u64);
        }
        self.batch_start.sizes.resize(count, self.start.size);
        let started = match target.batch_put_start(&self.batch_start) {
            Ok(items) => items,
            Err(_) => {
                return Outcome {
                    keys: 0,
                    errors: count as u64,
                }
            }
        };
        let mut out = Outcome::default();
        let items = &mut self.batch_end.items;
        let mut used = 0;
        for (key, result) in self.batch_start.keys.iter().zip(&started) {
            let Ok(replicas) = &result.0 else {
                out.errors += 1;
                continue;
            };
            if used == items.len() {
                items.push(EndItem {
                    key: String::new(),
                    replica_ids: Vec::new(),
                    checksum: None,
                });
            }
            let item = &mut items[used];
            item.key.clone_from(key);
            item.replica_ids.clear();
            item.replica_ids.extend(replicas.iter().map(|r| r.id));
            used += 1;
        }
        items.truncate(used);
        match target.batch_put_end(&self.batch_end) {
            Ok(ended) => {
                for r in ended {
                    match r.0 {
                        Ok(()) => out.keys += 1,
                        Err(_) => out.errors += 1,
                    }
                }
            }
            Err(_) => out.errors += used as u64,
        }
        out
    }

    /// BatchGetReplicaList of keys `first..first + count` (modulo `modulus`).
    fn batch_get<T: MetaTarget + ?Sized>(
        &mut self,
        target: &T,
        first: u64,
        count: usize,
        modulus: u64,
    ) -> Outcome {
        let keys = &mut self.batch_get.keys;
        keys.resize_with(count, String::new);
        for (i, key) in keys.iter_mut().enumerate() {
            set_key(key, &self.prefix, (first + i as u64) % modulus);
        }
        match target.batch_get_replica_list(&self.batch_get) {
            Ok(items) => {
                let keys = items.iter().filter(|r| r.0.is_ok()).count() as u64;
                Outcome {
                    keys,
                    errors: count as u64 - keys,
                }
            }
            Err(_) => Outcome {
                keys: 0,
                errors: count as u64,
            },
        }
    }

    /// Writes keys `0..count` in batches of up to 128 (not timed); fails on any error.
    fn prefill<T: MetaTarget + ?Sized>(&mut self, target: &T, count: u64) -> anyhow::Result<()> {
        let mut n = 0;
        while n < count {
            let chunk = (count - n).min(128) as usize;
            let out = self.batch_put(target, n, chunk);
            if out.errors > 0 {
                anyhow::bail!("prefill failed for {} of {chunk} keys", out.errors);
            }
            n += chunk as u64;
        }
        Ok(())
    }

    /// Force-removes keys `0..count` (not timed), for runs against a shared master.
    pub fn remove_written<T: MetaTarget + ?Sized>(&mut self, target: &T, count: u64) {
        let mut req = BatchRemoveRequest {
            tenant: String::new(),
            keys: Vec::new(),
            force: true,
        };
        let mut n = 0;
        while n < count {
            let chunk = (count - n).min(1024);
            req.keys.resize_with(chunk as usize, String::new);
            for (i, key) in req.keys.iter_mut().enumerate() {
                set_key(key, &self.prefix, n + i as u64);
            }
            if let Err(e) = target.batch_remove(&req) {
                tracing::warn!(error = %e, "cleanup of benchmark keys failed");
                return;
            }
            n += chunk;
        }
    }
}

/// What one worker measured.
struct WorkerReport {
    keys: u64,
    calls: u64,
    errors: u64,
    elapsed: Duration,
    latency: Histogram,
    /// Keys `0..written` exist under this worker's prefix (for cleanup).
    written: u64,
}

fn worker<T: MetaTarget + ?Sized>(
    target: &T,
    shape: Shape,
    settings: &LoadSettings,
    requests: &mut Requests,
    start_line: &Barrier,
) -> anyhow::Result<WorkerReport> {
    let prefill = if shape.workload.reads_prefilled_keys() {
        settings.prefill.max(1)
    } else {
        0
    };
    let prefilled = requests.prefill(target, prefill);
    start_line.wait();
    prefilled?;
    let mut latency = Histogram::default();
    let (mut keys, mut calls, mut errors, mut n) = (0u64, 0u64, 0u64, 0u64);
    let batch = shape.batch;
    let started = Instant::now();
    let deadline = started + settings.duration;
    let mut now = started;
    while now < deadline {
        let out = match shape.workload {
            Workload::Put => match requests.put(target, n) {
                Ok(()) => Outcome { keys: 1, errors: 0 },
                Err(_) => Outcome { keys: 0, errors: 1 },
            },
            Workload::Get => requests.get(target, n % prefill),
            Workload::BatchPut => requests.batch_put(target, n, batch),
            Workload::BatchGet => requests.batch_get(target, n % prefill, batch, prefill),
        };
        let after = Instant::now();
        latency.record(after - now);
        now = after;
        n += batch as u64;
        calls += 1;
        keys += out.keys;
        errors += out.errors;
    }
    let written = if prefill > 0 { prefill } else { n };
    Ok(WorkerReport {
        keys,
        calls,
        errors,
        elapsed: now - started,
        latency,
        written,
    })
}

/// What a shape measured, summed over its workers.
#[derive(Clone, Debug, Serialize)]
pub struct ShapeResult {
    /// `OP:CxT:bB`.
    pub shape: String,
    /// `wire`, `spawn` or `in-process`.
    pub mode: String,
    /// Successful keys per second.
    pub keys_per_s: f64,
    /// Calls (loop iterations) per second.
    pub calls_per_s: f64,
    /// RPCs per second (two per put call).
    pub rpcs_per_s: f64,
    /// Mean call latency.
    pub mean_us: f64,
    /// Median call latency.
    pub p50_us: f64,
    /// 99th percentile call latency.
    pub p99_us: f64,
    /// Slowest call.
    pub max_us: f64,
    /// Keys that succeeded.
    pub keys: u64,
    /// Items or calls that failed.
    pub errors: u64,
    /// Measured seconds (slowest worker).
    pub seconds: f64,
}

/// Runs `shape` with one target per client (threads of a client share it) and, when
/// `cleanup` is set, removes every key it wrote afterwards.
pub fn run_shape<T: MetaTarget>(
    targets: &[Arc<T>],
    shape: Shape,
    settings: &LoadSettings,
    key_space: &str,
    mode: &str,
    cleanup: bool,
) -> anyhow::Result<ShapeResult> {
    anyhow::ensure!(targets.len() == shape.clients, "one target per client");
    let start_line = Barrier::new(shape.workers());
    // Cleanup waits until every worker stopped measuring, so it never slows a timed call.
    let finish_line = Barrier::new(shape.workers());
    let writer = ClientId::new(super::nonce(), 0xbe9c);
    let reports: Vec<anyhow::Result<WorkerReport>> = std::thread::scope(|scope| {
        // Every worker must start: a missing one would leave the others at the start line.
        let handles: Vec<_> = (0..shape.workers())
            .map(|w| {
                let target = &targets[w / shape.threads];
                let (start_line, finish_line) = (&start_line, &finish_line);
                let prefix = format!("{key_space}-w{w:03}-");
                std::thread::Builder::new()
                    .name(format!("moonkv-bench-{w}"))
                    .spawn_scoped(scope, move || {
                        let mut requests = Requests::new(writer, prefix, settings.value_size);
                        let report = worker(&**target, shape, settings, &mut requests, start_line);
                        finish_line.wait();
                        if cleanup {
                            if let Ok(r) = &report {
                                requests.remove_written(&**target, r.written);
                            }
                        }
                        report
                    })
                    .expect("cannot start a benchmark worker thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("benchmark worker panicked")))
            })
            .collect()
    });
    let mut latency = Histogram::default();
    let (mut keys, mut calls, mut errors) = (0u64, 0u64, 0u64);
    let mut seconds = 0f64;
    for report in reports {
        let r = report?;
        latency.merge(&r.latency);
        keys += r.keys;
        calls += r.calls;
        errors += r.errors;
        seconds = seconds.max(r.elapsed.as_secs_f64());
    }
    let per_s = |v: u64| {
        if seconds > 0.0 {
            v as f64 / seconds
        } else {
            0.0
        }
    };
    Ok(ShapeResult {
        shape: shape.to_string(),
        mode: mode.to_string(),
        keys_per_s: per_s(keys),
        calls_per_s: per_s(calls),
        rpcs_per_s: per_s(calls * shape.workload.rpcs()),
        mean_us: latency.mean_us(),
        p50_us: latency.quantile_us(0.50),
        p99_us: latency.quantile_us(0.99),
        max_us: latency.max_us(),
        keys,
        errors,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_print() {
        let s: Shape = "batch-get:2x1:b128".parse().unwrap();
        assert_eq!(s.workload, Workload::BatchGet);
        assert_eq!((s.clients, s.threads, s.batch), (2, 1, 128));
        assert_eq!(s.to_string(), "batch-get:2x1:b128");
        assert_eq!(
            "put:1x1".parse::<Shape>().unwrap().to_string(),
            "put:1x1:b1"
        );
        for bad in [
            "put",
            "put:0x1",
            "put:1x1:b8",
            "batch-put:2x1",
            "get:1x1:b1:x",
            "nope:1x1",
        ] {
            assert!(bad.parse::<Shape>().is_err(), "{bad}");
        }
        assert_eq!(Shape::upstream_matrix().len(), 8);
    }

    #[test]
    fn keys_have_a_fixed_width() {
        let mut k = String::new();
        set_key(&mut k, "p-", 42);
        assert_eq!(k, "p-000000000042");
        set_key(&mut k, "p-", 999_999_999_999);
        assert_eq!(k, "p-999999999999");
    }
}
