//! The HTTP routes: `POST /v1/systemone`, `GET /v1/models`, `GET /health` and `/v1/health`,
//! `GET /metrics`, `GET /openapi.json` (the contract, `openapi.rs`), the demo page at `/`
//! (`demo.rs`) and the Workers AI route (`workers_ai.rs`). Order of checks on a decision: the
//! bearer key (401), the body limit (413), content type (415), JSON and validation (422, before
//! the model name), the served names (404), the queue (429 with `Retry-After`); then a worker
//! answers (200, 422 for over-long prompts, 500 with a message if the worker fails). A body a
//! route refuses unread is drained before the answer (`drain.rs`).

use super::contract::{
    unix_midnight, HealthBody, HealthStatus, ListObject, ModelCard, ModelList, ModelObject,
    OpenAiModel,
};
use super::intake::{check_key, read_json};
use super::openapi;
use super::state::{error_response, json_response, run, Decided};
pub use super::state::{AppState, ServerSettings};
use super::workers_ai;
use crate::request::{validate, RequestError};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// The publisher of the Clef models, as `/v1/models` reports it (`owned_by`).
const MODEL_OWNER: &str = "cloudflare";

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let demo = if state.settings.demo {
        super::demo::routes()
    } else {
        Router::new()
    };
    let hosted = workers_ai::ROUTES
        .iter()
        .fold(demo, |r, path| r.route(path, post(workers_ai::run_model)));
    hosted
        .route("/v1/systemone", post(systemone))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_document))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            state.settings.refused_body_drain,
            super::drain::drain_unread_body,
        ))
        .with_state(state)
}

async fn systemone(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let id = state.request_id(request.headers());
    let (resp, status, tokens) = match decide(&state, request, &id).await {
        Ok(decided) => {
            let mut resp = json_response(200, &decided.body, &id);
            decided.add_headers(&mut resp);
            (resp, 200, decided.tokens)
        }
        Err(e) => (error_response(&e, &id), e.status, 0),
    };
    let secs = started.elapsed().as_secs_f64();
    state.metrics.record("/v1/systemone", status, secs);
    tracing::info!(id = %id, status, tokens, ms = (secs * 1e3) as u64, "systemone");
    resp
}

async fn decide(state: &AppState, request: Request, id: &str) -> Result<Decided, RequestError> {
    check_key(&state.settings, request.headers())?;
    let value = read_json(&state.settings, request).await?;
    let request = validate(&value, Some(&state.settings.limits))?;
    let names = &state.settings.model_names;
    if !names.is_empty() && !names.iter().any(|n| n == &request.model) {
        return Err(RequestError {
            status: 404,
            loc: vec![Value::from("body"), Value::from("model")],
            msg: format!(
                "model {:?} is not served here; served models: {}",
                request.model,
                names.join(", ")
            ),
            kind: "model_not_found".into(),
        });
    }
    run(state, request, id).await
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let id = state.request_id(&headers);
    if let Err(e) = check_key(&state.settings, &headers) {
        state.metrics.record("/v1/models", e.status, 0.0);
        tracing::info!(id = %id, status = e.status, "models");
        return error_response(&e, &id);
    }
    let snap = state.snapshot();
    let mut card = state.settings.card.clone();
    card["counters"] = json!({
        "tokens": snap.tokens, "queued": snap.queued, "abandoned": snap.abandoned,
        "prefix_cache_hits": snap.cache_hits, "prefix_cache_misses": snap.cache_misses,
        "prefix_cache_evictions": snap.cache_evictions, "prefix_cache_bytes": snap.cache_bytes,
    });
    if !snap.device.is_empty() {
        card["counters"]["device"] = snap
            .device
            .iter()
            .enumerate()
            .map(|(worker, u)| {
                json!({
                    "worker": worker, "device_ids": u.device_ids,
                    "bytes_in_use": u.bytes_per_device, "live_tensors": u.live_tensors,
                })
            })
            .collect();
    }
    let names: Vec<String> = if state.settings.model_names.is_empty() {
        vec![card["name"].as_str().unwrap_or("clef").to_string()]
    } else {
        state.settings.model_names.clone()
    };
    let text = |field: &str| card[field].as_str().unwrap_or_default().to_string();
    let (description, release_date) = (text("description"), text("release_date"));
    let mut details = match card {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for field in ["name", "description", "release_date"] {
        details.shift_remove(field);
    }
    let created = unix_midnight(&release_date).unwrap_or(0);
    let list = ModelList {
        object: ListObject::List,
        data: names
            .iter()
            .map(|name| OpenAiModel {
                id: name.clone(),
                object: ModelObject::Model,
                created,
                owned_by: MODEL_OWNER.into(),
            })
            .collect(),
        models: names
            .into_iter()
            .map(|name| ModelCard {
                name,
                description: description.clone(),
                release_date: release_date.clone(),
                details: details.clone(),
            })
            .collect(),
    };
    state.metrics.record("/v1/models", 200, 0.0);
    tracing::info!(id = %id, status = 200, "models");
    let body = serde_json::to_value(list).unwrap_or(Value::Null);
    json_response(200, &body, &id)
}

async fn health(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let snap = state.snapshot();
    let hung = state.engine.deadline.hung();
    let ready = state.engine.is_ready() && hung.is_none();
    let body = HealthBody {
        status: match (hung, ready) {
            (Some(_), _) => HealthStatus::DeviceHung,
            (None, true) => HealthStatus::Ok,
            (None, false) => HealthStatus::Starting,
        },
        workers: snap.workers,
        workers_ready: snap.workers_ready,
        queued: snap.queued,
        reason: hung.map(str::to_string),
    };
    let body = serde_json::to_value(body).unwrap_or(Value::Null);
    json_response(
        if ready { 200 } else { 503 },
        &body,
        &state.request_id(&headers),
    )
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(&state.snapshot());
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

async fn openapi_document(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // Built per request (a few ms): the document is for tools, not the hot path.
    json_response(
        200,
        &openapi::document(&state.settings),
        &state.request_id(&headers),
    )
}

async fn method_not_allowed(State(state): State<Arc<AppState>>, request: Request) -> Response {
    route_error(
        &state,
        &request,
        405,
        "this route does not take that method; see /openapi.json",
        "method_not_allowed",
    )
}

async fn not_found(State(state): State<Arc<AppState>>, request: Request) -> Response {
    route_error(
        &state,
        &request,
        404,
        "no such route; see /openapi.json",
        "not_found",
    )
}

/// A refusal of the route itself, logged with the request's id, method and path.
fn route_error(
    state: &AppState,
    request: &Request,
    status: u16,
    msg: &str,
    kind: &str,
) -> Response {
    let id = state.request_id(request.headers());
    let (method, path) = (request.method(), request.uri().path());
    tracing::info!(id = %id, status, %method, path, "refused");
    error_response(&RequestError::status(status, msg, kind), &id)
}
