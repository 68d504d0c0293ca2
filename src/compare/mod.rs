//! `clef-tt compare-layers`: a device's numbers checked layer by layer against the CPU.
//!
//! Every request of a file runs twice under one precision profile, on the CPU mesh (the
//! reference) and on the device under test, and each quantity the device's layer trace
//! reads back (`engine::layer_trace`: vision blocks and merger, every decoder layer's residual
//! rows and state, the final rows; alone, continued, served and packed) is compared with the
//! reference's as a relative error `‖a − b‖ / ‖b‖` and as its worst element
//! `max |a − b| / max |b|`, each against a tolerance of its kind and profile
//! ([`tolerance`]; docs/tenstorrent.md, "The layer trace", says where they come from). A
//! mistake of a port breaks the first layer it touches far beyond rounding; an end-to-end
//! band on probabilities cannot tell it from bf16 noise.

mod tolerance;

pub use tolerance::{depth, tolerance, Tolerance};

use crate::encode::LengthRule;
use crate::engine::layer_trace::{LayerTrace, Side};
use crate::engine::Pipeline;
use crate::request::{parse_body, validate, RequestError};
use clef_device::MeshOps;
use std::fmt::Write as _;

/// A comparison that could not be made (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("line {line}: {message}")]
    Request { line: usize, message: String },
    #[error("line {line}: the device read {name} but the reference has no such quantity")]
    Unmatched { line: usize, name: String },
    #[error("no request lines")]
    Empty,
}

/// One quantity compared.
pub struct Row {
    pub name: String,
    pub rel: f64,
    pub worst: f64,
    pub tol: Tolerance,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.rel <= self.tol.rel && self.worst <= self.tol.worst
    }
}

/// One request's comparison.
pub struct Report {
    /// The request's line in the file (1-based).
    pub line: usize,
    pub tokens: usize,
    pub prefix: usize,
    pub rows: Vec<Row>,
    /// The device's runs that were not made, and why.
    pub notes: Vec<String>,
}

impl Report {
    /// The first quantity outside its tolerance, in the order the device computed them.
    pub fn first_failure(&self) -> Option<&Row> {
        self.rows.iter().find(|r| !r.ok())
    }
}

/// `(‖a − b‖ / ‖b‖, max |a − b| / max |b|)` in f64; a length mismatch is infinitely far.
pub fn errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    if a.len() != b.len() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let (mut diff2, mut ref2, mut worst, mut largest) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = (x as f64 - y as f64).abs();
        diff2 += d * d;
        ref2 += (y as f64) * (y as f64);
        worst = if d.is_nan() {
            f64::INFINITY
        } else {
            worst.max(d)
        };
        largest = largest.max((y as f64).abs());
    }
    // A NaN or an infinity on the device side is infinitely far.
    let scaled = |v: f64, by: f64| match v {
        v if !v.is_finite() => f64::INFINITY,
        v if by > 0.0 => v / by,
        v => v,
    };
    (scaled(diff2.sqrt(), ref2.sqrt()), scaled(worst, largest))
}

/// The device's trace against the reference's, quantity by quantity, in the device's order.
pub fn compare(
    line: usize,
    reference: &LayerTrace,
    device: &LayerTrace,
    profile: &str,
) -> Result<Report, CompareError> {
    // The deepest decoder layer ("layer"), or block of a tower run ("vision.K."), traced.
    let last = |what: &str| {
        device
            .quantities
            .iter()
            .filter(|q| match what {
                "layer" => q.name.contains(".layer."),
                run => q.name.starts_with(run) && q.name.contains(".block."),
            })
            .map(|q| depth(&q.name, |_| 0).saturating_sub(1))
            .max()
            .unwrap_or(0)
    };
    let rows = device
        .quantities
        .iter()
        .map(|q| {
            let r = reference
                .quantities
                .iter()
                .find(|r| r.name == q.name)
                .ok_or_else(|| CompareError::Unmatched {
                    line,
                    name: q.name.clone(),
                })?;
            let (rel, worst) = errors(&q.values, &r.values);
            Ok(Row {
                name: q.name.clone(),
                rel,
                worst,
                tol: tolerance(depth(&q.name, last), profile),
            })
        })
        .collect::<Result<_, CompareError>>()?;
    Ok(Report {
        line,
        tokens: device.tokens,
        prefix: device.prefix,
        rows,
        notes: device.notes.clone(),
    })
}

/// A report as a table: one row per quantity, its figures beside their tolerances.
pub fn render(report: &Report, profile: &str) -> String {
    let mut out = format!(
        "request at line {} ({} tokens, prefix {}), profile {profile}\n\n\
         | quantity | rel error | tolerance | worst / max | tolerance | |\n\
         |---|---:|---:|---:|---:|---|\n",
        report.line, report.tokens, report.prefix
    );
    for r in &report.rows {
        let _ = writeln!(
            out,
            "| {} | {:.2e} | {:.0e} | {:.2e} | {:.0e} | {} |",
            r.name,
            r.rel,
            r.tol.rel,
            r.worst,
            r.tol.worst,
            if r.ok() { "ok" } else { "OUTSIDE" }
        );
    }
    for note in &report.notes {
        let _ = writeln!(out, "\n{note}");
    }
    out
}

/// Every request line of `text` (a request body per line) on both pipelines: the reports,
/// each printed to `out` as it is made.
pub fn run<R: MeshOps, D: MeshOps>(
    reference: &Pipeline<R>,
    device: &Pipeline<D>,
    text: &str,
    rule: LengthRule,
    profile: &str,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<Vec<Report>> {
    let mut reports = Vec::new();
    for (i, body) in text.lines().enumerate() {
        if body.trim().is_empty() {
            continue;
        }
        let line = i + 1;
        let refused = |e: RequestError| CompareError::Request {
            line,
            message: e.to_string(),
        };
        let req = parse_body(body.as_bytes())
            .and_then(|v| validate(&v, None))
            .map_err(refused)?;
        let expected = reference
            .layer_trace(&req, rule, Side::Reference)
            .map_err(refused)?;
        let side = Side::Device {
            vision_rows: expected.vision_rows.as_deref(),
        };
        let got = device.layer_trace(&req, rule, side).map_err(refused)?;
        let report = compare(line, &expected, &got, profile)?;
        writeln!(out, "{}", render(&report, profile))?;
        reports.push(report);
    }
    if reports.is_empty() {
        return Err(CompareError::Empty.into());
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_relative_to_the_reference() {
        let (rel, worst) = errors(&[1.0, 2.0, 2.0], &[1.0, 2.0, 0.0]);
        assert!((rel - 2.0 / 5.0f64.sqrt()).abs() < 1e-12);
        assert!((worst - 1.0).abs() < 1e-12);
        assert_eq!(errors(&[1.0], &[1.0, 2.0]).0, f64::INFINITY);
        assert_eq!(errors(&[f32::NAN], &[1.0]), (f64::INFINITY, f64::INFINITY));
        assert_eq!(errors(&[0.5], &[0.0]), (0.5, 0.5));
    }
}
