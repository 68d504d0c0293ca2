//! What every route shares: the server's settings, the state behind the routes (engine,
//! metrics, request ids), JSON answers with their headers, and running a validated decision
//! through the queue (`run`), for `/v1/systemone` and the Workers AI route alike.
//!
//! Request ids: a client's (or a gateway's, or HAProxy's) `x-request-id` is kept when it is
//! well formed — one header of 1 to 128 visible ASCII characters (`!` to `~`: no spaces, no
//! control characters) — so one id names the request in every log on its way; otherwise
//! (absent, repeated, too long, anything else) the server makes one. Either way the answer carries it
//! (`x-request-id`, `x-typesafe-request-id`, Workers AI's `cf-ai-req-id`) and every log line
//! about the request names it, the worker's included.

use super::contract::{DecisionBody, PREFIX_CACHE_HEADER, REQUEST_ID_HEADER};
use super::drain::DrainBounds;
use super::error::error_body;
use super::metrics::{Metrics, Snapshot};
use crate::encode::json::dumps;
use crate::encode::state_key::{state_key, STATE_KEY_HEADER};
use crate::encode::LengthRule;
use crate::engine::prefix_cache::CacheUse;
use crate::engine::worker::{Engine, Job, SubmitError};
use crate::media::MediaLimits;
use crate::request::{HostLimits, RequestError, SystemOneRequest};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the routes need to know besides the engine.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub api_key: Option<String>,
    /// `CLEF_MODEL_NAMES`; empty = any name is accepted and echoed.
    pub model_names: Vec<String>,
    pub max_body_bytes: usize,
    /// How much of a body refused before it was read is drained so the client reads the answer.
    pub refused_body_drain: DrainBounds,
    pub rule: LengthRule,
    pub limits: HostLimits,
    /// The `/v1/models` card of the served model.
    pub card: Value,
    /// Serve the browser demo page at `/` (`CLEF_DEMO`).
    pub demo: bool,
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
            settings,
            metrics: Metrics::default(),
            next_id: AtomicU64::new(seed << 16),
        })
    }

    /// This request's id: its `x-request-id` when it has one and that one is well formed
    /// ([`well_formed_request_id`]), else a new one.
    pub(super) fn request_id(&self, headers: &HeaderMap) -> String {
        let mut sent = headers.get_all(REQUEST_ID_HEADER).iter();
        match (sent.next(), sent.next()) {
            (Some(id), None) if well_formed_request_id(id.as_bytes()) => {
                String::from_utf8_lossy(id.as_bytes()).into_owned()
            }
            _ => self.new_request_id(),
        }
    }

    /// An id of the server's own: `req_` and 16 hex digits.
    fn new_request_id(&self) -> String {
        format!("req_{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let s = &self.engine.stats;
        Snapshot {
            queued: s.queued.load(Ordering::SeqCst),
            running: s.running.load(Ordering::SeqCst),
            workers_ready: s.ready.load(Ordering::SeqCst),
            workers: self.engine.workers,
            tokens: s.tokens.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            packed: s.packed.load(Ordering::Relaxed),
            panics: s.panics.load(Ordering::Relaxed),
            cache_hits: s.prefix_cache.hits.load(Ordering::Relaxed),
            cache_misses: s.prefix_cache.misses.load(Ordering::Relaxed),
            cache_evictions: s.prefix_cache.evictions.load(Ordering::Relaxed),
            cache_bytes: s.prefix_cache.bytes.load(Ordering::Relaxed),
            // What each worker recorded after its last request: never read from a mesh, so no
            // route waits on a device call.
            device: s
                .device_usage
                .lock()
                .map(|u| u.iter().flatten().cloned().collect())
                .unwrap_or_default(),
            passes: s
                .passes
                .lock()
                .map(|p| p.iter().flatten().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// The longest client request id kept.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Whether a client's `x-request-id` is kept: 1 to [`MAX_REQUEST_ID_LEN`] bytes, each visible
/// ASCII (`!` to `~`).
pub fn well_formed_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len()) && id.iter().all(|b| (b'!'..=b'~').contains(b))
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

/// Seconds a client is told to wait after a 429 or a 503 (a full queue; a server going down,
/// whose balancer sends the retry elsewhere).
pub(super) const RETRY_AFTER_SECONDS: &str = "1";

pub(super) fn error_response(e: &RequestError, request_id: &str) -> Response {
    let mut resp = json_response(e.status, &error_body(e), request_id);
    if e.status == 429 || e.status == 503 {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    resp
}

/// A decision's body and what its headers and log line say.
pub(super) struct Decided {
    pub body: Value,
    pub tokens: usize,
    pub cache: CacheUse,
    pub state_key: String,
}

impl Decided {
    /// The headers of a decision's 200: how it used the prefix cache, its routing key.
    pub(super) fn add_headers(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        h.insert(
            PREFIX_CACHE_HEADER,
            HeaderValue::from_static(self.cache.name()),
        );
        if let Ok(v) = HeaderValue::from_str(&self.state_key) {
            h.insert(STATE_KEY_HEADER, v);
        }
    }
}

/// Queue a validated request and wait for its answer (429 when the queue is full); `id` names
/// it in the worker's log lines.
pub(super) async fn run(
    state: &AppState,
    request: SystemOneRequest,
    id: &str,
) -> Result<Decided, RequestError> {
    let key = state_key(&request);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = Job {
        id: id.to_string(),
        request,
        rule: state.settings.rule,
        reply: tx,
    };
    match state.engine.submit(job) {
        Ok(()) => {}
        Err(SubmitError::Full) => {
            return Err(RequestError::status(
                429,
                format!(
                    "the queue is full ({} requests waiting); retry shortly",
                    state.engine.capacity
                ),
                "rate_limit_exceeded",
            ))
        }
        Err(SubmitError::Closed) => {
            return Err(RequestError::status(
                503,
                "the server is shutting down",
                "unavailable",
            ))
        }
        Err(SubmitError::DeviceHung(reason)) => {
            return Err(crate::engine::deadline::DeviceDeadline::unavailable(
                &reason,
            ))
        }
    }
    // If this future is dropped (the client went away), `rx` closes and the worker skips the job.
    let decision = rx
        .await
        .map_err(|_| RequestError::internal("the worker stopped before answering"))??;
    let mut body = decision.response;
    DecisionBody::set_latency_ms(&mut body, decision.model_seconds);
    Ok(Decided {
        body,
        tokens: decision.record.input_ids.len(),
        cache: decision.cache,
        state_key: key,
    })
}

#[cfg(test)]
mod tests {
    use super::well_formed_request_id as ok;

    #[test]
    fn request_ids_are_kept_when_one_to_128_visible_ascii_characters() {
        assert!(ok(b"a") && ok(b"!~") && ok(&[b'x'; 128]));
        assert!(ok(b"7f3a9c1e-5b2d-4e8f-9a6b-0c1d2e3f4a5b") && ok(b"gw:req.42_A"));
        for bad in [
            &b""[..],
            &[b'x'; 129],
            b"has space",
            b"tab\there",
            b"del\x7f",
            b"caf\xc3\xa9",
        ] {
            assert!(!ok(bad), "{bad:?}");
        }
    }
}
