//! Frame codec micro-benchmarks: what one request or response costs to encode and decode,
//! for the shapes the master serves most (PutStart, GetReplicaList, batch reads).
//!
//! `cargo bench -p moonkv-proto --bench frame -- --quick`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{KeyRequest, KeysRequest, PutStartRequest, Request};
use moonkv_proto::{
    ClientId, GetReplicaListResponse, ItemResult, ReplicaDescriptor, ReplicaId, ReplicaKind,
    ReplicaStatus, ReplicateConfig, SegmentId,
};

const MAX: u32 = frame::DEFAULT_MAX_FRAME_BYTES;

fn key(i: usize) -> String {
    format!("bench-key-{i:016}")
}

fn descriptor(i: u64) -> ReplicaDescriptor {
    ReplicaDescriptor {
        id: ReplicaId(0x1234_5678_0000 + i),
        kind: ReplicaKind::Memory,
        status: ReplicaStatus::Complete,
        size: 4096,
        segment_id: SegmentId::new(7, i % 128),
        segment_name: format!("bench-segment-{:03}", i % 128).into(),
        endpoint: "127.0.0.1:50052".into(),
        address: 0x7f00_0000_0000 + i * 4096,
        grant: None,
    }
}

fn replica_list(i: u64) -> GetReplicaListResponse {
    GetReplicaListResponse {
        replicas: vec![descriptor(i)],
        lease_ttl_ms: 10_000,
        object_checksum: None,
    }
}

fn requests(c: &mut Criterion) {
    let put = Request::PutStart(PutStartRequest {
        client_id: ClientId::new(1, 2),
        tenant: String::new(),
        key: key(1),
        size: 4096,
        config: ReplicateConfig::default(),
    });
    let get = Request::GetReplicaList(KeyRequest {
        tenant: String::new(),
        key: key(2),
    });
    let batch = Request::BatchGetReplicaList(KeysRequest {
        tenant: String::new(),
        keys: (0..128).map(key).collect(),
    });
    let mut g = c.benchmark_group("request");
    for (name, req) in [
        ("put_start", &put),
        ("get_replica_list", &get),
        ("batch_get_b128", &batch),
    ] {
        let mut out = Vec::with_capacity(8192);
        g.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| {
                out.clear();
                frame::encode_request(&mut out, 42, black_box(req)).unwrap();
                out.len()
            })
        });
        out.clear();
        frame::encode_request(&mut out, 42, req).unwrap();
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| {
                let (f, _) = frame::decode(black_box(&out), MAX).unwrap().unwrap();
                frame::decode_request(&f).unwrap()
            })
        });
    }
    g.finish();
}

fn responses(c: &mut Criterion) {
    let one = replica_list(1);
    let batch: Vec<ItemResult<GetReplicaListResponse>> =
        (0..128).map(|i| ItemResult(Ok(replica_list(i)))).collect();
    let mut g = c.benchmark_group("response");
    let mut out = Vec::with_capacity(64 * 1024);
    g.bench_function("encode/get_replica_list", |b| {
        b.iter(|| {
            out.clear();
            frame::encode_ok(&mut out, 42, black_box(&one)).unwrap();
            out.len()
        })
    });
    out.clear();
    frame::encode_ok(&mut out, 42, &one).unwrap();
    g.bench_function("decode/get_replica_list", |b| {
        b.iter(|| {
            let (f, _) = frame::decode(black_box(&out), MAX).unwrap().unwrap();
            frame::decode_response::<GetReplicaListResponse>(&f).unwrap()
        })
    });

    g.throughput(Throughput::Elements(batch.len() as u64));
    g.bench_function("encode/batch_get_b128", |b| {
        b.iter(|| {
            out.clear();
            frame::encode_value(&mut out, FrameKind::Response, 42, 0, black_box(&batch)).unwrap();
            out.len()
        })
    });
    out.clear();
    frame::encode_ok(&mut out, 42, &batch).unwrap();
    g.bench_function("decode/batch_get_b128", |b| {
        b.iter(|| {
            let (f, _) = frame::decode(black_box(&out), MAX).unwrap().unwrap();
            frame::decode_response::<Vec<ItemResult<GetReplicaListResponse>>>(&f).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, requests, responses);
criterion_main!(benches);
