//! Error codes with upstream-compatible numbers, and the error type every layer returns.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

macro_rules! error_codes {
    ($($name:ident = $value:literal,)*) => {
        /// Result codes. Numbers and names match the upstream store, so tools keyed on them keep working.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, missing_docs)]
        #[repr(i32)]
        pub enum ErrorCode {
            $($name = $value,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The numeric value carried on the wire.
            pub fn as_i32(self) -> i32 {
                self as i32
            }

            /// Maps a wire number back; unknown numbers become `UNKNOWN_ERROR`.
            pub fn from_i32(value: i32) -> ErrorCode {
                match value {
                    $($value => ErrorCode::$name,)*
                    _ => ErrorCode::UNKNOWN_ERROR,
                }
            }

            /// The upstream name, e.g. `OBJECT_NOT_FOUND`.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => stringify!($name),)*
                }
            }
        }
    };
}

error_codes! {
    OK = 0,
    INTERNAL_ERROR = -1,
    BUFFER_OVERFLOW = -10,
    SHARD_INDEX_OUT_OF_RANGE = -100,
    SEGMENT_NOT_FOUND = -101,
    SEGMENT_ALREADY_EXISTS = -102,
    CLIENT_NOT_FOUND = -103,
    NO_AVAILABLE_HANDLE = -200,
    INVALID_VERSION = -300,
    INVALID_KEY = -400,
    WRITE_FAIL = -500,
    INVALID_PARAMS = -600,
    ILLEGAL_CLIENT = -601,
    INVALID_WRITE = -700,
    INVALID_READ = -701,
    INVALID_REPLICA = -702,
    REPLICA_IS_NOT_READY = -703,
    OBJECT_NOT_FOUND = -704,
    OBJECT_ALREADY_EXISTS = -705,
    OBJECT_HAS_LEASE = -706,
    LEASE_EXPIRED = -707,
    OBJECT_HAS_REPLICATION_TASK = -708,
    OBJECT_NO_REPLICATION_TASK = -709,
    REPLICA_NOT_FOUND = -710,
    REPLICA_ALREADY_EXISTS = -711,
    REPLICA_IS_GONE = -712,
    REPLICA_NOT_IN_LOCAL_MEMORY = -713,
    OBJECT_REPLICA_BUSY = -714,
    TRANSFER_FAIL = -800,
    CHECKSUM_MISMATCH = -801,
    RPC_FAIL = -900,
    RPC_TIMEOUT = -901,
    UNAVAILABLE_IN_CURRENT_STATUS = -1010,
    UNAVAILABLE_IN_CURRENT_MODE = -1011,
    NOT_SUPPORTED = -1012,
    FILE_NOT_FOUND = -1100,
    FILE_OPEN_FAIL = -1101,
    FILE_READ_FAIL = -1102,
    FILE_WRITE_FAIL = -1103,
    FILE_INVALID_BUFFER = -1104,
    FILE_LOCK_FAIL = -1105,
    FILE_INVALID_HANDLE = -1106,
    UNABLE_OFFLOAD = -1300,
    TASK_NOT_FOUND = -1400,
    SERIALIZE_FAIL = -1501,
    DESERIALIZE_FAIL = -1502,
    TENANT_QUOTA_EXCEEDED = -1700,
    TENANT_NOT_REGISTERED = -1701,
    TENANT_NOT_EMPTY = -1702,
    UNKNOWN_ERROR = -9999,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_i32(self.as_i32())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        i32::deserialize(d).map(ErrorCode::from_i32)
    }
}

/// What caused an [`Error`]: any error, shared so that [`Error`] stays `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// An error with its stable code, a sentence an operator can act on, and what caused it.
///
/// `Display` prints `CODE: message`, followed by `: cause` when there is one, because an
/// operator reads one line. As the cause is already printed, [`std::error::Error::source`]
/// continues below it (the cause's own source), so a chain printer names each error once;
/// [`Error::cause`] and [`Error::find_cause`] reach the cause itself (its `io::ErrorKind`, for
/// instance). Equality compares the code and the message only.
#[derive(Clone, Debug)]
pub struct Error {
    /// Stable, upstream-compatible code.
    pub code: ErrorCode,
    /// What went wrong, in plain words.
    pub message: Cow<'static, str>,
    /// The lower-level error this one wraps, if any.
    pub cause: Option<Cause>,
}

impl Error {
    /// Builds an error with a message.
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            cause: None,
        }
    }

    /// Builds an error that says what was being done (`context`) and keeps what failed.
    pub fn caused_by(
        code: ErrorCode,
        context: impl Into<Cow<'static, str>>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            code,
            message: context.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// The error this one wraps, if any.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }

    /// The wrapped error of type `E`, searched along the whole cause chain.
    pub fn find_cause<E: std::error::Error + 'static>(&self) -> Option<&E> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = self
            .cause
            .as_deref()
            .map(|cause| cause as &(dyn std::error::Error + 'static));
        while let Some(error) = next {
            if let Some(found) = error.downcast_ref::<E>() {
                return Some(found);
            }
            // A wrapped moonkv error's `source` skips its printed cause; step into the cause.
            next = match error.downcast_ref::<Error>() {
                Some(inner) => inner
                    .cause
                    .as_deref()
                    .map(|cause| cause as &(dyn std::error::Error + 'static)),
                None => error.source(),
            };
        }
        None
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().and_then(|cause| cause.source())
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for Error {}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Self::new(code, "")
    }
}

/// Result alias used across moonkv.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_upstream_numbers() {
        assert_eq!(ErrorCode::OBJECT_NOT_FOUND.as_i32(), -704);
        assert_eq!(ErrorCode::TENANT_NOT_EMPTY.as_i32(), -1702);
        assert_eq!(ErrorCode::from_i32(-901), ErrorCode::RPC_TIMEOUT);
        assert_eq!(ErrorCode::from_i32(12345), ErrorCode::UNKNOWN_ERROR);
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i32(code.as_i32()), *code);
        }
    }

    #[test]
    fn an_error_keeps_its_cause_and_names_it() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = Error::caused_by(ErrorCode::TRANSFER_FAIL, "connect to 10.0.0.1:7000", io);
        assert_eq!(
            error.to_string(),
            "TRANSFER_FAIL: connect to 10.0.0.1:7000: refused"
        );
        let cause = error.cause().expect("a cause");
        assert_eq!(
            cause.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        // The cause is printed already: the chain continues below it, never repeating it.
        assert!(std::error::Error::source(&error).is_none());
        let outer = Error::caused_by(ErrorCode::RPC_FAIL, "put k", error.clone());
        assert_eq!(
            outer.to_string(),
            "RPC_FAIL: put k: TRANSFER_FAIL: connect to 10.0.0.1:7000: refused"
        );
        let mut chain = Vec::new();
        let mut next = std::error::Error::source(&outer);
        while let Some(e) = next {
            chain.push(e.to_string());
            next = e.source();
        }
        assert!(chain.is_empty(), "{chain:?}");
        assert_eq!(
            outer.find_cause::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        assert_eq!(outer.clone(), outer);
        assert!(Error::new(ErrorCode::RPC_FAIL, "x")
            .find_cause::<std::io::Error>()
            .is_none());
    }
}
