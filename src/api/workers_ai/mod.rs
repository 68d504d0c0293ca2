//! Workers AI's Clef endpoint, so tooling written for the hosted API runs against clef-tt with
//! only its base URL changed: `POST /client/v4/accounts/{account_id}/ai/run/{model}` and the
//! same path without `/client/v4`, for `@cf/cloudflare/clef` and `@cf/cloudflare/clef-flash`
//! (both the served model, unless `CLEF_MODEL_NAMES` leaves one out).
//!
//! The answer is the `/v1/systemone` body inside Cloudflare's envelope, `{"result", "success",
//! "errors", "messages"}`; a refusal is `{"result": null, "success": false, "errors": [{"code",
//! "message"}]}` with the status and code the hosted API uses (see [`refusal`]). The body is
//! held to the hosted API's published schema (`rules`: no field it does not know, the types
//! its descriptions name, `data:` URL images) and to `--strict` with the hosted counts
//! (instructions required, ids `[A-Za-z0-9_.-]{1,100}`, 1–64 questions, 2–255 options, 2–10
//! levels, at most 4 images). Any account id is accepted unless `CLEF_ACCOUNT_ID` is set; the
//! bearer token is `CLEF_API_KEY` (any token when none is set). The request id (the client's
//! `x-request-id` when well formed) is also in `cf-ai-req-id`.

mod rules;

pub use rules::{hosted_limits, MAX_IMAGES};

use super::contract::{WorkersAiEnvelope, WorkersAiError};
use super::intake::{check_key, read_json};
use super::state::{json_response, run, AppState, Decided, ServerSettings, RETRY_AFTER_SECONDS};
use crate::request::{validate, RequestError};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// The hosted model ids and the body `model` each expects.
pub const MODELS: [(&str, &str); 2] = [
    ("@cf/cloudflare/clef", "clef"),
    ("@cf/cloudflare/clef-flash", "clef-flash"),
];

/// The route, with and without the API's `/client/v4` prefix (`model` holds slashes).
pub const ROUTES: [&str; 2] = [
    "/client/v4/accounts/{account_id}/ai/run/{*model}",
    "/accounts/{account_id}/ai/run/{*model}",
];

/// The request id header Workers AI answers with.
pub const REQUEST_ID_HEADER: &str = "cf-ai-req-id";

/// Workers AI's error codes (the hosted API's documentation).
mod code {
    pub const MALFORMED: u32 = 6003;
    pub const NOT_A_REQUEST: u32 = 5006;
    pub const HOSTED_RULE: u32 = 5012;
    pub const TOO_LONG: u32 = 5021;
    pub const UNKNOWN_MODEL: u32 = 7000;
    pub const WRONG_ACCOUNT: u32 = 7003;
    pub const AUTHENTICATION: u32 = 10000;
    pub const BUSY: u32 = 3040;
    pub const SERVER: u32 = 5000;
}

/// A refusal as the hosted API gives it.
#[derive(Debug)]
pub struct Refusal {
    pub status: u16,
    pub code: u32,
    pub message: String,
}

/// The hosted status and code of an error. `structural` marks the reference's own checks of
/// the body's shape (no questions, an unknown type, a missing field: 400/5006 there), as
/// against the hosted rules (422/5012). The table, Workers AI's codes of
/// the hosted API's documentation: malformed JSON 400/6003; not a request 400/5006; a hosted rule
/// 422/5012; too long (tokens or bytes) 413/5021; unknown model 400/7000; another account
/// 404/7003; authentication 401/10000; busy 429/3040 (503/3040 shutting down); else 500/5000.
pub fn refusal(e: &RequestError, structural: bool) -> Refusal {
    // Images are the hosted rules' (count, form, content): 5012 however they fail.
    let media = matches!(
        e.loc.get(1).and_then(Value::as_str),
        Some("images" | "videos")
    );
    let structural = structural && !media;
    let (status, code) = match e.kind.as_str() {
        "json_invalid" | "invalid_body" => (400, code::MALFORMED),
        "unsupported_media_type" => (415, code::MALFORMED),
        "max_tokens_exceeded" | "request_too_large" => (413, code::TOO_LONG),
        "authentication_error" => (401, code::AUTHENTICATION),
        "rate_limit_exceeded" => (429, code::BUSY),
        "unavailable" => (503, code::BUSY),
        _ if e.status == 422 && structural => (400, code::NOT_A_REQUEST),
        _ if e.status == 422 => (422, code::HOSTED_RULE),
        _ => (e.status.max(500), code::SERVER),
    };
    let field: Vec<String> = e
        .loc
        .iter()
        .skip(1)
        .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
        .collect();
    let message = match field.is_empty() {
        true => e.msg.clone(),
        false => format!("{}: {}", field.join("."), e.msg),
    };
    Refusal {
        status,
        code,
        message,
    }
}

fn refuse(status: u16, code: u32, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        code,
        message: message.into(),
    }
}

/// `POST .../accounts/{account_id}/ai/run/{model}`.
pub async fn run_model(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Response {
    let started = Instant::now();
    let id = state.request_id(request.headers());
    let (mut resp, status, tokens) = match decide(&state, path, request, &id).await {
        Ok(mut decided) => {
            let envelope = WorkersAiEnvelope {
                result: std::mem::take(&mut decided.body),
                success: true,
                errors: vec![],
                messages: vec![],
            };
            let body = serde_json::to_value(envelope).unwrap_or(Value::Null);
            let mut resp = json_response(200, &body, &id);
            decided.add_headers(&mut resp);
            (resp, 200, decided.tokens)
        }
        Err(r) => (failure(&r, &id), r.status, 0),
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    let secs = started.elapsed().as_secs_f64();
    state.metrics.record("/ai/run", status, secs);
    tracing::info!(id = %id, status, tokens, ms = (secs * 1e3) as u64, "workers_ai");
    resp
}

fn failure(r: &Refusal, id: &str) -> Response {
    let envelope = WorkersAiEnvelope {
        result: Value::Null,
        success: false,
        errors: vec![WorkersAiError {
            code: r.code,
            message: r.message.clone(),
        }],
        messages: vec![],
    };
    let body = serde_json::to_value(envelope).unwrap_or(Value::Null);
    let mut resp = json_response(r.status, &body, id);
    if r.status == 429 {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    resp
}

async fn decide(
    state: &AppState,
    path: Result<Path<(String, String)>, PathRejection>,
    request: Request,
    id: &str,
) -> Result<Decided, Refusal> {
    check_key(&state.settings, request.headers()).map_err(|e| refusal(&e, false))?;
    let Path((account, model)) = path.map_err(|e| {
        refuse(
            400,
            code::UNKNOWN_MODEL,
            format!("No route for that URI: {e}"),
        )
    })?;
    if let Some(want) = &state.settings.account_id {
        if &account != want {
            return Err(refuse(
                404,
                code::WRONG_ACCOUNT,
                format!(
                    "Could not route to account {account:?}: this server serves account {want:?}"
                ),
            ));
        }
    }
    let selector = served_selector(state, &model)?;
    let mut value = read_json(&state.settings, request)
        .await
        .map_err(|e| refusal(&e, false))?;
    validate(&value, None).map_err(|e| refusal(&e, true))?;
    rules::check(&value, selector, max_images(&state.settings))?;
    rules::lower_data_schemes(&mut value);
    let request = validate(&value, Some(&hosted_limits(&state.settings.limits)))
        .map_err(|e| refusal(&e, false))?;
    run(state, request, id)
        .await
        .map_err(|e| refusal(&e, false))
}

/// The body `model` of a hosted model id this server serves.
fn served_selector(state: &AppState, model: &str) -> Result<&'static str, Refusal> {
    let names = &state.settings.model_names;
    MODELS
        .iter()
        .find(|(id, selector)| {
            *id == model.trim_start_matches('/')
                && (names.is_empty() || names.iter().any(|n| n == selector))
        })
        .map(|(_, selector)| *selector)
        .ok_or_else(|| {
            let served: Vec<&str> = MODELS
                .iter()
                .filter(|(_, s)| names.is_empty() || names.iter().any(|n| n == s))
                .map(|(id, _)| *id)
                .collect();
            refuse(
                400,
                code::UNKNOWN_MODEL,
                format!(
                    "No such model {model:?}; served here: {}",
                    served.join(", ")
                ),
            )
        })
}

/// The images this route takes: the hosted API's 4, or fewer when the server takes fewer
/// (none without a vision tower).
pub fn max_images(settings: &ServerSettings) -> usize {
    settings
        .media
        .as_ref()
        .map_or(0, |m| m.max_images.min(MAX_IMAGES))
}
