//! `moonkv bench memcpy`: the machine's copy rate, the ceiling of every same-host cell. One
//! thread copies a buffer of each size into another over and over (both touched first, the
//! same buffer each time, as a benchmark that moves one object repeatedly does); the median of
//! `--repeat` timed runs is reported. `bench-upstream.sh` runs it in every round, so the
//! same-host figures can be read as a fraction of it.
//!
//! With `--fresh SPAN`, each copy goes instead to the next slot of a destination of `SPAN`
//! bytes, larger than the caches, with the node's streaming stores: the rate of writing into
//! memory no cache holds, as a put into freshly allocated space does, on `--threads` threads
//! (each copying its share of every slot). On the development VM this rate halves and recovers
//! for seconds at a time while nothing on the machine changes, which moves every large fresh
//! put with it; `bench-upstream.sh` records it in every round for that reason.

use moonkv_proto::units::format_size;
use std::time::{Duration, Instant};

/// `moonkv bench memcpy`.
#[derive(clap::Args, Debug)]
pub struct MemcpyBenchArgs {
    /// Buffer sizes (comma separated), e.g. `1MiB,4MiB`.
    #[arg(long, value_delimiter = ',', default_value = "1MiB,4MiB,16MiB,64MiB",
          value_parser = moonkv_proto::units::size_flag)]
    sizes: Vec<u64>,
    /// Copying time per run.
    #[arg(long, default_value = "300ms", value_parser = super::parse_duration)]
    duration: Duration,
    /// Runs per size; the median is reported.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Copy into the next slot of a destination of this many bytes each time (at least twice
    /// the largest size), with streaming stores, instead of into the same buffer.
    #[arg(long, value_parser = moonkv_proto::units::size_flag)]
    fresh: Option<u64>,
    /// Threads copying at once, each its share of every copy.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// One JSON object per size (`{"op":"memcpy","size":…,"gb_per_s":…}`; `"op":"fresh_write"`
    /// with `--fresh`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// How the probe copies.
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// Bytes of the destination each copy's slot is taken from (`None`: the same buffer).
    fresh: Option<usize>,
    threads: usize,
}

/// Measures and prints one line per size.
pub fn run(args: MemcpyBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    anyhow::ensure!(
        (1..=256).contains(&args.threads),
        "--threads must be between 1 and 256"
    );
    let fresh = args
        .fresh
        .map(|span| {
            usize::try_from(span)
                .ok()
                .filter(|&span| {
                    args.sizes
                        .iter()
                        .all(|&size| span as u64 >= size.saturating_mul(2))
                })
                .ok_or_else(|| {
                    anyhow::anyhow!("--fresh: {span} bytes is not at least twice every size")
                })
        })
        .transpose()?;
    let probe = Probe {
        fresh,
        threads: args.threads,
    };
    let (op, what) = match fresh {
        Some(_) => ("fresh_write", "fresh-write GB/s, streaming stores"),
        None => ("memcpy", "memcpy GB/s"),
    };
    if !args.json {
        println!(
            "| size | {what}, {} thread(s) | min–max of {} runs |",
            args.threads, args.repeat
        );
        println!("|--:|--:|--:|");
    }
    for &size in &args.sizes {
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| anyhow::anyhow!("--sizes: {size} is not a usable buffer size"))?;
        anyhow::ensure!(
            size >= probe.threads,
            "--sizes: {size} bytes cannot be shared by {} threads",
            probe.threads
        );
        let mut rates = measure(size, args.duration, args.repeat, probe);
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        if args.json {
            println!(r#"{{"op":"{op}","size":{size},"gb_per_s":{median:.4}}}"#);
        } else {
            println!(
                "| {} | {median:.2} | {:.2}–{:.2} |",
                format_size(size as u64),
                rates[0],
                rates[rates.len() - 1]
            );
        }
    }
    Ok(())
}

/// GB/s of `repeat` runs of copying `size` bytes for `duration` each, as `probe` says: each
/// thread copies its share of the object into its share of every slot of the destination in
/// turn (one slot, the same place each time, without `--fresh`).
fn measure(size: usize, duration: Duration, repeat: usize, probe: Probe) -> Vec<f64> {
    let src = vec![0x5au8; size];
    let mut dst = vec![0xa5u8; probe.fresh.unwrap_or(size)];
    let share = size.div_ceil(probe.threads);
    let stream = probe.fresh.is_some();
    (0..repeat)
        .map(|_| {
            let mut parts: Vec<Vec<&mut [u8]>> = (0..probe.threads).map(|_| Vec::new()).collect();
            for slot in dst.chunks_exact_mut(size) {
                for (t, piece) in slot.chunks_mut(share).enumerate() {
                    parts[t].push(piece);
                }
            }
            let started = Instant::now();
            let copied: u64 = std::thread::scope(|scope| {
                // A size that does not divide into `threads` shares leaves the last threads
                // without one: they copy nothing.
                let runs: Vec<_> = parts
                    .into_iter()
                    .zip(src.chunks(share))
                    .map(|(mut pieces, src)| {
                        scope
                            .spawn(move || copy_pieces(src, &mut pieces, stream, duration, started))
                    })
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .sum()
            });
            copied as f64 / started.elapsed().as_secs_f64() / 1e9
        })
        .collect()
}

/// One thread's copies of `src` into each of `pieces` in turn (`stream`: with streaming
/// stores), for `duration` from `started`. Returns the bytes copied.
fn copy_pieces(
    src: &[u8],
    pieces: &mut [&mut [u8]],
    stream: bool,
    duration: Duration,
    started: Instant,
) -> u64 {
    let mut copied = 0u64;
    let mut next = 0usize;
    while copied == 0 || started.elapsed() < duration {
        let piece = &mut pieces[next];
        if stream {
            moonkv_node::copy_streaming(piece, std::hint::black_box(src));
        } else {
            piece.copy_from_slice(std::hint::black_box(src));
        }
        std::hint::black_box(&mut *piece);
        copied += src.len() as u64;
        next = (next + 1) % pieces.len();
    }
    copied
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_run_copies_and_reports_a_positive_rate() {
        let probe = super::Probe {
            fresh: None,
            threads: 1,
        };
        let rates = super::measure(64 << 10, std::time::Duration::from_millis(5), 3, probe);
        assert_eq!(rates.len(), 3);
        assert!(rates.iter().all(|r| r.is_finite() && *r > 0.0), "{rates:?}");
    }

    #[test]
    fn fresh_writes_on_one_or_more_threads_report_a_positive_rate() {
        for threads in [1, 2, 3] {
            let probe = super::Probe {
                fresh: Some(1 << 20),
                threads,
            };
            let rates = super::measure(64 << 10, std::time::Duration::from_millis(5), 2, probe);
            assert_eq!(rates.len(), 2);
            assert!(
                rates.iter().all(|r| r.is_finite() && *r > 0.0),
                "{threads}: {rates:?}"
            );
        }
        // Five bytes in shares of two for four threads: three shares, the fourth thread idle.
        let probe = super::Probe {
            fresh: Some(16),
            threads: 4,
        };
        let rates = super::measure(5, std::time::Duration::from_millis(2), 1, probe);
        assert!(rates[0].is_finite() && rates[0] > 0.0, "{rates:?}");
    }
}
