//! `DIR=` of the child: the goldens of DIR answered through whole passes run eagerly (every op
//! dispatched: `TtMesh::set_pass_mode("eager")`), then twice through traced passes (the first
//! round captures what it has not yet, the second replays); every probability of the replayed
//! round must equal the eager round's bit for bit. On a fixture whose passes run (tiny-clef-g27),
//! passes must have been replayed; on one whose layer ops refuse its shapes (tiny-clef), every
//! chunk ran layer by layer in both modes (one round only: nothing would replay), which the
//! check says. With `stale_input` (the rows
//! not written before a replay, golden/mutate.py) the replayed round differs.

use clef_device::tt::TtMesh;
use clef_device::MeshOps;
use clef_tt::encode::LengthRule;
use clef_tt::engine::Pipeline;
use std::collections::BTreeMap;

/// Every `status: ok` golden of `dir` (`requests`, `expected`: its files' lines), by id: the
/// probabilities of each question, or the error.
fn answers(
    pipeline: &Pipeline<TtMesh>,
    requests: &[serde_json::Value],
    expected: &[serde_json::Value],
) -> BTreeMap<String, Result<Vec<Vec<f32>>, String>> {
    let mut out = BTreeMap::new();
    for exp in expected {
        if exp["entry"] != "systemone" || exp["status"] != "ok" {
            continue;
        }
        let req = requests.iter().find(|r| r["id"] == exp["id"]).unwrap();
        let rule = LengthRule::Reference {
            max_length: exp["max_length"].as_u64().unwrap() as usize,
        };
        let got = pipeline
            .decide_body(req["body"].as_str().unwrap().as_bytes(), rule, None)
            .map(|d| d.probabilities)
            .map_err(|e| e.to_string());
        out.insert(exp["id"].as_str().unwrap().to_string(), got);
    }
    out
}

/// The check (see the module docs): (records, passes replayed, failures).
pub fn run(
    pipeline: &Pipeline<TtMesh>,
    requests: &[serde_json::Value],
    expected: &[serde_json::Value],
    label: &str,
) -> (usize, u64, Vec<String>) {
    let mesh = pipeline.backbone.mesh();
    let replays = || mesh.pass_stats().map_or(0, |s| s.traced);
    let passes = || {
        mesh.pass_stats().map_or(0, |s| {
            s.traced
                + s.eager
                    .iter()
                    .filter(|(why, _)| why != "layer by layer")
                    .map(|(_, n)| n)
                    .sum::<u64>()
        })
    };
    mesh.set_pass_mode("eager").unwrap();
    let before = passes();
    let eager = answers(pipeline, requests, expected);
    if passes() == before {
        // The model's shapes are ones the layer ops refuse: every chunk runs layer by layer
        // in either mode, so there is nothing to replay.
        mesh.set_pass_mode("traced").unwrap();
        return (eager.len(), 0, Vec::new());
    }
    mesh.set_pass_mode("traced").unwrap();
    answers(pipeline, requests, expected);
    let before = replays();
    let traced = answers(pipeline, requests, expected);
    let replayed = replays() - before;
    let mut failures = Vec::new();
    for (id, want) in &eager {
        let got = &traced[id];
        match (want, got) {
            (Ok(a), Ok(b))
                if a.iter()
                    .flatten()
                    .map(|p| p.to_bits())
                    .eq(b.iter().flatten().map(|p| p.to_bits())) => {}
            (Ok(a), Ok(b)) => failures.push(format!(
                "{label} {id}: the replayed passes' probabilities {b:?} differ from the eager \
                 passes' {a:?}"
            )),
            (Err(e), _) | (_, Err(e)) => failures.push(format!("{label} {id}: error: {e}")),
        }
    }
    (eager.len(), replayed, failures)
}
