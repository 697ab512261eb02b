//! READ and WRITE: segment bytes over the socket, straight between the connection and segment
//! memory under the range lock of a view.

use super::{refuse_write, respond, Conn};
use crate::segment::SegmentMemory;
use moonkv_dataplane::header::{DataStatus, RequestHeader, ResponseHeader};
use std::io;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

pub(super) async fn serve_read(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<bool> {
    let Some(segment) = segment else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id)
            .await
            .map(|()| false);
    };
    let view = match segment.read_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return respond(stream, status, h.request_id).await.map(|()| false),
    };
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: h.length,
    }
    .encode();
    if cfg!(feature = "failpoints") {
        stream.write_all(&ok).await?;
        let half = view.len() / 2;
        stream.write_all(&view[..half]).await?;
        // The caller has really received half of the bytes when the point is passed.
        stream.flush().await?;
        crate::failpoints::hit(crate::failpoints::READ_MID_PAYLOAD);
        return stream.write_all(&view[half..]).await.map(|()| true);
    }
    // Small answers coalesce in the connection's buffer; a large one goes out with its header in
    // one vectored write, straight from segment memory to the socket.
    write_all_vectored(
        stream,
        &mut [io::IoSlice::new(&ok), io::IoSlice::new(&view)],
    )
    .await
    .map(|()| true)
}

/// Writes every byte of `slices`, in order, with as few writes as the stream allows.
pub(super) async fn write_all_vectored(
    stream: &mut Conn,
    mut slices: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = stream.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

pub(super) async fn serve_write(
    stream: &mut Conn,
    h: &RequestHeader,
    segment: Option<Arc<SegmentMemory>>,
) -> io::Result<bool> {
    let checked = match &segment {
        None => Err(DataStatus::UnknownSegment),
        Some(segment) => segment.check(h.address, h.length).map(|_| ()),
    };
    if let Err(status) = checked {
        return refuse_write(stream, h, status).await.map(|()| false);
    }
    let Some(segment) = segment else {
        return Ok(false);
    };
    let mut view = match segment.write_view(h.address, h.length).await {
        Ok(view) => view,
        Err(status) => return refuse_write(stream, h, status).await.map(|()| false),
    };
    // Straight from the socket into segment memory; acknowledged only once all bytes landed.
    // The reader wakes for large chunks of the payload, not every segment.
    let mut mark = super::low_water(stream);
    super::read_into_view(stream, &mut view, h.length, &mut mark).await?;
    drop(mark);
    drop(view);
    respond(stream, DataStatus::Ok, h.request_id)
        .await
        .map(|()| true)
}
