//! Every golden record of `tiny-clef/goldens` (and of `tiny-clef-g27/goldens`, the same requests
//! on a checkpoint with Clef 27B's per-head geometry) answered by clef-tt as the reference did: ids,
//! spans and option ids identical; f32 logits within 1e-4; probabilities within 1e-3 (and the
//! same top option); responses equal field by field after rounding, a 1e-4 difference allowed
//! only where the unrounded value sits within 1e-5 of a rounding boundary; error texts exact.
//! Under the `bf16` and `selected` profiles on the 1x2 mesh: probabilities within a few 1e-2 of
//! the bf16 run. All of it on the CPU mesh and through the Tenstorrent C ABI (host shim).

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshOps, MeshShape, WeightFormat};
use clef_tt::checkpoint::Checkpoint;
use clef_tt::encode::{encode, EncodeError, LengthRule};
use clef_tt::engine::Pipeline;
use clef_tt::head::answer::answer_rounded_with;
use clef_tt::request::{parse_body, validate, RequestError};
use serde_json::Value;

/// The fixture whose goldens a check reads: `tiny-clef` unless the pipeline's checkpoint is
/// another (`tiny-clef-g27`).
const TINY: &str = "tiny-clef";
const G27: &str = "tiny-clef-g27";

fn lines(fixture: &str, name: &str) -> Vec<Value> {
    let path = common::fixtures().join(fixture).join("goldens").join(name);
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Structural equality; numbers equal, or within 1e-4 where `near_boundary` allows.
fn same(got: &Value, want: &Value, unrounded: &Value, path: &str) {
    match (got, want) {
        (Value::Object(a), Value::Object(b)) => {
            let ka: Vec<&String> = a.keys().collect();
            let kb: Vec<&String> = b.keys().collect();
            assert_eq!(ka, kb, "{path}: keys or their order differ");
            for k in kb {
                same(
                    &a[k],
                    &b[k],
                    unrounded.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                );
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                same(
                    x,
                    y,
                    unrounded.get(i).unwrap_or(&Value::Null),
                    &format!("{path}[{i}]"),
                );
            }
        }
        (Value::Number(_), Value::Number(_)) => {
            let (a, b) = (num(got), num(want));
            if a != b {
                let raw = unrounded.as_f64().unwrap_or(f64::NAN);
                let to_boundary = ((raw * 1e4).fract().abs() - 0.5).abs() * 1e-4;
                assert!(
                    (a - b).abs() <= 1.0001e-4 && to_boundary <= 1e-5,
                    "{path}: {a} vs {b} (unrounded {raw}, {to_boundary:e} from a boundary)"
                );
            }
        }
        _ => assert_eq!(got, want, "{path}"),
    }
}

/// Every record through `pipeline` against the reference's f32 run.
fn check_f32_goldens<B: MeshOps>(pipeline: &Pipeline<B>, fixture: &str, label: &str) {
    let requests = lines(fixture, "requests.jsonl");
    let expected = lines(fixture, "expected_f32.jsonl");
    assert_eq!(requests.len(), 50);
    let (mut max_dlogit, mut max_dp, mut answered, mut errors) = (0.0f64, 0.0f64, 0, 0);
    for (req, exp) in requests.iter().zip(&expected) {
        let id = req["id"].as_str().unwrap();
        let body = req["body"].as_str().unwrap();
        let max_length = req["max_length"].as_u64().unwrap() as usize;
        let rule = LengthRule::Reference { max_length };
        if req["entry"] == "encode_record" {
            let parsed = parse_body(body.as_bytes()).unwrap();
            let r = validate(&parsed, None).unwrap();
            match encode(pipeline.tokenizer(), &r, &[], rule) {
                Err(EncodeError::Request(e)) => {
                    assert_eq!(e.msg, exp["error"]["message"].as_str().unwrap(), "{id}")
                }
                other => panic!("{id}: expected an error, got {other:?}"),
            }
            errors += 1;
            continue;
        }
        let result = pipeline.decide_body(body.as_bytes(), rule, None);
        if exp["status"] == "error" {
            let e: RequestError = result
                .err()
                .unwrap_or_else(|| panic!("{id}: expected an error"));
            assert_eq!(e.status, 422, "{id}");
            assert_eq!(e.msg, exp["error"]["message"].as_str().unwrap(), "{id}");
            errors += 1;
            continue;
        }
        let d = result.unwrap_or_else(|e| panic!("{id}: {e}"));
        let want_ids: Vec<u32> = exp["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(d.record.input_ids, want_ids, "{id}: input ids");
        let parsed = parse_body(body.as_bytes()).unwrap();
        let request = validate(&parsed, None).unwrap();
        let mut unrounded = serde_json::Map::new();
        for (k, q) in exp["questions"].as_array().unwrap().iter().enumerate() {
            let enc = &d.record.questions[k];
            assert_eq!(enc.id, q["question_id"].as_str().unwrap(), "{id} q{k}");
            assert_eq!(
                enc.kind as u64,
                q["question_type"].as_u64().unwrap(),
                "{id} q{k}"
            );
            let span = [enc.span.0 as u64, enc.span.1 as u64];
            assert_eq!(
                serde_json::json!(span),
                q["question_span"],
                "{id} q{k} span"
            );
            let spans: Vec<[usize; 2]> = enc.option_spans.iter().map(|s| [s.0, s.1]).collect();
            assert_eq!(
                serde_json::json!(spans),
                q["option_spans"],
                "{id} q{k} option spans"
            );
            assert_eq!(
                serde_json::json!(enc.option_ids),
                q["option_ids"],
                "{id} q{k} option ids"
            );
            let want_logits: Vec<f64> = q["logits"].as_array().unwrap().iter().map(num).collect();
            let want_probs = common::expected_probabilities(q);
            for (a, b) in d.logits[k].iter().zip(&want_logits) {
                let diff = (*a as f64 - b).abs();
                max_dlogit = max_dlogit.max(diff);
                assert!(diff <= 1e-4, "{id} q{k}: logit {a} vs {b}");
            }
            for (a, b) in d.probabilities[k].iter().zip(&want_probs) {
                let diff = (*a as f64 - b).abs();
                max_dp = max_dp.max(diff);
                assert!(diff <= 1e-3, "{id} q{k}: probability {a} vs {b}");
            }
            let top = |p: &[f64]| {
                p.iter()
                    .enumerate()
                    .fold(0, |best, (i, v)| if *v > p[best] { i } else { best })
            };
            let ours: Vec<f64> = d.probabilities[k].iter().map(|&p| p as f64).collect();
            assert_eq!(top(&ours), top(&want_probs), "{id} q{k}: top option");
            let question = &request.questions[k];
            unrounded.insert(
                question.id.clone(),
                serde_json::to_value(answer_rounded_with(
                    question,
                    enc,
                    &d.probabilities[k],
                    |x| x,
                ))
                .unwrap(),
            );
        }
        let want = exp["response"].clone();
        let unrounded = serde_json::json!({"answers": unrounded});
        same(&d.response, &want, &unrounded, id);
        answered += 1;
    }
    assert_eq!((answered, errors), (37, 13));
    eprintln!("{label}: max |Δlogit| {max_dlogit:e}, max |Δp| {max_dp:e}");
}

#[test]
fn every_golden_record_matches_the_f32_reference() {
    let ckpt = Checkpoint::open(&common::fixtures().join(TINY)).unwrap();
    let pipeline = Pipeline::new(&ckpt, CpuMesh::new(MeshShape::ONE), WeightFormat::F32).unwrap();
    check_f32_goldens(&pipeline, TINY, "cpu 1x1");
}

/// The same requests on Clef 27B's per-head geometry (head_dim 256, rotary 64, DeltaNet key and
/// value dims 128), on one and two devices.
#[test]
fn every_g27_golden_record_matches_the_f32_reference() {
    let ckpt = Checkpoint::open(&common::fixtures().join(G27)).unwrap();
    for shape in [MeshShape::ONE, MeshShape::PAIR] {
        let pipeline = Pipeline::new(&ckpt, CpuMesh::new(shape), WeightFormat::F32).unwrap();
        check_f32_goldens(&pipeline, G27, &format!("g27 cpu {shape}"));
    }
}

#[test]
fn every_g27_golden_record_is_close_to_the_bf16_reference_under_both_profiles() {
    for profile in ["bf16", "selected"] {
        check_bf16_goldens(
            &common::fixture_pipeline_on(G27, profile, |n| {
                CpuMesh::new(MeshShape::PAIR).with_numerics(n)
            }),
            G27,
            &format!("g27 cpu {profile} 1x2"),
        );
    }
}

#[test]
fn every_golden_record_matches_the_f32_reference_through_the_tt_shim_on_1x1() {
    let pipeline = common::tt_profile_pipeline("f32", MeshShape::ONE);
    check_f32_goldens(&pipeline, TINY, "tt 1x1");
}

#[test]
fn every_golden_record_matches_the_f32_reference_through_the_tt_shim_on_1x2() {
    let pipeline = common::tt_profile_pipeline("f32", MeshShape::PAIR);
    check_f32_goldens(&pipeline, TINY, "tt 1x2");
}

/// The `bf16` profile (bf16 weights and activations, HiFi4 with f32 accumulation, bf16 KV and
/// embeddings) by the TP=2 plan on the 1x2 mesh against the reference's bf16 run: input ids
/// identical, every probability within a few 1e-2 (goldens README: "bf16 or device path vs
/// expected_bf16 ... probabilities within a few 1e-2").
///
/// A probability the reference's own f32 and bf16 runs put further apart than the band (a logit
/// tie at bf16 resolution: tiny-clef-g27's `noul_partial_extra_object_criteria`, logits 19.60
/// and 19.65, Δp 0.050 between the runs) may sit within the band of either run.
fn check_bf16_goldens<B: MeshOps>(pipeline: &Pipeline<B>, fixture: &str, label: &str) {
    let (mut worst, mut answered, mut by_f32) = (0.0f64, 0, 0);
    let f32_runs = lines(fixture, "expected_f32.jsonl");
    for ((req, exp), exp32) in lines(fixture, "requests.jsonl")
        .iter()
        .zip(&lines(fixture, "expected_bf16.jsonl"))
        .zip(&f32_runs)
    {
        let id = req["id"].as_str().unwrap();
        assert_eq!(exp["id"], req["id"]);
        if req["entry"] == "encode_record" || exp["status"] == "error" {
            continue;
        }
        let rule = LengthRule::Reference {
            max_length: req["max_length"].as_u64().unwrap() as usize,
        };
        let d = pipeline
            .decide_body(req["body"].as_str().unwrap().as_bytes(), rule, None)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(
            serde_json::json!(d.record.input_ids),
            exp["input_ids"],
            "{id}"
        );
        for (k, q) in exp["questions"].as_array().unwrap().iter().enumerate() {
            let want = q["probabilities"].as_array().unwrap();
            let want32 = exp32["questions"][k]["probabilities"].as_array().unwrap();
            assert_eq!(d.probabilities[k].len(), want.len(), "{id} q{k}");
            for ((a, b), c) in d.probabilities[k].iter().zip(want).zip(want32) {
                let diff = (f64::from(*a) - num(b)).abs();
                let tie = (num(b) - num(c)).abs() > 5e-2 - 1e-2;
                if diff > 5e-2 && tie && (f64::from(*a) - num(c)).abs() <= 5e-2 {
                    by_f32 += 1;
                    continue;
                }
                worst = worst.max(diff);
                assert!(diff <= 5e-2, "{id} q{k}: {a} vs {b}");
            }
        }
        answered += 1;
    }
    eprintln!(
        "{label}: {answered} records, worst probability difference {worst:.2e} \
         ({by_f32} tied probabilities within the band of the f32 run instead)"
    );
    assert_eq!(answered, 37);
}

#[test]
fn every_golden_record_is_close_to_the_bf16_reference_under_the_bf16_profile() {
    check_bf16_goldens(
        &common::profile_pipeline("bf16", MeshShape::PAIR),
        TINY,
        "cpu bf16 1x2",
    );
}

/// The Tenstorrent default profile (`selected`: bfp8_b / bf16 weights, HiFi2) meets the same
/// bound on the CPU mesh and through the shim.
#[test]
fn every_golden_record_is_close_to_the_bf16_reference_under_the_selected_profile() {
    check_bf16_goldens(
        &common::profile_pipeline("selected", MeshShape::PAIR),
        TINY,
        "cpu selected 1x2",
    );
}

#[test]
fn the_bf16_and_selected_profiles_through_the_tt_shim_meet_the_same_bound() {
    for profile in ["bf16", "selected"] {
        check_bf16_goldens(
            &common::tt_profile_pipeline(profile, MeshShape::PAIR),
            TINY,
            &format!("tt {profile} 1x2"),
        );
    }
}
