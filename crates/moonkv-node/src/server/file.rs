//! FILE_READ and FILE_WRITE: the disk tier's replica files, streamed in bounded steps with
//! their checksum verified on the way out, and written only once synced under their name.

use super::{refuse_write, respond, Conn};
use crate::disk::{format::MAX_TENANT_LEN, with_cause, DiskFault, DiskStore, WriteError};
use moonkv_dataplane::header::{DataStatus, FileMeta, RequestHeader, ResponseHeader};
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The data-plane answer to a disk fault.
fn fault_status(fault: DiskFault) -> DataStatus {
    match fault {
        DiskFault::NotFound => DataStatus::FileNotFound,
        DiskFault::Corrupt => DataStatus::FileCorrupt,
        DiskFault::Full => DataStatus::DiskFull,
        DiskFault::ReadFailed => DataStatus::FileReadFail,
        DiskFault::WriteFailed => DataStatus::FileWriteFail,
    }
}

/// Streams a disk file: its header and length are verified first (a bad one is refused with
/// nothing sent), then the payload goes out in steps of [`FILE_STEP`] bytes with its checksum
/// computed on the way, and a one-byte trailer says whether it matched (or the file failed
/// mid-read, the rest then zero-filled so the connection stays in step). A 1 GiB file never
/// needs more than one step of node memory.
pub(super) async fn serve_file_read(
    stream: &mut Conn,
    h: &RequestHeader,
    disk: Option<&Arc<DiskStore>>,
) -> io::Result<bool> {
    let Some(disk) = disk else {
        return respond(stream, DataStatus::UnknownSegment, h.request_id)
            .await
            .map(|()| false);
    };
    let mut file = match disk.open_stream(h.address, h.length).await {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(file = h.address, error = %with_cause(&e), "disk file read refused");
            return respond(stream, fault_status(e.fault()), h.request_id)
                .await
                .map(|()| false);
        }
    };
    let ok = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: h.length,
    }
    .encode();
    stream.write_all(&ok).await?;
    let mut buf = vec![0u8; FILE_STEP.min(h.length as usize).max(1)];
    let mut failed = None;
    while file.remaining() > 0 {
        match file.next(&mut buf).await {
            Ok(chunk) => stream.write_all(chunk).await?,
            Err(e) => {
                tracing::warn!(file = h.address, error = %with_cause(&e), "disk file read failed mid-stream");
                failed = Some(DataStatus::FileReadFail);
                break;
            }
        }
    }
    if failed.is_some() {
        let mut left = file.remaining();
        buf.fill(0);
        while left > 0 {
            let take = left.min(buf.len() as u64) as usize;
            stream.write_all(&buf[..take]).await?;
            left -= take as u64;
        }
    }
    let trailer = match failed {
        Some(status) => status,
        None => match file.finish() {
            Ok(()) => DataStatus::Ok,
            Err(e) => fault_status(e.fault()),
        },
    };
    stream
        .write_all(&[trailer as u8])
        .await
        .map(|()| trailer == DataStatus::Ok)
}

/// Bytes of a disk file sent per step.
const FILE_STEP: usize = 1 << 20;

/// Writes a disk file from the payload; acknowledged once the file is synced under its name.
/// With a grant, `granted_size` is the object size it allows.
pub(super) async fn serve_file_write(
    stream: &mut Conn,
    h: &RequestHeader,
    disk: Option<&Arc<DiskStore>>,
    granted_size: Option<u64>,
) -> io::Result<bool> {
    let Some(disk) = disk else {
        return refuse_write(stream, h, DataStatus::UnknownSegment)
            .await
            .map(|()| false);
    };
    if h.length < FileMeta::FIXED_LEN as u64 {
        return refuse_write(stream, h, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    }
    let mut fixed = [0u8; FileMeta::FIXED_LEN];
    stream.read_exact(&mut fixed).await?;
    let rest = h.length - FileMeta::FIXED_LEN as u64;
    let tenant_len = u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]) as u64;
    let key_len = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]) as u64;
    let sane = tenant_len <= MAX_TENANT_LEN as u64
        && key_len <= moonkv_proto::MAX_KEY_LEN as u64
        && tenant_len + key_len < rest
        && h.address != 0;
    if !sane {
        let skipped = RequestHeader { length: rest, ..*h };
        return refuse_write(stream, &skipped, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    }
    let mut text = vec![0u8; (tenant_len + key_len) as usize];
    stream.read_exact(&mut text).await?;
    let size = rest - tenant_len - key_len;
    if granted_size.is_some_and(|granted| granted != size) {
        let skipped = RequestHeader { length: size, ..*h };
        return refuse_write(stream, &skipped, DataStatus::Forbidden)
            .await
            .map(|()| false);
    }
    let (tenant, key) = text.split_at(tenant_len as usize);
    let (Ok(tenant), Ok(key)) = (std::str::from_utf8(tenant), std::str::from_utf8(key)) else {
        let skipped = RequestHeader { length: size, ..*h };
        return refuse_write(stream, &skipped, DataStatus::FileWriteFail)
            .await
            .map(|()| false);
    };
    match disk.write_from(h.address, tenant, key, size, stream).await {
        Ok(()) => respond(stream, DataStatus::Ok, h.request_id)
            .await
            .map(|()| true),
        Err(WriteError::Disk(e)) => {
            tracing::debug!(file = h.address, error = %with_cause(&e), "disk file write refused");
            respond(stream, fault_status(e.fault()), h.request_id)
                .await
                .map(|()| false)
        }
        Err(WriteError::Payload(e)) => Err(e),
    }
}
