//! Latency histograms for the benchmarks: an HDR histogram of nanoseconds at three significant
//! digits, so every reported quantile is within 0.1% of a recorded value. Each worker thread
//! keeps its own and they are merged.
//!
//! The mean and the maximum are kept exactly beside it: the HDR histogram only knows each value
//! to within its bucket.

use std::time::Duration;

/// Significant decimal digits the histogram keeps.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latency counts in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: hdrhistogram::Histogram<u64>,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            // Auto-resizing, so it grows to whatever the slowest request took.
            counts: hdrhistogram::Histogram::new(SIGNIFICANT_DIGITS)
                .expect("three significant digits is a valid precision"),
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    /// Counts one latency.
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        if self.counts.record(ns).is_err() {
            // Only a value beyond what the counts array can index gets here; it still counts,
            // in the top bucket.
            self.counts.saturating_record(ns);
        }
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.add(&other.counts).is_err() {
            // `add` fails only when growing would overflow `usize` (a 32-bit target): clamp the
            // counts into range rather than lose them.
            for v in other.counts.iter_recorded() {
                let value = v.value_iterated_to();
                let count = v.count_at_value();
                self.counts.saturating_record_n(value, count);
            }
        }
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Number of recorded values.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.counts.len()
    }

    /// Exact mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        match self.counts.len() {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64 / 1e3,
        }
    }

    /// The `q` quantile (0..=1) in microseconds: the value of rank `ceil(q * count)`, within
    /// 0.1%, never above the largest recorded value.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.counts.is_empty() {
            return 0.0;
        }
        let ns = self.counts.value_at_quantile(q.clamp(0.0, 1.0));
        ns.min(self.max_ns) as f64 / 1e3
    }

    /// Largest recorded value in microseconds.
    pub fn max_us(&self) -> f64 {
        self.max_ns as f64 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error of `reported` (µs) against `ns`.
    fn error(reported_us: f64, ns: u64) -> f64 {
        (reported_us * 1e3 - ns as f64).abs() / ns.max(1) as f64
    }

    #[test]
    fn any_single_value_is_reported_within_a_tenth_of_a_percent() {
        // Every value of the exact range and its edge, then both sides of each power of two,
        // where the bucket width doubles.
        let powers = (11..64).flat_map(|s| {
            let p = 1u64 << s;
            [p - 1, p, p + 1, p + p / 2]
        });
        let values = (0..2100u64)
            .chain(powers)
            .chain([999_999_999, 3_600_000_000_000, u64::MAX]);
        for ns in values {
            let mut h = Histogram::default();
            h.record(Duration::from_nanos(ns));
            for q in [0.0, 0.5, 0.99, 1.0] {
                let reported = h.quantile_us(q);
                assert!(
                    error(reported, ns) <= 1e-3,
                    "{ns} ns reported as {reported} µs"
                );
            }
            assert_eq!(h.max_us(), ns as f64 / 1e3);
        }
    }

    #[test]
    fn quantiles_of_a_uniform_run() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count(), 1000);
        assert!((h.mean_us() - 500.5).abs() < 1e-9);
        let p50 = h.quantile_us(0.5);
        let p99 = h.quantile_us(0.99);
        // Rank ceil(q * n): the 500th and the 990th value.
        assert!(error(p50, 500_000) <= 1e-3, "p50 {p50}");
        assert!(error(p99, 990_000) <= 1e-3, "p99 {p99}");
        assert_eq!(h.quantile_us(1.0), 1000.0);
        assert_eq!(h.max_us(), 1000.0);
        assert_eq!(Histogram::default().quantile_us(0.5), 0.0);
        assert_eq!(Histogram::default().mean_us(), 0.0);
    }

    #[test]
    fn merged_histograms_report_like_one() {
        let mut whole = Histogram::default();
        let mut parts = [Histogram::default(), Histogram::default()];
        for us in 1..=1000u64 {
            whole.record(Duration::from_micros(us));
            // The second part holds the slow tail, so merging has to grow the first.
            parts[usize::from(us > 900)].record(Duration::from_micros(us * 1000));
            whole.record(Duration::from_micros(us * 1000));
        }
        let mut merged = Histogram::default();
        merged.merge(&parts[0]);
        merged.merge(&parts[1]);
        for us in 1..=1000u64 {
            merged.record(Duration::from_micros(us));
        }
        assert_eq!(merged.count(), whole.count());
        assert_eq!(merged.mean_us(), whole.mean_us());
        assert_eq!(merged.max_us(), whole.max_us());
        for q in [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(merged.quantile_us(q), whole.quantile_us(q), "q {q}");
        }
    }
}
