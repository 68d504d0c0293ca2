//! `POST /v1/systemone`'s body as the reference reads it:
//! instructions, option descriptions and score levels may be any JSON value (rendered as
//! compact sorted JSON), score criteria may also be an object (its keys are the levels) or a
//! string (its characters are), noul criteria an object with any other keys (ignored) or a falsy
//! non-object (read as none), the state any JSON value. The schema says no more and no less
//! than `crate::request::validate` checks, so every body it forbids is refused (422) — the
//! schemathesis run's `negative_data_rejection` — and what is refused beyond it (an empty id
//! without instructions, images that are not pictures, over-long prompts) is documented as 422.
//! `tests/contract_agreement.rs` holds the two to each other mechanically: generated and
//! mutated bodies pass this schema (through a JSON Schema validator) exactly when they pass
//! `validate`.

use indexmap::IndexMap;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/systemone`: a state and the questions to answer about it, in one pass.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SystemOneRequest")]
pub struct SystemOneBody {
    /// The model to ask. Echoed in the answer.
    pub model: String,
    /// What the model reads: text, or any JSON value (objects and arrays are rendered as
    /// JSON, keys sorted).
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
pub(super) struct ImageObject {
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
    /// The question: text, or any JSON value (rendered as JSON). Absent, null or empty: the
    /// question id is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub instructions: Option<Value>,
    /// What yes (`true`) and no (`false`) mean when the question alone does not say, each any
    /// JSON value (null: no description); other keys are ignored, and a falsy value that is not
    /// an object (null, false, 0, "", []) means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "noul_criteria")]
    pub criteria: Option<Value>,
}

/// One option out of several; the answer is a probability per option.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChoiceQuestion {
    /// The question: text, or any JSON value (rendered as JSON). Absent, null or empty: the
    /// question id is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub instructions: Option<Value>,
    /// Option id to description (text or any JSON value; null: none), in the order to show
    /// them.
    pub criteria: IndexMap<String, Value>,
}

/// A level on an ordered scale; the answer is the expected level and a probability per level.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ScoreQuestion {
    /// The question: text, or any JSON value (rendered as JSON). Absent, null or empty: the
    /// question id is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub instructions: Option<Value>,
    /// The levels, lowest first (level `i` is answered as key `"i"`): a list of descriptions
    /// (text or any JSON value), or, as the reference iterates them, an object (its keys are
    /// the levels) or a string (its characters are).
    #[schemars(schema_with = "score_levels")]
    pub criteria: Value,
}

fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({})
}

/// An object (`true` / `false` descriptions of any type, other keys allowed), or a falsy
/// value that is not an object: null, false, 0, "" or []. (Spelled as typed branches rather
/// than one `enum`: client generators read those.)
fn noul_criteria(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [
            {"type": "object", "properties": {"true": {}, "false": {}}},
            {"type": "null"},
            {"type": "boolean", "const": false},
            {"type": "number", "minimum": 0, "maximum": 0},
            {"type": "string", "maxLength": 0},
            {"type": "array", "items": {}, "maxItems": 0},
        ]
    })
}

/// A list, an object or a string (branches 0, 1, 2); the option bounds are written into each
/// by `openapi.rs`.
fn score_levels(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [
            {"type": "array", "items": {}},
            {"type": "object", "additionalProperties": true},
            {"type": "string"},
        ]
    })
}
