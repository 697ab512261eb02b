//! Bulk copies of the node's same-host paths: a shared pool's bytes into or out of a segment,
//! and an embedded segment's own reads and writes.
//!
//! Two choices differ from `memcpy` (`docs/data-plane.md`, *Copy loops*):
//!
//! - **AVX2 loops, not `rep movsb`.** glibc copies pieces between ~2 KiB and the L2 size with
//!   `rep movsb`. On the 2-vCPU EPYC VM of `docs/benchmarks.md` that ran at 4.7 GB/s per node
//!   thread for the 128 KiB pieces of a 32 × 128 KiB batch, where a loop of vector loads and
//!   stores ran at 12.3 GB/s.
//! - **Streaming stores into the store, for long calls.** A call that moves 8 MiB or more
//!   (`LocalPlan::LONG_CALL`, set by the caller) rarely finds its destination in a cache.
//!   Non-temporal stores write whole lines without reading them first: 16 and 64 MiB puts
//!   went from 9.4–10.0 GB/s to 13.3–13.6 when memory bandwidth was scarce, and stayed even
//!   when it was not. Smaller calls keep ordinary stores where the cache is large: a 4 MiB
//!   object replaced in a loop stayed in a 32 MiB L3, and streaming made it 20% slower. A put
//!   (not an upsert) of 2 MiB or more streams too: its ranges were just allocated, so they are
//!   rarely cached (`server::put_local`, `FRESH_STREAM_MIN`).
//! - **Streaming by the cache's size, both ways.** A same-host copy, into the store or out of
//!   it, of a quarter of the last-level cache or more streams ([`cache_stream_min`]): its
//!   source and destination no longer both fit in the cache, so even a loop of the same copy
//!   finds no destination line there. On a VM with an 8 MiB L3 that is 2 MiB, and 4 MiB gets
//!   and rewrites doubled in speed; with a 32 MiB L3 it is 8 MiB, where long calls stream
//!   already.
//!
//! Pieces under [`VECTOR_MIN`] bytes, and CPUs without AVX2, use `copy_nonoverlapping`.
//!
//! Unsafe code here, and why it is sound: the loops read exactly `len` bytes from `src` and
//! write exactly `len` bytes to `dst` (the callers' contract, as for `copy_nonoverlapping`);
//! the SIMD functions run only after the CPU was found to have their feature.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// Pieces shorter than this are copied by `copy_nonoverlapping`.
pub(crate) const VECTOR_MIN: usize = 4096;

/// An embedded segment's writes of at least this many bytes use streaming stores; the same
/// bound as a caller's long calls (`moonkv_dataplane::same_host::LONG_CALL_BYTES`).
pub(crate) const STREAM_MIN: usize = moonkv_dataplane::same_host::LONG_CALL_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Plain,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The best loop this CPU runs.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                return Level::Avx2;
            }
        }
        Level::Plain
    })
}

/// Copies of at least this many bytes use streaming stores whatever their direction: a quarter
/// of the last-level cache (from `/sys/devices/system/cpu/cpu0/cache`), between 1 and 8 MiB;
/// 8 MiB where the cache size cannot be read. A copy reads as many bytes as it writes, so from
/// there its source and destination together take half the cache or more, and a loop of such
/// copies, even of the same bytes, no longer finds its destination lines cached: ordinary
/// stores would read every line before writing it. On a VM with a 32 MiB L3 this is 8 MiB,
/// the long-call bound; on one with 8 MiB, 2 MiB, where a 4 MiB copy with ordinary stores ran
/// at 7.2 GB/s and with streaming stores at 18.9 (`docs/benchmarks.md`, *Streaming by the
/// cache's size*).
pub(crate) fn cache_stream_min() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        last_level_cache_bytes().map_or(STREAM_MIN, |bytes| (bytes / 4).clamp(1 << 20, STREAM_MIN))
    })
}

/// The size of cpu0's highest-level data or unified cache, from sysfs.
fn last_level_cache_bytes() -> Option<usize> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for entry in std::fs::read_dir(base).ok()?.flatten() {
        let dir = entry.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_cache_size(&size))
        else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, bytes)| bytes)
}

/// A sysfs cache size (`32768K`, `8M`, or plain bytes), read as every size in moonkv is.
fn parse_cache_size(text: &str) -> Option<usize> {
    let bytes = moonkv_proto::units::parse_size(text).ok()?;
    usize::try_from(bytes).ok()
}

/// Copies `src` into store memory `dst` (a put): streaming stores from [`STREAM_MIN`] bytes.
pub(crate) fn into_store(dst: &mut [u8], src: &[u8]) {
    copy_slices(dst, src, src.len() >= STREAM_MIN);
}

/// Copies `src` into `dst` (equal lengths) the way the node copies a put into space it has
/// just allocated: streaming stores where the CPU has AVX2. Public for benchmarks that probe
/// the machine's rate of such writes (`moonkv bench memcpy --fresh`).
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    copy_slices(dst, src, true);
}

/// Copies store memory `src` into `dst` (a get): ordinary stores.
pub(crate) fn out_of_store(dst: &mut [u8], src: &[u8]) {
    copy_slices(dst, src, false);
}

fn copy_slices(dst: &mut [u8], src: &[u8], stream: bool) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: two live slices of `len` bytes; `&mut` and `&` cannot overlap.
    unsafe { copy_raw(level(), dst.as_mut_ptr(), src.as_ptr(), src.len(), stream) }
}

/// Copies `len` bytes from `src` to `dst` with the loops of `level`; `stream`: with streaming
/// stores.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, not
/// overlapping; `level` at most [`level()`].
pub(crate) unsafe fn copy_raw(
    level: Level,
    dst: *mut u8,
    src: *const u8,
    len: usize,
    stream: bool,
) {
    if len >= VECTOR_MIN {
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            // SAFETY: the caller's contract; AVX2 was detected (`level`).
            unsafe {
                if stream {
                    x86::stream256(dst, src, len)
                } else {
                    x86::vector256(dst, src, len)
                }
            }
            return;
        }
    }
    let _ = (level, stream);
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes moved per loop iteration: eight vectors of 32.
    const STEP: usize = 256;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn stream256(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: every access lies in `[0, len)` of `src` or `dst` (the loop runs while
        // `n >= STEP` bytes remain; the head and the tail are plain copies), and streaming
        // stores need `dst` 32-byte aligned, which the head establishes.
        //
        // The head aligns `dst` to a whole cache line, not just to 32 bytes: on the EPYC VM of
        // `docs/benchmarks.md` this loop ran at half speed into lines it entered 32 bytes in
        // (8.3 against 15.1 GB/s on two threads, 64 MiB).
        unsafe {
            let head = ((dst as usize).wrapping_neg() & 63).min(len);
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut n) = (dst.add(head), src.add(head), len - head);
            while n >= STEP {
                for k in 0..STEP / 32 {
                    let v = _mm256_loadu_si256(s.add(32 * k).cast());
                    _mm256_stream_si256(d.add(32 * k).cast(), v);
                }
                (d, s, n) = (d.add(STEP), s.add(STEP), n - STEP);
            }
            // Streaming stores are weakly ordered: make them visible before anything that
            // follows (the answer that tells the caller its bytes are in).
            _mm_sfence();
            std::ptr::copy_nonoverlapping(s, d, n);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn vector256(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: every access lies in `[0, len)` of `src` or `dst`.
        unsafe {
            let (mut d, mut s, mut n) = (dst, src, len);
            while n >= STEP {
                for k in 0..STEP / 32 {
                    let v = _mm256_loadu_si256(s.add(32 * k).cast());
                    _mm256_storeu_si256(d.add(32 * k).cast(), v);
                }
                (d, s, n) = (d.add(STEP), s.add(STEP), n - STEP);
            }
            std::ptr::copy_nonoverlapping(s, d, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels() -> Vec<Level> {
        let mut all = vec![Level::Plain];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(Level::Avx2);
            }
        }
        all
    }

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("12X"), None);
        assert_eq!(parse_cache_size("99999999999999999999G"), None);
    }

    #[test]
    fn the_streaming_bound_is_a_quarter_of_the_cache_between_1_and_8_mib() {
        let min = cache_stream_min();
        assert!((1 << 20..=STREAM_MIN).contains(&min), "{min}");
        if let Some(bytes) = last_level_cache_bytes() {
            assert_eq!(min, (bytes / 4).clamp(1 << 20, STREAM_MIN));
        } else {
            assert_eq!(min, STREAM_MIN);
        }
    }

    #[test]
    fn every_loop_copies_exactly_its_bytes_at_any_length_and_alignment() {
        const GUARD: usize = 80;
        let lengths = [
            0usize,
            1,
            63,
            255,
            4095,
            4096,
            4097,
            4096 + 255,
            4096 + 256,
            65_536 + 13,
            300_001,
        ];
        let src: Vec<u8> = (0..300_001 + 128)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for level in levels() {
            for stream in [false, true] {
                for &len in &lengths {
                    for (so, doff) in [(0, 0), (1, 0), (0, 1), (3, 61), (64, 33), (17, 64)] {
                        let mut dst = vec![0xA5u8; len + doff + 2 * GUARD];
                        let at = GUARD + doff;
                        // SAFETY: both ranges lie inside their vectors; distinct vectors.
                        unsafe {
                            copy_raw(
                                level,
                                dst.as_mut_ptr().add(at),
                                src.as_ptr().add(so),
                                len,
                                stream,
                            )
                        };
                        let what =
                            format!("{level:?} stream={stream} len={len} offsets={so}/{doff}");
                        assert_eq!(&dst[at..at + len], &src[so..so + len], "{what}");
                        assert!(dst[..at].iter().all(|&b| b == 0xA5), "{what}: wrote before");
                        assert!(
                            dst[at + len..].iter().all(|&b| b == 0xA5),
                            "{what}: wrote after"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_slice_forms_copy_and_refuse_unequal_lengths() {
        let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut a = vec![0u8; 10_000];
        into_store(&mut a, &src);
        assert_eq!(a, src);
        let mut b = vec![0u8; 10_000];
        out_of_store(&mut b, &a);
        assert_eq!(b, src);
        let unequal = std::panic::catch_unwind(|| into_store(&mut [0u8; 3], &[1u8; 4]));
        assert!(unequal.is_err());
    }
}
