//! [`IndexerError`]: every failure the indexer reports, each with the HTTP status it answers.

use thiserror::Error;

/// Errors of the indexer library and its HTTP API.
#[derive(Debug, Error)]
pub enum IndexerError {
    /// The request is malformed or names something invalid; nothing changed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request body is in a content type the API does not speak.
    #[error("unsupported content type {0:?}; use application/json or application/msgpack")]
    UnsupportedContentType(String),
    /// The request conflicts with what is registered (a second profile for one partition, a
    /// source registered twice).
    #[error("conflict: {0}")]
    Conflict(String),
    /// Nothing matches what the request names (an unknown source, partition or instance).
    #[error("not found: {0}")]
    NotFound(String),
    /// A ZMQ socket failed.
    #[error("zmq {op} on {endpoint}: {source}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The endpoint involved.
        endpoint: String,
        /// The libzmq error.
        source: zmq::Error,
    },
    /// The moonkv event library refused something (endpoint, snapshot address).
    #[error(transparent)]
    Events(#[from] moonkv_events::EventsError),
    /// Reading the static sources file failed.
    #[error("config {path}: {reason}")]
    Config {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The HTTP listener failed.
    #[error("http listener: {0}")]
    Io(#[from] std::io::Error),
}

impl IndexerError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> u16 {
        match self {
            IndexerError::BadRequest(_) => 400,
            IndexerError::UnsupportedContentType(_) => 415,
            IndexerError::Conflict(_) => 409,
            IndexerError::NotFound(_) => 404,
            IndexerError::Socket { .. } | IndexerError::Events(_) => 502,
            IndexerError::Config { .. } | IndexerError::Io(_) => 500,
        }
    }

    /// A short stable name for the error kind (the `code` of an error answer).
    pub fn code(&self) -> &'static str {
        match self {
            IndexerError::BadRequest(_) => "bad_request",
            IndexerError::UnsupportedContentType(_) => "unsupported_content_type",
            IndexerError::Conflict(_) => "conflict",
            IndexerError::NotFound(_) => "not_found",
            IndexerError::Socket { .. } => "socket",
            IndexerError::Events(_) => "events",
            IndexerError::Config { .. } => "config",
            IndexerError::Io(_) => "io",
        }
    }
}
