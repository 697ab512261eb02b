//! A log-linear latency histogram in the HDR style: exact below 64 ns, then 64 buckets per
//! power of two, so every recorded value is reported within 1.6% of itself. Recording is an
//! index computation and an increment; each worker thread keeps its own and they are merged.

use std::time::Duration;

/// Sub-buckets per power of two, as a bit count.
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
/// Enough buckets for any u64 nanosecond value.
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// Latency counts in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

fn index_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let msb = 63 - ns.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (ns >> shift) as usize - SUB;
    SUB + shift as usize * SUB + sub
}

/// The middle of bucket `index` (its lower bound below 64 ns, where buckets are exact).
fn value_of(index: usize) -> u64 {
    if index < SUB {
        return index as u64;
    }
    let shift = ((index - SUB) / SUB) as u32;
    let sub = ((index - SUB) % SUB) as u64;
    let low = (SUB as u64 + sub) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Histogram {
    /// Counts one latency.
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[index_of(ns)] += 1;
        self.total += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Number of recorded values.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Exact mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64 / 1e3
        }
    }

    /// The `q` quantile (0..=1) in microseconds, within one bucket (≤ 1.6%).
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_of(i).min(self.max_ns) as f64 / 1e3;
            }
        }
        self.max_ns as f64 / 1e3
    }

    /// Largest recorded value in microseconds.
    pub fn max_us(&self) -> f64 {
        self.max_ns as f64 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in (0..2_000_000u64).step_by(7).chain([u64::MAX / 2, u64::MAX]) {
            let i = index_of(ns);
            assert!(i < BUCKETS);
            assert!(i >= last, "index went backwards at {ns}");
            last = i;
            let v = value_of(i);
            let err = (v as f64 - ns as f64).abs() / (ns.max(1) as f64);
            assert!(err <= 1.0 / SUB as f64, "{ns} reported as {v}");
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
        assert!((p50 - 500.0).abs() / 500.0 < 0.02, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.02, "p99 {p99}");
        assert_eq!(h.max_us(), 1000.0);
        let mut other = Histogram::default();
        other.merge(&h);
        assert_eq!(other.quantile_us(0.5), p50);
    }
}
