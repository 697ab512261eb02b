//! The node side of the data plane: accepts connections and serves reads and writes of the
//! segments in its table, one request at a time per connection.

use super::header::{DataOp, DataStatus, RequestHeader, ResponseHeader, REQUEST_LEN};
use crate::node::segment::SegmentMemory;
use moonkv_proto::SegmentId;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A refused write at most this long has its payload read and discarded so the connection stays
/// usable; a longer one is answered and the connection closed.
pub const MAX_DRAIN_BYTES: u64 = 64 << 20;

/// Reads smaller than this are sent with their header in one write.
const COALESCE_BYTES: usize = 16 << 10;

/// Segments a node serves, by id.
pub(crate) type SegmentTable = Arc<RwLock<HashMap<SegmentId, Arc<SegmentMemory>>>>;

/// A running data-plane listener.
pub(crate) struct DataServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl DataServer {
    /// Starts serving `table` on an already bound listener.
    pub fn spawn(listener: TcpListener, table: SegmentTable) -> io::Result<DataServer> {
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, table, stopped));
        Ok(DataServer {
            local_addr,
            stop,
            task,
        })
    }

    /// Address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every connection.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    table: SegmentTable,
    mut stopped: watch::Receiver<bool>,
) {
    // Dropping the set at the end aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let table = table.clone();
                    connections.spawn(async move {
                        if let Err(e) = serve_connection(stream, table).await {
                            tracing::debug!(%peer, error = %e, "data-plane connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "data-plane accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Serves one connection until the peer closes it or sends something unrecoverable.
pub(crate) async fn serve_connection(mut stream: TcpStream, table: SegmentTable) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut raw = [0u8; REQUEST_LEN];
    loop {
        if !read_header(&mut stream, &mut raw).await? {
            return Ok(());
        }
        let header = match RequestHeader::decode(&raw) {
            Ok(h) => h,
            Err(request_id) => {
                respond(&mut stream, DataStatus::BadHeader, request_id).await?;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad data-plane header",
                ));
            }
        };
        let segment = table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&header.segment_id)
            .cloned();
        match header.op {
            op if op == DataOp::Read as u8 => serve_read(&mut stream, &header, segment).await?,
            op if op == DataOp::Write as u8 => serve_write(&mut stream, &header, segment).await?,
            // An unknown op carries no payload by definition, so the stream is still in step.
            _ => respond(&mut stream, DataStatus::BadOp, header.request_id).await?,
        }
    }
}

/// Fills `raw`; `Ok(false)` on a clean end of stream before the first byte.
async fn read_header(stream: &mut TcpStream, raw: &mut [u8; REQUEST_LEN]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < REQUEST_LEN {
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

async fn respond(stream: &mut TcpStream, status: DataStatus, request_id: u64) -> io::Result<()> {
    stream
        .write_all(
            &ResponseHeader {
                status,
                request_id,
                length: 0,
            }
            .encode(),
        )
        .await
}

async fn serve_read(
    stream: &mut TcpStream,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<()> {
    let Some(segment) = segment else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id).await;
    };
    let view = match segment.read_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return respond(stream, status, h.request_id).await,
    };
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: h.length,
    }
    .encode();
    if view.len() <= COALESCE_BYTES {
        let mut out = Vec::with_capacity(ok.len() + view.len());
        out.extend_from_slice(&ok);
        out.extend_from_slice(&view);
        stream.write_all(&out).await
    } else {
        stream.write_all(&ok).await?;
        // Straight from segment memory to the socket.
        stream.write_all(&view).await
    }
}

async fn serve_write(
    stream: &mut TcpStream,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<()> {
    let checked = match &segment {
        None => Err(DataStatus::UnknownSegment),
        Some(segment) => segment.check(h.address, h.length).map(|_| ()),
    };
    if let Err(status) = checked {
        return refuse_write(stream, h, status).await;
    }
    let Some(segment) = segment else {
        return Ok(());
    };
    let mut view = match segment.write_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return refuse_write(stream, h, status).await,
    };
    // Straight from the socket into segment memory; acknowledged only once all bytes landed.
    stream.read_exact(&mut view).await?;
    drop(view);
    respond(stream, DataStatus::Ok, h.request_id).await
}

/// Answers a refused write, keeping the stream in step by discarding its payload when that is
/// cheap enough; otherwise answers and closes.
async fn refuse_write(
    stream: &mut TcpStream,
    h: &RequestHeader,
    status: DataStatus,
) -> io::Result<()> {
    if h.length > MAX_DRAIN_BYTES {
        respond(stream, DataStatus::TooLarge, h.request_id).await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("refused write of {} bytes ({status:?})", h.length),
        ));
    }
    let mut scratch = [0u8; 16 * 1024];
    let mut left = h.length;
    while left > 0 {
        let take = left.min(scratch.len() as u64) as usize;
        stream.read_exact(&mut scratch[..take]).await?;
        left -= take as u64;
    }
    respond(stream, status, h.request_id).await
}
