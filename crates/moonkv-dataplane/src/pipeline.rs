//! Pipelined bursts: many requests in flight on one connection.
//!
//! The caller writes every request of a burst back to back (headers, grants and write payloads
//! through one buffered writer, so small requests share syscalls) while it reads the answers,
//! which the node sends in request order. Read payloads go straight from the socket into the
//! caller's buffers and write payloads straight from the caller's buffers onto the socket; there
//! is no staging copy. Each answer is awaited with the step deadline, so a burst fails only when
//! the node makes no progress for that long.
//!
//! Results are per request. A refusal that keeps the connection in step (a forged grant, a range
//! outside the segment) fails only its request; an I/O error, a timeout or a refusal after which
//! the node closes the connection fails that request and every later one of the burst.

use crate::connection::{
    head, refusal, stays_in_step, transfer_fail, transfer_io_fail, DataConnection, HeadBytes,
};
use crate::header::{
    DataOp, DataStatus, LocalPlan, RequestHeader, ResponseHeader, MAX_LOCAL_RANGES, RESPONSE_LEN,
};
use crate::low_water::{read_payload, LowWater};
use moonkv_proto::{Error, ErrorCode, Result, SegmentId};
use std::io::IoSlice;
use std::pin::pin;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Buffer of the burst writer and reader: small requests and answers coalesce up to this size,
/// larger payloads bypass it.
const BURST_BUFFER: usize = 64 << 10;

/// One request of a burst.
pub enum Piece<'a> {
    /// Read `buf.len()` bytes at `address` of `segment` into `buf`.
    Read {
        /// Segment holding the bytes.
        segment: SegmentId,
        /// Absolute address of the first byte.
        address: u64,
        /// Where the bytes go.
        buf: &'a mut [u8],
        /// The replica's grant (empty: none).
        grant: &'a [u8],
    },
    /// Write `data` at `address` of `segment`.
    Write {
        /// Segment receiving the bytes.
        segment: SegmentId,
        /// Absolute address of the first byte.
        address: u64,
        /// The bytes.
        data: &'a [u8],
        /// The replica's grant (empty: none).
        grant: &'a [u8],
    },
    /// Read `bufs` total bytes at `address` of `segment`, spread over `bufs` in order (one
    /// request: the answer's payload is scattered straight from the socket).
    ReadV {
        /// Segment holding the bytes.
        segment: SegmentId,
        /// Absolute address of the first byte.
        address: u64,
        /// Where the bytes go, in order.
        bufs: Vec<&'a mut [u8]>,
        /// The grant covering the whole range (empty: none).
        grant: &'a [u8],
    },
    /// Write the concatenation of `parts` at `address` of `segment` (one request: the payload
    /// is gathered straight from `parts` onto the socket).
    WriteV {
        /// Segment receiving the bytes.
        segment: SegmentId,
        /// Absolute address of the first byte.
        address: u64,
        /// The bytes, in order.
        parts: Vec<&'a [u8]>,
        /// The grant covering the whole range (empty: none).
        grant: &'a [u8],
    },
}

impl Piece<'_> {
    /// Bytes this piece moves.
    pub fn len(&self) -> usize {
        match self {
            Piece::Read { buf, .. } => buf.len(),
            Piece::Write { data, .. } => data.len(),
            Piece::ReadV { bufs, .. } => bufs.iter().map(|b| b.len()).sum(),
            Piece::WriteV { parts, .. } => parts.iter().map(|p| p.len()).sum(),
        }
    }

    /// Whether the piece moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a burst stopped before its last answer.
#[derive(Debug, Clone)]
pub struct BurstBreak {
    /// The error every unanswered request of the burst gets.
    pub error: Error,
    /// The node made no progress within the step deadline: bytes already sent may still land.
    pub timed_out: bool,
}

/// The outcome of a burst: one result per answered request, in order, and why it stopped early.
#[derive(Debug)]
pub struct Burst {
    /// Results of the first `results.len()` requests.
    pub results: Vec<Result<()>>,
    /// Set when later requests got no answer; they failed with `error`.
    pub broken: Option<BurstBreak>,
}

impl Burst {
    /// One result per request of a burst of `n`, unanswered ones failing with the break error.
    pub fn into_results(self, n: usize) -> Vec<Result<()>> {
        let mut results = self.results;
        let missing = self.broken.map(|b| b.error).unwrap_or_else(|| {
            Error::new(ErrorCode::INTERNAL_ERROR, "a data-plane answer is missing")
        });
        results.resize_with(n, || Err(missing.clone()));
        results
    }
}

/// What the writer sends for one piece.
struct Send<'a> {
    head: HeadBytes,
    /// Bytes that follow the head before any payload (a same-host request's plan).
    extra: Vec<u8>,
    payload: Vec<&'a [u8]>,
}

/// Bursts with at most this many READ answers read their payloads with a receive low-water
/// mark (`crate::low_water`).
const MARKED_BURST_READS: usize = 4;

/// What the reader expects for one piece.
struct Expect<'a> {
    request_id: u64,
    op: DataOp,
    segment: SegmentId,
    address: u64,
    len: u64,
    /// Where a read's payload goes, in order (empty for a write and a same-host request).
    sinks: Vec<&'a mut [u8]>,
}

impl DataConnection {
    /// Sends every piece back to back and collects the answers (see the module doc). The
    /// connection stays usable only if the burst completed.
    pub async fn burst(&mut self, pieces: Vec<Piece<'_>>, step: Duration) -> Burst {
        self.burst_flagged(pieces, step, 0).await
    }

    /// [`DataConnection::burst`], with `flags` ([`LocalPlan::flags`]) on its same-host requests.
    pub async fn burst_flagged(
        &mut self,
        pieces: Vec<Piece<'_>>,
        step: Duration,
        flags: u32,
    ) -> Burst {
        let mut sends = Vec::with_capacity(pieces.len());
        let mut expects = Vec::with_capacity(pieces.len());
        // Same-host requests name the caller's memory instead of carrying bytes; the node copies
        // nothing after this (see `crate::same_host`). The memory is lent until the node answered
        // (`Lent`).
        let lent_socket = self.lend_socket.clone();
        let deadline_ns = lent_socket
            .as_ref()
            .map(|_| crate::same_host::deadline_for(step));
        for piece in pieces {
            let id = self.take_id();
            let len = piece.len();
            let (op, segment, address, grant, payload, sinks) = match piece {
                Piece::Read {
                    segment,
                    address,
                    buf,
                    grant,
                } => (DataOp::Read, segment, address, grant, vec![], vec![buf]),
                Piece::ReadV {
                    segment,
                    address,
                    bufs,
                    grant,
                } => (DataOp::Read, segment, address, grant, vec![], bufs),
                Piece::Write {
                    segment,
                    address,
                    data,
                    grant,
                } => (DataOp::Write, segment, address, grant, vec![data], vec![]),
                Piece::WriteV {
                    segment,
                    address,
                    parts,
                    grant,
                } => (DataOp::Write, segment, address, grant, parts, vec![]),
            };
            // On an attached connection the plan names the caller's buffers (a piece with more
            // ranges than a plan may list still goes over the socket).
            let plan = deadline_ns.and_then(|deadline_ns| {
                let ranges: Vec<(u64, u64)> = if op == DataOp::Read {
                    sinks
                        .iter()
                        .map(|b| (b.as_ptr() as u64, b.len() as u64))
                        .collect()
                } else {
                    payload
                        .iter()
                        .map(|p| (p.as_ptr() as u64, p.len() as u64))
                        .collect()
                };
                let ranges: Vec<(u64, u64)> = ranges.into_iter().filter(|r| r.1 > 0).collect();
                (ranges.len() <= MAX_LOCAL_RANGES).then_some(LocalPlan {
                    deadline_ns,
                    ranges,
                    flags,
                })
            });
            let (op, payload, sinks, extra) = match plan {
                None => (op, payload, sinks, Vec::new()),
                Some(plan) => {
                    let mut extra = Vec::new();
                    plan.encode_into(&mut extra);
                    let local_op = if op == DataOp::Read {
                        DataOp::ReadLocal
                    } else {
                        DataOp::WriteLocal
                    };
                    (local_op, vec![], vec![], extra)
                }
            };
            let head = match head(
                RequestHeader::new(op, id, segment, address, len as u64),
                grant,
            ) {
                Ok(head) => head,
                // Only an oversized grant fails here; nothing was sent yet.
                Err(error) => {
                    return Burst {
                        results: Vec::new(),
                        broken: Some(BurstBreak {
                            error,
                            timed_out: false,
                        }),
                    }
                }
            };
            sends.push(Send {
                head,
                extra,
                payload,
            });
            expects.push(Expect {
                request_id: id,
                op,
                segment,
                address,
                len: len as u64,
                sinks,
            });
        }
        let endpoint = self.endpoint().to_string();
        self.healthy = false;
        // From here the node may touch the caller's memory named by the plans: if this future is
        // dropped before every answer arrived, dropping `lent` waits until the node let go.
        let lent = lent_socket
            .filter(|_| sends.iter().any(|send| !send.extra.is_empty()))
            .zip(deadline_ns)
            .map(|(socket, deadline_ns)| crate::same_host::Lent::new(socket, deadline_ns));
        // The payloads of a short burst wake the reader for large chunks, not every segment. A
        // long one keeps its socket busy, so the mark saves little there, and measured, it
        // lengthened the tail (64 MiB gets: p99 42 -> 60 ms).
        let reads = expects.iter().filter(|e| e.op == DataOp::Read).count();
        let mut mark = if reads <= MARKED_BURST_READS {
            LowWater::of(self.stream_ref())
        } else {
            LowWater::unmarked()
        };
        let burst = {
            let (reader, writer) = tokio::io::split(self.stream_mut());
            let mut send_all = pin!(send_all(writer, &sends, step));
            let mut receive = pin!(receive_all(reader, expects, step, &endpoint, &mut mark));
            // The answers decide when the burst is over: once they stop, a send still blocked on a
            // node that no longer reads is abandoned.
            let mut send_end = None;
            let mut burst = loop {
                tokio::select! {
                    sent = &mut send_all, if send_end.is_none() => {
                        send_end = Some(sent.err().unwrap_or(SendEnd::Done));
                    }
                    burst = &mut receive => break burst,
                }
            };
            if let (Some(brk), Some(SendEnd::Failed(why))) = (&mut burst.broken, &send_end) {
                if !brk.timed_out {
                    // The answer side only saw the connection end; the send side knows why.
                    brk.error = transfer_fail(&endpoint, why);
                }
            }
            burst
        };
        self.healthy = burst.broken.is_none();
        match lent {
            // Every plan was answered: the node is done with the memory.
            Some(lent) if burst.broken.is_none() => lent.returned(),
            // Broken off (a timeout, a reset): wait until the node provably stopped.
            other => drop(other),
        }
        burst
    }
}

/// How the send side of a burst ended.
enum SendEnd {
    Done,
    Failed(String),
}

async fn send_all<W: tokio::io::AsyncWrite + Unpin>(
    mut writer: W,
    sends: &[Send<'_>],
    step: Duration,
) -> std::result::Result<(), SendEnd> {
    // Heads and small payloads gather here; a large payload goes out together with what
    // gathered before it in one vectored write, so no request head travels on its own.
    let mut gathered: Vec<u8> = Vec::with_capacity(BURST_BUFFER.min(sends.len() * 256));
    let failed = |e: std::io::Error| SendEnd::Failed(format!("send request: {e}"));
    let timed_out = || SendEnd::Failed("send request: timed out".to_string());
    for send in sends {
        gathered.extend_from_slice(&send.head);
        gathered.extend_from_slice(&send.extra);
        let size: usize = send.payload.iter().map(|p| p.len()).sum();
        let large = size >= BURST_BUFFER / 4;
        if !large {
            for part in &send.payload {
                gathered.extend_from_slice(part);
            }
            if gathered.len() < BURST_BUFFER {
                continue;
            }
        }
        let mut slices = vec![IoSlice::new(&gathered)];
        if large {
            slices.extend(send.payload.iter().map(|p| IoSlice::new(p)));
        }
        match tokio::time::timeout(step, write_all_vectored(&mut writer, &mut slices)).await {
            Ok(Ok(())) => gathered.clear(),
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => return Err(timed_out()),
        }
    }
    let rest = async {
        writer.write_all(&gathered).await?;
        writer.flush().await
    };
    match tokio::time::timeout(step, rest).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(timed_out()),
    }
}

/// Writes every byte of `slices`, in order, with as few writes as the stream allows.
pub(crate) async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = writer.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

async fn receive_all<R: AsyncRead + Unpin>(
    reader: R,
    expects: Vec<Expect<'_>>,
    step: Duration,
    endpoint: &str,
    mark: &mut LowWater,
) -> Burst {
    let mut input = AnswerReader::new(reader);
    let mut results = Vec::with_capacity(expects.len());
    let stop = |results, error, timed_out| Burst {
        results,
        broken: Some(BurstBreak { error, timed_out }),
    };
    let timed_out = || {
        transfer_fail(
            endpoint,
            &format!("no answer within {step:?} (the node may be stalled)"),
        )
    };
    for expect in expects {
        let mut raw = [0u8; RESPONSE_LEN];
        // Buffering past the header is fine before a small payload (answers share reads), but
        // a large one goes from the socket straight into its sink.
        let greedy = expect.op != DataOp::Read || expect.len < (BURST_BUFFER / 4) as u64;
        match tokio::time::timeout(step, input.read_header(&mut raw, greedy)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let error = transfer_io_fail(endpoint, "receive answer", e);
                return stop(results, error, false);
            }
            Err(_) => return stop(results, timed_out(), true),
        }
        let Some(answer) = ResponseHeader::decode(&raw) else {
            return stop(
                results,
                transfer_fail(endpoint, "malformed answer header"),
                false,
            );
        };
        if answer.request_id != expect.request_id && answer.status != DataStatus::Unauthenticated {
            return stop(
                results,
                transfer_fail(endpoint, "answer for another request"),
                false,
            );
        }
        if answer.status != DataStatus::Ok {
            let what = match expect.op {
                DataOp::Read => "read",
                DataOp::ReadLocal => "same-host read",
                DataOp::WriteLocal => "same-host write",
                _ => "write",
            };
            let error = refusal(
                endpoint,
                what,
                expect.segment,
                expect.address,
                expect.len,
                answer.status,
            );
            if !stays_in_step(answer.status) {
                return stop(results, error, false);
            }
            results.push(Err(error));
            continue;
        }
        if expect.op == DataOp::Read {
            if answer.length != expect.len {
                let error = transfer_fail(endpoint, "read answered with a different length");
                return stop(results, error, false);
            }
            // Bytes of this answer's payload still to come.
            let mut left = expect.len;
            for sink in expect.sinks {
                let len = sink.len() as u64;
                let read = input.read_payload(sink, left, mark);
                left = left.saturating_sub(len);
                match tokio::time::timeout(step, read).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        let error = transfer_io_fail(endpoint, "receive read bytes", e);
                        return stop(results, error, false);
                    }
                    Err(_) => return stop(results, timed_out(), true),
                }
            }
            // The next answer may be a bare header.
            mark.want(1);
        }
        results.push(Ok(()));
    }
    Burst {
        results,
        broken: None,
    }
}

/// The reading side of a burst: answer headers come through a buffer, so the answers of small
/// requests share reads, and payloads go from that buffer (what it already holds) and then
/// from the socket straight into their sinks. A header read before a large payload asks the
/// socket for no more than the header, so that payload is never copied through the buffer.
struct AnswerReader<R> {
    inner: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> AnswerReader<R> {
    fn new(inner: R) -> Self {
        AnswerReader {
            inner,
            buf: vec![0u8; BURST_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Fills `out` with the next header; `greedy` lets the read take whatever else is there.
    async fn read_header(
        &mut self,
        out: &mut [u8; RESPONSE_LEN],
        greedy: bool,
    ) -> std::io::Result<()> {
        while self.end - self.start < RESPONSE_LEN {
            if self.start > 0 && self.buf.len() - self.start < RESPONSE_LEN {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let limit = if greedy {
                self.buf.len()
            } else {
                self.start + RESPONSE_LEN
            };
            let n = self.inner.read(&mut self.buf[self.end..limit]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.end += n;
        }
        out.copy_from_slice(&self.buf[self.start..self.start + RESPONSE_LEN]);
        self.start += RESPONSE_LEN;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(())
    }

    /// Fills `sink` with the next payload bytes; `left` bytes of the payload are still to
    /// come, `sink`'s included.
    async fn read_payload(
        &mut self,
        sink: &mut [u8],
        left: u64,
        mark: &mut LowWater,
    ) -> std::io::Result<()> {
        let buffered = (self.end - self.start).min(sink.len());
        sink[..buffered].copy_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if buffered < sink.len() {
            let left = left.saturating_sub(buffered as u64);
            read_payload(&mut self.inner, &mut sink[buffered..], left, mark).await?;
        }
        Ok(())
    }
}
