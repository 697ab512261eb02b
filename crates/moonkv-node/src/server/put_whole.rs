//! PUT_WHOLE: a put taken whole by the node over the socket (`docs/data-plane.md`, *Puts
//! through the node*). The caller sends its keys and sizes, then the bytes; the node starts the
//! write at its master as that caller, reads each key's bytes from the connection straight
//! into the segment the master placed it in, and ends it. The caller's put is one round trip
//! instead of three (start, bytes, end); in `moonkv up` the start and end never leave the
//! node's process, and the start runs while the bytes are still on their way.
//!
//! Taken by a node that checks no secrets and no grants, as PUT_LOCAL. A key whose replicas
//! the master placed anywhere but this node's memory segments has its bytes read and dropped,
//! is revoked and answered `NOT_SUPPORTED`, so the caller writes it the usual way. A
//! connection that breaks mid-payload ends nothing: every key it started is revoked.

use super::put_local::{decode, finish, not_copied, start};
use super::whole::{answer_items_then, Target};
use super::{refuse_write, Conn, Served, MAX_DRAIN_BYTES};
use moonkv_dataplane::header::{DataStatus, RequestHeader};
use moonkv_dataplane::low_water::read_payload;
use moonkv_proto::{Error, ErrorCode};
use std::io;
use tokio::io::AsyncReadExt;

/// Serves one PUT_WHOLE whose body was read; its payload (`h.length` bytes) is next on the
/// stream.
pub(super) async fn serve_put_whole(
    stream: &mut Conn,
    h: &RequestHeader,
    served: &Served,
    body: &[u8],
) -> io::Result<bool> {
    let Some(master) = served.put_whole_master() else {
        return refuse_write(stream, h, DataStatus::LocalRefused)
            .await
            .map(|()| false);
    };
    // Larger puts are not read on one connection (the caller splits them), and a refused one
    // could not be drained.
    if h.length > MAX_DRAIN_BYTES {
        return refuse_write(stream, h, DataStatus::TooLarge)
            .await
            .map(|()| false);
    }
    let Some((upsert, request)) = decode(body, h.length) else {
        return refuse_write(stream, h, DataStatus::OutOfRange)
            .await
            .map(|()| false);
    };
    let mut started = start(served, master, upsert, request).await;
    let targets = std::mem::take(&mut started.targets);
    if let Err(e) = receive(stream, &started.sizes, &targets, &mut started.results).await {
        // Whatever landed of the key being read is not the caller's value.
        started.give_up(|| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                "the connection broke before the put's bytes were all in; revoked",
            )
        });
        drop(finish(master, started).await);
        return Err(e);
    }
    let (results, events) = finish(master, started).await;
    answer_items_then(stream, h, &results, events).await
}

/// Reads the payload, key by key in the order of `sizes`: a key placed here (in `targets`,
/// in key order) straight into its replica; any other key's bytes into nothing. A replica that
/// cannot be written fails its key in `results`.
async fn receive(
    stream: &mut Conn,
    sizes: &[u64],
    targets: &[Target],
    results: &mut [Result<(), Error>],
) -> io::Result<()> {
    let mut next = 0;
    // The reader wakes for large chunks of the payload, not every segment: the mark follows
    // the payload's bytes still to come (`left`), and is the default for bytes read otherwise.
    let mut mark = super::low_water(stream);
    let mut left: u64 = sizes.iter().sum();
    for (key, &size) in sizes.iter().enumerate() {
        let first = next;
        while next < targets.len() && targets[next].key == key {
            next += 1;
        }
        let here = &targets[first..next];
        let at = left;
        left -= size;
        if here.is_empty() || results[key].is_err() {
            mark.want(1);
            skip(stream, size).await?;
            continue;
        }
        if let [only] = here {
            let mut view = match only.segment.write_view(only.address, size).await {
                Ok(view) => view,
                Err(status) => {
                    results[key] = Err(not_copied(status));
                    mark.want(1);
                    skip(stream, size).await?;
                    continue;
                }
            };
            super::read_into_view(stream, &mut view, at, &mut mark).await?;
            continue;
        }
        // Several replicas on this node: the bytes once, then into each (one range locked
        // at a time).
        let mut bytes = vec![0u8; size as usize];
        read_payload(stream, &mut bytes, at, &mut mark).await?;
        for target in here {
            match target.segment.write_view(target.address, size).await {
                Ok(mut view) => view.copy_from_slice(&bytes),
                Err(status) => results[key] = Err(not_copied(status)),
            }
        }
    }
    Ok(())
}

/// Reads `len` bytes of the stream and drops them.
async fn skip(stream: &mut Conn, len: u64) -> io::Result<()> {
    let copied = tokio::io::copy(&mut (&mut *stream).take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
