//! Decision bodies (`POST /v1/systemone`, and the hosted route's before its own rules): parsing
//! that keeps what the reference sees (object key order, int/float distinction, exact big
//! integers, duplicate keys as last value at first position), and validation in the reference's
//! order with its messages, plus clear errors where the reference would crash.

use super::RequestError;
use serde_json::Value;

/// The three question types, with the head's type-embedding index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuestionType {
    Noul = 0,
    Choice = 1,
    Score = 2,
}

impl QuestionType {
    pub fn name(&self) -> &'static str {
        match self {
            QuestionType::Noul => "noul",
            QuestionType::Choice => "choice",
            QuestionType::Score => "score",
        }
    }
}

/// One validated question.
#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    pub id: String,
    pub kind: QuestionType,
    /// As given (`None` when absent).
    pub instructions: Option<Value>,
    /// As given (`None` when absent).
    pub criteria: Option<Value>,
}

/// A validated request.
#[derive(Clone, Debug, PartialEq)]
pub struct SystemOneRequest {
    pub model: String,
    pub state: Value,
    pub questions: Vec<Question>,
    /// `truncate` of the body (`None` when absent).
    pub truncate: Option<bool>,
    /// Whether `images` or `videos` is non-empty.
    pub has_media: bool,
    /// `images`: base64 strings or `data:` URLs, as given (the hosted `{content_type, base64}`
    /// form as the data URL it spells).
    pub images: Vec<String>,
    /// `videos`: each a list of frame strings, as given.
    pub videos: Vec<Vec<String>>,
}

fn media_error(loc: &[&str], msg: &str) -> RequestError {
    let mut e = RequestError::invalid(loc, msg, "value_error");
    // Indices are numbers in FastAPI's paths.
    for part in e.loc.iter_mut().skip(2) {
        if let Some(n) = part.as_str().and_then(|s| s.parse::<u64>().ok()) {
            *part = Value::from(n);
        }
    }
    e
}

/// The image types the hosted form names (`{"content_type", "base64"}`).
pub const IMAGE_CONTENT_TYPES: [&str; 3] = ["image/png", "image/jpeg", "image/webp"];

/// One image or video frame: a base64 string or `data:` URL as given, or the hosted form
/// `{"content_type": "image/png", "base64": "..."}`, which is read as the data URL it spells.
fn media_string(value: &Value, loc: &[&str], what: &str) -> Result<String, RequestError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Object(o) => {
            let (Some(Value::String(kind)), Some(Value::String(data)), 2) =
                (o.get("content_type"), o.get("base64"), o.len())
            else {
                return Err(media_error(
                    loc,
                    &format!(
                        "{what} object must have exactly \"content_type\" and \"base64\" strings"
                    ),
                ));
            };
            if !IMAGE_CONTENT_TYPES.contains(&kind.as_str()) {
                return Err(media_error(
                    loc,
                    &format!(
                        "content_type {kind:?} is not one of {}",
                        IMAGE_CONTENT_TYPES.join(", ")
                    ),
                ));
            }
            Ok(format!("data:{kind};base64,{data}"))
        }
        _ => Err(media_error(
            loc,
            &format!("{what} must be a base64 string, a data: URL or {{content_type, base64}}"),
        )),
    }
}

/// `images` (absent or null: none): a list of images.
fn media_strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, RequestError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| media_string(v, &[field, &i.to_string()], "an image"))
            .collect(),
        Some(_) => Err(media_error(
            &[field],
            "images must be a list of base64 strings, data: URLs or {content_type, base64}",
        )),
    }
}

/// Bounds that protect the host (configurable; the reference has none).
#[derive(Clone, Debug, PartialEq)]
pub struct HostLimits {
    pub max_questions: usize,
    pub max_choice_options: usize,
    pub max_score_levels: usize,
    /// Longest question id, in characters (ids are repeated in the prompt).
    pub max_id_chars: usize,
    /// The hosted API's rules too: instructions required, ids `[A-Za-z0-9_.-]{1,100}`, at
    /// least 2 choice options and 2 score levels.
    pub strict: bool,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_questions: 64,
            max_choice_options: 255,
            max_score_levels: 10,
            max_id_chars: 1024,
            strict: false,
        }
    }
}

/// Parse a body as Python's `json.loads` would see it.
pub fn parse_body(bytes: &[u8]) -> Result<Value, RequestError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        RequestError::invalid(&[], format!("the body is not UTF-8: {e}"), "json_invalid")
    })?;
    serde_json::from_str(text).map_err(|e| {
        RequestError::invalid(
            &[],
            format!("the body is not valid JSON: {e}"),
            "json_invalid",
        )
    })
}

/// Python truthiness of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => {
            let t = n.to_string();
            t.parse::<f64>().map(|x| x != 0.0).unwrap_or(true)
        }
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Validate a parsed body: the reference's checks in its order, then shapes it would crash on.
pub fn validate(
    body: &Value,
    limits: Option<&HostLimits>,
) -> Result<SystemOneRequest, RequestError> {
    const REQUIRED: &str = "model and state are required";
    let Value::Object(obj) = body else {
        return Err(RequestError::value_error(&[], REQUIRED));
    };
    let model = match obj.get("model") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(RequestError::value_error(&["model"], REQUIRED)),
    };
    let Some(state) = obj.get("state") else {
        return Err(RequestError::value_error(&["state"], REQUIRED));
    };
    let questions = match obj.get("questions") {
        Some(Value::Object(q)) if !q.is_empty() => q,
        _ => {
            return Err(RequestError::value_error(
                &["questions"],
                "at least one question is required",
            ))
        }
    };
    let mut out = Vec::with_capacity(questions.len());
    for (id, q) in questions {
        out.push(validate_question(id, q)?);
    }
    let truncate = match obj.get("truncate") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(RequestError::invalid(
                &["truncate"],
                "truncate must be a boolean",
                "bool_type",
            ))
        }
    };
    let images = media_strings(obj.get("images"), "images")?;
    let videos = match obj.get("videos") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Array(frames) => frames
                    .iter()
                    .enumerate()
                    .map(|(k, f)| {
                        media_string(
                            f,
                            &["videos", &i.to_string(), &k.to_string()],
                            "a video frame",
                        )
                    })
                    .collect(),
                _ => Err(media_error(
                    &["videos", &i.to_string()],
                    "a video must be a list of frames (base64 strings or data: URLs)",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(media_error(&["videos"], "videos must be a list of videos")),
    };
    let request = SystemOneRequest {
        model,
        state: state.clone(),
        questions: out,
        truncate,
        has_media: !images.is_empty() || !videos.is_empty(),
        images,
        videos,
    };
    if let Some(l) = limits {
        check_limits(&request, l)?;
    }
    Ok(request)
}

fn validate_question(id: &str, q: &Value) -> Result<Question, RequestError> {
    let loc = ["questions", id];
    let Value::Object(q) = q else {
        return Err(RequestError::value_error(
            &loc,
            format!("{id}: question must be an object"),
        ));
    };
    let kind = match q.get("type") {
        Some(Value::String(s)) if s == "noul" => QuestionType::Noul,
        Some(Value::String(s)) if s == "choice" => QuestionType::Choice,
        Some(Value::String(s)) if s == "score" => QuestionType::Score,
        _ => {
            return Err(RequestError::value_error(
                &["questions", id, "type"],
                format!("{id}: type must be noul, choice, or score"),
            ))
        }
    };
    let criteria = q.get("criteria").cloned();
    let cloc = ["questions", id, "criteria"];
    if kind != QuestionType::Noul && !criteria.as_ref().map(truthy).unwrap_or(false) {
        return Err(RequestError::value_error(
            &cloc,
            format!("{id}: criteria must not be empty"),
        ));
    }
    // Shapes the reference does not reject but crashes on.
    match (kind, &criteria) {
        (QuestionType::Choice, Some(c)) if !c.is_object() => {
            return Err(RequestError::value_error(
                &cloc,
                format!("{id}: choice criteria must be an object of option id to description"),
            ))
        }
        (QuestionType::Noul, Some(c)) if truthy(c) && !c.is_object() => {
            return Err(RequestError::value_error(
                &cloc,
                format!("{id}: noul criteria must be an object with \"true\" and/or \"false\""),
            ))
        }
        (QuestionType::Score, Some(c)) if !(c.is_array() || c.is_object() || c.is_string()) => {
            return Err(RequestError::value_error(
                &cloc,
                format!("{id}: score criteria must be a list of levels"),
            ))
        }
        _ => {}
    }
    Ok(Question {
        id: id.to_string(),
        kind,
        instructions: q.get("instructions").cloned(),
        criteria,
    })
}

fn check_limits(r: &SystemOneRequest, l: &HostLimits) -> Result<(), RequestError> {
    if r.questions.len() > l.max_questions {
        return Err(RequestError::value_error(
            &["questions"],
            format!(
                "{} questions; at most {} are allowed",
                r.questions.len(),
                l.max_questions
            ),
        ));
    }
    for q in &r.questions {
        let chars = q.id.chars().count();
        if chars > l.max_id_chars {
            return Err(RequestError::value_error(
                &["questions"],
                format!(
                    "a question id of {chars} characters; at most {} are allowed",
                    l.max_id_chars
                ),
            ));
        }
        let n = option_count(q);
        if l.strict {
            check_strict(q, n)?;
        }
        let (max, what) = match q.kind {
            QuestionType::Choice => (l.max_choice_options, "choice options"),
            QuestionType::Score => (l.max_score_levels, "score levels"),
            QuestionType::Noul => continue,
        };
        if n > max {
            return Err(RequestError::value_error(
                &["questions", &q.id, "criteria"],
                format!("{}: {n} {what}; at most {max} are allowed", q.id),
            ));
        }
    }
    Ok(())
}

fn check_strict(q: &Question, options: usize) -> Result<(), RequestError> {
    let id_ok = !q.id.is_empty()
        && q.id.len() <= 100
        && q.id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !id_ok {
        return Err(RequestError::value_error(
            &["questions", &q.id],
            format!(
                "{:?}: question ids must match [A-Za-z0-9_.-]{{1,100}}",
                q.id
            ),
        ));
    }
    let has_instructions = q.instructions.as_ref().is_some_and(truthy);
    if !has_instructions {
        return Err(RequestError::value_error(
            &["questions", &q.id, "instructions"],
            format!("{}: instructions are required", q.id),
        ));
    }
    if q.kind != QuestionType::Noul && options < 2 {
        return Err(RequestError::value_error(
            &["questions", &q.id, "criteria"],
            format!("{}: at least 2 options are required", q.id),
        ));
    }
    Ok(())
}

/// How many options a validated question has.
pub fn option_count(q: &Question) -> usize {
    match q.kind {
        QuestionType::Noul => 2,
        _ => match &q.criteria {
            Some(Value::Array(a)) => a.len(),
            Some(Value::Object(o)) => o.len(),
            Some(Value::String(s)) => s.chars().count(),
            _ => 0,
        },
    }
}
