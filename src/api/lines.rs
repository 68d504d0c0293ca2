//! Request lines (what `clef-tt decide` runs): answer requests from a file with a local model, one result line per
//! request — `{"status": <http status>, "body": <response or error body>}` — the same bodies the
//! server sends under the same limits. `--max-length N` applies the reference's single budget
//! instead (the state silently cut to fit), which is how the goldens' truncation cases run.
//! With `--url` the bodies go to a running server and its answers are printed the same way
//! (without the server's `latency_ms`, so both modes print the same lines for one model).

use super::client::{Client, ClientError};
use crate::encode::json::dumps;
use crate::encode::LengthRule;
use crate::engine::Pipeline;
use crate::request::HostLimits;
use clef_device::MeshOps;
use serde_json::json;
use std::io::Write;

/// The request bodies of a file: the whole file when it is one JSON value, else one per
/// non-empty line (a bad line still becomes a request, answered with its parse error).
pub fn bodies(text: &str) -> Vec<String> {
    if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
        return vec![text.to_string()];
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// One result line for one body.
pub fn result_line<B: MeshOps>(
    pipeline: &Pipeline<B>,
    body: &str,
    rule: LengthRule,
    limits: Option<&HostLimits>,
) -> String {
    let (status, body) = match pipeline.decide_body(body.as_bytes(), rule, limits) {
        Ok(d) => (200, d.response),
        Err(e) => (e.status, super::error_body(&e)),
    };
    dumps(&json!({"status": status, "body": body}), false)
}

/// Answer every body of `text`, writing one line each to `out`.
pub fn run<B: MeshOps>(
    pipeline: &Pipeline<B>,
    text: &str,
    rule: LengthRule,
    out: &mut impl Write,
) -> std::io::Result<usize> {
    let limits = match rule {
        LengthRule::Reference { .. } => None,
        LengthRule::Server { .. } => Some(HostLimits::default()),
    };
    let all = bodies(text);
    for body in &all {
        writeln!(
            out,
            "{}",
            result_line(pipeline, body, rule, limits.as_ref())
        )?;
    }
    Ok(all.len())
}

/// Why remote request lines stopped.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("writing a result line: {0}")]
    Write(#[from] std::io::Error),
}

/// Send every body of `text` to the server behind `client`, writing one line each to `out`.
/// A server that cannot be reached is an error (nothing more is sent).
pub fn run_remote(client: &Client, text: &str, out: &mut impl Write) -> Result<usize, RemoteError> {
    let all = bodies(text);
    for body in &all {
        let reply = client.decide(body.as_bytes())?;
        let mut value = serde_json::from_str::<serde_json::Value>(&reply.body)
            .unwrap_or(serde_json::Value::String(reply.body));
        if let Some(m) = value.as_object_mut() {
            m.shift_remove("latency_ms");
        }
        writeln!(
            out,
            "{}",
            dumps(&json!({"status": reply.status, "body": value}), false)
        )?;
    }
    Ok(all.len())
}
