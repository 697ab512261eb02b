//! Engine hot-path micro-benchmarks, single-threaded, no network: PutStart + PutEnd,
//! GetReplicaList, their batch forms, and put/remove churn (which exercises the segment
//! allocator's allocate and free, since the allocator itself is private to the engine).
//!
//! `cargo bench -p moonkv-master --bench engine -- --quick`

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use moonkv_master::engine::{AvailabilitySink, Engine, EngineConfig, NoopSink, SystemClock};
use moonkv_master::server::events::EventHook;
use moonkv_master::server::KvEventsSettings;
use moonkv_proto::msg::{
    BatchEndRequest, BatchPutStartRequest, BatchRemoveRequest, EndItem, EndRequest, KeyRequest,
    KeysRequest, MountSegmentRequest, PutStartRequest, RemoveRequest,
};
use moonkv_proto::{ClientId, ReplicaType, ReplicateConfig, Segment, SegmentId};
use std::fmt::Write as _;
use std::sync::Arc;

const WRITER: ClientId = ClientId::new(0xbe9c, 1);
const SEGMENTS: u64 = 128;
const SEGMENT_SIZE: u64 = 64 << 30;
const VALUE_SIZE: u64 = 4096;
const PREFILL: usize = 10_000;

/// An engine with fake segments mounted (only their base and size matter to the master).
fn engine() -> Engine {
    engine_with(Arc::new(NoopSink))
}

/// [`engine`] publishing the KV event stream (on an ephemeral port, nobody subscribed), as
/// `moonkv up` does.
fn engine_publishing() -> Engine {
    let settings = KvEventsSettings {
        enabled: true,
        bind_endpoint: "tcp://127.0.0.1:*".into(),
        backend_id: "bench".into(),
        ..KvEventsSettings::default()
    };
    engine_with(Arc::new(
        EventHook::start(&settings).expect("event publisher"),
    ))
}

fn engine_with(sink: Arc<dyn AvailabilitySink>) -> Engine {
    engine_of(sink, SEGMENTS)
}

fn engine_of(sink: Arc<dyn AvailabilitySink>, segments: u64) -> Engine {
    let engine = Engine::new(EngineConfig::default(), Arc::new(SystemClock), sink);
    for i in 0..segments {
        let segment = Segment {
            id: SegmentId::new(0xbe9c, i),
            name: format!("bench-segment-{i:03}").into(),
            base: (i + 1) << 40,
            size: SEGMENT_SIZE,
            endpoint: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            host_id: "bench".into(),
        };
        engine
            .mount_segment(&MountSegmentRequest {
                segment,
                client_id: WRITER,
                keeps_catalog: false,
            })
            .unwrap();
    }
    engine
}

fn set_key(buf: &mut String, prefix: &str, n: u64) {
    buf.clear();
    let _ = write!(buf, "{prefix}-{n:016}");
}

/// One PutStart + PutEnd of `key`, reusing the request buffers.
fn put(engine: &Engine, start: &mut PutStartRequest, end: &mut EndRequest) {
    let replicas = engine.put_start(start).unwrap();
    end.key.clone_from(&start.key);
    end.replica_ids.clear();
    end.replica_ids.extend(replicas.iter().map(|r| r.id));
    engine.put_end(end).unwrap();
}

fn put_requests() -> (PutStartRequest, EndRequest) {
    let start = PutStartRequest {
        client_id: WRITER,
        tenant: String::new(),
        key: String::new(),
        size: VALUE_SIZE,
        config: ReplicateConfig::default(),
    };
    let end = EndRequest {
        client_id: WRITER,
        tenant: String::new(),
        key: String::new(),
        replica_type: ReplicaType::All,
        replica_ids: Vec::new(),
        checksum: None,
    };
    (start, end)
}

fn single_key(c: &mut Criterion) {
    let engine = engine();
    let (mut start, mut end) = put_requests();
    let mut g = c.benchmark_group("engine");
    let mut n = 0u64;
    g.bench_function("put_start+put_end", |b| {
        b.iter(|| {
            n += 1;
            set_key(&mut start.key, "put", n);
            put(&engine, &mut start, &mut end);
        })
    });

    for i in 0..PREFILL as u64 {
        set_key(&mut start.key, "get", i);
        put(&engine, &mut start, &mut end);
    }
    let gets: Vec<KeyRequest> = (0..PREFILL as u64)
        .map(|i| {
            let mut key = String::new();
            set_key(&mut key, "get", i);
            KeyRequest {
                tenant: String::new(),
                key,
            }
        })
        .collect();
    let mut i = 0;
    g.bench_function("get_replica_list", |b| {
        b.iter(|| {
            i = (i + 1) % gets.len();
            black_box(engine.get_replica_list(&gets[i]).unwrap())
        })
    });

    let mut remove = RemoveRequest {
        tenant: String::new(),
        key: String::new(),
        force: true,
    };
    g.bench_function("put+remove_churn", |b| {
        b.iter(|| {
            n += 1;
            set_key(&mut start.key, "churn", n);
            put(&engine, &mut start, &mut end);
            remove.key.clone_from(&start.key);
            engine.remove(&remove).unwrap();
        })
    });
    g.finish();
}

fn batches(c: &mut Criterion) {
    batches_of(c, "engine_batch", &engine());
    batches_of(c, "engine_batch_events", &engine_publishing());
}

/// One batch Start and End of fresh keys (`prefix`-`n`, `n` counting on), reusing the request
/// buffers; the End's events leave from this thread, as when the master answers a request.
fn batch_put(
    engine: &Engine,
    start: &mut BatchPutStartRequest,
    end: &mut BatchEndRequest,
    prefix: &str,
    n: &mut u64,
) -> Vec<moonkv_proto::ItemResult<()>> {
    for key in start.keys.iter_mut() {
        *n += 1;
        set_key(key, prefix, *n);
    }
    let started = engine.batch_put_start(start).unwrap();
    end_what_started(end, &start.keys, &started);
    engine.reporting_inline(|| engine.batch_put_end(end).unwrap())
}

/// Fills `end` with one item per key of a batch Start, with the replica ids it got.
fn end_what_started(
    end: &mut BatchEndRequest,
    keys: &[String],
    started: &[moonkv_proto::ItemResult<Vec<moonkv_proto::ReplicaDescriptor>>],
) {
    end.items.clear();
    end.items
        .extend(keys.iter().zip(started).map(|(key, r)| EndItem {
            key: key.clone(),
            replica_ids: r.0.as_ref().unwrap().iter().map(|d| d.id).collect(),
            checksum: None,
        }));
}

fn batches_of(c: &mut Criterion, group: &str, engine: &Engine) {
    let mut g = c.benchmark_group(group);
    for batch in [8usize, 32, 128] {
        g.throughput(Throughput::Elements(batch as u64));
        let mut start = BatchPutStartRequest {
            client_id: WRITER,
            tenant: String::new(),
            keys: vec![String::new(); batch],
            sizes: vec![VALUE_SIZE; batch],
            config: ReplicateConfig::default(),
        };
        let mut end = BatchEndRequest {
            client_id: WRITER,
            tenant: String::new(),
            replica_type: ReplicaType::All,
            items: Vec::with_capacity(batch),
        };
        let prefix = format!("bput{batch}");
        let mut n = 0u64;
        g.bench_function(format!("batch_put_b{batch}"), |b| {
            b.iter(|| black_box(batch_put(engine, &mut start, &mut end, &prefix, &mut n)))
        });
        // The same batch put with its keys removed after each End: the maps stay at a steady
        // size, as in a cycle of puts and removals, instead of growing for the whole run.
        let mut remove = BatchRemoveRequest {
            tenant: String::new(),
            keys: Vec::with_capacity(batch),
            force: true,
        };
        g.bench_function(format!("batch_put_remove_b{batch}"), |b| {
            b.iter(|| {
                black_box(batch_put(engine, &mut start, &mut end, &prefix, &mut n));
                remove.keys.clear();
                remove.keys.extend(start.keys.iter().cloned());
                black_box(engine.reporting_inline(|| engine.batch_remove(&remove).unwrap()))
            })
        });
        let keys: Vec<String> = (0..batch as u64)
            .map(|i| {
                let mut key = String::new();
                set_key(&mut key, &prefix, i + 1);
                key
            })
            .collect();
        let req = KeysRequest {
            tenant: String::new(),
            keys,
        };
        g.bench_function(format!("batch_get_b{batch}"), |b| {
            b.iter(|| black_box(engine.batch_get_replica_list(&req).unwrap()))
        });
    }
    g.finish();
}

/// A fresh engine per sample batch: the first puts into empty shard maps (growth included).
fn cold_start(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_cold");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("1000_puts_into_new_engine", |b| {
        b.iter_batched(
            engine,
            |engine| {
                let (mut start, mut end) = put_requests();
                for n in 0..1000 {
                    set_key(&mut start.key, "cold", n);
                    put(&engine, &mut start, &mut end);
                }
                engine
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Evicts the caches' lines, as a put's copy between its Start and its End does (and the rest of
/// a client's cycle between two puts).
struct Thrash(Vec<u64>);

impl Thrash {
    fn new() -> Self {
        Thrash(vec![1; 48 << 17])
    }
    fn run(&mut self) {
        for (i, w) in self.0.iter_mut().enumerate() {
            *w = w.wrapping_add(i as u64);
        }
        black_box(&self.0);
    }
}

/// A batch Start and a batch End of 32 keys of 128 KiB each, each timed alone with the caches
/// evicted before it: the master's work for a same-host batch put as a client's cycle finds it.
/// One segment, as `moonkv up` mounts, 20,000 objects kept beside the batch, events published.
fn cache_cold(c: &mut Criterion) {
    const BATCH: usize = 32;
    let settings = KvEventsSettings {
        enabled: true,
        bind_endpoint: "tcp://127.0.0.1:*".into(),
        backend_id: "bench".into(),
        ..KvEventsSettings::default()
    };
    let engine = engine_of(
        Arc::new(EventHook::start(&settings).expect("event publisher")),
        1,
    );
    let (mut start1, mut end1) = put_requests();
    start1.size = 128 << 10;
    for n in 0..20_000 {
        set_key(&mut start1.key, "kept", n);
        put(&engine, &mut start1, &mut end1);
    }
    let mut start = BatchPutStartRequest {
        client_id: WRITER,
        tenant: String::new(),
        keys: vec![String::new(); BATCH],
        sizes: vec![128 << 10; BATCH],
        config: ReplicateConfig::default(),
    };
    let mut end = BatchEndRequest {
        client_id: WRITER,
        tenant: String::new(),
        replica_type: ReplicaType::All,
        items: Vec::with_capacity(BATCH),
    };
    let mut remove = BatchRemoveRequest {
        tenant: String::new(),
        keys: Vec::with_capacity(BATCH),
        force: true,
    };
    let mut thrash = Thrash::new();
    let mut n = 0u64;
    let mut g = c.benchmark_group("engine_cache_cold");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(30);
    let mut one = |timed_start: bool| {
        for key in start.keys.iter_mut() {
            n += 1;
            set_key(key, "cold", n);
        }
        thrash.run();
        let t = std::time::Instant::now();
        let started = engine.batch_put_start(&start).unwrap();
        let mut took = t.elapsed();
        end_what_started(&mut end, &start.keys, &started);
        thrash.run();
        let t = std::time::Instant::now();
        black_box(engine.reporting_inline(|| engine.batch_put_end(&end).unwrap()));
        if !timed_start {
            took = t.elapsed();
        }
        remove.keys.clear();
        remove.keys.extend(start.keys.iter().cloned());
        black_box(engine.reporting_inline(|| engine.batch_remove(&remove).unwrap()));
        took
    };
    g.bench_function("batch_put_start_b32_128k", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| one(true)).sum())
    });
    g.bench_function("batch_put_end_b32_128k", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| one(false)).sum())
    });
    g.finish();
}

criterion_group!(benches, single_key, batches, cold_start, cache_cold);
criterion_main!(benches);
