//! The caller side of one data-plane connection: single requests here, pipelined bursts in
//! [`crate::pipeline`]. With a shared secret a connection opens with the authentication
//! handshake; every request carries the grant of the replica it touches (empty when the master
//! issued none). Connections come from, and go back to, a [`crate::pool::ConnectionPool`].

use crate::handshake::{self, Answer, Mode, ANSWER_LEN};
use crate::header::{
    AttachRequest, DataOp, DataStatus, FileMeta, LocalPlan, RequestHeader, ResponseHeader,
    REQUEST_LEN, RESPONSE_LEN,
};
use crate::low_water::{read_payload, LowWater};
use crate::stream::{ConnectFailure, Stream, TlsConnector};
use moonkv_proto::auth::{Secret, NONCE_LEN, SECRET_ENV, SECRET_FILE_ENV};
use moonkv_proto::grant::GRANT_LEN;
use moonkv_proto::{Error, ErrorCode, Result, SegmentId};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A PUT_WHOLE payload up to this size goes out in one write with its request.
const INLINE_PAYLOAD: usize = 64 << 10;

/// The answer body of a request served whole that is read with its header, in one call, when
/// it is no longer than this (a same-host batch of 128 keys answers in about 700 bytes).
const ANSWER_WITH_HEADER: usize = 1024;

/// One data-plane connection to a node.
pub struct DataConnection {
    /// The receive low-water mark while a [`DataConnection::get_whole`] answer's bytes are
    /// read over several calls. Declared before `stream` so that it is dropped (and the mark
    /// set back) while the socket is still open.
    whole_mark: Option<LowWater>,
    stream: Stream,
    endpoint: String,
    next_request_id: u64,
    /// False once the stream may be out of step (I/O error); such a connection is not pooled.
    pub(crate) healthy: bool,
    /// Set once the node agreed to copy this connection's memory ranges straight from and to
    /// this process (see [`DataConnection::attach`]): a second descriptor of the socket, which
    /// memory lent to a same-host request is waited for on (`same_host::Lent`), so the wait can
    /// outlive the connection.
    pub(crate) lend_socket: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The pool's slot this connection occupies while checked out (none while idle or fenced).
    pub(crate) permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Keeps the pool's count of open connections right when this one is dropped.
    pub(crate) _open: Option<crate::pool::OpenGuard>,
    /// Bytes of a [`DataConnection::get_whole`] answer not read yet.
    whole_left: u64,
}

impl DataConnection {
    /// Connects to a node's data endpoint; with a `secret`, performs the handshake (one round
    /// trip) and checks the node's proof. Without one, a node that requires authentication
    /// refuses the first request.
    pub async fn connect(
        endpoint: &str,
        timeout: Duration,
        secret: Option<&Secret>,
    ) -> Result<DataConnection> {
        Self::connect_with_tls(endpoint, timeout, secret, None).await
    }

    /// Like [`DataConnection::connect`], over TLS when `tls` is given; the handshake with the
    /// secret then runs inside TLS.
    pub async fn connect_with_tls(
        endpoint: &str,
        timeout: Duration,
        secret: Option<&Secret>,
        tls: Option<&TlsConnector>,
    ) -> Result<DataConnection> {
        let connected = async {
            crate::stream::connect(
                endpoint,
                tls,
                "node",
                Some(crate::stream::unacked_bound(timeout)),
            )
            .await
            .map_err(|e| match e {
                ConnectFailure::Tcp(e) => transfer_io_fail(endpoint, "connect failed", e),
                ConnectFailure::Tls(why) => Error::new(ErrorCode::ILLEGAL_CLIENT, why.to_string()),
            })
        };
        Self::open(connected, endpoint, timeout, secret, "connect timed out").await
    }

    /// Connects to the local socket `name` of the node whose data endpoint is `endpoint` (the
    /// name its STATS answer gave, [`crate::header::NodeStats::local_socket`]); with a `secret`,
    /// performs the handshake as over TCP. Errors name `endpoint`, the node's address.
    pub async fn connect_local(
        endpoint: &str,
        name: &str,
        timeout: Duration,
        secret: Option<&Secret>,
    ) -> Result<DataConnection> {
        let connected = async {
            crate::stream::connect_local(name).await.map_err(|e| {
                transfer_io_fail(endpoint, &format!("connect to local socket {name}"), e)
            })
        };
        let late = "connect to local socket timed out";
        Self::open(connected, endpoint, timeout, secret, late).await
    }

    /// A connection over the stream `connected` gives, after the handshake when there is a
    /// `secret`; both within `timeout` (else `late` says what timed out).
    async fn open(
        connected: impl std::future::Future<Output = Result<Stream>>,
        endpoint: &str,
        timeout: Duration,
        secret: Option<&Secret>,
        late: &str,
    ) -> Result<DataConnection> {
        let opened = async {
            let mut stream = connected.await?;
            if let Some(secret) = secret {
                authenticate(&mut stream, endpoint, secret).await?;
            }
            Ok::<_, Error>(stream)
        };
        let stream = tokio::time::timeout(timeout, opened)
            .await
            .map_err(|_| transfer_fail(endpoint, late))??;
        Ok(DataConnection {
            whole_mark: None,
            stream,
            endpoint: endpoint.to_string(),
            next_request_id: 1,
            healthy: true,
            lend_socket: None,
            permit: None,
            _open: None,
            whole_left: 0,
        })
    }

    /// Whether this connection is plain TCP to a loopback address.
    pub(crate) fn on_loopback(&self) -> bool {
        matches!(&self.stream, Stream::Plain(tcp)
            if tcp.peer_addr().is_ok_and(|peer| peer.ip().to_canonical().is_loopback()))
    }

    /// Whether this connection runs over the node's local socket.
    pub fn is_local(&self) -> bool {
        matches!(self.stream, Stream::Local(_))
    }

    /// Asks the node to copy this connection's memory ranges straight between its segments and
    /// this process's memory (`crate::same_host`). Only tried over the node's local socket or
    /// plain TCP to a loopback address; `Ok(false)` when not tried or when the node declines
    /// (an older node, one started with same-host copies off, or one that cannot reach this
    /// process), and the connection then carries bytes over the socket as before. `Err` only
    /// when the connection itself failed.
    pub async fn attach(&mut self, timeout: Duration) -> Result<bool> {
        let socket = match &self.stream {
            Stream::Plain(tcp) if self.on_loopback() => {
                std::os::fd::AsFd::as_fd(tcp).try_clone_to_owned()
            }
            Stream::Local(unix) => std::os::fd::AsFd::as_fd(unix).try_clone_to_owned(),
            _ => return Ok(false),
        };
        // Without a second handle on the socket lent memory could not be waited for: no
        // same-host copies then.
        let Ok(lend_socket) = socket else {
            return Ok(false);
        };
        // The node reads these bytes out of this process to show it can reach it; they live
        // until its answer has come.
        let probe: Box<[u8; 16]> = Box::new(rand::random());
        let request = AttachRequest {
            pid: std::process::id(),
            probe_address: probe.as_ptr() as u64,
            probe: *probe,
        };
        let id = self.take_id();
        let bytes = request.header(id).encode();
        self.healthy = false;
        let asked = async {
            self.stream
                .write_all(&bytes)
                .await
                .map_err(|e| self.io_fail("send attach", e))?;
            self.read_response(id).await
        };
        let response = tokio::time::timeout(timeout, asked)
            .await
            .map_err(|_| transfer_fail(&self.endpoint, "attach: no answer in time"))??;
        drop(probe);
        self.healthy = stays_in_step(response.status);
        if !self.healthy {
            return Err(self.refused("attach", SegmentId::new(0, 0), 0, 0, response.status));
        }
        let attached = response.status == DataStatus::Ok;
        if attached {
            self.lend_socket = Some(std::sync::Arc::new(lend_socket));
        }
        Ok(attached)
    }

    pub(crate) fn stream_ref(&self) -> &Stream {
        &self.stream
    }

    pub(crate) fn stream_mut(&mut self) -> &mut Stream {
        &mut self.stream
    }

    /// Endpoint this connection talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Reads `buf.len()` bytes at `address` of `segment` straight into `buf`, presenting
    /// `grant` (empty: none).
    pub async fn read(
        &mut self,
        segment: SegmentId,
        address: u64,
        buf: &mut [u8],
        grant: &[u8],
    ) -> Result<()> {
        self.read_op(DataOp::Read, segment, address, buf, grant)
            .await
    }

    /// Reads disk file `file_id` of disk `disk` (exactly `buf.len()` bytes) into `buf`. The node
    /// verifies the file first; a missing or corrupt file is refused with nothing sent.
    pub async fn read_file(
        &mut self,
        disk: SegmentId,
        file_id: u64,
        buf: &mut [u8],
        grant: &[u8],
    ) -> Result<()> {
        self.read_op(DataOp::FileRead, disk, file_id, buf, grant)
            .await
    }

    /// The node's data-plane counters (a STATS request).
    pub async fn stats(&mut self) -> Result<crate::header::NodeStats> {
        let id = self.take_id();
        let header = RequestHeader::new(DataOp::Stats, id, SegmentId::new(0, 0), 0, 0);
        let head = head(header, &[])?;
        self.healthy = false;
        self.stream
            .write_all(&head)
            .await
            .map_err(|e| self.io_fail("send stats request", e))?;
        let response = self.read_response(id).await?;
        if response.status != DataStatus::Ok {
            self.healthy = stays_in_step(response.status);
            return Err(self.refused("stats request", SegmentId::new(0, 0), 0, 0, response.status));
        }
        if response.length > crate::header::MAX_STATS_LEN {
            return Err(transfer_fail(&self.endpoint, "stats answer too long"));
        }
        let mut body = vec![0u8; response.length as usize];
        self.stream
            .read_exact(&mut body)
            .await
            .map_err(|e| self.io_fail("receive stats", e))?;
        self.healthy = true;
        serde_json::from_slice(&body)
            .map_err(|e| transfer_fail(&self.endpoint, &format!("stats answer is not valid: {e}")))
    }

    /// A same-host put through the node ([`DataOp::PutLocal`]): `plan` lists the caller's
    /// memory of the objects laid end to end (`total` bytes), `body` is the encoded request.
    /// Returns the node's answer body once it has ended or revoked every key, or the status it
    /// refused the request with before placing anything (`LOCAL_REFUSED`: a node that does not
    /// take such puts, or a connection not attached).
    pub async fn put_local(
        &mut self,
        plan: &LocalPlan,
        total: u64,
        body: &[u8],
    ) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        self.through_node(DataOp::PutLocal, plan, total, body).await
    }

    /// A same-host get through the node ([`DataOp::GetLocal`]): `plan` lists the caller's
    /// buffers laid end to end (`total` bytes), `body` is the encoded request. The buffers are
    /// lent to the node until it answers: should this future be dropped first, dropping it
    /// waits until the node provably let go of them (see `crate::same_host`). Returns the
    /// node's answer body, or the status it refused the request with before writing anything.
    /// On a connection that is not attached, nothing is sent and `LOCAL_REFUSED` comes back.
    pub async fn get_local(
        &mut self,
        plan: &LocalPlan,
        total: u64,
        body: &[u8],
    ) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        let Some(socket) = self.lend_socket.clone() else {
            return Ok(Err(DataStatus::LocalRefused));
        };
        let lent = crate::same_host::Lent::new(socket, plan.deadline_ns);
        let answer = self.through_node(DataOp::GetLocal, plan, total, body).await;
        // Answered: the node no longer writes into the buffers. A broken connection, or this
        // future dropped, leaves `lent` to wait until the node let go.
        if answer.is_ok() {
            lent.returned();
        }
        answer
    }

    /// A put through the node over the socket ([`DataOp::PutWhole`]): `body` is the encoded
    /// request (as for PUT_LOCAL), `parts` the objects' bytes laid end to end. Returns the
    /// node's answer body once it has ended or revoked every key, or the status it refused
    /// the request with before placing anything (a node that does not take such puts).
    pub async fn put_whole(
        &mut self,
        body: &[u8],
        parts: &[&[u8]],
    ) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let id = self.take_id();
        // The request and, when they are small, the bytes in one write.
        let inline = if total <= INLINE_PAYLOAD { total } else { 0 };
        let mut out = self.whole_request(
            DataOp::PutWhole,
            id,
            total as u64,
            None,
            body,
            inline,
            "put",
        )?;
        if inline > 0 {
            parts.iter().for_each(|p| out.extend_from_slice(p));
        }
        self.healthy = false;
        let sent = async {
            if inline > 0 {
                return self.stream.write_all(&out).await;
            }
            // The request and every part, in as few writes as the socket takes.
            let mut slices: Vec<std::io::IoSlice<'_>> = std::iter::once(out.as_slice())
                .chain(parts.iter().copied())
                .filter(|p| !p.is_empty())
                .map(std::io::IoSlice::new)
                .collect();
            let mut slices = slices.as_mut_slice();
            while !slices.is_empty() {
                let n = self.stream.write_vectored(slices).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                std::io::IoSlice::advance_slices(&mut slices, n);
            }
            Ok(())
        }
        .await;
        if let Err(e) = sent {
            // The node may have refused the put and closed; its answer says why.
            return match tokio::time::timeout(Duration::from_millis(200), self.read_response(id))
                .await
            {
                Ok(Ok(r)) if r.status != DataStatus::Ok => Ok(Err(r.status)),
                _ => Err(self.io_fail("send put", e)),
            };
        }
        self.read_answer_body(id).await
    }

    /// A get through the node over the socket ([`DataOp::GetWhole`]): `body` is the encoded
    /// request, `capacity` the most bytes the caller takes (the request's `length`). Returns
    /// the node's answer (a MessagePack `Vec<ItemResult<GotWhole>>`) and how many bytes follow
    /// it on the connection, or the status the node refused the request with. The bytes are
    /// read with [`DataConnection::read_whole_bytes`]; the connection is back in step (and may
    /// return to its pool) once all of them were.
    pub async fn get_whole(
        &mut self,
        body: &[u8],
        capacity: u64,
    ) -> Result<std::result::Result<(Vec<u8>, u64), DataStatus>> {
        let id = self.take_id();
        self.whole_mark = None;
        let out = self.whole_request(DataOp::GetWhole, id, capacity, None, body, 0, "get")?;
        self.healthy = false;
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| self.io_fail("send get", e))?;
        let response = self.read_response(id).await?;
        if response.status != DataStatus::Ok {
            self.healthy = stays_in_step(response.status);
            return Ok(Err(response.status));
        }
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .await
            .map_err(|e| self.io_fail("receive the answer of a get", e))?;
        let len = u64::from(u32::from_be_bytes(len));
        let bytes = response
            .length
            .checked_sub(4 + len)
            .filter(|b| len <= u64::from(crate::header::MAX_PUT_LOCAL_BODY) && *b <= capacity)
            .ok_or_else(|| transfer_fail(&self.endpoint, "malformed answer of a get"))?;
        let mut answer = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut answer)
            .await
            .map_err(|e| self.io_fail("receive the answer of a get", e))?;
        if bytes == 0 {
            self.healthy = true;
        }
        self.whole_left = bytes;
        Ok(Ok((answer, bytes)))
    }

    /// Reads the next `buf.len()` bytes of a [`DataConnection::get_whole`] answer; `last`: the
    /// last of them, after which the connection is back in step.
    pub async fn read_whole_bytes(&mut self, buf: &mut [u8], last: bool) -> Result<()> {
        // Never more than the answer still owes: `buf` is part of it.
        let left = self.whole_left.max(buf.len() as u64);
        // One mark for all of the answer's bytes, set back after its last part (or a failure).
        let mark = self
            .whole_mark
            .get_or_insert_with(|| LowWater::of(&self.stream));
        let read = read_payload(&mut self.stream, buf, left, mark).await;
        if read.is_err() || last {
            self.whole_mark = None;
        }
        read.map_err(|e| self.io_fail("receive the bytes of a get", e))?;
        self.whole_left = left - buf.len() as u64;
        if last {
            self.healthy = true;
        }
        Ok(())
    }

    /// The start of a request the node serves whole (PUT_LOCAL, GET_LOCAL, PUT_WHOLE,
    /// GET_WHOLE): its header (`length`), a same-host request's plan, then the body with its
    /// `u32` length; `room`: bytes the caller appends after it. `what` names the request in
    /// the error for a body over the limit.
    #[allow(clippy::too_many_arguments)]
    fn whole_request(
        &self,
        op: DataOp,
        id: u64,
        length: u64,
        plan: Option<&LocalPlan>,
        body: &[u8],
        room: usize,
        what: &str,
    ) -> Result<Vec<u8>> {
        let head = head(
            RequestHeader::new(op, id, SegmentId::new(0, 0), 0, length),
            &[],
        )?;
        let body_len = u32::try_from(body.len())
            .ok()
            .filter(|n| *n <= crate::header::MAX_PUT_LOCAL_BODY)
            .ok_or_else(|| transfer_fail(&self.endpoint, &format!("{what} request too long")))?;
        let plan_len = plan.map_or(0, |p| 16 * (p.ranges.len() + 1));
        let mut out = Vec::with_capacity(head.len() + plan_len + 4 + body.len() + room);
        out.extend_from_slice(&head);
        if let Some(plan) = plan {
            plan.encode_into(&mut out);
        }
        out.extend_from_slice(&body_len.to_be_bytes());
        out.extend_from_slice(body);
        Ok(out)
    }

    /// Sends a request the node serves whole (PUT_LOCAL, GET_LOCAL) and reads its answer body.
    async fn through_node(
        &mut self,
        op: DataOp,
        plan: &LocalPlan,
        total: u64,
        body: &[u8],
    ) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        let id = self.take_id();
        let out = self.whole_request(op, id, total, Some(plan), body, 0, "same-host")?;
        self.healthy = false;
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| self.io_fail("send same-host request", e))?;
        self.read_answer_body(id).await
    }

    /// The answer of a request the node serves whole: its body, or the status it was refused
    /// with. The header and a body of up to [`ANSWER_WITH_HEADER`] bytes come in one read: the
    /// node writes them together, and nothing else arrives on this connection before its next
    /// request, so a read past the header takes this answer's bytes only (more than the header
    /// announces is refused as malformed).
    async fn read_answer_body(
        &mut self,
        id: u64,
    ) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        let mut raw = [0u8; RESPONSE_LEN + ANSWER_WITH_HEADER];
        let mut got = 0;
        while got < RESPONSE_LEN {
            let n = match self.stream.read(&mut raw[got..]).await {
                Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
                other => other,
            }
            .map_err(|e| self.io_fail("receive answer", e))?;
            got += n;
        }
        let (head, early) = raw[..got].split_at(RESPONSE_LEN);
        let head: &[u8; RESPONSE_LEN] = head.try_into().expect("split at RESPONSE_LEN");
        let response = self.check_response(head, id)?;
        if early.len() as u64 > response.length {
            return Err(transfer_fail(
                &self.endpoint,
                "answer longer than its header announced",
            ));
        }
        if response.status != DataStatus::Ok {
            self.healthy = stays_in_step(response.status) && response.length == 0;
            return Ok(Err(response.status));
        }
        if response.length > u64::from(crate::header::MAX_PUT_LOCAL_BODY) {
            return Err(transfer_fail(
                &self.endpoint,
                "answer of a request served whole too long",
            ));
        }
        let mut answer = vec![0u8; response.length as usize];
        answer[..early.len()].copy_from_slice(early);
        if early.len() < answer.len() {
            self.stream
                .read_exact(&mut answer[early.len()..])
                .await
                .map_err(|e| self.io_fail("receive the answer of a request served whole", e))?;
        }
        self.healthy = true;
        Ok(Ok(answer))
    }

    /// Writes disk file `file_id` of disk `disk` holding the concatenation of `parts`; returns
    /// once the node synced it.
    pub async fn write_file(
        &mut self,
        disk: SegmentId,
        file_id: u64,
        meta: &FileMeta,
        parts: &[&[u8]],
        grant: &[u8],
    ) -> Result<()> {
        let prefix = meta.encode();
        let data_len: usize = parts.iter().map(|p| p.len()).sum();
        let length = (prefix.len() + data_len) as u64;
        let id = self.take_id();
        let header = RequestHeader::new(DataOp::FileWrite, id, disk, file_id, length);
        let head = head(header, grant)?;
        self.healthy = false;
        let sent = async {
            let mut head = head.to_vec();
            head.extend_from_slice(&prefix);
            self.stream.write_all(&head).await?;
            for part in parts {
                self.stream.write_all(part).await?;
            }
            Ok(())
        }
        .await;
        if let Err(e) = sent {
            return Err(self.io_fail("send file write", e));
        }
        let response = self.read_response(id).await?;
        self.healthy = stays_in_step(response.status);
        if response.status != DataStatus::Ok {
            return Err(self.refused("file write", disk, file_id, length, response.status));
        }
        Ok(())
    }

    async fn read_op(
        &mut self,
        op: DataOp,
        segment: SegmentId,
        address: u64,
        buf: &mut [u8],
        grant: &[u8],
    ) -> Result<()> {
        let id = self.take_id();
        let header = RequestHeader::new(op, id, segment, address, buf.len() as u64);
        let head = head(header, grant)?;
        self.healthy = false;
        self.stream
            .write_all(&head)
            .await
            .map_err(|e| self.io_fail("send read", e))?;
        let response = self.read_response(id).await?;
        if response.status != DataStatus::Ok {
            self.healthy = stays_in_step(response.status);
            let what = if op == DataOp::FileRead {
                "file read"
            } else {
                "read"
            };
            return Err(self.refused(what, segment, address, buf.len() as u64, response.status));
        }
        if response.length != buf.len() as u64 {
            return Err(transfer_fail(
                &self.endpoint,
                "read answered with a different length",
            ));
        }
        let mut mark = LowWater::of(&self.stream);
        let read = read_payload(&mut self.stream, buf, buf.len() as u64, &mut mark).await;
        drop(mark);
        read.map_err(|e| self.io_fail("receive read bytes", e))?;
        if op == DataOp::FileRead {
            // The node checked the file's checksum while streaming it: the trailer says whether
            // the bytes just received are good.
            let mut trailer = [0u8; 1];
            self.stream
                .read_exact(&mut trailer)
                .await
                .map_err(|e| self.io_fail("receive file read trailer", e))?;
            let status = DataStatus::from_u8(trailer[0]);
            if status != DataStatus::Ok {
                self.healthy = true;
                return Err(self.refused("file read", segment, address, buf.len() as u64, status));
            }
        }
        self.healthy = true;
        Ok(())
    }

    /// Writes `data` at `address` of `segment`, presenting `grant` (empty: none); returns once
    /// the node confirmed the bytes are in its memory.
    pub async fn write(
        &mut self,
        segment: SegmentId,
        address: u64,
        data: &[u8],
        grant: &[u8],
    ) -> Result<()> {
        let id = self.take_id();
        let header = RequestHeader::new(DataOp::Write, id, segment, address, data.len() as u64);
        let head = head(header, grant)?;
        self.healthy = false;
        let sent = async {
            self.stream.write_all(&head).await?;
            self.stream.write_all(data).await
        }
        .await;
        if let Err(e) = sent {
            // The node may have refused the write and closed; its answer says why.
            return match tokio::time::timeout(Duration::from_millis(200), self.read_response(id))
                .await
            {
                Ok(Ok(r)) if r.status != DataStatus::Ok => {
                    Err(self.refused("write", segment, address, data.len() as u64, r.status))
                }
                _ => Err(self.io_fail("send write", e)),
            };
        }
        let response = self.read_response(id).await?;
        self.healthy = stays_in_step(response.status);
        if response.status != DataStatus::Ok {
            return Err(self.refused(
                "write",
                segment,
                address,
                data.len() as u64,
                response.status,
            ));
        }
        Ok(())
    }

    /// Settles a connection whose write was abandoned mid-request (its deadline passed): stops
    /// sending, then waits until the node closes the connection, so none of the bytes already
    /// sent can still land in segment memory. True once settled; false if the node stayed
    /// silent for `limit` (it may still apply the write later).
    pub async fn fence(mut self, limit: Duration) -> bool {
        // A dying connection no longer counts against its pool's cap.
        self.permit = None;
        let _ = self.stream.shutdown().await;
        let drain = async {
            let mut scratch = [0u8; 4096];
            // EOF or an error: the node has finished with this connection.
            while matches!(self.stream.read(&mut scratch).await, Ok(n) if n > 0) {}
        };
        tokio::time::timeout(limit, drain).await.is_ok()
    }

    pub(crate) fn take_id(&mut self) -> u64 {
        let id = self.next_request_id;
        self.next_request_id = self.next_request_id.wrapping_add(1);
        id
    }

    pub(crate) async fn read_response(&mut self, request_id: u64) -> Result<ResponseHeader> {
        let mut raw = [0u8; RESPONSE_LEN];
        self.stream
            .read_exact(&mut raw)
            .await
            .map_err(|e| self.io_fail("receive answer", e))?;
        self.check_response(&raw, request_id)
    }

    /// The answer header `raw`, when it is well formed and answers `request_id`.
    fn check_response(&self, raw: &[u8; RESPONSE_LEN], request_id: u64) -> Result<ResponseHeader> {
        let response = ResponseHeader::decode(raw)
            .ok_or_else(|| transfer_fail(&self.endpoint, "malformed answer header"))?;
        // A failed handshake proof is answered before any request was read, as request 0.
        if response.request_id != request_id && response.status != DataStatus::Unauthenticated {
            return Err(transfer_fail(&self.endpoint, "answer for another request"));
        }
        Ok(response)
    }

    pub(crate) fn io_fail(&self, what: &str, e: std::io::Error) -> Error {
        let why = crate::stream::explain(&e, "node", &self.endpoint);
        let hint = plaintext_hint(matches!(self.stream, Stream::Plain(_)), &e);
        transfer_fail(&self.endpoint, &format!("{what}: {why}{hint}"))
    }

    pub(crate) fn refused(
        &self,
        what: &str,
        segment: SegmentId,
        address: u64,
        len: u64,
        status: DataStatus,
    ) -> Error {
        refusal(&self.endpoint, what, segment, address, len, status)
    }
}

/// The caller's error for a request the node at `endpoint` refused with `status`.
pub(crate) fn refusal(
    endpoint: &str,
    what: &str,
    segment: SegmentId,
    address: u64,
    len: u64,
    status: DataStatus,
) -> Error {
    let code = match status {
        DataStatus::UnknownSegment => ErrorCode::SEGMENT_NOT_FOUND,
        DataStatus::OutOfRange | DataStatus::AddressOverflow => ErrorCode::INVALID_PARAMS,
        DataStatus::FileNotFound => ErrorCode::FILE_NOT_FOUND,
        DataStatus::FileCorrupt => ErrorCode::CHECKSUM_MISMATCH,
        DataStatus::FileWriteFail | DataStatus::DiskFull => ErrorCode::FILE_WRITE_FAIL,
        DataStatus::FileReadFail => ErrorCode::FILE_READ_FAIL,
        DataStatus::Unauthenticated | DataStatus::Forbidden => ErrorCode::ILLEGAL_CLIENT,
        _ => ErrorCode::TRANSFER_FAIL,
    };
    Error::new(
        code,
        format!(
            "node {endpoint} refused a {what} of {len} bytes at {address:#x} in segment {segment}: {}",
            status.describe()
        ),
    )
}

/// Whether the node keeps the connection after answering `status`.
pub(crate) fn stays_in_step(status: DataStatus) -> bool {
    !matches!(
        status,
        DataStatus::TooLarge | DataStatus::BadHeader | DataStatus::Unauthenticated
    )
}

/// The request header followed by the grant, ready to send.
pub(crate) fn head(mut header: RequestHeader, grant: &[u8]) -> Result<HeadBytes> {
    if grant.len() > GRANT_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("a grant is at most {GRANT_LEN} bytes, got {}", grant.len()),
        ));
    }
    header.grant_len = grant.len() as u16;
    let mut bytes = [0u8; REQUEST_LEN + GRANT_LEN];
    bytes[..REQUEST_LEN].copy_from_slice(&header.encode());
    bytes[REQUEST_LEN..REQUEST_LEN + grant.len()].copy_from_slice(grant);
    Ok(HeadBytes {
        bytes,
        len: REQUEST_LEN + grant.len(),
    })
}

/// A request header and its grant, on the stack.
pub(crate) struct HeadBytes {
    bytes: [u8; REQUEST_LEN + GRANT_LEN],
    len: usize,
}

impl std::ops::Deref for HeadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The caller's side of the handshake: hello, answer (checking the node's proof), then the
/// caller's proof when asked, sent without waiting.
async fn authenticate(stream: &mut Stream, endpoint: &str, secret: &Secret) -> Result<()> {
    let client_nonce: [u8; NONCE_LEN] = rand::random();
    let plain = matches!(stream, Stream::Plain(_));
    let io = |e: std::io::Error| {
        let why = crate::stream::explain(&e, "node", endpoint);
        let hint = plaintext_hint(plain, &e);
        transfer_fail(endpoint, &format!("handshake: {why}{hint}"))
    };
    stream
        .write_all(&handshake::hello(&client_nonce))
        .await
        .map_err(io)?;
    let mut raw = [0u8; ANSWER_LEN];
    stream.read_exact(&mut raw).await.map_err(io)?;
    let answer = Answer::decode(&raw)
        .ok_or_else(|| transfer_fail(endpoint, "malformed handshake answer"))?;
    if answer.mode == Mode::Open {
        return Ok(());
    }
    if !secret.verify_server(&answer.challenge, &client_nonce, &answer.server_proof) {
        return Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            format!(
                "node {endpoint} could not prove it holds the shared secret \
                 (is {SECRET_ENV} / {SECRET_FILE_ENV} the same as the cluster's?)"
            ),
        ));
    }
    let proof = secret.client_proof(&answer.challenge, &client_nonce);
    stream.write_all(&proof).await.map_err(io)
}

/// A node that requires TLS closes a plaintext connection at once; say so when that may be it.
fn plaintext_hint(plain: bool, e: &std::io::Error) -> String {
    use std::io::ErrorKind::{ConnectionReset, UnexpectedEof};
    if plain && matches!(e.kind(), UnexpectedEof | ConnectionReset) {
        format!(
            " (if the node serves TLS, set {})",
            moonkv_proto::tls::CA_FILE_ENV
        )
    } else {
        String::new()
    }
}

pub(crate) fn transfer_fail(endpoint: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        format!("data transfer with node {endpoint} failed: {why}"),
    )
}

/// A failed transfer whose cause is an I/O error; the error stays reachable as its source.
pub(crate) fn transfer_io_fail(endpoint: &str, what: &str, cause: std::io::Error) -> Error {
    Error::caused_by(
        ErrorCode::TRANSFER_FAIL,
        format!("data transfer with node {endpoint} failed: {what}"),
        cause,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// How a fake node writes the answer to one PUT_LOCAL.
    enum Reply {
        /// Header and body in one write.
        Together(Vec<u8>),
        /// The header, then (after the caller had time to read it) the body.
        Apart(Vec<u8>),
        /// A header announcing `len` bytes, followed by `body`.
        Announcing { len: u64, body: Vec<u8> },
        /// A refusal.
        Refused(DataStatus),
    }

    /// A caller's PUT_LOCAL answered by a fake node as `reply` says.
    async fn put_local_answered(reply: Reply) -> Result<std::result::Result<Vec<u8>, DataStatus>> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let node = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; REQUEST_LEN];
            s.read_exact(&mut head).await.unwrap();
            let request = RequestHeader::decode(&head).unwrap();
            let header = |status, length| {
                ResponseHeader {
                    status,
                    request_id: request.request_id,
                    length,
                }
                .encode()
                .to_vec()
            };
            match reply {
                Reply::Together(body) => {
                    let mut out = header(DataStatus::Ok, body.len() as u64);
                    out.extend_from_slice(&body);
                    s.write_all(&out).await.unwrap();
                }
                Reply::Apart(body) => {
                    s.write_all(&header(DataStatus::Ok, body.len() as u64))
                        .await
                        .unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    s.write_all(&body).await.unwrap();
                }
                Reply::Announcing { len, body } => {
                    let mut out = header(DataStatus::Ok, len);
                    out.extend_from_slice(&body);
                    s.write_all(&out).await.unwrap();
                }
                Reply::Refused(status) => s.write_all(&header(status, 0)).await.unwrap(),
            }
            // Held open until the caller is done, so that the end of the stream is no answer.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        });
        let mut conn = DataConnection::connect(&endpoint, Duration::from_secs(5), None)
            .await
            .unwrap();
        let plan = LocalPlan {
            deadline_ns: u64::MAX,
            ranges: vec![(4096, 8)],
            flags: 0,
        };
        let answer = conn.put_local(&plan, 8, b"request").await;
        drop(conn);
        node.await.unwrap();
        answer
    }

    #[tokio::test]
    async fn an_answer_body_read_with_its_header_or_after_it_is_the_whole_body() {
        let short: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let long: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let exact = vec![9u8; ANSWER_WITH_HEADER];
        for body in [short, long, exact, Vec::new()] {
            let together = put_local_answered(Reply::Together(body.clone())).await;
            assert_eq!(together.unwrap().unwrap(), body);
            let apart = put_local_answered(Reply::Apart(body.clone())).await;
            assert_eq!(apart.unwrap().unwrap(), body);
        }
    }

    #[tokio::test]
    async fn an_answer_longer_than_its_header_announces_is_refused_as_malformed() {
        let answer = put_local_answered(Reply::Announcing {
            len: 10,
            body: vec![1u8; 30],
        })
        .await;
        let e = answer.unwrap_err();
        assert_eq!(e.code, ErrorCode::TRANSFER_FAIL);
        assert!(
            e.message.contains("longer than its header announced"),
            "{e}"
        );
        // A refusal that carries bytes is malformed too.
        let refused = put_local_answered(Reply::Announcing {
            len: 0,
            body: vec![1u8; 3],
        })
        .await;
        assert!(refused.is_err());
    }

    #[tokio::test]
    async fn a_refusal_is_its_status() {
        let answer = put_local_answered(Reply::Refused(DataStatus::LocalRefused)).await;
        assert_eq!(answer.unwrap(), Err(DataStatus::LocalRefused));
    }
}
