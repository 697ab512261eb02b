//! A master in the caller's own process (`moonkv up` runs one beside its node): requests go to
//! it as calls, not through a socket, and are answered exactly as on a connection of a node.

use crate::msg::Request;
use std::future::Future;
use std::pin::Pin;

/// An answer still being worked on: the encoded answer frame (`crate::frame`).
pub type AnswerFuture = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;

/// A master reachable by a call in this process.
pub trait InProcessMaster: Send + Sync + std::fmt::Debug {
    /// Answers `request` as the master answers it on a node's connection (admission, space
    /// waits, fences): its encoded answer frame.
    fn answer(&self, request: Request) -> AnswerFuture;
}

/// Decodes an answer frame of [`InProcessMaster::answer`].
pub fn decode_answer<T: serde::de::DeserializeOwned>(frame: &[u8]) -> crate::Result<T> {
    match crate::frame::decode(frame, u32::MAX) {
        Ok(Some((frame, _))) => crate::frame::decode_response(&frame),
        _ => Err(crate::Error::new(
            crate::ErrorCode::INTERNAL_ERROR,
            "the in-process master gave a malformed answer",
        )),
    }
}
