//! Why a request is refused: an HTTP status, the path of the field at fault and a message, with
//! FastAPI's error `type` (`value_error`, `json_invalid`, `max_tokens_exceeded`, ...). The model
//! code raises these; `api` turns them into the wire body (`detail` + `error`) or the hosted
//! envelope.

use serde_json::Value;

/// One refusal.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {msg}")]
pub struct RequestError {
    pub status: u16,
    /// Path of the offending field, starting with `"body"` (empty when no field is at fault).
    pub loc: Vec<Value>,
    pub msg: String,
    /// FastAPI error type: `value_error`, `json_invalid`, `max_tokens_exceeded`, ...
    pub kind: String,
}

impl RequestError {
    /// A 422 at `loc` (below `body`).
    pub fn invalid(loc: &[&str], msg: impl Into<String>, kind: &str) -> Self {
        let mut path = vec![Value::from("body")];
        path.extend(loc.iter().map(|s| Value::from(*s)));
        RequestError {
            status: 422,
            loc: path,
            msg: msg.into(),
            kind: kind.to_string(),
        }
    }

    /// The reference's own `ValueError`, at `loc`.
    pub fn value_error(loc: &[&str], msg: impl Into<String>) -> Self {
        Self::invalid(loc, msg, "value_error")
    }

    /// An error of the whole request (no field at fault).
    pub fn status(status: u16, msg: impl Into<String>, kind: &str) -> Self {
        RequestError {
            status,
            loc: vec![],
            msg: msg.into(),
            kind: kind.to_string(),
        }
    }

    /// A 500 for a failure on our side.
    pub fn internal(msg: impl Into<String>) -> Self {
        RequestError {
            status: 500,
            loc: vec![],
            msg: msg.into(),
            kind: "internal_error".into(),
        }
    }
}
