//! The wire types of the HTTP contract, the one source of `GET /openapi.json` (`openapi.rs`
//! derives its schemas from them with `schemars`).
//!
//! Responses are these types: the engine builds a [`DecisionBody`] of [`Answer`]s (the request
//! model's, `crate::request`, re-exported here as part of the contract), errors are an
//! [`ErrorBody`], `/health` a [`HealthBody`], `/v1/models` a [`ModelList`]; each is serialised
//! by serde, so the document and the bytes on the wire cannot disagree.
//! The requests are [`SystemOneBody`] (`request.rs`: `/v1/systemone`, everything the reference
//! accepts) and [`WorkersAiBody`] (`hosted.rs`: Workers AI's route, its published schema).
//! The server reads bodies with `crate::request::validate` (the reference's checks in the
//! reference's order over the raw JSON, so key order and exact numbers survive) and, on the
//! hosted route, `workers_ai::rules`; `openapi.rs` adds the limits the server was started
//! with, and the schemathesis run in CI checks live that every body the document forbids is
//! refused and every answer is documented.

mod hosted;
mod request;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::request::{Answer, ChoiceAnswer, DecisionBody, NoulAnswer, ScoreAnswer, Usage};
pub use hosted::{is_space, model_pattern, WorkersAiBody, DATA_URL_PATTERN};
pub use request::{ChoiceQuestion, NoulQuestion, QuestionBody, ScoreQuestion, SystemOneBody};

/// The request id every JSON answer carries (also as `x-typesafe-request-id`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// How a decision used the prefix cache.
pub const PREFIX_CACHE_HEADER: &str = "x-clef-prefix-cache";

/// Every error: FastAPI's `detail` list and the same message under `error`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    pub detail: Vec<ErrorDetail>,
    pub error: ErrorSummary,
}

/// Where and what went wrong.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// Path of the offending field, from `"body"` (empty when no field is at fault).
    #[schemars(with = "Vec<LocPart>")]
    pub loc: Vec<Value>,
    pub msg: String,
    /// `value_error`, `json_invalid`, `bool_type`, `max_tokens_exceeded`, `request_too_large`,
    /// `unsupported_media_type`, `authentication_error`, `model_not_found`,
    /// `rate_limit_exceeded`, `unavailable`, `internal_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
}

/// A field name, or an index into a list.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a schema only: locations are JSON values
enum LocPart {
    Field(String),
    Index(u64),
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ErrorSummary {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `/health`: 200 once every worker is warm, 503 before.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct HealthBody {
    pub status: HealthStatus,
    pub workers: usize,
    pub workers_ready: usize,
    /// Decisions waiting for a worker.
    pub queued: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    Starting,
}

/// `/v1/models`: the served model under each name it answers to.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelList {
    pub models: Vec<ModelCard>,
}

/// A served model: the SDKs' three fields, then clef-tt's details (weights, device, mesh,
/// precision, limits, prefix cache, counters).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelCard {
    pub name: String,
    pub description: String,
    /// `YYYY-MM-DD`.
    pub release_date: String,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// Workers AI's envelope (the hosted route,
/// `/client/v4/accounts/{account_id}/ai/run/@cf/cloudflare/clef`): the `/v1/systemone` answer
/// in `result` with `success` true and no errors, or `result` null, `success` false and the
/// hosted API's error code.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct WorkersAiEnvelope {
    #[schemars(with = "Option<DecisionBody>")]
    pub result: Value,
    pub success: bool,
    pub errors: Vec<WorkersAiError>,
    pub messages: Vec<String>,
}

/// One hosted error: Workers AI's code and the message.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct WorkersAiError {
    /// 6003 malformed JSON; 5006 not a request (no questions, unknown type, missing
    /// field); 5012 a hosted rule (too many questions or images, unknown field, empty
    /// instructions, bad image); 5021 too long (tokens or bytes); 7000 unknown model; 7003 not
    /// this account; 10000 authentication; 3040 busy; 5000 server error.
    pub code: u32,
    pub message: String,
}
