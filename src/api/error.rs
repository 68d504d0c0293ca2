//! Client-facing errors: a [`RequestError`] as the FastAPI-style body
//! `{"detail": [{"loc", "msg", "type"}], "error": {"message", "type"}}` (the message in both
//! places so every client's extractor finds it).

use super::contract::{ErrorBody, ErrorDetail, ErrorSummary};
use crate::request::RequestError;
use serde_json::Value;

/// The body ([`ErrorBody`]) of a refusal, as JSON.
pub fn error_body(e: &RequestError) -> Value {
    let body = ErrorBody {
        detail: vec![ErrorDetail {
            loc: e.loc.clone(),
            msg: e.msg.clone(),
            kind: e.kind.clone(),
        }],
        error: ErrorSummary {
            message: e.msg.clone(),
            kind: e.kind.clone(),
        },
    };
    serde_json::to_value(body).unwrap_or(Value::Null)
}
