//! What PUT_LOCAL and GET_LOCAL (requests the node serves whole) share: the key limit, the
//! master's batch answers as one result per key, the answer to the caller, and looking at the
//! caller once per step of copying across all the keys of one request.

use super::same_host::LOCAL_STEP;
use super::Conn;
use moonkv_dataplane::header::{DataStatus, RequestHeader, ResponseHeader};
use moonkv_proto::{Error, ErrorCode, ItemResult};
use std::io;
use tokio::io::AsyncWriteExt;

/// Most keys one request served whole may carry.
pub(crate) const MAX_KEYS: usize = 4096;

/// A batch answer of the master as one result per key (`n` of them): the whole call's error
/// for every key, or an error for every key when the count is off.
pub(super) fn per_key<T>(
    answer: Result<Vec<ItemResult<T>>, Error>,
    n: usize,
) -> Vec<Result<T, Error>> {
    match answer {
        Ok(items) if items.len() == n => items.into_iter().map(|i| i.0).collect(),
        Ok(items) => {
            let why = format!("the master answered {} items for {n} keys", items.len());
            (0..n)
                .map(|_| Err(Error::new(ErrorCode::INTERNAL_ERROR, why.clone())))
                .collect()
        }
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
}

/// Answers a request the node served whole with one result per key; `Ok(true)` when every key
/// succeeded.
pub(super) async fn answer_items<T: serde::Serialize>(
    stream: &mut Conn,
    h: &RequestHeader,
    results: &[ItemResult<T>],
) -> io::Result<bool> {
    let ok = results.iter().all(|r| r.0.is_ok());
    let answer = rmp_serde::to_vec_named(results).map_err(io::Error::other)?;
    let header = ResponseHeader {
        status: DataStatus::Ok,
        request_id: h.request_id,
        length: answer.len() as u64,
    };
    stream.write_all(&header.encode()).await?;
    stream.write_all(&answer).await.map(|()| ok)
}

/// Looks at the caller (deadline, process, connection) once per [`LOCAL_STEP`] copied for one
/// request, not once per key, so a batch of small keys costs no more system calls than one
/// object of its size.
pub(super) struct Looks(usize);

impl Looks {
    /// The first copy looks first.
    pub(super) fn new() -> Looks {
        Looks(usize::MAX)
    }

    /// Before copying `bytes` more: whether the caller still waits for them (the caller is
    /// looked at only once a step's worth was copied since the last look).
    pub(super) fn still_waiting(
        &mut self,
        peer: &crate::same_host::Peer,
        deadline_ns: u64,
        bytes: usize,
    ) -> bool {
        if self.0 >= LOCAL_STEP {
            if !peer.waiting(deadline_ns) {
                return false;
            }
            self.0 = 0;
        }
        self.0 = self.0.saturating_add(bytes);
        true
    }
}
