//! Packed prefill passes (`engine/packing/`) on the CPU mesh: every text and media golden,
//! shuffled into random packs, is answered bitwise as it is alone (logits, probabilities,
//! response, errors) under the `f32` and `bf16` profiles; with the prefix cache on, packs of
//! repeated and new long states give the same answers and the same cache use as the same
//! requests one at a time; a request longer than the budget runs alone; a request whose
//! client left is answered 499 and the others are not disturbed; a failed pass fails only the
//! requests in it; a request that panics in its answer leaves the others of its pack answered.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::MeshShape;
use clef_tt::encode::LengthRule;
use clef_tt::engine::prefix_cache::{CacheUse, PrefixCacheConfig, PrefixCacheStats};
use clef_tt::engine::{Decision, Pipeline, INJECTED_DEVICE_FAULT, INJECTED_FAULT};
use clef_tt::request::{parse_body, validate, RequestError, SystemOneRequest};
use serde_json::{json, Value};
use std::sync::Arc;

fn jsonl(dir: &str, name: &str) -> Vec<Value> {
    let path = common::fixtures().join("tiny-clef").join(dir).join(name);
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every golden request the pipeline answers (text and media), with its length rule; a
/// request the parser or validator refuses never reaches a worker and is left out.
fn golden_requests() -> Vec<(String, SystemOneRequest, LengthRule)> {
    let mut out = Vec::new();
    for (dir, expected) in [
        ("goldens", "expected_f32.jsonl"),
        ("goldens-media", "expected_f32.jsonl"),
    ] {
        let requests = jsonl(dir, "requests.jsonl");
        for exp in jsonl(dir, expected) {
            let id = exp["id"].as_str().unwrap();
            let Some(req) = requests.iter().find(|r| r["id"] == id) else {
                continue;
            };
            if req["entry"] == "encode_record" {
                continue;
            }
            let Ok(parsed) = parse_body(req["body"].as_str().unwrap().as_bytes()) else {
                continue;
            };
            let Ok(valid) = validate(&parsed, None) else {
                continue;
            };
            let max_length = exp["max_length"]
                .as_u64()
                .or_else(|| req["max_length"].as_u64())
                .unwrap() as usize;
            out.push((
                format!("{dir}/{id}"),
                valid,
                LengthRule::Reference { max_length },
            ));
        }
    }
    out
}

/// A small deterministic generator (the packs are random, and the same on every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// The requests in a seeded random order, cut into packs of 2 to 6.
fn random_packs(n: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Lcg(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.next(i + 1));
    }
    let mut packs = Vec::new();
    let mut at = 0;
    while at < n {
        let size = (2 + rng.next(5)).min(n - at);
        packs.push(order[at..at + size].to_vec());
        at += size;
    }
    packs
}

/// Answer `members` of `requests` through one `decide_pack` call.
fn pack(
    pipeline: &Pipeline<CpuMesh>,
    requests: &[(String, SystemOneRequest, LengthRule)],
    members: &[usize],
    budget: usize,
) -> Vec<Result<Decision, RequestError>> {
    let jobs: Vec<(&SystemOneRequest, LengthRule)> = members
        .iter()
        .map(|&i| (&requests[i].1, requests[i].2))
        .collect();
    let mut answers: Vec<Option<Result<Decision, RequestError>>> = vec![None; jobs.len()];
    pipeline.decide_pack(&jobs, budget, &|_| false, &mut |i, r| {
        assert!(answers[i].is_none(), "job {i} answered twice");
        answers[i] = Some(r);
    });
    answers
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.unwrap_or_else(|| panic!("job {i} never answered")))
        .collect()
}

fn bits(d: &Decision) -> Vec<Vec<u32>> {
    d.logits
        .iter()
        .map(|q| q.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// Packed answers of every golden equal the solo answers bit for bit.
fn packed_equals_solo(profile: &str, shape: MeshShape, seed: u64) {
    let requests = golden_requests();
    assert!(requests.len() >= 50, "{} golden requests", requests.len());
    let pipeline = common::profile_pipeline(profile, shape);
    let solo: Vec<Result<Decision, RequestError>> = requests
        .iter()
        .map(|(_, r, rule)| pipeline.decide(r, *rule))
        .collect();
    let (mut packed_answers, mut errors) = (0, 0);
    for members in random_packs(requests.len(), seed) {
        let answers = pack(&pipeline, &requests, &members, 1 << 20);
        for (&i, got) in members.iter().zip(answers) {
            let id = &requests[i].0;
            match (&solo[i], got) {
                (Ok(want), Ok(got)) => {
                    assert_eq!(bits(&got), bits(want), "{profile} {id}: logits");
                    assert_eq!(got.response, want.response, "{profile} {id}");
                    assert_eq!(got.record.input_ids, want.record.input_ids, "{id}");
                    assert_eq!(got.cache, want.cache, "{id}");
                    if got.pass_requests > 1 {
                        packed_answers += 1;
                    }
                }
                (Err(want), Err(got)) => {
                    assert_eq!(&got, want, "{profile} {id}: the error");
                    errors += 1;
                }
                (want, got) => panic!("{profile} {id}: alone {want:?}, packed {got:?}"),
            }
        }
    }
    eprintln!("{profile} {shape}: {packed_answers} answers from packed passes, {errors} errors");
    assert!(packed_answers >= 40, "{packed_answers} packed answers");
    assert!(errors > 0, "the goldens' failing requests were packed too");
}

#[test]
fn packed_goldens_are_bitwise_their_solo_answers_under_f32() {
    packed_equals_solo("f32", MeshShape::ONE, 1);
    packed_equals_solo("f32", MeshShape::PAIR, 2);
}

#[test]
fn packed_goldens_are_bitwise_their_solo_answers_under_bf16() {
    packed_equals_solo("bf16", MeshShape::PAIR, 3);
}

/// A state of roughly `words` words, different per `seed`.
fn state(words: usize, seed: usize) -> String {
    common::state_words(words, seed)
}

fn request(words: usize, seed: usize, set: usize) -> SystemOneRequest {
    let questions = match set {
        0 => json!({
            "team": {"type": "choice", "instructions": "Which team owns this?",
                     "criteria": {"billing": "Billing", "infra": "Servers", "auth": "Logins"}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"}
        }),
        _ => json!({
            "severity": {"type": "score", "instructions": "How severe is it?",
                         "criteria": ["low", "medium", "high"]}
        }),
    };
    let body = json!({"model": "clef", "state": state(words, seed), "questions": questions});
    validate(&body, None).unwrap()
}

fn cached_pipeline() -> Pipeline<CpuMesh> {
    common::profile_pipeline("f32", MeshShape::PAIR).with_prefix_cache(
        PrefixCacheConfig {
            slots: 64,
            ..Default::default()
        },
        Arc::new(PrefixCacheStats::default()),
    )
}

const SERVER: LengthRule = LengthRule::Server {
    max_state: 16384,
    max_tail: 4096,
    truncate: false,
};

/// Prefix-cache hits, misses and requests sharing a prefix in one pack: the same answers, bit
/// for bit, and the same cache use as the requests one at a time in the same order.
#[test]
fn packs_mixing_cache_hits_and_misses_answer_as_one_at_a_time() {
    // (words, seed, question set): repeats of one state with other questions, new states, a
    // short (uncacheable) one, and the same state twice in one pack before it is cached.
    let plan = [
        (300, 1, 0),
        (300, 1, 1),
        (520, 2, 0),
        (60, 3, 0),
        (300, 1, 0),
        (700, 4, 1),
        (700, 4, 0),
        (520, 2, 1),
        (150, 5, 0),
        (150, 5, 1),
    ];
    let requests: Vec<(String, SystemOneRequest, LengthRule)> = plan
        .iter()
        .map(|&(w, s, q)| (format!("{w}/{s}/{q}"), request(w, s, q), SERVER))
        .collect();
    let alone = cached_pipeline();
    let solo: Vec<Decision> = requests
        .iter()
        .map(|(_, r, rule)| alone.decide(r, *rule).unwrap())
        .collect();
    let packed = cached_pipeline();
    let mut uses = Vec::new();
    for members in [vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]] {
        for (&i, got) in members
            .iter()
            .zip(pack(&packed, &requests, &members, 1 << 20))
        {
            let got = got.unwrap();
            let want = &solo[i];
            assert_eq!(bits(&got), bits(want), "{}", requests[i].0);
            assert_eq!(got.response, want.response, "{}", requests[i].0);
            assert_eq!(got.cache, want.cache, "{}", requests[i].0);
            assert!(got.pass_requests > 1, "{} was packed", requests[i].0);
            uses.push(got.cache);
        }
    }
    for kind in [CacheUse::Hit, CacheUse::Miss, CacheUse::Uncacheable] {
        assert!(uses.contains(&kind), "{kind:?} in {uses:?}");
    }
}

/// The budget: requests that fit share a pass; one longer than the budget runs alone.
#[test]
fn a_request_longer_than_the_budget_runs_alone() {
    let requests: Vec<(String, SystemOneRequest, LengthRule)> = [(40, 1), (40, 2), (400, 3)]
        .iter()
        .map(|&(w, s)| (format!("{w}/{s}"), request(w, s, 0), SERVER))
        .collect();
    let pipeline = common::profile_pipeline("f32", MeshShape::ONE);
    let solo: Vec<Decision> = requests
        .iter()
        .map(|(_, r, rule)| pipeline.decide(r, *rule).unwrap())
        .collect();
    let tokens: Vec<usize> = solo.iter().map(|d| d.record.input_ids.len()).collect();
    // A budget the first two fit together and the third does not fit alone.
    let budget = tokens[0] + tokens[1];
    assert!(tokens[2] > budget, "{tokens:?}");
    let answers = pack(&pipeline, &requests, &[0, 1, 2], budget);
    let passes: Vec<usize> = answers
        .iter()
        .map(|a| a.as_ref().unwrap().pass_requests)
        .collect();
    assert_eq!(passes, [2, 2, 1]);
    for (want, got) in solo.iter().zip(&answers) {
        assert_eq!(bits(got.as_ref().unwrap()), bits(want));
    }
    // One token less: the first two no longer share a pass.
    let answers = pack(&pipeline, &requests, &[0, 1, 2], budget - 1);
    let passes: Vec<usize> = answers
        .iter()
        .map(|a| a.as_ref().unwrap().pass_requests)
        .collect();
    assert_eq!(passes, [1, 1, 1]);
}

/// A request whose client left before its pass gets a 499; the rest of its pack is answered
/// as alone.
#[test]
fn a_cancelled_member_leaves_its_pack_undisturbed() {
    let requests: Vec<(String, SystemOneRequest, LengthRule)> = (0..4)
        .map(|s| (format!("{s}"), request(50 + 10 * s, s, 0), SERVER))
        .collect();
    let pipeline = common::profile_pipeline("f32", MeshShape::ONE);
    let jobs: Vec<(&SystemOneRequest, LengthRule)> =
        requests.iter().map(|(_, r, rule)| (r, *rule)).collect();
    let mut answers: Vec<Option<Result<Decision, RequestError>>> = vec![None; 4];
    pipeline.decide_pack(&jobs, 4096, &|i| i == 2, &mut |i, r| answers[i] = Some(r));
    for (i, a) in answers.into_iter().enumerate() {
        let a = a.unwrap();
        if i == 2 {
            assert_eq!(a.unwrap_err().status, 499);
        } else {
            let want = pipeline.decide(jobs[i].0, jobs[i].1).unwrap();
            let got = a.unwrap();
            assert_eq!(bits(&got), bits(&want));
            assert_eq!(got.pass_requests, 3);
        }
    }
}

/// A pass that fails (a device error) fails the requests in it, each with the error it would
/// have had alone; the requests of the other packs are answered, and the pipeline goes on.
#[test]
fn a_failed_pass_fails_only_its_own_requests() {
    let requests: Vec<(String, SystemOneRequest, LengthRule)> = (0..5)
        .map(|s| {
            let mut r = request(50 + 10 * s, s, 0);
            if s == 1 {
                r.state = serde_json::Value::String(format!("FAIL {}", state(60, 1)));
            }
            (format!("{s}"), r, SERVER)
        })
        .collect();
    let pipeline = common::profile_pipeline("f32", MeshShape::ONE).with_device_fault(Arc::new(
        |req: &SystemOneRequest| req.state.as_str().is_some_and(|s| s.starts_with("FAIL")),
    ));
    let alone: Vec<Result<Decision, RequestError>> = requests
        .iter()
        .map(|(_, r, rule)| pipeline.decide(r, *rule))
        .collect();
    let failed = alone[1].as_ref().unwrap_err();
    assert_eq!(failed.status, 500);
    assert!(failed.msg.contains(INJECTED_DEVICE_FAULT), "{failed:?}");
    // Requests 0-2 share the first pass (the budget holds three of them), 3-4 the second.
    let tokens: Vec<usize> = alone
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|d| d.record.input_ids.len())
        .collect();
    let budget = 3 * tokens.iter().max().unwrap() + 20;
    let answers = pack(&pipeline, &requests, &[0, 1, 2, 3, 4], budget);
    for (i, got) in answers.iter().enumerate() {
        match (i, got) {
            (0..=2, Err(e)) => assert_eq!(e, failed, "{i}"),
            (3 | 4, Ok(d)) => {
                assert_eq!(bits(d), bits(alone[i].as_ref().unwrap()), "{i}");
                assert_eq!(d.pass_requests, 2);
            }
            other => panic!("{other:?}"),
        }
    }
    // The pipeline goes on: the same requests without the failing one are answered.
    let answers = pack(&pipeline, &requests, &[0, 2, 3], budget);
    for (&i, got) in [0, 2, 3].iter().zip(&answers) {
        assert_eq!(
            bits(got.as_ref().unwrap()),
            bits(alone[i].as_ref().unwrap())
        );
    }
}

/// A request that panics while it is answered (an injected fault in its answer) leaves its
/// pack's other requests answered as alone before the panic reaches the worker, which then
/// fails that request alone.
#[test]
fn a_panicking_member_leaves_the_rest_of_its_pack_answered() {
    let requests: Vec<(String, SystemOneRequest, LengthRule)> = (0..4)
        .map(|s| {
            let mut r = request(50 + 10 * s, s, 0);
            if s == 2 {
                r.state = serde_json::Value::String(format!("PANIC {}", state(60, 2)));
            }
            (format!("{s}"), r, SERVER)
        })
        .collect();
    let plain = common::profile_pipeline("f32", MeshShape::ONE);
    let faulty = common::profile_pipeline("f32", MeshShape::ONE).with_fault_switch(Arc::new(
        |req: &SystemOneRequest| req.state.as_str().is_some_and(|s| s.starts_with("PANIC")),
    ));
    let jobs: Vec<(&SystemOneRequest, LengthRule)> =
        requests.iter().map(|(_, r, rule)| (r, *rule)).collect();
    let mut answers: Vec<Option<Result<Decision, RequestError>>> = vec![None; 4];
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        faulty.decide_pack(&jobs, 4096, &|_| false, &mut |i, r| answers[i] = Some(r));
    }));
    let panic = outcome.expect_err("the faulty member's panic reaches the caller");
    let msg = panic.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(msg.contains(INJECTED_FAULT), "{msg}");
    for (i, a) in answers.into_iter().enumerate() {
        if i == 2 {
            assert!(a.is_none(), "the panicking member was answered");
            continue;
        }
        let want = plain.decide(jobs[i].0, jobs[i].1).unwrap();
        let got = a
            .unwrap_or_else(|| panic!("member {i} unanswered"))
            .unwrap();
        assert_eq!(bits(&got), bits(&want), "{i}");
        assert_eq!(got.pass_requests, 4);
    }
}
