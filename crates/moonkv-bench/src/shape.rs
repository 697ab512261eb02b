//! Benchmark shapes: one operation run by `clients × threads` workers, written `OP:CxT[:bB]`.

use std::fmt;
use std::str::FromStr;

/// What a worker loops over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// PutStart + PutEnd of a new key.
    Put,
    /// GetReplicaList of a prefilled key.
    Get,
    /// BatchPutStart + BatchPutEnd of `batch` new keys.
    BatchPut,
    /// BatchGetReplicaList of `batch` prefilled keys.
    BatchGet,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Get => "get",
            Workload::BatchPut => "batch-put",
            Workload::BatchGet => "batch-get",
        }
    }

    fn is_batch(self) -> bool {
        matches!(self, Workload::BatchPut | Workload::BatchGet)
    }

    /// Whether workers read keys written before the clock starts.
    pub fn reads_prefilled_keys(self) -> bool {
        matches!(self, Workload::Get | Workload::BatchGet)
    }

    /// RPCs per call.
    pub fn rpcs(self) -> u64 {
        match self {
            Workload::Put | Workload::BatchPut => 2,
            Workload::Get | Workload::BatchGet => 1,
        }
    }
}

/// One benchmark shape, written `OP:CxT[:bB]` (e.g. `put:2x1`, `batch-get:2x1:b128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Operation.
    pub workload: Workload,
    /// Connections (wire) or worker groups (in-process).
    pub clients: usize,
    /// Threads per client.
    pub threads: usize,
    /// Keys per call (1 for the single-key forms).
    pub batch: usize,
}

impl Shape {
    /// Total worker threads.
    pub fn workers(&self) -> usize {
        self.clients * self.threads
    }

    /// The eight shapes of the upstream comparison.
    pub fn upstream_matrix() -> Vec<Shape> {
        [
            "put:1x1:b1",
            "put:2x1:b1",
            "get:1x1:b1",
            "get:2x1:b1",
            "batch-put:2x1:b8",
            "batch-put:2x1:b128",
            "batch-get:2x1:b8",
            "batch-get:2x1:b128",
        ]
        .iter()
        .map(|s| s.parse().expect("built-in shapes parse"))
        .collect()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}x{}:b{}",
            self.workload.name(),
            self.clients,
            self.threads,
            self.batch
        )
    }
}

/// A `--shape` that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Not `OP:CxT[:bB]`.
    #[error("bad shape `{0}`: expected OP:CxT[:bB], e.g. put:2x1 or batch-get:2x1:b128")]
    Malformed(String),
    /// A batch workload without `:bB`.
    #[error("bad shape `{0}`: batch shapes need a batch size, e.g. :b8")]
    NoBatchSize(String),
}

impl FromStr for Shape {
    type Err = ShapeError;

    fn from_str(text: &str) -> std::result::Result<Shape, ShapeError> {
        let usage = || ShapeError::Malformed(text.to_string());
        let mut parts = text.trim().split(':');
        let workload = match parts.next() {
            Some("put") => Workload::Put,
            Some("get") => Workload::Get,
            Some("batch-put") => Workload::BatchPut,
            Some("batch-get") => Workload::BatchGet,
            _ => return Err(usage()),
        };
        let (clients, threads) = parts
            .next()
            .and_then(|ct| ct.split_once('x'))
            .and_then(|(c, t)| Some((c.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
            .filter(|(c, t)| *c > 0 && *t > 0)
            .ok_or_else(usage)?;
        let batch = match parts.next() {
            None => {
                if workload.is_batch() {
                    return Err(ShapeError::NoBatchSize(text.to_string()));
                }
                1
            }
            Some(b) => b
                .strip_prefix('b')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(usage)?,
        };
        if parts.next().is_some() || (!workload.is_batch() && batch != 1) {
            return Err(usage());
        }
        Ok(Shape {
            workload,
            clients,
            threads,
            batch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_print() {
        let s: Shape = "batch-get:2x1:b128".parse().unwrap();
        assert_eq!(s.workload, Workload::BatchGet);
        assert_eq!((s.clients, s.threads, s.batch), (2, 1, 128));
        assert_eq!(s.to_string(), "batch-get:2x1:b128");
        assert_eq!(
            "put:1x1".parse::<Shape>().unwrap().to_string(),
            "put:1x1:b1"
        );
        for bad in [
            "put",
            "put:0x1",
            "put:1x1:b8",
            "batch-put:2x1",
            "get:1x1:b1:x",
            "nope:1x1",
        ] {
            assert!(bad.parse::<Shape>().is_err(), "{bad}");
        }
        assert_eq!(Shape::upstream_matrix().len(), 8);
    }
}
