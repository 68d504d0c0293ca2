//! What a decision answers: the body the engine builds ([`DecisionBody`]: the model name, one
//! [`Answer`] per question in the request's order, [`Usage`], `truncated`, `latency_ms`), with
//! the reference's answer shapes (the reference's code). Serde gives the bytes on the
//! wire and schemars their schema, so `api`'s OpenAPI document describes exactly these.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
