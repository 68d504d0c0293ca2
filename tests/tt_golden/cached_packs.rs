//! The prefix cache in packs on a mesh (`tests/tt_golden.rs`, child dirs `cached+` and
//! `cached+-`): misses, hits and requests waiting for a prefix, in the passes the plan says,
//! each answered as the same request alone.

use clef_tt::encode::LengthRule;
use clef_tt::engine::prefix_cache::{CacheUse, PrefixCacheConfig, PrefixCacheStats};
use clef_tt::engine::Pipeline;
use clef_tt::request::SystemOneRequest;
use std::sync::Arc;

/// A request of a state of `words` words (different per `seed`) and one of two question sets.
fn long_state_request(words: usize, seed: usize, set: usize) -> SystemOneRequest {
    let questions = match set {
        0 => serde_json::json!({
            "team": {"type": "choice", "instructions": "Which team owns this?",
                     "criteria": {"billing": "Billing", "infra": "Servers", "auth": "Logins"}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"}
        }),
        _ => serde_json::json!({
            "severity": {"type": "score", "instructions": "How severe is it?",
                         "criteria": ["low", "medium", "high"]}
        }),
    };
    let state = crate::common::state_words(words, seed);
    let body = serde_json::json!({"model": "clef", "state": state, "questions": questions});
    clef_tt::request::validate(&body, None).unwrap()
}

/// How far a cached pack's answer may be from the same request alone on the same mesh: both run
/// the same golden functions, the pack's hits from the state a batched pass kept, the solo
/// passes over the whole prompt (they agree to about 5e-6). The tiny model's answers barely
/// move with its state: keeping the state at the block's end instead of the prefix's (the keep
/// mask left out, mutation `keep_unmasked`) moves them 1.1e-3, far inside the bf16 band.
const KEPT_TOLERANCE: f64 = 2e-4;

/// A request of a cached pack: (words, seed, question set) of [`long_state_request`], its cache
/// use and whether it shares a batched pass.
type PlannedRequest = (usize, usize, usize, CacheUse, bool);

/// Prefix-cache misses and hits packed into batched passes (docs/packing.md): with the cache on, a
/// pack of new long states (misses), a short one (uncacheable) and a repeat of a state the pack
/// computes runs the misses and the short one as one batched pass keeping each miss's prefix state,
/// the repeat after it (alone) as a hit of that state; a second pack batches two new misses, then
/// two hits of one kept state as a pass continuing it, and a hit of the other kept state alone.
/// Every answer must be within [`KEPT_TOLERANCE`] of the same request alone on the same mesh with
/// no cache (a whole-prompt pass), and each request's cache use and pass what the plan says.
/// `batched: false`: a mesh that refuses the model's shapes as a batch; its first pack runs each
/// member alone instead (a miss as its prefix, then the rest from the prefix's state), with the
/// same cache use, and no pass is shared. Returns the pipeline, now with the cache on, and the
/// failures.
pub fn run<B: clef_device::MeshOps>(
    pipeline: Pipeline<B>,
    label: &str,
    batched: bool,
) -> (Pipeline<B>, Vec<String>) {
    const SERVER: LengthRule = LengthRule::Server {
        max_state: 16384,
        max_tail: 4096,
        truncate: false,
    };
    use CacheUse::{Hit, Miss, Uncacheable};
    let packs: [&[PlannedRequest]; 2] = [
        &[
            (300, 1, 0, Miss, true),
            (520, 2, 0, Miss, true),
            (60, 3, 0, Uncacheable, true),
            (300, 1, 1, Hit, false),
        ],
        &[
            (300, 1, 0, Hit, true),
            (150, 5, 0, Miss, true),
            (300, 1, 1, Hit, true),
            (200, 6, 1, Miss, true),
            (520, 2, 1, Hit, false),
        ],
    ];
    let mut bad = Vec::new();
    let mut solo = Vec::new();
    for &(words, seed, set, ..) in packs.iter().copied().flatten() {
        let request = long_state_request(words, seed, set);
        match pipeline.decide(&request, SERVER) {
            Ok(d) => solo.push(d),
            Err(e) => bad.push(format!("{label} {words}/{seed}/{set} alone: {e}")),
        }
    }
    let pipeline = pipeline.with_prefix_cache(
        PrefixCacheConfig {
            slots: 16,
            ..Default::default()
        },
        Arc::new(PrefixCacheStats::default()),
    );
    if !bad.is_empty() {
        return (pipeline, bad);
    }
    let mut solo = solo.into_iter();
    let mut worst = 0.0f64;
    for members in packs {
        let requests: Vec<SystemOneRequest> = members
            .iter()
            .map(|&(w, s, q, ..)| long_state_request(w, s, q))
            .collect();
        let jobs: Vec<(&SystemOneRequest, LengthRule)> =
            requests.iter().map(|r| (r, SERVER)).collect();
        let mut answers: Vec<Option<Result<clef_tt::engine::Decision, String>>> =
            vec![None; jobs.len()];
        pipeline.decide_pack(&jobs, 1 << 20, &|_| false, &mut |i, r| {
            answers[i] = Some(r.map_err(|e| e.to_string()));
        });
        for (&(w, s, q, cache, shared), answer) in members.iter().zip(answers) {
            let name = format!("{label} {w}/{s}/{q}");
            let Some(want) = solo.next() else {
                continue;
            };
            let got = match answer {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    bad.push(format!("{name}: error: {e}"));
                    continue;
                }
                None => {
                    bad.push(format!("{name}: never answered"));
                    continue;
                }
            };
            let shared = shared && batched;
            if got.cache != cache || (got.pass_requests > 1) != shared {
                bad.push(format!(
                    "{name}: cache {:?} in a pass of {} requests, planned {cache:?} {}",
                    got.cache,
                    got.pass_requests,
                    if shared { "in a batch" } else { "alone" }
                ));
            }
            let mut here = 0.0f64;
            for (g, w) in got
                .probabilities
                .iter()
                .flatten()
                .zip(want.probabilities.iter().flatten())
            {
                let diff = (f64::from(*g) - f64::from(*w)).abs();
                here = here.max(if diff.is_nan() { f64::INFINITY } else { diff });
            }
            worst = worst.max(here);
            if here > KEPT_TOLERANCE || got.probabilities.len() != want.probabilities.len() {
                bad.push(format!(
                    "{name}: {:.6?} vs {:.6?} alone, outside the kept-state tolerance",
                    got.probabilities, want.probabilities
                ));
            }
        }
    }
    println!("golden-shadow {label}: worst probability difference from alone {worst:.2e}");
    (pipeline, bad)
}
