//! The reference's record layout (the reference's code): prompt pieces tokenized one by
//! one, question and option spans, option order, and the length rules — the reference's single
//! `max_length` budget, or the server's state-piece / tail limits.

use super::json::dumps;
use crate::request::{Question, QuestionType, RequestError, SystemOneRequest};
use serde_json::{Map, Value};
use tokenizers::Tokenizer;

pub const SYSTEM_PROMPT: &str = "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of that field's allowed options.";
pub const NOUL_TRUE: &str = "The proposition is true or the answer is yes.";
pub const NOUL_FALSE: &str = "The proposition is false or the answer is no.";
const SUFFIX: &str =
    "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:";

fn prefix_text() -> String {
    format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n")
}

/// How the prompt's length is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthRule {
    /// The reference: one budget for the whole prompt; the state is silently cut to fit.
    Reference { max_length: usize },
    /// The server: the state piece (prefix, media, state) and the tail (schema, suffix) each
    /// bounded; over → 422 unless `truncate`, which keeps the state's first tokens.
    Server {
        max_state: usize,
        max_tail: usize,
        truncate: bool,
    },
}

/// One encoded question.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedQuestion {
    pub id: String,
    pub kind: QuestionType,
    pub span: (usize, usize),
    pub option_spans: Vec<(usize, usize)>,
    /// Option ids in model order.
    pub option_ids: Vec<String>,
}

/// A request turned into model input.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedRecord {
    pub input_ids: Vec<u32>,
    pub questions: Vec<EncodedQuestion>,
    /// End of the state piece (prefix + media + kept state): where the schema starts.
    pub state_end: usize,
    /// Whether state tokens were dropped.
    pub truncated: bool,
}

/// Why a request could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// `render(value)`: a string verbatim, anything else as compact sorted JSON.
pub fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => dumps(other, true),
    }
}

/// A question's options in model order: (option id, description or `None`).
pub fn question_options(q: &Question) -> Vec<(String, Option<Value>)> {
    match q.kind {
        QuestionType::Noul => {
            let mut t = Some(Value::from(NOUL_TRUE));
            let mut f = Some(Value::from(NOUL_FALSE));
            if let Some(Value::Object(c)) = &q.criteria {
                if let Some(v) = c.get("true") {
                    t = Some(v.clone());
                }
                if let Some(v) = c.get("false") {
                    f = Some(v.clone());
                }
            }
            let some = |v: Option<Value>| v.filter(|x| !x.is_null());
            vec![("true".into(), some(t)), ("false".into(), some(f))]
        }
        QuestionType::Choice => {
            let mut opts: Vec<(String, Option<Value>)> = match &q.criteria {
                Some(Value::Object(c)) => c
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone()).filter(|x| !x.is_null())))
                    .collect(),
                _ => Vec::new(),
            };
            opts.sort_by(|a, b| a.0.cmp(&b.0));
            opts
        }
        QuestionType::Score => score_levels(q)
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), Some(v).filter(|x| !x.is_null())))
            .collect(),
    }
}

/// The levels of a score question as Python iterates its criteria (list elements, object
/// keys, or string characters).
pub fn score_levels(q: &Question) -> Vec<Value> {
    match &q.criteria {
        Some(Value::Array(a)) => a.clone(),
        Some(Value::Object(o)) => o.keys().map(|k| Value::from(k.as_str())).collect(),
        Some(Value::String(s)) => s.chars().map(|c| Value::from(c.to_string())).collect(),
        _ => Vec::new(),
    }
}

/// The rendered option semantics `{"description":…,"option_id":…}`.
fn option_text(id: &str, description: &Option<Value>) -> String {
    let mut m = Map::new();
    m.insert("option_id".into(), Value::from(id));
    if let Some(d) = description {
        m.insert("description".into(), d.clone());
    }
    dumps(&Value::Object(m), true)
}

struct Tok<'a>(&'a Tokenizer);

impl Tok<'_> {
    fn ids(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        self.0
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))
    }
}

/// Encode a validated request. `media_ids` are the expanded media tokens (empty for text).
pub fn encode(
    tokenizer: &Tokenizer,
    req: &SystemOneRequest,
    media_ids: &[u32],
    rule: LengthRule,
) -> Result<EncodedRecord, EncodeError> {
    let tok = Tok(tokenizer);
    // Schema first, with spans relative to its start.
    let mut schema: Vec<u32> = tok.ids("\n\nSCHEMA FIELDS:\n")?;
    let mut questions = Vec::with_capacity(req.questions.len());
    for (i, q) in req.questions.iter().enumerate() {
        let header = format!(
            "\nFIELD {}\nID: {}\nTYPE: {}\nINSTRUCTION: ",
            i + 1,
            q.id,
            q.kind.name()
        );
        schema.extend(tok.ids(&header)?);
        let instructions = match &q.instructions {
            None | Some(Value::Null) => Value::from(q.id.as_str()),
            Some(Value::String(s)) if s.is_empty() => Value::from(q.id.as_str()),
            Some(v) => v.clone(),
        };
        let start = schema.len();
        schema.extend(tok.ids(&render(&instructions))?);
        let span = (start, schema.len());
        if span.0 == span.1 {
            return Err(RequestError::value_error(
                &["questions", &q.id, "instructions"],
                format!(
                    "{:?}: the instruction text is empty (an empty question id needs instructions)",
                    q.id
                ),
            )
            .into());
        }
        schema.extend(tok.ids("\nALLOWED OPTIONS:\n")?);
        let mut option_spans = Vec::new();
        let mut option_ids = Vec::new();
        for (j, (id, desc)) in question_options(q).into_iter().enumerate() {
            schema.extend(tok.ids(&format!("OPTION {}: ", j + 1))?);
            let s = schema.len();
            schema.extend(tok.ids(&option_text(&id, &desc))?);
            option_spans.push((s, schema.len()));
            schema.extend(tok.ids("\n")?);
            option_ids.push(id);
        }
        schema.extend(tok.ids("END FIELD\n")?);
        questions.push(EncodedQuestion {
            id: q.id.clone(),
            kind: q.kind,
            span,
            option_spans,
            option_ids,
        });
    }
    let prefix = tok.ids(&prefix_text())?;
    let suffix = tok.ids(SUFFIX)?;
    let state = tok.ids(&render(&req.state))?;
    let head_len = prefix.len() + media_ids.len();
    let tail_len = schema.len() + suffix.len();
    let keep = match rule {
        LengthRule::Reference { max_length } => {
            let fixed = head_len + tail_len;
            if fixed > max_length {
                return Err(RequestError::value_error(
                    &[],
                    format!("schema requires {fixed} tokens before state; maximum is {max_length}"),
                )
                .into());
            }
            state.len().min(max_length - fixed)
        }
        LengthRule::Server {
            max_state,
            max_tail,
            truncate,
        } => {
            if tail_len > max_tail {
                return Err(RequestError::invalid(
                    &["questions"],
                    format!("the schema and suffix take {tail_len} tokens; at most {max_tail} are allowed"),
                    "max_tokens_exceeded",
                )
                .into());
            }
            if head_len > max_state {
                return Err(RequestError::invalid(
                    &["images"],
                    format!("the prompt prefix and media take {head_len} tokens; the state piece allows {max_state}"),
                    "max_tokens_exceeded",
                )
                .into());
            }
            let piece = head_len + state.len();
            if piece > max_state && !truncate {
                return Err(RequestError::invalid(
                    &["state"],
                    format!(
                        "the state piece takes {piece} tokens ({} of them the state); at most {max_state} are allowed \
                         (send \"truncate\": true to keep the first state tokens)",
                        state.len()
                    ),
                    "max_tokens_exceeded",
                )
                .into());
            }
            state.len().min(max_state - head_len)
        }
    };
    let state_end = head_len + keep;
    let mut input_ids = Vec::with_capacity(state_end + tail_len);
    input_ids.extend_from_slice(&prefix);
    input_ids.extend_from_slice(media_ids);
    input_ids.extend_from_slice(&state[..keep]);
    input_ids.extend_from_slice(&schema);
    input_ids.extend_from_slice(&suffix);
    for q in &mut questions {
        q.span = (q.span.0 + state_end, q.span.1 + state_end);
        for s in &mut q.option_spans {
            *s = (s.0 + state_end, s.1 + state_end);
        }
    }
    Ok(EncodedRecord {
        input_ids,
        questions,
        state_end,
        truncated: keep < state.len(),
    })
}
