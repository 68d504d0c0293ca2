//! `clef-tt eval`: how a precision profile moves the answers. Scores a goldens directory (the
//! layout of `tests/fixtures/tiny-clef/goldens/`: `requests.jsonl` and `expected_f32.jsonl`)
//! against its f32 reference run: every record the reference answered through `systemone`,
//! each under the reference's length rule with its own `max_length`. N counts their questions,
//! A those whose top option (first maximum, model option order) equals the reference's; |dp| is
//! taken over every option probability. Agreement is reported, not enforced.

use super::Pipeline;
use crate::encode::LengthRule;
use clef_device::MeshOps;
use serde_json::Value;
use std::path::Path;

/// A goldens directory that cannot be scored.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {source}")]
    Json {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Goldens(String),
}

/// The scores of one goldens set.
#[derive(Debug, Default)]
pub struct EvalReport {
    pub records: usize,
    pub questions: usize,
    pub agreeing: usize,
    pub max_dp: f64,
    pub mean_dp: f64,
    /// Records that failed here though the reference answered them: (id, error).
    pub failures: Vec<(String, String)>,
}

fn read_lines(path: &Path) -> Result<Vec<Value>, EvalError> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read {
        path: shown(),
        source,
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| EvalError::Json {
                path: shown(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// Index of the first maximum.
fn top(values: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in values.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

/// Scores the goldens directory `goldens` on `pipeline`.
pub fn run<B: MeshOps>(pipeline: &Pipeline<B>, goldens: &Path) -> Result<EvalReport, EvalError> {
    let requests = read_lines(&goldens.join("requests.jsonl"))?;
    let expected = read_lines(&goldens.join("expected_f32.jsonl"))?;
    if requests.len() != expected.len() {
        return Err(EvalError::Goldens(format!(
            "{} requests but {} expected records",
            requests.len(),
            expected.len()
        )));
    }
    let missing = |what: &str| EvalError::Goldens(format!("a record without {what}"));
    let mut report = EvalReport::default();
    let (mut dp_sum, mut dp_count) = (0.0f64, 0usize);
    for (req, exp) in requests.iter().zip(&expected) {
        if req["entry"] != "systemone" || exp["status"] != "ok" {
            continue;
        }
        let id = req["id"].as_str().unwrap_or("?").to_string();
        let body = req["body"].as_str().ok_or_else(|| missing("a body"))?;
        let max_length = req["max_length"]
            .as_u64()
            .ok_or_else(|| missing("max_length"))?;
        let reference = exp["questions"]
            .as_array()
            .ok_or_else(|| missing("questions"))?;
        report.records += 1;
        report.questions += reference.len();
        let rule = LengthRule::Reference {
            max_length: max_length as usize,
        };
        let decision = match pipeline.decide_body(body.as_bytes(), rule, None) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(record = %id, "failed: {e}");
                report.failures.push((id, e.to_string()));
                continue;
            }
        };
        for (q, ours) in reference.iter().zip(&decision.probabilities) {
            let theirs: Vec<f64> = q["probabilities"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            let ours: Vec<f64> = ours.iter().map(|&p| f64::from(p)).collect();
            if theirs.len() != ours.len() {
                report
                    .failures
                    .push((id.clone(), "option counts differ".into()));
                continue;
            }
            if top(&ours) == top(&theirs) {
                report.agreeing += 1;
            }
            for (a, b) in ours.iter().zip(&theirs) {
                let dp = (a - b).abs();
                report.max_dp = report.max_dp.max(dp);
                dp_sum += dp;
                dp_count += 1;
            }
        }
    }
    report.mean_dp = if dp_count > 0 {
        dp_sum / dp_count as f64
    } else {
        0.0
    };
    Ok(report)
}

/// The report's last line.
pub fn summary(profile: &str, r: &EvalReport) -> String {
    format!(
        "profile {profile}: top-option agreement {}/{}, max |dp| {:.3e}, mean |dp| {:.3e}",
        r.agreeing, r.questions, r.max_dp, r.mean_dp
    )
}
