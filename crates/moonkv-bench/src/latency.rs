//! `moonkv bench latency`: what one cache miss costs on this machine, the unit of a metadata
//! operation's work when a copy has just pushed the master's lines out of the caches.
//!
//! - **Dependent loads by span.** One thread follows a chain of indexes through a buffer of
//!   each span, one 64-byte line per step, in an order drawn at random (one cycle through every
//!   line, so the chain never closes early and stays within a cache it should have left). Each
//!   load waits for the one before, as a probe of a hash table that follows a pointer does;
//!   nanoseconds per load are reported.
//! - **A line between two CPUs.** Two threads, on CPUs 0 and 1 where the machine lets them be
//!   placed, pass one cache line back and forth; nanoseconds per round trip are reported. That
//!   is what a lock or counter costs when the thread that last wrote it ran on the other CPU.
//!
//! On the development VM (2 vCPUs, 2026-12-07), loads within 4 MiB took 16 ns and from 16 MiB
//! up 118–260 ns, and a line's round trip between the two vCPUs 53–73 ns at some hours and
//! 330 ns at others: a 32-key batch Start, 1–1.7 µs per key after a copy, waits for about six
//! such misses per key (docs/benchmarks.md).

use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `moonkv bench latency`.
#[derive(clap::Args, Debug)]
pub struct LatencyBenchArgs {
    /// Spans of the dependent-load chain (comma separated), e.g. `1MiB,64MiB`.
    #[arg(long, value_delimiter = ',', default_value = "32KiB,1MiB,4MiB,16MiB,64MiB,256MiB",
          value_parser = moonkv_proto::units::size_flag)]
    spans: Vec<u64>,
    /// Loads per span.
    #[arg(long, default_value_t = 2_000_000)]
    loads: u64,
    /// Round trips of the line between two CPUs (0: skip that probe).
    #[arg(long, default_value_t = 200_000)]
    round_trips: u64,
    /// One JSON object per figure (`{"op":"load","span":…,"ns":…}`, `{"op":"line_round_trip",
    /// "pinned":…,"ns":…}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Bytes between the chain's steps: one cache line.
const LINE: usize = 64;
/// `u64` words per line.
const WORDS: usize = LINE / 8;

/// Measures and prints.
pub fn run(args: LatencyBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.loads > 0, "--loads must be positive");
    if !args.json {
        println!("| probe | ns |");
        println!("|---|--:|");
    }
    for &span in &args.spans {
        let lines = usize::try_from(span / LINE as u64)
            .ok()
            .filter(|&l| l >= 2)
            .ok_or_else(|| anyhow::anyhow!("--spans: {span} bytes is not at least two lines"))?;
        let chain = Chain::new(lines, &mut rand::rng());
        let ns = chain.ns_per_load(args.loads);
        if args.json {
            println!(r#"{{"op":"load","span":{span},"ns":{ns:.1}}}"#);
        } else {
            println!(
                "| dependent load within {} | {ns:.1} |",
                moonkv_proto::units::format_size(span)
            );
        }
    }
    if args.round_trips > 0 {
        let (ns, pinned) = line_round_trip(args.round_trips);
        if args.json {
            println!(r#"{{"op":"line_round_trip","pinned":{pinned},"ns":{ns:.1}}}"#);
        } else {
            let how = if pinned {
                "CPUs 0 and 1"
            } else {
                "two threads, not placed (the machine refused)"
            };
            println!("| a line's round trip between {how} | {ns:.1} |");
        }
    }
    Ok(())
}

/// A buffer of lines whose first words chain every line into one cycle, in random order.
struct Chain {
    words: Vec<u64>,
}

impl Chain {
    /// `lines` lines in an order drawn from `rng`: one no prefetcher guesses.
    fn new(lines: usize, rng: &mut impl Rng) -> Chain {
        let mut order: Vec<usize> = (0..lines).collect();
        order.shuffle(rng);
        let mut words = vec![0u64; lines * WORDS];
        for (k, &line) in order.iter().enumerate() {
            let to = order[(k + 1) % lines];
            words[line * WORDS] = (to * WORDS) as u64;
        }
        Chain { words }
    }

    /// Follows the chain for `loads` steps (after one untimed pass through it).
    fn ns_per_load(&self, loads: u64) -> f64 {
        let lines = (self.words.len() / WORDS) as u64;
        let mut at = 0usize;
        for _ in 0..lines {
            at = self.words[at] as usize;
        }
        let started = Instant::now();
        for _ in 0..loads {
            at = self.words[at] as usize;
        }
        let took = started.elapsed();
        std::hint::black_box(at);
        took.as_nanos() as f64 / loads as f64
    }
}

/// A counter on a line of its own.
#[repr(align(64))]
struct Line(AtomicU64);

/// Nanoseconds per round trip of one line between two threads, and whether they ran on CPUs 0
/// and 1 as asked. Each side waits at most a second for the other before giving up, and the
/// whole probe stops after [`ROUND_TRIP_CAP`] (two threads that share one CPU take turns by
/// the scheduler's time slice).
fn line_round_trip(round_trips: u64) -> (f64, bool) {
    let line = Arc::new(Line(AtomicU64::new(0)));
    let other = Arc::clone(&line);
    let pinned_other = std::thread::spawn(move || {
        let pinned = pin(1);
        for i in 0..round_trips {
            if !wait_for(&other.0, 2 * i + 1) {
                break;
            }
            other.0.store(2 * i + 2, Ordering::Release);
        }
        pinned
    });
    let pinned = pin(0);
    let started = Instant::now();
    let mut done = 0;
    for i in 0..round_trips {
        line.0.store(2 * i + 1, Ordering::Release);
        if !wait_for(&line.0, 2 * i + 2) {
            break;
        }
        done += 1;
        if done % 1024 == 0 && started.elapsed() > ROUND_TRIP_CAP {
            break;
        }
    }
    let took = started.elapsed();
    let pinned_other = pinned_other.join().unwrap_or(false);
    (
        took.as_nanos() as f64 / done.max(1) as f64,
        pinned && pinned_other,
    )
}

/// Longest the line round-trip probe runs.
const ROUND_TRIP_CAP: Duration = Duration::from_secs(3);

/// Spins until `line` holds `value`, letting another thread on this CPU run now and then;
/// false after a second without it.
fn wait_for(line: &AtomicU64, value: u64) -> bool {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while line.load(Ordering::Acquire) != value {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            std::thread::yield_now();
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_secs(1) {
                return false;
            }
        }
    }
    true
}

/// Keeps this thread on `cpu`; false when the machine does not allow it.
fn pin(cpu: usize) -> bool {
    let mut set = rustix::thread::CpuSet::new();
    if cpu >= rustix::thread::CpuSet::MAX_CPU {
        return false;
    }
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn the_chain_visits_every_line_once_before_it_closes() {
        for (lines, seed) in [(2, 1), (3, 7), (1000, 99), (4096, 12345)] {
            let chain = Chain::new(lines, &mut StdRng::seed_from_u64(seed));
            let mut seen = vec![false; lines];
            let mut at = 0usize;
            for step in 0..lines {
                assert_eq!(
                    at % WORDS,
                    0,
                    "{lines} lines: a step off a line's first word"
                );
                let line = at / WORDS;
                assert!(
                    !seen[line],
                    "{lines} lines: line {line} again at step {step}"
                );
                seen[line] = true;
                at = chain.words[at] as usize;
            }
            assert_eq!(
                at, 0,
                "{lines} lines: the chain does not close after every line"
            );
        }
    }

    #[test]
    fn both_probes_report_positive_times() {
        let chain = Chain::new(64, &mut StdRng::seed_from_u64(3));
        let ns = chain.ns_per_load(10_000);
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        let (ns, _pinned) = line_round_trip(1_000);
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
    }
}
