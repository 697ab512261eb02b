//! Frame codec of the client ↔ master protocol.
//!
//! Every frame is a 17-byte header followed by a MessagePack body (all integers big-endian):
//!
//! ```text
//! u32 length      bytes after this field (13 + body length), at most the negotiated maximum
//! u8  kind        1 = request, 2 = response, 3 = hello
//! u64 request_id  chosen by the client; echoed in the response
//! i32 code        request: opcode · response: 0 or a negative ErrorCode · hello: 0
//! ... body        MessagePack
//! ```
//!
//! A response body is the operation's result on code 0, otherwise the error message (a string).

use crate::error::{Error, ErrorCode};
use crate::msg::{Op, Request};
use serde::Serialize;

/// Header length in bytes, including the length field.
pub const HEADER_LEN: usize = 17;
/// Default cap on one frame, in bytes.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A request; `code` is the opcode.
    Request = 1,
    /// A response; `code` is 0 or an error code.
    Response = 2,
    /// The client's first frame.
    Hello = 3,
}

/// Why bytes could not be read as a frame. Any of these closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field exceeds the maximum frame size.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// Accepted maximum.
        max: u32,
    },
    /// The length field is smaller than the header.
    #[error("frame length {0} is shorter than the 13-byte header remainder")]
    TooShort(u32),
    /// The kind byte is not 1, 2 or 3.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
}

/// A frame borrowed from a read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Kind of frame.
    pub kind: FrameKind,
    /// Request id.
    pub request_id: u64,
    /// Opcode or status.
    pub code: i32,
    /// MessagePack body.
    pub body: &'a [u8],
}

/// Tries to take one frame from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((frame, consumed)))` otherwise. The
/// length is checked before the body is awaited, so a hostile length never causes a large buffer.
pub fn decode(buf: &[u8], max_frame_bytes: u32) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge {
            len,
            max: max_frame_bytes,
        });
    }
    if (len as usize) < HEADER_LEN - 4 {
        return Err(FrameError::TooShort(len));
    }
    if buf.len() >= 5 {
        kind_of(buf[4])?;
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let kind = kind_of(buf[4])?;
    let request_id = u64::from_be_bytes(buf[5..13].try_into().expect("8 bytes"));
    let code = i32::from_be_bytes(buf[13..17].try_into().expect("4 bytes"));
    Ok(Some((
        Frame {
            kind,
            request_id,
            code,
            body: &buf[HEADER_LEN..total],
        },
        total,
    )))
}

fn kind_of(byte: u8) -> Result<FrameKind, FrameError> {
    match byte {
        1 => Ok(FrameKind::Request),
        2 => Ok(FrameKind::Response),
        3 => Ok(FrameKind::Hello),
        other => Err(FrameError::UnknownKind(other)),
    }
}

fn begin(out: &mut Vec<u8>, kind: FrameKind, request_id: u64, code: i32) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind as u8);
    out.extend_from_slice(&request_id.to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    start
}

fn finish(out: &mut [u8], start: usize) {
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Appends a request frame to `out`.
pub fn encode_request(out: &mut Vec<u8>, request_id: u64, request: &Request) -> Result<(), Error> {
    let start = begin(
        out,
        FrameKind::Request,
        request_id,
        request.op() as u16 as i32,
    );
    if let Err(e) = request.encode_body(out) {
        out.truncate(start);
        return Err(Error::new(ErrorCode::SERIALIZE_FAIL, e.to_string()));
    }
    finish(out, start);
    Ok(())
}

/// Appends a frame of `kind` carrying `body` serialized as MessagePack.
pub fn encode_value<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    kind: FrameKind,
    request_id: u64,
    code: i32,
    body: &T,
) -> Result<(), Error> {
    let start = begin(out, kind, request_id, code);
    if let Err(e) = rmp_serde::encode::write(out, body) {
        out.truncate(start);
        return Err(Error::new(ErrorCode::SERIALIZE_FAIL, e.to_string()));
    }
    finish(out, start);
    Ok(())
}

/// Appends a success response.
pub fn encode_ok<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    request_id: u64,
    value: &T,
) -> Result<(), Error> {
    encode_value(out, FrameKind::Response, request_id, 0, value)
}

/// Appends an error response carrying the code and message.
pub fn encode_err(out: &mut Vec<u8>, request_id: u64, error: &Error) {
    let code = match error.code {
        ErrorCode::OK => ErrorCode::INTERNAL_ERROR.as_i32(),
        c => c.as_i32(),
    };
    encode_value(out, FrameKind::Response, request_id, code, &*error.message)
        .expect("a string always encodes");
}

/// Decodes the request carried by a request frame.
pub fn decode_request(frame: &Frame<'_>) -> Result<Request, Error> {
    let op = u16::try_from(frame.code)
        .ok()
        .and_then(Op::from_u16)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::NOT_SUPPORTED,
                format!("unknown opcode {}", frame.code),
            )
        })?;
    Request::decode(op, frame.body).map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("malformed {op:?} request body: {e}"),
        )
    })
}

/// Decodes the result carried by a response frame.
pub fn decode_response<T: serde::de::DeserializeOwned>(frame: &Frame<'_>) -> Result<T, Error> {
    if frame.code == 0 {
        rmp_serde::from_slice(frame.body).map_err(|e| {
            Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!("malformed response body: {e}"),
            )
        })
    } else {
        let message: String = rmp_serde::from_slice(frame.body).unwrap_or_default();
        Err(Error::new(ErrorCode::from_i32(frame.code), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::KeyRequest;
    use proptest::prelude::*;

    #[test]
    fn request_frame_has_documented_layout() {
        let req = Request::ExistKey(KeyRequest {
            tenant: "".into(),
            key: "a".into(),
        });
        let mut out = Vec::new();
        encode_request(&mut out, 7, &req).unwrap();
        // body: fixarray(2) [fixstr "", fixstr "a"]
        let expected: Vec<u8> = vec![
            0, 0, 0, 17, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 10, 0x92, 0xa0, 0xa1, b'a',
        ];
        assert_eq!(out, expected);
        let (frame, used) = decode(&out, 1024).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(decode_request(&frame).unwrap(), req);
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut out = Vec::new();
        encode_ok(&mut out, 1, &true).unwrap();
        for cut in 0..out.len() {
            assert_eq!(decode(&out[..cut], 1024).unwrap(), None);
        }
    }

    #[test]
    fn oversized_and_malformed_headers_are_refused() {
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], 1024),
            Err(FrameError::TooLarge {
                len: u32::MAX,
                max: 1024
            })
        );
        assert_eq!(decode(&[0, 0, 0, 3], 1024), Err(FrameError::TooShort(3)));
        assert_eq!(
            decode(&[0, 0, 0, 13, 9], 1024),
            Err(FrameError::UnknownKind(9))
        );
    }

    #[test]
    fn unknown_opcode_and_bad_body_are_clean_errors() {
        let mut out = Vec::new();
        encode_value(&mut out, FrameKind::Request, 1, 999, &1u8).unwrap();
        let (frame, _) = decode(&out, 1024).unwrap().unwrap();
        assert_eq!(
            decode_request(&frame).unwrap_err().code,
            ErrorCode::NOT_SUPPORTED
        );
        out.clear();
        encode_value(
            &mut out,
            FrameKind::Request,
            1,
            Op::PutStart as i32,
            &"garbage",
        )
        .unwrap();
        let (frame, _) = decode(&out, 1024).unwrap().unwrap();
        assert_eq!(
            decode_request(&frame).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
    }

    #[test]
    fn error_responses_round_trip() {
        let mut out = Vec::new();
        encode_err(
            &mut out,
            3,
            &Error::new(ErrorCode::OBJECT_NOT_FOUND, "gone"),
        );
        let (frame, _) = decode(&out, 1024).unwrap().unwrap();
        let err = decode_response::<bool>(&frame).unwrap_err();
        assert_eq!(err.code, ErrorCode::OBJECT_NOT_FOUND);
        assert_eq!(err.message, "gone");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((frame, used))) = decode(&bytes, 1 << 16) {
                prop_assert!(used <= bytes.len());
                if frame.kind == FrameKind::Request {
                    let _ = decode_request(&frame);
                }
                let _ = decode_response::<Vec<crate::ReplicaDescriptor>>(&frame);
            }
        }
    }
}
