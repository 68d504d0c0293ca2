//! Client-facing errors: an HTTP status and a FastAPI-style body
//! `{"detail": [{"loc", "msg", "type"}], "error": {"message", "type"}}` (the message in both
//! places so every client's extractor finds it).

use super::contract::{ErrorBody, ErrorDetail, ErrorSummary};
use serde_json::Value;

/// One error answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {msg}")]
pub struct ApiError {
    pub status: u16,
    /// Path of the offending field, starting with `"body"`.
    pub loc: Vec<Value>,
    pub msg: String,
    /// FastAPI error type: `value_error`, `json_invalid`, `max_tokens_exceeded`, ...
    pub kind: String,
}

impl ApiError {
    /// A 422 at `loc` (below `body`).
    pub fn invalid(loc: &[&str], msg: impl Into<String>, kind: &str) -> Self {
        let mut path = vec![Value::from("body")];
        path.extend(loc.iter().map(|s| Value::from(*s)));
        ApiError {
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
        ApiError {
            status,
            loc: vec![],
            msg: msg.into(),
            kind: kind.to_string(),
        }
    }

    /// A 500 for a failure on our side.
    pub fn internal(msg: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            loc: vec![],
            msg: msg.into(),
            kind: "internal_error".into(),
        }
    }

    /// The body ([`ErrorBody`]) as JSON.
    pub fn body(&self) -> Value {
        let body = ErrorBody {
            detail: vec![ErrorDetail {
                loc: self.loc.clone(),
                msg: self.msg.clone(),
                kind: self.kind.clone(),
            }],
            error: ErrorSummary {
                message: self.msg.clone(),
                kind: self.kind.clone(),
            },
        };
        serde_json::to_value(body).unwrap_or(Value::Null)
    }
}
