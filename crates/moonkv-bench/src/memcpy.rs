//! `moonkv bench memcpy`: the machine's copy rate, the ceiling of every same-host cell. One
//! thread copies a buffer of each size into another over and over (both touched first, the
//! same buffer each time, as a benchmark that moves one object repeatedly does); the median of
//! `--repeat` timed runs is reported. `bench-upstream.sh` runs it in every round, so the
//! same-host figures can be read as a fraction of it.

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
    /// One JSON object per size (`{"op":"memcpy","size":…,"gb_per_s":…}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Measures and prints one line per size.
pub fn run(args: MemcpyBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be positive");
    if !args.json {
        println!(
            "| size | memcpy GB/s, one thread | min–max of {} runs |",
            args.repeat
        );
        println!("|--:|--:|--:|");
    }
    for &size in &args.sizes {
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| anyhow::anyhow!("--sizes: {size} is not a usable buffer size"))?;
        let mut rates = measure(size, args.duration, args.repeat);
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        if args.json {
            println!(r#"{{"op":"memcpy","size":{size},"gb_per_s":{median:.4}}}"#);
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

/// GB/s of `repeat` runs of copying `size` bytes for `duration` each.
fn measure(size: usize, duration: Duration, repeat: usize) -> Vec<f64> {
    let src = vec![0x5au8; size];
    let mut dst = vec![0xa5u8; size];
    (0..repeat)
        .map(|_| {
            let (started, mut copies) = (Instant::now(), 0u64);
            while copies == 0 || started.elapsed() < duration {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
                copies += 1;
            }
            (copies as f64 * size as f64) / started.elapsed().as_secs_f64() / 1e9
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_run_copies_and_reports_a_positive_rate() {
        let rates = super::measure(64 << 10, std::time::Duration::from_millis(5), 3);
        assert_eq!(rates.len(), 3);
        assert!(rates.iter().all(|r| r.is_finite() && *r > 0.0), "{rates:?}");
    }
}
