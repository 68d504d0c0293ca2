//! Workers AI's request body for `@cf/cloudflare/clef` and `clef-flash`, as the hosted API's
//! published schema states it (cloudflare-docs `workers-ai-models/clef.json`): the limits its
//! descriptions give (1–64 questions, ids `[A-Za-z0-9_.-]` of at most 100 characters, 2–255
//! options, 2–10 levels, at most 4 images) become schema keywords, and the types its
//! descriptions name are the only ones allowed — the state a string, an object or an array;
//! instructions a non-empty string, object or array; option and noul descriptions a string,
//! object, array or null; levels a string, object or array; images `data:` URLs or
//! `{content_type, base64}`; no other field. `workers_ai::rules` refuses (422/5012) every body
//! this schema forbids and the reference's validation lets through, so a request that works
//! here works on Workers AI and the other way round.

use super::request::ImageObject;
use indexmap::IndexMap;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::Value;

/// The characters ECMAScript's `\s` matches, as a regex class: the published pattern of
/// `model` (`^\s*(clef|clef-flash)\s*$`) is evaluated where Workers AI runs, in JavaScript.
/// Spelled out so that Python (schemathesis) and Rust read the pattern alike.
pub const SPACE_CLASS: &str =
    r"[\t\n\u000b\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]";

/// Whether `c` is in [`SPACE_CLASS`].
pub fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

/// The pattern of a body `model` naming one of `selectors` (`clef`, `clef-flash`), spaces
/// around it allowed.
pub fn model_pattern(selectors: &[&str]) -> String {
    format!("^{SPACE_CLASS}*({}){SPACE_CLASS}*$", selectors.join("|"))
}

/// The pattern of a hosted image string: a `data:` URL (the scheme in any case).
pub const DATA_URL_PATTERN: &str = "^[Dd][Aa][Tt][Aa]:";

/// Workers AI's `POST .../ai/run/@cf/cloudflare/clef` body.
#[derive(JsonSchema)]
#[schemars(
    rename = "WorkersAiSystemOneRequest",
    extend("additionalProperties" = false)
)]
pub struct WorkersAiBody {
    /// The model selector: `clef` for @cf/cloudflare/clef, `clef-flash` for
    /// @cf/cloudflare/clef-flash (the path's), spaces around it allowed.
    #[schemars(schema_with = "model")]
    pub model: String,
    /// The content to evaluate: a string, or structured data (an object or an array).
    #[schemars(schema_with = "state")]
    pub state: Value,
    /// Question id (letters, digits, `_`, `.`, `-`; at most 100 characters) to a typed
    /// question; 1 to 64 questions.
    pub questions: IndexMap<String, WorkersAiQuestion>,
    /// At most 4 PNG, JPEG or WebP images placed before the state, each a base64 `data:` URL
    /// or `{"content_type", "base64"}`; remote URLs and bare base64 are not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<WorkersAiImage>")]
    pub images: Option<Vec<Value>>,
}

/// One hosted question, by `type` (each refuses unknown fields: `openapi.rs` closes them
/// once the `type` tag is in their properties).
#[derive(JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[schemars(rename = "WorkersAiQuestion")]
pub enum WorkersAiQuestion {
    Noul(WorkersAiNoul),
    Choice(WorkersAiChoice),
    Score(WorkersAiScore),
}

/// A yes/no question; the answer is the probability of yes.
#[derive(JsonSchema)]
#[schemars(rename = "WorkersAiNoulQuestion")]
pub struct WorkersAiNoul {
    /// The yes/no question: a non-empty string, or an object or array that holds the question
    /// in one field and referenced data in others.
    #[schemars(schema_with = "instructions")]
    pub instructions: Value,
    /// What a yes and a no mean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "WorkersAiNoulCriteria")]
    pub criteria: Option<Value>,
}

/// What a yes (`true`) and a no (`false`) mean: a string, object, array or null each.
#[derive(JsonSchema)]
#[allow(dead_code)] // a schema only
#[schemars(rename = "WorkersAiNoulCriteria", extend("additionalProperties" = false))]
pub struct WorkersAiNoulCriteria {
    #[serde(rename = "true", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "description")]
    pub yes: Option<Value>,
    #[serde(rename = "false", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "description")]
    pub no: Option<Value>,
}

/// Pick one option from a set; the answer is a probability per option.
#[derive(JsonSchema)]
#[schemars(rename = "WorkersAiChoiceQuestion")]
pub struct WorkersAiChoice {
    /// What to decide: a non-empty string, or an object or array holding the question and
    /// referenced data.
    #[schemars(schema_with = "instructions")]
    pub instructions: Value,
    /// Option id (a non-empty string) to its description: a string, object, array or null;
    /// 2 to 255 options.
    #[schemars(schema_with = "options")]
    pub criteria: IndexMap<String, Value>,
}

/// Rate on an ordered rubric; the answer is the expected level and a probability per level.
#[derive(JsonSchema)]
#[schemars(rename = "WorkersAiScoreQuestion")]
pub struct WorkersAiScore {
    /// What to rate: a non-empty string, or an object or array holding the question and
    /// referenced data.
    #[schemars(schema_with = "instructions")]
    pub instructions: Value,
    /// The level descriptions (a string, object or array each), lowest first; 2 to 10 levels.
    #[schemars(schema_with = "levels")]
    pub criteria: Vec<Value>,
}

/// A hosted image: a `data:` URL, or the object form.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "WorkersAiImage")]
#[allow(dead_code)] // a schema only
pub enum WorkersAiImage {
    DataUrl(#[schemars(schema_with = "data_url")] String),
    Object(ImageObject),
}

fn model(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "pattern": model_pattern(&["clef", "clef-flash"])})
}

// Unions as `anyOf` of typed branches (objects with `additionalProperties`, arrays with
// `items`), the form client generators read; a `type` list means the same to a validator.

fn state(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"anyOf": [
        {"type": "string"},
        {"type": "object", "additionalProperties": true},
        {"type": "array", "items": {}},
    ]})
}

fn instructions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "object", "additionalProperties": true, "minProperties": 1},
        {"type": "array", "items": {}, "minItems": 1},
    ]})
}

/// An option's or a noul outcome's description.
fn description_schema() -> serde_json::Value {
    serde_json::json!({"anyOf": [
        {"type": "string"},
        {"type": "object", "additionalProperties": true},
        {"type": "array", "items": {}},
        {"type": "null"},
    ]})
}

fn description(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(description_schema()).unwrap_or_default()
}

fn options(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "propertyNames": {"minLength": 1},
        "additionalProperties": description_schema(),
    })
}

fn levels(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "array", "items": {"anyOf": [
        {"type": "string"},
        {"type": "object", "additionalProperties": true},
        {"type": "array", "items": {}},
    ]}})
}

fn data_url(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string", "pattern": DATA_URL_PATTERN,
        "contentMediaType": "image/*",
    })
}
