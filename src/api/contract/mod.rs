//! The wire types of the HTTP contract, the one source of `GET /openapi.json` (`openapi.rs`
//! derives its schemas from them with `schemars`).
//!
//! Responses are these types: the engine builds a [`DecisionBody`] of [`Answer`]s, errors are
//! an [`ErrorBody`], `/health` a [`HealthBody`], `/v1/models` a [`ModelList`]; each is
//! serialised by serde, so the document and the bytes on the wire cannot disagree.
//! The request is [`SystemOneBody`]: the shape a client sends. The server reads bodies with
//! `request::validate` (the reference's checks in the reference's order over the raw JSON, so
//! key order and exact numbers survive); `openapi.rs` adds the limits the server was started
//! with, and the schemathesis run in CI checks live that every body the document calls valid
//! is answered.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The request id every JSON answer carries (also as `x-typesafe-request-id`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// How a decision used the prefix cache.
pub const PREFIX_CACHE_HEADER: &str = "x-clef-prefix-cache";

/// `POST /v1/systemone`: a state and the questions to answer about it, in one pass.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SystemOneRequest")]
pub struct SystemOneBody {
    /// The model to ask. Echoed in the answer.
    pub model: String,
    /// What the model reads: text, or any JSON value (objects and arrays are rendered as
    /// JSON, in the order given).
    pub state: Value,
    /// The questions by id, answered jointly (answers depend on the set asked together). Ids
    /// appear in the prompt.
    pub questions: IndexMap<String, QuestionBody>,
    /// Images placed before the state: base64 strings, `data:image/...;base64,` URLs or
    /// `{"content_type", "base64"}` objects (PNG, JPEG or WebP). Needs a model with a vision
    /// tower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<ImageInput>>")]
    pub images: Option<Vec<Value>>,
    /// Videos as lists of frames (each frame as an image), after the images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<Vec<ImageInput>>>")]
    pub videos: Option<Vec<Vec<Value>>>,
    /// Cut an over-long state to the token limit instead of answering 422 (the server's
    /// default is in `/v1/models` under `limits.truncate_states`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
}

/// An image or video frame: base64 of the file, or a `data:` URL of it.
#[derive(JsonSchema)]
#[schemars(
    extend("contentEncoding" = "base64", "contentMediaType" = "image/*"),
    transparent
)]
#[allow(dead_code)] // a schema only: images are read as strings
struct ImageString(String);

/// An image as a string or in Workers AI's object form.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a schema only: images are read by `request::validate`
enum ImageInput {
    Encoded(ImageString),
    Object(ImageObject),
}

/// Workers AI's image form.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // a schema only
struct ImageObject {
    content_type: ImageContentType,
    #[schemars(extend("contentEncoding" = "base64"))]
    base64: String,
}

#[derive(JsonSchema)]
#[allow(dead_code)] // a schema only: `request::IMAGE_CONTENT_TYPES`
enum ImageContentType {
    #[serde(rename = "image/png")]
    Png,
    #[serde(rename = "image/jpeg")]
    Jpeg,
    #[serde(rename = "image/webp")]
    Webp,
}

/// One question, by `type`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[schemars(rename = "Question")]
pub enum QuestionBody {
    Noul(NoulQuestion),
    Choice(ChoiceQuestion),
    Score(ScoreQuestion),
}

/// A yes/no question; the answer is the probability of yes.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct NoulQuestion {
    /// The question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// What yes and no mean, when the question alone does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criteria: Option<NoulCriteria>,
}

/// One option out of several; the answer is a probability per option.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChoiceQuestion {
    /// The question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Option id to description, in the order to show them.
    pub criteria: IndexMap<String, String>,
}

/// A level on an ordered scale; the answer is the expected level and a probability per level.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ScoreQuestion {
    /// The question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The levels, lowest first (level `i` is answered as key `"i"`).
    pub criteria: Vec<String>,
}

/// What yes (`true`) and no (`false`) mean for a `noul` question.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoulCriteria {
    #[serde(rename = "true", default, skip_serializing_if = "Option::is_none")]
    pub yes: Option<String>,
    #[serde(rename = "false", default, skip_serializing_if = "Option::is_none")]
    pub no: Option<String>,
}

/// The answer to a decision.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SystemOneResponse")]
pub struct DecisionBody {
    /// The model name of the request.
    pub model: String,
    /// One answer per question id, in the request's order.
    pub answers: IndexMap<String, Answer>,
    pub usage: Usage,
    /// Present (true) when the state was cut to the token limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// Model time of this decision in milliseconds (set by the HTTP server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
}

impl DecisionBody {
    /// Set `latency_ms` on a serialised body (the server times the request after the engine
    /// has built it).
    pub fn set_latency_ms(body: &mut Value, seconds: f64) {
        body["latency_ms"] = Value::from((seconds * 1e4).round() / 10.0);
    }
}

/// Tokens read (the whole prompt) and written (always 0: the head answers without decoding).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// One question's answer, by `type`. Probabilities are rounded to 4 decimals.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Answer {
    Noul(NoulAnswer),
    Choice(ChoiceAnswer),
    Score(ScoreAnswer),
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct NoulAnswer {
    /// Probability of yes.
    pub noul: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChoiceAnswer {
    /// The most probable option id (the first, in the request's order, on a tie).
    pub choice: String,
    /// Its probability.
    pub confidence: f64,
    /// Every option id's probability, in the request's order.
    pub probabilities: IndexMap<String, f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ScoreAnswer {
    /// The expected level, `Σ i · p(i)`.
    pub score: f64,
    /// The probability of the most probable level.
    pub confidence: f64,
    /// Level index (`"0"`, `"1"`, ...) to the level as given.
    pub legend: IndexMap<String, Value>,
    /// Level index to probability.
    pub probabilities: IndexMap<String, f64>,
}

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
