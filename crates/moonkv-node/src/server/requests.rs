//! The request loop of one connection: reads each request's header and grant, checks the
//! grant, dispatches by operation and answers STATS itself.

use super::file::{serve_file_read, serve_file_write};
use super::get_local::serve_get_local;
use super::get_whole::serve_get_whole;
use super::handshake::{attach, greet, refuse_connection};
use super::memory::{serve_read, serve_write};
use super::put_local::serve_put_local;
use super::put_whole::serve_put_whole;
use super::same_host::{read_plan, serve_local};
use super::{refuse, respond, Conn, Served};
use crate::claims::Claims;
use moonkv_dataplane::handshake::HELLO_MAGIC;
use moonkv_dataplane::header::{
    DataOp, DataStatus, RequestHeader, ResponseHeader, MAX_PUT_LOCAL_BODY, REQUEST_LEN,
};
use moonkv_proto::auth::Secret;
use moonkv_proto::grant::{self, Grant, Refusal, GRANT_LEN};
use std::io;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncBufRead, AsyncReadExt, AsyncWriteExt};

/// The request loop of one connection. Answers are buffered while more requests are already
/// waiting, so a pipelined burst is answered with few writes, and flushed before the loop waits
/// for the caller.
pub(super) async fn serve_requests(
    stream: &mut Conn,
    served: &Served,
    ends: Option<crate::same_host::Ends>,
    opening_until: tokio::time::Instant,
) -> io::Result<()> {
    let mut raw = [0u8; REQUEST_LEN];
    if !read_header(stream, &mut raw[..HELLO_MAGIC.len()], 0).await? {
        return Ok(());
    }
    let mut filled = HELLO_MAGIC.len();
    if raw[..HELLO_MAGIC.len()] == HELLO_MAGIC {
        // The hello and proof are due by the connection's opening deadline, however slowly
        // their bytes drip in.
        match tokio::time::timeout_at(opening_until, greet(stream, served)).await {
            Ok(greeted) => greeted?,
            Err(_) => {
                served.metrics.handshake_timed_out();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the data-plane handshake did not finish in time",
                ));
            }
        }
        filled = 0;
    } else if served.access.secret.is_some() {
        // A request without the handshake: answer it by its id, then close.
        served.metrics.refused_handshake();
        read_header(stream, &mut raw, filled).await?;
        let request_id = RequestHeader::decode(&raw).map_or_else(|id| id, |h| h.request_id);
        return refuse_connection(stream, request_id, "request without the handshake").await;
    }
    let mut grant = [0u8; GRANT_LEN];
    let deadlines = served.access.deadlines;
    // The caller process, once it attached this connection for same-host copies.
    let mut attached: Option<crate::same_host::Peer> = None;
    // One ATTACH per connection: a refused one is not retried on the same socket.
    let mut attach_tried = false;
    loop {
        if stream.buffer().is_empty() && !more_waiting(stream)? {
            stream.flush().await?;
        }
        // Waiting for the next request may take long; once it is here, it must keep moving.
        stream.get_mut().get_mut().end_request();
        stream.get_mut().get_mut().set_limit(deadlines.idle);
        let arrived = read_header(stream, &mut raw, filled).await;
        stream.get_mut().get_mut().set_limit(deadlines.io);
        if !arrived? {
            return Ok(());
        }
        filled = 0;
        let header = match RequestHeader::decode(&raw) {
            Ok(h) => h,
            Err(request_id) => {
                respond(stream, DataStatus::BadHeader, request_id).await?;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad data-plane header",
                ));
            }
        };
        let grant_len = usize::from(header.grant_len);
        if grant_len != 0 && grant_len != GRANT_LEN {
            respond(stream, DataStatus::BadHeader, header.request_id).await?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad data-plane grant length",
            ));
        }
        stream.read_exact(&mut grant[..grant_len]).await?;
        if header.op == DataOp::Attach as u8 {
            // Grants nothing by itself: every same-host request still needs its grant.
            if attach_tried {
                served.metrics.refused_attach();
                tracing::debug!("a second ATTACH on one connection refused");
                respond(stream, DataStatus::LocalRefused, header.request_id).await?;
                continue;
            }
            attach_tried = true;
            attached = attach(stream, &header, ends, served).await?;
            continue;
        }
        let whole = header.op == DataOp::PutLocal as u8 || header.op == DataOp::GetLocal as u8;
        let plan = if DataOp::is_local(header.op) || whole {
            match read_plan(stream, &header).await? {
                Ok(plan) => Some(plan),
                Err(status) => {
                    respond(stream, status, header.request_id).await?;
                    continue;
                }
            }
        } else {
            None
        };
        let mut granted_file_size = None;
        // STATS names no range, so it needs no grant: the handshake (when the node has a
        // secret) is what admits it. Standalone clients learn their master from it.
        // PUT_LOCAL and GET_LOCAL carry none either: only a node that checks no grants takes
        // them.
        // PUT_WHOLE and GET_WHOLE neither: a node that checks grants refuses them (PUT_WHOLE
        // after draining its payload).
        let needs_grant = header.op != DataOp::Stats as u8
            && !whole
            && header.op != DataOp::PutWhole as u8
            && header.op != DataOp::GetWhole as u8;
        if let Some(key) = served.access.grant_key.as_ref().filter(|_| needs_grant) {
            match check_grant(key, &served.access.claims, &header, &grant[..grant_len]) {
                Ok(size) => granted_file_size = size,
                Err(refusal) => {
                    tracing::debug!(
                        op = header.op,
                        segment = %header.segment_id,
                        address = header.address,
                        length = header.length,
                        reason = refusal.describe(),
                        "data-plane request refused"
                    );
                    served.metrics.refused_grant(refusal);
                    refuse(stream, &header, DataStatus::Forbidden).await?;
                    continue;
                }
            }
        }
        served.counters.requests.fetch_add(1, Ordering::Relaxed);
        // From its first transfer on (after any wait for a range lock), the request has a time
        // cap: a caller trickling its payload cannot keep the lock past it.
        stream
            .get_mut()
            .get_mut()
            .begin_request(deadlines.request_cap(header.length));
        let id = header.segment_id;
        let started = std::time::Instant::now();
        let ok = match header.op {
            op if op == DataOp::Stats as u8 => serve_stats(stream, &header, served).await?,
            op if op == DataOp::Read as u8 => {
                serve_read(stream, &header, served.segment(id)).await?
            }
            op if op == DataOp::Write as u8 => {
                serve_write(stream, &header, served.segment(id)).await?
            }
            op if DataOp::is_local(op) => {
                let plan = plan.as_ref().expect("read with the header");
                let ok = serve_local(stream, &header, served.segment(id), attached.as_ref(), plan)
                    .await?;
                if ok {
                    served.counters.same_host.fetch_add(1, Ordering::Relaxed);
                }
                ok
            }
            op if whole => {
                let plan = plan.as_ref().expect("read with the header");
                let Some(body) = read_body(stream).await? else {
                    respond(stream, DataStatus::BadHeader, header.request_id).await?;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "same-host request body too long",
                    ));
                };
                let peer = attached.as_ref();
                let ok = if op == DataOp::PutLocal as u8 {
                    serve_put_local(stream, &header, served, peer, plan, &body).await?
                } else {
                    serve_get_local(stream, &header, served, peer, plan, &body).await?
                };
                if ok {
                    served.counters.same_host.fetch_add(1, Ordering::Relaxed);
                }
                ok
            }
            op if op == DataOp::PutWhole as u8 => {
                let Some(body) = read_body(stream).await? else {
                    respond(stream, DataStatus::BadHeader, header.request_id).await?;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "put request body too long",
                    ));
                };
                serve_put_whole(stream, &header, served, &body).await?
            }
            op if op == DataOp::GetWhole as u8 => {
                let Some(body) = read_body(stream).await? else {
                    respond(stream, DataStatus::BadHeader, header.request_id).await?;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "get request body too long",
                    ));
                };
                serve_get_whole(stream, &header, served, &body).await?
            }
            op if op == DataOp::FileRead as u8 => {
                serve_file_read(stream, &header, served.disk(id)).await?
            }
            op if op == DataOp::FileWrite as u8 => {
                serve_file_write(stream, &header, served.disk(id), granted_file_size).await?
            }
            // An unknown op carries no payload by definition, so the stream is still in step.
            _ => respond(stream, DataStatus::BadOp, header.request_id)
                .await
                .map(|()| false)?,
        };
        served
            .metrics
            .served(header.op, ok, header.length, started.elapsed());
    }
}

/// The length-prefixed body of a PUT_LOCAL, GET_LOCAL or PUT_WHOLE; `None` when it is longer than
/// [`MAX_PUT_LOCAL_BODY`] (the stream can then not be kept in step).
async fn read_body(stream: &mut Conn) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len);
    if len > MAX_PUT_LOCAL_BODY {
        return Ok(None);
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Whether the next request's bytes are already here (a pipelined burst): its answers can keep
/// gathering in the connection's buffer instead of going out one small write each. Looks
/// without waiting.
fn more_waiting(stream: &mut Conn) -> io::Result<bool> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(&mut *stream).poll_fill_buf(&mut cx) {
        std::task::Poll::Ready(Ok(buf)) => Ok(!buf.is_empty()),
        std::task::Poll::Ready(Err(e)) => Err(e),
        std::task::Poll::Pending => Ok(false),
    }
}

/// Fills `raw` from byte `filled` on; `Ok(false)` on a clean end of stream before the first
/// byte.
async fn read_header(stream: &mut Conn, raw: &mut [u8], mut filled: usize) -> io::Result<bool> {
    while filled < raw.len() {
        let n = stream.read(&mut raw[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated data-plane header",
            ));
        }
        filled += n;
    }
    Ok(true)
}

/// Checks the request's grant (and, for memory ranges, the claims: see [`crate::claims`]); for
/// file writes returns the granted object size.
fn check_grant(
    secret: &Secret,
    claims: &Claims,
    h: &RequestHeader,
    token: &[u8],
) -> Result<Option<u64>, Refusal> {
    let grant = Grant::open(secret, h.segment_id, token)?;
    let now = moonkv_proto::grant::unix_now_ms();
    match DataOp::as_socket_op(h.op) {
        op if op == DataOp::Read as u8 => {
            claims.admit_range(h.segment_id, &grant, h.address, h.length, false)
        }
        op if op == DataOp::Write as u8 => {
            claims.admit_range(h.segment_id, &grant, h.address, h.length, true)
        }
        op if op == DataOp::FileRead as u8 => {
            grant.permits_file(grant::READ, h.address, now)?;
            if h.length != grant.size {
                return Err(Refusal::OutOfRange);
            }
            Ok(())
        }
        op if op == DataOp::FileWrite as u8 => {
            grant.permits_file(grant::WRITE, h.address, now)?;
            if h.length < grant.size {
                return Err(Refusal::OutOfRange);
            }
            return Ok(Some(grant.size));
        }
        // Unknown ops are answered BAD_OP by the dispatcher.
        _ => Ok(()),
    }
    .map(|()| None)
}

/// Answers a STATS request with the counters as JSON.
async fn serve_stats(stream: &mut Conn, h: &RequestHeader, served: &Served) -> io::Result<bool> {
    if h.length != 0 {
        return respond(stream, DataStatus::BadOp, h.request_id)
            .await
            .map(|()| false);
    }
    let stats = served.stats();
    let body = serde_json::to_vec(&stats).map_err(io::Error::other)?;
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: body.len() as u64,
    };
    stream.write_all(&ok.encode()).await?;
    stream.write_all(&body).await.map(|()| true)
}
