//! Length fields inside a body must not make the decoder allocate what they claim: a
//! MessagePack array or string header announcing 2^32 - 1 items inside a tiny frame is refused
//! after at most a bounded preallocation. Measured with a counting global allocator (this file
//! is its own test binary, and its one test runs the cases sequentially).

// Unsafe here: a counting allocator that forwards every call to the system allocator unchanged.
#![allow(unsafe_code)]

use moonkv_proto::msg::{Op, Request};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters do not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (see `alloc`).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak bytes allocated above the starting point while decoding `body` as `op`.
fn peak_while_decoding(op: Op, body: &[u8]) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let result = Request::decode(op, body);
    let peak = PEAK.load(Ordering::Relaxed) - base;
    drop(result);
    peak
}

const ARRAY32_MAX: [u8; 5] = [0xdd, 0xff, 0xff, 0xff, 0xff];
const STR32_MAX: [u8; 5] = [0xdb, 0xff, 0xff, 0xff, 0xff];
const BIN32_MAX: [u8; 5] = [0xc6, 0xff, 0xff, 0xff, 0xff];

fn body(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn huge_length_claims_in_small_bodies_allocate_little() {
    let tenant: &[u8] = &[0xa1, b't'];
    let id: &[u8] = &[0x92, 0x01, 0x02];
    let cases: Vec<(&str, Op, Vec<u8>)> = vec![
        // [tenant, keys: array32(2^32-1) of which 2 present]
        (
            "keys array",
            Op::BatchExistKey,
            body(&[&[0x92], tenant, &ARRAY32_MAX, &[0xa1, b'a', 0xa1, b'b']]),
        ),
        // [client_id, tenant, keys: [], sizes: array32(2^32-1) of 1s, ...]
        (
            "sizes array",
            Op::BatchPutStart,
            body(&[&[0x95], id, tenant, &[0x90], &ARRAY32_MAX, &[1, 1, 1]]),
        ),
        // [segments: array32(2^32-1), client_id]
        (
            "segments array",
            Op::ReMountSegment,
            body(&[&[0x92], &ARRAY32_MAX]),
        ),
        // [tenant, items: array32 of [key, ids: array32]]
        (
            "nested arrays",
            Op::RevalidateReplicas,
            body(&[
                &[0x92],
                tenant,
                &ARRAY32_MAX,
                &[0x92, 0xa1, b'k'],
                &ARRAY32_MAX,
                &[1, 2, 3],
            ]),
        ),
        // [tenant, key: str32(4 GiB)]
        (
            "key string",
            Op::ExistKey,
            body(&[&[0x92], tenant, &STR32_MAX, b"abc"]),
        ),
        // [tenant, key: bin32(4 GiB)] (bin where a string is expected)
        (
            "key bin",
            Op::GetReplicaList,
            body(&[&[0x92], tenant, &BIN32_MAX, b"abc"]),
        ),
        // [tenant, keys: array32(2^32-1) of str32(4 GiB)]
        (
            "strings in array",
            Op::BatchRemove,
            body(&[&[0x93], tenant, &ARRAY32_MAX, &STR32_MAX, &STR32_MAX]),
        ),
    ];
    for (name, op, bytes) in cases {
        assert!(Request::decode(op, &bytes).is_err(), "{name} decoded");
        let peak = peak_while_decoding(op, &bytes);
        // serde caps a sequence's preallocation at 1 MiB whatever its header claims.
        assert!(
            peak <= 2 << 20,
            "{name}: {peak} bytes allocated for a {}-byte body",
            bytes.len()
        );
        println!("{name}: {}-byte body, peak {peak} bytes", bytes.len());
    }
}

#[test]
fn legitimate_bodies_cost_a_bounded_multiple_of_their_size() {
    // The worst legitimate case: many one-byte empty keys, each a 24-byte String.
    let n = 1 << 16;
    let mut bytes = vec![0x92, 0xa1, b't', 0xdd];
    bytes.extend_from_slice(&(n as u32).to_be_bytes());
    bytes.extend(std::iter::repeat_n(0xa0u8, n));
    let peak = peak_while_decoding(Op::BatchExistKey, &bytes);
    let ratio = peak as f64 / bytes.len() as f64;
    println!(
        "{n} empty keys: {}-byte body, peak {peak} bytes ({ratio:.1}x)",
        bytes.len()
    );
    assert!(ratio < 64.0, "{ratio}x");
}
