//! Admin HTTP: health, metrics, event status and snapshot, and upstream's inspection endpoints.
//!
//! Paths and JSON shapes follow the upstream master so dashboards and scripts keep working.

use super::events::EventHook;
use super::ha::{Gate, HaState};
use super::metrics::Metrics;
use crate::engine::Medium;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use moonkv_proto::msg::RemoveAllRequest;
use moonkv_proto::types::{ReplicaKind, ReplicaStatus, SegmentStatus};
use moonkv_proto::{Error, ErrorCode};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// Whether this master serves (HA role) and the engine of its current term.
    pub gate: Arc<Gate>,
    pub metrics: Arc<Metrics>,
    pub events: Arc<EventHook>,
    pub backend_id: String,
    /// When set, mutating endpoints require `Authorization: Bearer <secret>`.
    pub secret: Option<moonkv_proto::auth::Secret>,
}

/// The refusal for a request that does not carry the shared secret (when one is configured),
/// to a mutating endpoint; `None` lets it through.
fn refuse_unauthorized(state: &AdminState, headers: &HeaderMap) -> Option<Response> {
    refuse_without_secret(
        state,
        headers,
        "this endpoint changes data: send `Authorization: Bearer <shared secret>`",
    )
}

/// Guards the read-only endpoints that reveal keys or ids: with a secret configured they need
/// it too (`Authorization: Bearer <shared secret>`).
async fn require_secret_to_reveal(
    State(state): State<AdminState>,
    headers: HeaderMap,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let why = "this endpoint reveals keys or ids: send `Authorization: Bearer <shared secret>`";
    match refuse_without_secret(&state, &headers, why) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

fn refuse_without_secret(state: &AdminState, headers: &HeaderMap, why: &str) -> Option<Response> {
    let secret = state.secret.as_ref()?;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::as_bytes);
    if presented.is_some_and(|token| secret.matches(token)) {
        return None;
    }
    let body = json!({"success": false, "error_code": ErrorCode::ILLEGAL_CLIENT.as_i32(),
        "error_message": why});
    Some((StatusCode::UNAUTHORIZED, Json(body)).into_response())
}

/// Builds the admin router.
pub(crate) fn router(state: AdminState) -> Router {
    let revealing = Router::new()
        .route("/kv_events/snapshot", get(events_snapshot))
        .route("/query_key", get(query_key))
        .route("/get_all_keys", get(get_all_keys))
        .route("/get_segments_detail", get(get_segments_detail))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_secret_to_reveal,
        ));
    // Upstream's service plane: only the serving leader answers it.
    let service = Router::new()
        .route("/kv_events/status", get(events_status))
        .merge(revealing)
        .route("/get_all_segments", get(get_all_segments))
        .route("/api/v1/remove_all", post(remove_all))
        .route(
            "/api/v1/tenant_quotas",
            get(get_quotas).put(put_quota).delete(delete_quota),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_serving,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/role", get(role))
        .route("/ha_status", get(ha_status))
        .route("/leader", get(leader))
        .route("/metrics", get(metrics))
        .merge(service)
        // Admin bodies are small JSON documents; a larger one is refused before it is buffered.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Largest admin request body accepted (axum's default would be 2 MiB per connection).
const MAX_BODY_BYTES: usize = 64 << 10;

/// A standby answers the service-plane endpoints as upstream does: 503, `-1011`.
async fn require_serving(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if state.gate.serving() {
        return next.run(request).await;
    }
    let refusal = state.gate.refusal();
    let body = json!({"success": false, "error_code": ErrorCode::UNAVAILABLE_IN_CURRENT_MODE.as_i32(),
        "error_message": format!("service plane is not active: {}", refusal.message)});
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Maps an error to upstream's HTTP status and JSON body.
fn error_response(e: &Error) -> Response {
    let status = match e.code {
        ErrorCode::INVALID_PARAMS => StatusCode::BAD_REQUEST,
        ErrorCode::SEGMENT_NOT_FOUND
        | ErrorCode::OBJECT_NOT_FOUND
        | ErrorCode::TENANT_NOT_REGISTERED => StatusCode::NOT_FOUND,
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
        | ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
        | ErrorCode::TENANT_NOT_EMPTY => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = json!({"success": false, "error_code": e.code.as_i32(), "error_message": format!("{}: {}", e.code, e.message)});
    (status, Json(body)).into_response()
}

fn bad_request(message: impl Into<String>) -> Response {
    error_response(&Error::new(ErrorCode::INVALID_PARAMS, message.into()))
}

/// `leader` while serving (always without HA), `standby` otherwise.
fn role_name(gate: &Gate) -> &'static str {
    if gate.serving() {
        "leader"
    } else {
        "standby"
    }
}

async fn health(State(s): State<AdminState>) -> Json<Value> {
    let serving = s.gate.serving();
    let view = s.gate.view();
    let state = if serving {
        HaState::Serving
    } else if view.state == HaState::Serving {
        HaState::Standby
    } else {
        view.state
    };
    let mut body = json!({"status": "ok", "role": role_name(&s.gate), "ha_state": state.as_str(),
        "service_ready": serving});
    if let Some(leader) = view.leader.filter(|_| s.gate.is_ha()) {
        body["leader_address"] = json!(leader.rpc_addr);
        body["view_version"] = json!(leader.term);
    }
    Json(body)
}

async fn role(State(s): State<AdminState>) -> &'static str {
    role_name(&s.gate)
}

async fn ha_status(State(s): State<AdminState>) -> &'static str {
    match s.gate.view().state {
        HaState::Serving if !s.gate.serving() => HaState::Standby.as_str(),
        state => state.as_str(),
    }
}

/// Upstream's `{present, leader_address?, view_version?}`, plus where the leader's admin
/// port and event stream are (subscribers follow the leader's events endpoint).
async fn leader(State(s): State<AdminState>) -> Json<Value> {
    let view = s.gate.view();
    match view.leader.filter(|_| s.gate.is_ha()) {
        Some(l) => Json(
            json!({"present": true, "leader_address": l.rpc_addr, "view_version": l.term,
            "admin_address": l.admin_addr, "events_endpoint": l.events_endpoint}),
        ),
        None if !s.gate.is_ha() => Json(json!({"present": true, "view_version": 0})),
        None => Json(json!({"present": false})),
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let text = tokio::task::spawn_blocking(move || s.metrics.encode())
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn events_status(State(s): State<AdminState>) -> Json<Value> {
    Json(serde_json::to_value(s.events.status()).unwrap_or(Value::Null))
}

#[derive(Deserialize)]
struct TenantParam {
    tenant_id: Option<String>,
}

async fn events_snapshot(State(s): State<AdminState>, Query(p): Query<TenantParam>) -> Response {
    let engine = s.gate.engine();
    let tenant = p.tenant_id.filter(|t| !t.is_empty());
    let snap =
        match tokio::task::spawn_blocking(move || engine.placement_snapshot(tenant.as_deref()))
            .await
        {
            Ok(snap) => snap,
            Err(e) => return error_response(&Error::new(ErrorCode::INTERNAL_ERROR, e.to_string())),
        };
    let objects: Vec<Value> = snap
        .objects
        .iter()
        .map(|o| {
            json!({
                "tenant_id": o.tenant,
                "object_key": o.key,
                "group_id": o.group_id,
                "media": o.media.iter().map(|m| Medium::as_str(*m)).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({
        "backend_id": s.backend_id,
        "publisher_epoch": s.events.epoch(),
        "watermark_event_id": snap.watermark_event_id,
        "objects": objects,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct KeyParam {
    key: Option<String>,
    tenant_id: Option<String>,
}

async fn query_key(State(s): State<AdminState>, Query(p): Query<KeyParam>) -> Response {
    let Some(key) = p.key.filter(|k| !k.is_empty()) else {
        return bad_request("missing `key` query parameter");
    };
    match s
        .gate
        .engine()
        .query_key(p.tenant_id.as_deref().unwrap_or(""), &key)
    {
        Ok(resp) => {
            let data: Vec<Value> = resp
                .replicas
                .iter()
                .map(|r| {
                    json!({
                        "id": r.id.0,
                        "kind": match r.kind { ReplicaKind::Memory => "memory", ReplicaKind::LocalDisk => "disk" },
                        "status": match r.status { ReplicaStatus::Complete => "COMPLETE", ReplicaStatus::Processing => "PROCESSING" },
                        "size_": r.size,
                        "buffer_address_": r.address,
                        "transport_endpoint_": r.endpoint,
                        "segment_name": r.segment_name,
                    })
                })
                .collect();
            Json(json!({"success": true, "data": data, "lease_ttl_ms": resp.lease_ttl_ms}))
                .into_response()
        }
        Err(e) => error_response(&e),
    }
}

async fn get_all_keys(State(s): State<AdminState>, Query(p): Query<TenantParam>) -> String {
    let engine = s.gate.engine();
    let tenant = p.tenant_id.unwrap_or_default();
    let keys = tokio::task::spawn_blocking(move || engine.all_keys(&tenant))
        .await
        .unwrap_or_default();
    let mut text = String::new();
    for k in keys {
        text.push_str(&k);
        text.push('\n');
    }
    text
}

async fn get_all_segments(State(s): State<AdminState>) -> String {
    let mut text = String::new();
    for seg in s.gate.engine().segments() {
        if seg.status == SegmentStatus::Ok {
            text.push_str(&seg.segment.name);
            text.push('\n');
        }
    }
    text
}

fn status_name(s: SegmentStatus) -> &'static str {
    match s {
        SegmentStatus::Ok => "OK",
        SegmentStatus::GracefullyUnmounting => "GRACEFULLY_UNMOUNTING",
        SegmentStatus::Unmounting => "UNMOUNTING",
    }
}

async fn get_segments_detail(State(s): State<AdminState>) -> Json<Value> {
    let segments: Vec<Value> = s
        .gate
        .engine()
        .segments()
        .iter()
        .map(|seg| {
            let pct = if seg.capacity_bytes == 0 {
                0.0
            } else {
                seg.used_bytes as f64 * 100.0 / seg.capacity_bytes as f64
            };
            json!({
                "segment_name": seg.segment.name,
                "segment_id": seg.segment.id.to_string(),
                "client_id": seg.client_id.to_string(),
                "base_address": format!("{:#x}", seg.segment.base),
                "size_bytes": seg.segment.size,
                "size_human": moonkv_proto::units::format_size_with(seg.segment.size, 2),
                "te_endpoint": seg.segment.endpoint,
                "host_id": seg.segment.host_id,
                "protocol": seg.segment.protocol,
                "status": status_name(seg.status),
                "allocator_used_bytes": seg.used_bytes,
                "allocator_capacity_bytes": seg.capacity_bytes,
                "allocator_usage_percent": pct,
                "medium": "cpu",
                "suspect": seg.suspect,
            })
        })
        .chain(s.gate.engine().disk_segments().iter().map(|disk| {
            let pct = disk.used_bytes as f64 * 100.0 / disk.capacity_bytes.max(1) as f64;
            json!({
                "segment_name": disk.disk.name,
                "segment_id": disk.disk.id.to_string(),
                "client_id": disk.client_id.to_string(),
                "size_bytes": disk.capacity_bytes,
                "size_human": moonkv_proto::units::format_size_with(disk.capacity_bytes, 2),
                "te_endpoint": disk.disk.endpoint,
                "protocol": "file",
                "status": disk.status,
                "allocator_used_bytes": disk.used_bytes,
                "allocator_capacity_bytes": disk.capacity_bytes,
                "allocator_usage_percent": pct,
                "medium": "disk",
            })
        }))
        .collect();
    Json(json!({"total_segments": segments.len(), "segments": segments}))
}

async fn remove_all(
    State(s): State<AdminState>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = refuse_unauthorized(&s, &headers) {
        return refused;
    }
    let force = matches!(p.get("force").map(String::as_str), Some("true") | Some("1"));
    let engine = s.gate.engine();
    let tenant = p.get("tenant_id").cloned();
    let result = tokio::task::spawn_blocking(move || match tenant {
        Some(tenant) => engine.remove_all(&RemoveAllRequest { tenant, force }),
        None => Ok(engine.remove_all_tenants(force)),
    })
    .await;
    match result {
        Ok(Ok(n)) => Json(json!({"success": true, "removed_count": n})).into_response(),
        Ok(Err(e)) => error_response(&e),
        Err(e) => error_response(&Error::new(ErrorCode::INTERNAL_ERROR, e.to_string())),
    }
}

async fn get_quotas(State(s): State<AdminState>, Query(p): Query<TenantParam>) -> Response {
    let single = p.tenant_id.is_some();
    match s.gate.engine().tenant_quotas(p.tenant_id.as_deref()) {
        Ok(list) if single => Json(json!({"success": true, "data": list.first()})).into_response(),
        Ok(list) => Json(json!({"success": true, "data": list})).into_response(),
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
struct QuotaBody {
    requested_quota_bytes: u64,
}

async fn put_quota(
    State(s): State<AdminState>,
    headers: HeaderMap,
    Query(p): Query<TenantParam>,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = refuse_unauthorized(&s, &headers) {
        return refused;
    }
    let Some(tenant) = p.tenant_id else {
        return bad_request("missing `tenant_id` query parameter");
    };
    let body: QuotaBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return bad_request(format!(
                "body must be {{\"requested_quota_bytes\": N}}: {e}"
            ))
        }
    };
    match s
        .gate
        .engine()
        .set_tenant_quota(&tenant, body.requested_quota_bytes)
    {
        Ok(snap) => Json(json!({"success": true, "data": snap})).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn delete_quota(
    State(s): State<AdminState>,
    headers: HeaderMap,
    Query(p): Query<TenantParam>,
) -> Response {
    if let Some(refused) = refuse_unauthorized(&s, &headers) {
        return refused;
    }
    let Some(tenant) = p.tenant_id else {
        return bad_request("missing `tenant_id` query parameter");
    };
    match s.gate.engine().delete_tenant_quota(&tenant) {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => error_response(&e),
    }
}
