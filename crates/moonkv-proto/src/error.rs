//! Error codes with upstream-compatible numbers, and the error type every layer returns.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

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

/// An error with its stable code and a sentence an operator can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Error {
    /// Stable, upstream-compatible code.
    pub code: ErrorCode,
    /// What went wrong, in plain words.
    pub message: Cow<'static, str>,
}

impl Error {
    /// Builds an error with a message.
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Self {
            code,
            message: Cow::Borrowed(""),
        }
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
}
