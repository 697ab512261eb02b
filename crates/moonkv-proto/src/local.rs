//! A master in the caller's own process (`moonkv up` runs one beside its node): requests go to
//! it as calls, not through a socket, and are answered exactly as on a connection of a node,
//! but as values: nothing is encoded or decoded on the way.

use crate::msg::Request;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;

/// An answer still being worked on, and the request it answers, given back.
pub type AnswerFuture = Pin<Box<dyn Future<Output = (Request, Answer)> + Send>>;

/// What the master in this process answered.
pub enum Answer {
    /// The value the master's engine answered (`T` of the operation's `Result<T>`), or its
    /// error.
    Value(crate::Result<Box<dyn Any + Send>>),
    /// An encoded answer frame (`crate::frame`): for the few operations the master answers
    /// only that way.
    Frame(Vec<u8>),
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Value(Ok(_)) => f.write_str("Value(Ok(..))"),
            Answer::Value(Err(e)) => write!(f, "Value(Err({e}))"),
            Answer::Frame(frame) => write!(f, "Frame({} bytes)", frame.len()),
        }
    }
}

/// Like [`AnswerFuture`], with what the answer left to do ([`InProcessMaster::answer_then`]).
pub type AnswerThenFuture =
    Pin<Box<dyn Future<Output = (Request, Answer, Option<Box<dyn Send>>)> + Send>>;

/// A master reachable by a call in this process.
pub trait InProcessMaster: Send + Sync + std::fmt::Debug {
    /// Answers `request` as the master answers it on a node's connection (admission, space
    /// waits, fences), and gives the request back.
    fn answer(&self, request: Request) -> AnswerFuture;

    /// Like [`InProcessMaster::answer`], but what the answer leaves to do that its caller
    /// need not wait for (sending the events it published) is done when the third value is
    /// dropped: a node drops it once it passed the answer on. By default there is nothing.
    fn answer_then(&self, request: Request) -> AnswerThenFuture {
        let answer = self.answer(request);
        Box::pin(async move {
            let (request, answer) = answer.await;
            (request, answer, None)
        })
    }
}

impl Answer {
    /// The answer as the operation's answer type `T`: a value of another type, or a frame
    /// that does not decode as one, is an `INTERNAL_ERROR`.
    pub fn take<T: serde::de::DeserializeOwned + 'static>(self) -> crate::Result<T> {
        match self {
            Answer::Value(Ok(value)) => value.downcast::<T>().map(|v| *v).map_err(|_| {
                crate::Error::new(
                    crate::ErrorCode::INTERNAL_ERROR,
                    format!(
                        "the in-process master answered another type than {}",
                        std::any::type_name::<T>()
                    ),
                )
            }),
            Answer::Value(Err(e)) => Err(e),
            Answer::Frame(frame) => decode_answer(&frame),
        }
    }
}

/// Decodes an answer frame.
fn decode_answer<T: serde::de::DeserializeOwned>(frame: &[u8]) -> crate::Result<T> {
    match crate::frame::decode(frame, u32::MAX) {
        Ok(Some((frame, _))) => crate::frame::decode_response(&frame),
        _ => Err(crate::Error::new(
            crate::ErrorCode::INTERNAL_ERROR,
            "the in-process master gave a malformed answer",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn an_answer_is_taken_as_its_type_and_only_as_it() {
        let answer = Answer::Value(Ok(Box::new(7u64)));
        assert_eq!(answer.take::<u64>().unwrap(), 7);
        let answer = Answer::Value(Ok(Box::new(7u64)));
        let e = answer.take::<String>().unwrap_err();
        assert_eq!(e.code, ErrorCode::INTERNAL_ERROR);
        let answer = Answer::Value(Err(crate::Error::new(ErrorCode::OBJECT_NOT_FOUND, "gone")));
        assert_eq!(
            answer.take::<u64>().unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        let mut frame = Vec::new();
        crate::frame::encode_ok(&mut frame, 0, &9u64).unwrap();
        assert_eq!(Answer::Frame(frame).take::<u64>().unwrap(), 9);
        let answer = Answer::Frame(vec![1, 2, 3]);
        assert_eq!(
            answer.take::<u64>().unwrap_err().code,
            ErrorCode::INTERNAL_ERROR
        );
    }
}
