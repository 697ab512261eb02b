//! The network side of a transfer: byte ranges of memory replicas ("jobs") grouped by node,
//! dealt over at most a few pooled connections per node ("lanes"), each lane one pipelined
//! burst. A batch of N keys on K nodes therefore costs K × (at most the pool cap) bursts, each
//! a single round trip's worth of latency, not N request/answer exchanges.

use super::transfer::Transfer;
use futures_util::future::join_all;
use moonkv_dataplane::{DataConnection, Piece};
use moonkv_proto::types::ReplicaDescriptor;
use moonkv_proto::{Error, ReplicaId, Result, SegmentId};
use std::collections::HashMap;

/// What a job does with its bytes.
pub(crate) enum JobIo<'a> {
    /// Bytes from the replica into this buffer.
    Read(&'a mut [u8]),
    /// Bytes from this buffer into the replica.
    Write(&'a [u8]),
}

/// One contiguous range of one memory replica, on behalf of one object of the call.
pub(crate) struct Job<'a> {
    /// Index of the object (key) of the call this range belongs to.
    pub object: usize,
    pub replica: ReplicaId,
    pub endpoint: &'a str,
    pub segment: SegmentId,
    pub address: u64,
    pub grant: &'a [u8],
    pub io: JobIo<'a>,
}

impl<'a> Job<'a> {
    /// The jobs moving `len` bytes at `offset` of `replica`, split into `chunk`-sized ranges.
    pub fn ranges(
        object: usize,
        replica: &'a ReplicaDescriptor,
        offset: u64,
        io: JobIo<'a>,
        chunk: usize,
        out: &mut Vec<Job<'a>>,
    ) {
        let job = |address: u64, io| Job {
            object,
            replica: replica.id,
            endpoint: &replica.endpoint,
            segment: replica.segment_id,
            address,
            grant: replica.grant.as_deref().unwrap_or_default(),
            io,
        };
        let base = replica.address + offset;
        match io {
            JobIo::Read(buf) => {
                for (i, piece) in buf.chunks_mut(chunk).enumerate() {
                    out.push(job(base + (i * chunk) as u64, JobIo::Read(piece)));
                }
            }
            JobIo::Write(data) => {
                for (i, piece) in data.chunks(chunk).enumerate() {
                    out.push(job(base + (i * chunk) as u64, JobIo::Write(piece)));
                }
            }
        }
    }

    fn len(&self) -> usize {
        match &self.io {
            JobIo::Read(buf) => buf.len(),
            JobIo::Write(data) => data.len(),
        }
    }

    fn is_write(&self) -> bool {
        matches!(self.io, JobIo::Write(_))
    }

    fn piece(&mut self) -> Piece<'_> {
        match &mut self.io {
            JobIo::Read(buf) => Piece::Read {
                segment: self.segment,
                address: self.address,
                buf,
                grant: self.grant,
            },
            JobIo::Write(data) => Piece::Write {
                segment: self.segment,
                address: self.address,
                data,
                grant: self.grant,
            },
        }
    }
}

impl Transfer {
    /// Runs every job; one result per object index in `0..objects` (the first failure of an
    /// object's ranges, `Ok` for objects without jobs).
    pub(crate) async fn run_jobs(
        &self,
        jobs: Vec<Job<'_>>,
        objects: usize,
        lanes: usize,
    ) -> Vec<Result<()>> {
        let mut by_node: HashMap<&str, Vec<Job<'_>>> = HashMap::new();
        for job in jobs {
            by_node.entry(job.endpoint).or_default().push(job);
        }
        let lanes = lanes.clamp(1, self.pool_cap());
        let mut work = Vec::new();
        for (endpoint, jobs) in by_node {
            let count = lanes.min(jobs.len());
            let mut dealt: Vec<Vec<Job<'_>>> = (0..count).map(|_| Vec::new()).collect();
            for (i, job) in jobs.into_iter().enumerate() {
                dealt[i % count].push(job);
            }
            work.extend(dealt.into_iter().map(|lane| self.run_lane(endpoint, lane)));
        }
        let mut results: Vec<Result<()>> = (0..objects).map(|_| Ok(())).collect();
        for (object, outcome) in join_all(work).await.into_iter().flatten() {
            if let (Err(e), Ok(())) = (outcome, &results[object]) {
                results[object] = Err(e);
            }
        }
        results
    }

    /// One connection working through its jobs as one burst; a burst on a connection from the
    /// idle list that fails before its first answer is retried once on a new connection (the
    /// node may have closed the idle socket).
    async fn run_lane(&self, endpoint: &str, mut jobs: Vec<Job<'_>>) -> Vec<(usize, Result<()>)> {
        let mut out = Vec::with_capacity(jobs.len());
        let fail_all = |jobs: &[Job<'_>], out: &mut Vec<(usize, Result<()>)>, e: &Error| {
            out.extend(jobs.iter().map(|j| (j.object, Err(e.clone()))));
        };
        let (mut conn, mut reused) = match self.pool().checkout(endpoint).await {
            Ok(checked_out) => checked_out,
            Err(e) => {
                fail_all(&jobs, &mut out, &e);
                return out;
            }
        };
        let mut done = 0;
        loop {
            let pieces: Vec<Piece<'_>> = jobs[done..].iter_mut().map(Job::piece).collect();
            let burst = conn.burst(pieces, self.step_timeout()).await;
            let answered = burst.results.len();
            for (job, result) in jobs[done..].iter().zip(burst.results) {
                if result.is_ok() {
                    self.advance(job.len());
                }
                out.push((job.object, result));
            }
            done += answered;
            let Some(broken) = burst.broken else {
                self.pool().checkin(conn);
                return out;
            };
            if reused && answered == 0 && !broken.timed_out {
                reused = false;
                if let Err(e) = self.pool().redial(&mut conn).await {
                    fail_all(&jobs[done..], &mut out, &e);
                    return out;
                }
                continue;
            }
            let rest = &jobs[done..];
            fail_all(rest, &mut out, &broken.error);
            if broken.timed_out && rest.iter().any(Job::is_write) {
                // Bytes already sent may still be applied by a stalled node.
                let ids: Vec<ReplicaId> = rest
                    .iter()
                    .filter(|j| j.is_write())
                    .map(|j| j.replica)
                    .collect();
                self.fence(ids, conn);
            } else {
                self.pool().forget(endpoint);
                drop::<DataConnection>(conn);
            }
            return out;
        }
    }
}
