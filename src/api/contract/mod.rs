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

/// `/health`: 200 once every worker is warm, 503 before, and 503 for good once a device stopped
/// answering (the process exits after its drain window).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct HealthBody {
    pub status: HealthStatus,
    pub workers: usize,
    pub workers_ready: usize,
    /// Decisions waiting for a worker.
    pub queued: usize,
    /// Why the server is unhealthy (with `device_hung`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
    Starting,
    /// A worker's device missed the device deadline (`CLEF_DEVICE_TIMEOUT`).
    DeviceHung,
}

/// `/v1/models`: the served model under each name it answers to, twice: the port's cards
/// (`models`) and OpenAI's list shape (`object`, `data`), which OpenAI clients and Tenstorrent's
/// `tt` CLI read to find what a server serves (`tt`'s discovery takes every `data` entry's `id`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelList {
    pub object: ListObject,
    pub data: Vec<OpenAiModel>,
    pub models: Vec<ModelCard>,
}

/// OpenAI's list marker: always `"list"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ListObject {
    #[serde(rename = "list")]
    List,
}

/// OpenAI's model marker: always `"model"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModelObject {
    #[serde(rename = "model")]
    Model,
}

/// A served name in OpenAI's model shape.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct OpenAiModel {
    /// The name to put in a request's `model` (as the card's `name`).
    pub id: String,
    pub object: ModelObject,
    /// The model's release date as Unix seconds (midnight UTC).
    pub created: u64,
    /// The model's publisher.
    pub owned_by: String,
}

/// Unix seconds at midnight UTC of a `YYYY-MM-DD` date (proleptic Gregorian), or None for
/// anything else or a date before 1970.
pub fn unix_midnight(date: &str) -> Option<u64> {
    let mut parts = date.splitn(3, '-');
    let mut field = |len: usize| {
        parts
            .next()
            .filter(|p| p.len() == len && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<i64>().ok())
    };
    let (y, m, d) = (field(4)?, field(2)?, field(2)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month[(m - 1) as usize] {
        return None;
    }
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400).ok()
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

#[cfg(test)]
mod tests {
    use super::unix_midnight;

    #[test]
    fn unix_midnight_agrees_with_the_calendar() {
        // Values from Python's datetime (UTC midnight).
        for (date, secs) in [
            ("1970-01-01", 0),
            ("1999-12-31", 946_598_400),
            ("2000-03-01", 951_868_800),
            ("2024-02-29", 1_709_164_800),
            ("2026-11-29", 1_795_910_400),
        ] {
            assert_eq!(unix_midnight(date), Some(secs), "{date}");
        }
        for bad in [
            "2026-02-29",
            "2026-13-01",
            "2026-1-01",
            "1969-12-31",
            "2026-11-29x",
            "",
        ] {
            assert_eq!(unix_midnight(bad), None, "{bad}");
        }
    }
}
