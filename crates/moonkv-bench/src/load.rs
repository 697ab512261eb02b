//! The metadata load itself: reused requests, the per-thread loop, and what a run measured.
//!
//! A shape runs `clients × threads` workers for a fixed time (see [`Shape`]). Each worker
//! issues one call at a time and times it; a "call" is one loop iteration: PutStart + PutEnd
//! for `put`, BatchPutStart + BatchPutEnd for `batch-put`, one RPC for the two get forms
//! (the same unit the upstream master_bench reports its latency in).

use super::histogram::Histogram;
use super::shape::{Shape, Workload};
use super::target::MetaTarget;
use moonkv_proto::msg::*;
use moonkv_proto::{ClientId, ReplicaType, ReplicateConfig, Result};
use serde::Serialize;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

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
    buf.push_str(std::str::from_utf8(&digits).unwrap_or_default());
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
                    replica_ids: Default::default(),
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
    /// Runs of this shape; the figures above are from the median run by keys/s.
    pub runs: usize,
    /// Lowest keys/s over the runs.
    pub keys_per_s_min: f64,
    /// Highest keys/s over the runs.
    pub keys_per_s_max: f64,
}

impl ShapeResult {
    /// The median run of `runs` (by keys/s), carrying the spread of all of them.
    pub fn median(mut runs: Vec<ShapeResult>) -> Option<ShapeResult> {
        runs.sort_by(|a, b| a.keys_per_s.total_cmp(&b.keys_per_s));
        let (min, max) = (runs.first()?.keys_per_s, runs.last()?.keys_per_s);
        let n = runs.len();
        let mut median = runs.swap_remove(n / 2);
        median.runs = n;
        median.keys_per_s_min = min;
        median.keys_per_s_max = max;
        Some(median)
    }
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
        runs: 1,
        keys_per_s_min: per_s(keys),
        keys_per_s_max: per_s(keys),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_a_fixed_width() {
        let mut k = String::new();
        set_key(&mut k, "p-", 42);
        assert_eq!(k, "p-000000000042");
        set_key(&mut k, "p-", 999_999_999_999);
        assert_eq!(k, "p-999999999999");
    }
}
