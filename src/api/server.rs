//! The HTTP server: `POST /v1/systemone`, `GET /v1/models`, `GET /health` and `/v1/health`,
//! `GET /metrics`, `GET /openapi.json` (the contract, `openapi.rs`), and the demo page at `/`
//! (see `demo.rs`). Order of checks on a decision: the bearer key (401), the body limit (413),
//! content type (415), JSON and validation (422, before the model name), the served names
//! (404), the queue (429 with `Retry-After`); then a worker answers (200, 422 for over-long
//! prompts, 500 with a message if the worker fails).

use super::contract::{DecisionBody, HealthBody, HealthStatus, ModelCard, ModelList};
use super::intake::{check_key, read_json, status_error};
use super::metrics::{Metrics, Snapshot};
use super::openapi::{self, PREFIX_CACHE_HEADER, REQUEST_ID_HEADER};
use super::workers_ai;
use super::{validate, ApiError, HostLimits, SystemOneRequest};
use crate::encode::json::dumps;
use crate::encode::state_key::{state_key, STATE_KEY_HEADER};
use crate::encode::LengthRule;
use crate::engine::prefix_cache::CacheUse;
use crate::engine::worker::{Engine, Job, SubmitError};
use crate::media::MediaLimits;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clef_device::DeviceUsage;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Reads the device memory and live tensors of every worker's mesh (for backends that track
/// them), for `/v1/models` and `/metrics`.
#[derive(Clone)]
pub struct DeviceProbe(Arc<dyn Fn() -> Vec<DeviceUsage> + Send + Sync>);

impl DeviceProbe {
    pub fn new(f: impl Fn() -> Vec<DeviceUsage> + Send + Sync + 'static) -> Self {
        DeviceProbe(Arc::new(f))
    }

    pub fn read(&self) -> Vec<DeviceUsage> {
        (self.0)()
    }
}

impl std::fmt::Debug for DeviceProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceProbe")
    }
}

/// What the routes need to know besides the engine.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub api_key: Option<String>,
    /// `CLEF_MODEL_NAMES`; empty = any name is accepted and echoed.
    pub model_names: Vec<String>,
    pub max_body_bytes: usize,
    pub rule: LengthRule,
    pub limits: HostLimits,
    /// The `/v1/models` card of the served model.
    pub card: Value,
    /// Serve the browser demo page at `/` (`CLEF_DEMO`).
    pub demo: bool,
    /// The workers' device usage, where the backend reports it.
    pub device: Option<DeviceProbe>,
    /// Bounds on images and videos; `None` when the model has no vision tower.
    pub media: Option<MediaLimits>,
    /// `CLEF_ACCOUNT_ID`: the only account id the Workers AI route accepts (`None`: any).
    pub account_id: Option<String>,
}

/// Shared state of the routes.
pub struct AppState {
    pub engine: Engine,
    pub settings: ServerSettings,
    pub metrics: Metrics,
    /// `GET /openapi.json`, built once from the settings.
    openapi: Value,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(engine: Engine, settings: ServerSettings) -> Arc<Self> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Arc::new(AppState {
            engine,
            openapi: openapi::document(&settings),
            settings,
            metrics: Metrics::default(),
            next_id: AtomicU64::new(seed << 16),
        })
    }

    pub(super) fn request_id(&self) -> String {
        format!("req_{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn snapshot(&self) -> Snapshot {
        let s = &self.engine.stats;
        Snapshot {
            queued: s.queued.load(Ordering::SeqCst),
            running: s.running.load(Ordering::SeqCst),
            workers_ready: s.ready.load(Ordering::SeqCst),
            workers: self.engine.workers,
            tokens: s.tokens.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            panics: s.panics.load(Ordering::Relaxed),
            cache_hits: s.prefix_cache.hits.load(Ordering::Relaxed),
            cache_misses: s.prefix_cache.misses.load(Ordering::Relaxed),
            cache_evictions: s.prefix_cache.evictions.load(Ordering::Relaxed),
            cache_bytes: s.prefix_cache.bytes.load(Ordering::Relaxed),
            device: self
                .settings
                .device
                .as_ref()
                .map(DeviceProbe::read)
                .unwrap_or_default(),
        }
    }
}

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
        .with_state(state)
}

pub(super) fn json_response(status: u16, body: &Value, request_id: &str) -> Response {
    let mut resp = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        dumps(body, false),
    )
        .into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(REQUEST_ID_HEADER, v.clone());
        h.insert("x-typesafe-request-id", v);
    }
    resp
}

/// Seconds a client is told to wait after a 429.
pub(super) const RETRY_AFTER_SECONDS: &str = "1";

fn error_response(e: &ApiError, request_id: &str) -> Response {
    let mut resp = json_response(e.status, &e.body(), request_id);
    if e.status == 429 {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    resp
}

async fn systemone(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let id = state.request_id();
    let (resp, status, tokens) = match decide(&state, request).await {
        Ok(Decided {
            body,
            tokens,
            cache,
            state_key,
        }) => {
            let mut resp = json_response(200, &body, &id);
            let h = resp.headers_mut();
            h.insert(PREFIX_CACHE_HEADER, HeaderValue::from_static(cache.name()));
            if let Ok(v) = HeaderValue::from_str(&state_key) {
                h.insert(STATE_KEY_HEADER, v);
            }
            (resp, 200, tokens)
        }
        Err(e) => (error_response(&e, &id), e.status, 0),
    };
    let secs = started.elapsed().as_secs_f64();
    state.metrics.record("/v1/systemone", status, secs);
    tracing::info!(id = %id, status, tokens, ms = (secs * 1e3) as u64, "systemone");
    resp
}

/// A decision's body and what its headers and log line say.
pub(super) struct Decided {
    pub body: Value,
    pub tokens: usize,
    pub cache: CacheUse,
    pub state_key: String,
}

async fn decide(state: &AppState, request: Request) -> Result<Decided, ApiError> {
    let value = read_json(state, request).await?;
    let request = validate(&value, Some(&state.settings.limits))?;
    let names = &state.settings.model_names;
    if !names.is_empty() && !names.iter().any(|n| n == &request.model) {
        return Err(ApiError {
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
    run(state, request).await
}

/// Queue a validated request and wait for its answer (429 when the queue is full).
pub(super) async fn run(state: &AppState, request: SystemOneRequest) -> Result<Decided, ApiError> {
    let key = state_key(&request);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = Job {
        request,
        rule: state.settings.rule,
        reply: tx,
    };
    match state.engine.submit(job) {
        Ok(()) => {}
        Err(SubmitError::Full) => {
            return Err(status_error(
                429,
                format!(
                    "the queue is full ({} requests waiting); retry shortly",
                    state.engine.capacity
                ),
                "rate_limit_exceeded",
            ))
        }
        Err(SubmitError::Closed) => {
            return Err(status_error(
                503,
                "the server is shutting down",
                "unavailable",
            ))
        }
    }
    // If this future is dropped (the client went away), `rx` closes and the worker skips the job.
    let decision = rx
        .await
        .map_err(|_| ApiError::internal("the worker stopped before answering"))??;
    let mut body = decision.response;
    DecisionBody::set_latency_ms(&mut body, decision.model_seconds);
    Ok(Decided {
        body,
        tokens: decision.record.input_ids.len(),
        cache: decision.cache,
        state_key: key,
    })
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let id = state.request_id();
    if let Err(e) = check_key(&state, &headers) {
        state.metrics.record("/v1/models", e.status, 0.0);
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
    let list = ModelList {
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
    let body = serde_json::to_value(list).unwrap_or(Value::Null);
    json_response(200, &body, &id)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let snap = state.snapshot();
    let ready = state.engine.is_ready();
    let body = HealthBody {
        status: if ready {
            HealthStatus::Ok
        } else {
            HealthStatus::Starting
        },
        workers: snap.workers,
        workers_ready: snap.workers_ready,
        queued: snap.queued,
    };
    let body = serde_json::to_value(body).unwrap_or(Value::Null);
    json_response(if ready { 200 } else { 503 }, &body, &state.request_id())
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

async fn openapi_document(State(state): State<Arc<AppState>>) -> Response {
    json_response(200, &state.openapi, &state.request_id())
}

async fn method_not_allowed(State(state): State<Arc<AppState>>) -> Response {
    route_error(
        &state,
        405,
        "this route does not take that method; see /openapi.json",
        "method_not_allowed",
    )
}

async fn not_found(State(state): State<Arc<AppState>>) -> Response {
    route_error(&state, 404, "no such route; see /openapi.json", "not_found")
}

fn route_error(state: &AppState, status: u16, msg: &str, kind: &str) -> Response {
    error_response(&status_error(status, msg, kind), &state.request_id())
}
