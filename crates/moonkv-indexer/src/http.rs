//! The HTTP API (default port 13333, as Conductor's): `POST /register`, `POST /unregister`,
//! `POST /query`, `POST /query_by_hash`, `GET /sources`, `GET /health`, `GET /metrics`.
//!
//! Bodies are JSON, or MessagePack with `Content-Type: application/msgpack`; an answer comes in
//! the request's format (or MessagePack when `Accept` asks for it). Every refusal is a JSON (or
//! MessagePack) `{"error", "code"}` with a 4xx status; no input makes a handler panic.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{HashQueryRequest, QueryRequest, SourceSpec, UnregisterRequest};
use crate::error::IndexerError;
use crate::state::Indexer;

/// Conductor's port, the default of `moonkv indexer`.
pub const DEFAULT_PORT: u16 = 13333;

/// Largest request body (a 4 M-token prompt as JSON fits).
pub const MAX_BODY_BYTES: usize = 64 << 20;

const MSGPACK: &str = "application/msgpack";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Msgpack,
}

impl Format {
    fn label(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Msgpack => "msgpack",
        }
    }
}

fn request_format(headers: &HeaderMap) -> Result<Format, IndexerError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    let ct = ct
        .to_str()
        .map_err(|_| IndexerError::UnsupportedContentType("<not ASCII>".into()))?;
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "" | "application/json" | "text/json" => Ok(Format::Json),
        "application/msgpack" | "application/x-msgpack" | "application/vnd.msgpack" => {
            Ok(Format::Msgpack)
        }
        _ => Err(IndexerError::UnsupportedContentType(ct.to_owned())),
    }
}

fn answer_format(headers: &HeaderMap, request: Format) -> Format {
    let wants_msgpack = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("msgpack"));
    if wants_msgpack {
        Format::Msgpack
    } else {
        request
    }
}

fn parse<T: DeserializeOwned>(format: Format, body: &[u8]) -> Result<T, IndexerError> {
    match format {
        Format::Json => serde_json::from_slice(body)
            .map_err(|e| IndexerError::BadRequest(format!("invalid JSON body: {e}"))),
        Format::Msgpack => rmp_serde::from_slice(body)
            .map_err(|e| IndexerError::BadRequest(format!("invalid MessagePack body: {e}"))),
    }
}

fn reply<T: Serialize>(format: Format, status: StatusCode, value: &T) -> Response {
    let (bytes, ct) = match format {
        Format::Json => (
            serde_json::to_vec(value).map_err(|e| e.to_string()),
            "application/json",
        ),
        Format::Msgpack => (
            rmp_serde::to_vec_named(value).map_err(|e| e.to_string()),
            MSGPACK,
        ),
    };
    match bytes {
        Ok(b) => (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(ct))],
            b,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

fn refuse(format: Format, e: &IndexerError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    #[derive(Serialize)]
    struct Refusal<'a> {
        error: String,
        code: &'a str,
    }
    reply(
        format,
        status,
        &Refusal {
            error: e.to_string(),
            code: e.code(),
        },
    )
}

/// Runs `f` on the parsed body and answers in the request's format.
fn handle<T: DeserializeOwned, R: Serialize>(
    headers: &HeaderMap,
    body: &[u8],
    f: impl FnOnce(T, Format) -> Result<R, IndexerError>,
) -> Response {
    let format = match request_format(headers) {
        Ok(f) => f,
        Err(e) => return refuse(Format::Json, &e),
    };
    let out = answer_format(headers, format);
    match parse::<T>(format, body).and_then(|req| f(req, format)) {
        Ok(r) => reply(out, StatusCode::OK, &r),
        Err(e) => refuse(out, &e),
    }
}

async fn register(State(ix): State<Arc<Indexer>>, headers: HeaderMap, body: Bytes) -> Response {
    // Registration connects sockets and may start a thread: off the async workers.
    let r = tokio::task::spawn_blocking(move || {
        handle(&headers, &body, |spec: SourceSpec, _| {
            let instance_id = spec.instance_id.clone();
            let slot = ix.register(spec)?;
            Ok(serde_json::json!({
                "status": "registered successfully",
                "instance_id": instance_id,
                "source_id": slot.0,
            }))
        })
    })
    .await;
    r.unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

async fn unregister(State(ix): State<Arc<Indexer>>, headers: HeaderMap, body: Bytes) -> Response {
    // Unregistering joins the source threads.
    let r = tokio::task::spawn_blocking(move || {
        handle(&headers, &body, |req: UnregisterRequest, _| {
            let removed = ix.unregister(&req)?;
            Ok(serde_json::json!({
                "status": "unregistered successfully",
                "removed_instances": removed,
            }))
        })
    })
    .await;
    r.unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

async fn query(State(ix): State<Arc<Indexer>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(&headers, &body, |req: QueryRequest, format| {
        ix.metrics()
            .queries
            .get_or_create(&vec![("format", format.label().to_owned())])
            .inc();
        ix.query(&req)
    })
}

async fn query_by_hash(
    State(ix): State<Arc<Indexer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&headers, &body, |req: HashQueryRequest, format| {
        ix.metrics()
            .queries
            .get_or_create(&vec![("format", format.label().to_owned())])
            .inc();
        ix.query_by_hash(&req)
    })
}

async fn sources(State(ix): State<Arc<Indexer>>) -> Response {
    reply(Format::Json, StatusCode::OK, &ix.sources())
}

async fn health(State(ix): State<Arc<Indexer>>) -> Response {
    reply(
        Format::Json,
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "sources": ix.source_count(),
            "blocks": ix.index().blocks(),
        }),
    )
}

async fn metrics(State(ix): State<Arc<Indexer>>) -> Response {
    let m = ix.metrics();
    m.blocks.set(ix.index().blocks() as i64);
    m.index_bytes.set(ix.index().heap_bytes() as i64);
    let chains = ix.index().chains();
    m.chain_cache_blocks.set(chains.len() as i64);
    m.chain_cache_bytes.set(chains.heap_bytes() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

/// The API's routes over `indexer`.
pub fn router(indexer: Arc<Indexer>) -> Router {
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/sources", get(sources))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(indexer)
}

/// A bound listener serving the API.
pub struct Server {
    listener: tokio::net::TcpListener,
    indexer: Arc<Indexer>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free one).
    pub async fn bind(addr: SocketAddr, indexer: Arc<Indexer>) -> Result<Server, IndexerError> {
        Ok(Server {
            listener: tokio::net::TcpListener::bind(addr).await?,
            indexer,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr, IndexerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), IndexerError> {
        axum::serve(self.listener, router(self.indexer))
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    }
}
