//! `moonkv bench store --batch N`: the batch data path as inference engines drive it. Each call
//! is `batch_put_from` of N fresh keys of one size, then `batch_get_into` of the same keys into
//! caller buffers allocated and touched beforehand, then `batch_exists` of them; the keys are
//! removed afterwards, outside the clock. Reported per operation: keys/s, GB/s, median and p99
//! call latency, and the data-plane connections the store opened per call (the pool's cap bounds
//! it by nodes × connections per node, whatever the batch size).

use super::histogram::Histogram;
use moonkv_client::{ReplicateConfig, Store};
use std::time::{Duration, Instant};

/// One batch cell: keys per call, object size, calls.
pub struct BatchCell<'a> {
    pub runtime: &'a tokio::runtime::Runtime,
    pub store: &'a Store,
    pub batch: usize,
    pub size: usize,
    pub calls: usize,
    pub key_space: &'a str,
}

/// The figures of one operation over every call of a cell.
#[derive(Debug)]
pub struct BatchRow {
    pub op: &'static str,
    pub batch: usize,
    pub size: usize,
    pub keys_per_s: f64,
    pub bytes_per_s: f64,
    pub latency: Histogram,
    pub connections_per_call: f64,
}

impl BatchCell<'_> {
    /// Runs the cell; rows for put, get and exists.
    pub fn run(&self) -> anyhow::Result<Vec<BatchRow>> {
        let value = super::store::pattern(self.size);
        let mut out: Vec<Vec<u8>> = (0..self.batch).map(|_| vec![0u8; self.size]).collect();
        let mut put = Timing::default();
        let mut get = Timing::default();
        let mut exists = Timing::default();
        for call in 0..self.calls {
            let keys: Vec<String> = (0..self.batch)
                .map(|k| {
                    format!(
                        "{}-b{}-{}-{call}-{k}",
                        self.key_space, self.batch, self.size
                    )
                })
                .collect();
            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
            let values: Vec<&[u8]> = (0..self.batch).map(|_| value.as_slice()).collect();

            let opened = self.store.data_plane_stats().opened;
            let started = Instant::now();
            let results = self.runtime.block_on(self.store.batch_put_from(
                &names,
                &values,
                &ReplicateConfig::default(),
            ));
            put.record(
                started.elapsed(),
                self.store.data_plane_stats().opened - opened,
            );
            first_error("batch_put_from", results)?;

            let opened = self.store.data_plane_stats().opened;
            let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            let started = Instant::now();
            let results = self
                .runtime
                .block_on(self.store.batch_get_into(&names, &mut bufs));
            get.record(
                started.elapsed(),
                self.store.data_plane_stats().opened - opened,
            );
            first_error("batch_get_into", results)?;
            anyhow::ensure!(
                out.iter().all(|b| b == &value),
                "batch_get_into returned other bytes than were put"
            );

            let started = Instant::now();
            let results = self.runtime.block_on(self.store.batch_exists(&names));
            exists.record(started.elapsed(), 0);
            for found in results {
                anyhow::ensure!(found?, "batch_exists missed a key just written");
            }
            for removed in self.runtime.block_on(self.store.batch_remove(&names, true)) {
                removed?;
            }
        }
        Ok(vec![
            put.row("batch_put_from", self.batch, self.size),
            get.row("batch_get_into", self.batch, self.size),
            exists.row("batch_exists", self.batch, 0),
        ])
    }
}

/// Calls of one operation.
#[derive(Default)]
struct Timing {
    elapsed: Duration,
    calls: u64,
    opened: u64,
    latency: Histogram,
}

impl Timing {
    fn record(&mut self, took: Duration, opened: u64) {
        self.elapsed += took;
        self.calls += 1;
        self.opened += opened;
        self.latency.record(took);
    }

    fn row(self, op: &'static str, batch: usize, size: usize) -> BatchRow {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let keys = (self.calls as usize * batch) as f64;
        BatchRow {
            op,
            batch,
            size,
            keys_per_s: keys / secs,
            bytes_per_s: keys * size as f64 / secs,
            latency: self.latency,
            connections_per_call: self.opened as f64 / self.calls.max(1) as f64,
        }
    }
}

fn first_error<T>(op: &str, results: Vec<moonkv_client::Result<T>>) -> anyhow::Result<()> {
    for (i, result) in results.into_iter().enumerate() {
        if let Err(e) = result {
            anyhow::bail!("{op}: key {i} failed: {e}");
        }
    }
    Ok(())
}

/// The markdown table of batch rows.
pub fn table(rows: &[BatchRow]) -> String {
    let mut out = String::from(
        "| op | batch | size | keys/s | GB/s | p50 call | p99 call | connections opened per call |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.3} | {} | {} | {:.2} |\n",
            r.op,
            r.batch,
            if r.size == 0 {
                "-".into()
            } else {
                super::store::size_label(r.size as u64)
            },
            r.keys_per_s,
            r.bytes_per_s / 1e9,
            super::report::micros(r.latency.quantile_us(0.5)),
            super::report::micros(r.latency.quantile_us(0.99)),
            r.connections_per_call,
        ));
    }
    out
}
