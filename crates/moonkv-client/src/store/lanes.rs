//! The network side of a transfer: byte ranges of memory replicas ("jobs") grouped by node,
//! dealt over at most a few pooled connections per node ("lanes"), each lane one pipelined
//! burst. A batch of N keys on K nodes therefore costs K × (at most the pool cap) bursts, each
//! a single round trip's worth of latency, not N request/answer exchanges.

use super::transfer::Transfer;
use futures_util::future::join_all;
use moonkv_dataplane::header::LocalPlan;
use moonkv_dataplane::same_host::LONG_CALL_BYTES;
use moonkv_dataplane::{DataConnection, Piece};
use moonkv_proto::types::ReplicaDescriptor;
use moonkv_proto::{Error, ReplicaId, Result, SegmentId};
use std::collections::HashMap;

/// Same-host bytes of one call from which its waiting caller stops polling while they are
/// copied: about what the node copies in the time a caller polls (`MOONKV_SPIN_US`, 200 µs).
/// Polling through a longer copy only takes a CPU from the node on a small machine. A write
/// of that size stays quiet through its End as well ([`Transfer::quiet_write`]).
///
/// [`Transfer::quiet_write`]: super::transfer::Transfer::quiet_write
pub(crate) const QUIET_BYTES: usize = 2 << 20;

/// Socket bytes of one call from which its waiting caller stops polling while they move: a
/// transfer of 1 MiB takes longer than a caller polls (it is ~280 µs on loopback on the
/// machine of `docs/benchmarks.md`), so polling through it never catches the answer early,
/// and on a small machine it takes a CPU from the node and the kernel that move the bytes.
pub(crate) const QUIET_SOCKET_BYTES: usize = 1 << 20;

/// Whether a call moving these bytes (copied by a node on this machine; through sockets)
/// waits for them without polling.
fn waits_quietly(same_host_bytes: usize, socket_bytes: usize) -> bool {
    same_host_bytes >= QUIET_BYTES || socket_bytes >= QUIET_SOCKET_BYTES
}

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

/// Jobs that travel as one request: neighbours in one segment, moving the same way.
type Group<'a> = Vec<Job<'a>>;

/// The one request a group makes: a single range as it is, several as one vectored request.
fn piece_of<'b>(group: &'b mut [Job<'_>]) -> Piece<'b> {
    if let [one] = group {
        return one.piece();
    }
    let (segment, address, grant) = (group[0].segment, group[0].address, group[0].grant);
    if group[0].is_write() {
        let parts = group
            .iter()
            .filter_map(|j| match &j.io {
                JobIo::Write(data) => Some(*data),
                JobIo::Read(_) => None,
            })
            .collect();
        Piece::WriteV {
            segment,
            address,
            parts,
            grant,
        }
    } else {
        let bufs = group
            .iter_mut()
            .filter_map(|j| match &mut j.io {
                JobIo::Read(buf) => Some(&mut **buf),
                JobIo::Write(_) => None,
            })
            .collect();
        Piece::ReadV {
            segment,
            address,
            bufs,
            grant,
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
        let (mut same_host_bytes, mut socket_bytes) = (0usize, 0usize);
        for (endpoint, jobs) in &by_node {
            let bytes: usize = jobs.iter().map(Job::len).sum();
            if self.pool().same_host(endpoint) {
                same_host_bytes += bytes;
            } else {
                socket_bytes += bytes;
            }
        }
        // Bytes that many rarely stay in a cache: the node writes them with streaming stores.
        let flags = if same_host_bytes >= LONG_CALL_BYTES {
            LocalPlan::LONG_CALL
        } else {
            0
        };
        let mut work = Vec::new();
        for (endpoint, jobs) in by_node {
            let groups = coalesce(jobs, self.chunk_for(endpoint));
            let count = lanes.min(groups.len());
            let mut dealt: Vec<Vec<Group<'_>>> = (0..count).map(|_| Vec::new()).collect();
            for (i, group) in groups.into_iter().enumerate() {
                dealt[i % count].push(group);
            }
            work.extend(
                dealt
                    .into_iter()
                    .map(|lane| self.run_lane(endpoint, lane, flags)),
            );
        }
        // A call whose same-host copies are long keeps its waiting thread off the CPUs the
        // node copies with (see `CallerLane::block_on`); one whose socket transfers are long,
        // off the CPUs the node and the kernel move its bytes with.
        let _quiet = waits_quietly(same_host_bytes, socket_bytes).then(|| self.quiet_wait());
        let _moving = (socket_bytes > 0).then(super::transfer::SocketCall::start);
        let mut results: Vec<Result<()>> = (0..objects).map(|_| Ok(())).collect();
        for (object, outcome) in join_all(work).await.into_iter().flatten() {
            if let (Err(e), Ok(())) = (outcome, &results[object]) {
                results[object] = Err(e);
            }
        }
        results
    }

    /// One connection working through its requests as one burst; a burst on a connection from
    /// the idle list that fails before its first answer is retried once on a new connection
    /// (the node may have closed the idle socket).
    async fn run_lane(
        &self,
        endpoint: &str,
        mut groups: Vec<Group<'_>>,
        flags: u32,
    ) -> Vec<(usize, Result<()>)> {
        let mut out = Vec::with_capacity(groups.len());
        let fail_all = |groups: &[Group<'_>], out: &mut Vec<(usize, Result<()>)>, e: &Error| {
            out.extend(groups.iter().flatten().map(|j| (j.object, Err(e.clone()))));
        };
        let (mut conn, mut reused) = match self.pool().checkout(endpoint).await {
            Ok(checked_out) => checked_out,
            Err(e) => {
                fail_all(&groups, &mut out, &e);
                return out;
            }
        };
        let mut done = 0;
        loop {
            let pieces: Vec<Piece<'_>> = groups[done..].iter_mut().map(|g| piece_of(g)).collect();
            let burst = conn.burst_flagged(pieces, self.step_timeout(), flags).await;
            let answered = burst.results.len();
            for (group, result) in groups[done..].iter().zip(burst.results) {
                for job in group {
                    if result.is_ok() {
                        self.advance(job.len());
                    }
                    out.push((job.object, result.clone()));
                }
            }
            done += answered;
            let Some(broken) = burst.broken else {
                self.pool().checkin(conn);
                return out;
            };
            if reused && answered == 0 && !broken.timed_out {
                reused = false;
                if let Err(e) = self.pool().redial(&mut conn).await {
                    fail_all(&groups[done..], &mut out, &e);
                    return out;
                }
                continue;
            }
            let rest = &groups[done..];
            fail_all(rest, &mut out, &broken.error);
            let writes: Vec<ReplicaId> = rest
                .iter()
                .flatten()
                .filter(|j| j.is_write())
                .map(|j| j.replica)
                .collect();
            if broken.timed_out && !writes.is_empty() {
                // Bytes already sent may still be applied by a stalled node.
                self.fence(writes, conn);
            } else {
                self.pool().forget(endpoint);
                drop::<DataConnection>(conn);
            }
            return out;
        }
    }
}

/// Sorts one node's jobs by place and merges neighbours into requests of at most `limit` bytes:
/// ranges that follow each other in one segment, move the same way and carry no grant (a
/// grant names one replica, so a range with one stays a request of its own). The small objects
/// of a batch, which the master places side by side, then cost one request per `limit` bytes
/// instead of one each.
fn coalesce(mut jobs: Vec<Job<'_>>, limit: usize) -> Vec<Group<'_>> {
    jobs.sort_by_key(|j| (j.segment, j.address));
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut size = 0;
    for job in jobs {
        let follows = |last: &Job<'_>| {
            last.segment == job.segment
                && last.address + last.len() as u64 == job.address
                && last.is_write() == job.is_write()
                && last.grant.is_empty()
                && job.grant.is_empty()
        };
        match groups.last_mut() {
            Some(group) if group.last().is_some_and(follows) && size + job.len() <= limit => {
                size += job.len();
                group.push(job);
            }
            _ => {
                size = job.len();
                groups.push(vec![job]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_copies_and_long_socket_transfers_are_waited_for_quietly() {
        assert!(!waits_quietly(0, 0));
        assert!(!waits_quietly(QUIET_BYTES - 1, QUIET_SOCKET_BYTES - 1));
        assert!(waits_quietly(QUIET_BYTES, 0));
        assert!(waits_quietly(0, QUIET_SOCKET_BYTES));
        // A 4 KiB get or a 128 × 4 KiB batch keeps polling; a 1 MiB get over a socket does not.
        assert!(!waits_quietly(0, 128 * 4096));
        assert!(waits_quietly(0, 1 << 20));
        // Same-host copies of 1 MiB still poll: the node copies them faster than a poll lasts.
        assert!(!waits_quietly(1 << 20, 0));
    }

    fn job<'a>(
        object: usize,
        segment: u64,
        address: u64,
        io: JobIo<'a>,
        grant: &'a [u8],
    ) -> Job<'a> {
        Job {
            object,
            replica: ReplicaId(object as u64 + 1),
            endpoint: "node:1",
            segment: SegmentId::new(segment, 0),
            address,
            grant,
            io,
        }
    }

    /// (first object, objects) of each group.
    fn shape(groups: &[Group<'_>]) -> Vec<Vec<usize>> {
        groups
            .iter()
            .map(|g| g.iter().map(|j| j.object).collect())
            .collect()
    }

    #[test]
    fn neighbours_merge_up_to_the_limit_and_everything_else_stays_apart() {
        let mut bufs: Vec<Vec<u8>> = (0..9).map(|_| vec![0u8; 100]).collect();
        let data = vec![1u8; 100];
        let grant = [9u8; 4];
        let mut it = bufs.iter_mut();
        let mut read = |object, segment, address| {
            job(
                object,
                segment,
                address,
                JobIo::Read(it.next().unwrap()),
                &[],
            )
        };
        // Given out of order: sorting by place puts 0..=3 side by side.
        let mut jobs = vec![
            read(2, 1, 1200),
            read(0, 1, 1000),
            read(3, 1, 1300),
            read(1, 1, 1100),
            // A gap before it.
            read(4, 1, 1500),
            // Right after 4, but in another segment.
            read(5, 2, 1600),
        ];
        jobs.push(job(6, 1, 1600, JobIo::Write(&data), &[]));
        jobs.push(job(7, 1, 1700, JobIo::Write(&data), &grant));
        jobs.push(job(8, 1, 1800, JobIo::Write(&data), &[]));
        let groups = coalesce(jobs, 300);
        assert_eq!(
            shape(&groups),
            // 0..=2 fill the 300-byte limit; 4 follows a gap; 6 is a write after the read 4; 7
            // carries a grant and 8 follows a granted range; segment 2 sorts last.
            vec![
                vec![0, 1, 2],
                vec![3],
                vec![4],
                vec![6],
                vec![7],
                vec![8],
                vec![5]
            ]
        );
    }

    #[test]
    fn a_merged_group_is_one_vectored_request_and_a_single_range_stays_plain() {
        let mut a = vec![0u8; 10];
        let mut b = vec![0u8; 20];
        let mut group = vec![
            job(0, 1, 100, JobIo::Read(&mut a), &[]),
            job(1, 1, 110, JobIo::Read(&mut b), &[]),
        ];
        match piece_of(&mut group) {
            Piece::ReadV { address, bufs, .. } => {
                assert_eq!(address, 100);
                assert_eq!(bufs.iter().map(|b| b.len()).collect::<Vec<_>>(), [10, 20]);
            }
            _ => panic!("two neighbours make one vectored read"),
        }
        let data = [1u8; 5];
        let mut single = vec![job(2, 1, 200, JobIo::Write(&data), &[])];
        assert!(matches!(
            piece_of(&mut single),
            Piece::Write { address: 200, .. }
        ));
    }
}
