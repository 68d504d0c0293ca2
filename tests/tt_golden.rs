//! The model's numbers through ttnn's own definition of each op: the golden-shadow mode of the
//! ttnn backend (`CLEF_TT_GOLDEN=1`, ffi/shim/ttnn/clef_tt_ttnn/golden/). Every ttnn call the
//! shim makes on the mock P150x2 also computes its output on the host with the op's ttnn golden
//! function (torch), per device, and downloads return those values. The text and media goldens,
//! through the ttnn backend on the 1x2 mesh under the `bf16` and `selected` profiles, must then
//! answer as the reference's bf16 run does, exactly as tests/goldens.rs and tests/media.rs
//! compare the CPU bf16 profile: input ids identical, every probability within 5e-2 of
//! `expected_bf16.jsonl`; and, beyond them, the same top option of every choice and score
//! question (argmax; a noul answer is its value, within the same band) unless the reference's
//! own bf16 logits tie (top two within one bf16 ulp). A deliberate convention change in the op
//! mapping (`CLEF_TT_GOLDEN_MUTATE=gate_sign`: the delta rule's log-decay with the wrong sign)
//! must fail that check.
//!
//! The same goldens of `tiny-clef-g27` (Clef 27B's per-head geometry: head_dim 256 with the fused
//! rope op, DeltaNet dims of 128 in the flat layout, ttnn's native conv, vision heads of 72) run
//! the same way: text and media under `bf16`, text under `selected`. A probability the
//! reference's own f32 and bf16 runs put further apart than the band (a logit tie at bf16
//! resolution, tests/goldens.rs) may sit within the band of either run.
//!
//! Packed requests (docs/packing.md): `tiny-clef-g27`'s text and media goldens, answered again
//! in packs of 4 through `Pipeline::decide_pack`, run as batched passes (the layer ops over a
//! batch of padded blocks; media blocks at M-RoPE positions of their own) and must stay in the
//! same band; `tiny-clef`'s, whose shapes the layer ops do not take, must be refused as a batch
//! and answered one by one, in the band. With the prefix cache on (`cached_packs`), packs of
//! long new states run as batched passes that keep each miss's prefix state, and hits of one
//! kept state run as a batched pass continuing it, all within 2e-4 of the same requests
//! alone; on `tiny-clef`, refused as a batch, the same packs run member by member (a miss as
//! its prefix, then the rest) with the same cache use and answers.
//!
//! Each check runs in a child process of this test binary (the embedded CPython reads its
//! environment once per process): `child_scores_the_goldens` does the work when
//! `CLEF_TT_GOLDEN_CHILD` names the profiles, and passes at once otherwise. Two children run at
//! once (one per fixture for the unmutated goldens, then the mutations). A run that fails by an
//! error rather than by its answers (a decision that failed, a panic) is run once more in a new
//! process, its first failure printed and kept in
//! `target/tmp/tt_golden/plain*/first-attempt-output.txt`; answers outside the band fail at once.
//!
//! Runs where the ttnn shim was built, the mock kit's environment is set and torch imports in
//! the shim's Python; otherwise each test says why it is skipped and passes, unless
//! `CLEF_REQUIRE_TT_GOLDEN=1`, which makes that a failure. One command:
//!
//! ```text
//! source /tmp/ttmock/env.sh   # made by ffi/ttnn-mock/setup.sh --golden /tmp/ttmock (torch too)
//! CARGO_TARGET_DIR=target/tt cargo test --test tt_golden -- --nocapture
//! ```

mod common;
// `cached+` / `cached+-` of the child: prefix-cache hits and misses in packs.
#[path = "tt_golden/cached_packs.rs"]
mod cached_packs;
// `DIR=` of the child: replayed passes against the same passes run eagerly.
#[path = "tt_golden/traced.rs"]
mod traced;

use clef_device::tt::{MeshPlacement, Shim, TtMesh};
use clef_device::MeshShape;
use clef_tt::encode::LengthRule;
use common::golden_kit::kit;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex};

/// The band of the bf16 profile (tests/goldens.rs `check_bf16_goldens`, tests/media.rs).
const BAND: f64 = 5e-2;
const CHILD: &str = "CLEF_TT_GOLDEN_CHILD";

fn jsonl(dir: &str, name: &str) -> Vec<Value> {
    std::fs::read_to_string(common::fixtures().join(dir).join(name))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    common::golden_kit::scratch("tt_golden", name)
}

/// Children running at once: each keeps about one core busy (its embedded CPython), and the
/// 2-core machines this runs on have two.
const CHILDREN_AT_ONCE: usize = 2;

/// A turn to run a child: taken before it starts, given back when dropped.
struct Turn;

static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

impl Turn {
    fn take() -> Turn {
        let (count, freed) = &RUNNING;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= CHILDREN_AT_ONCE {
            n = freed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

/// This binary's `child_scores_the_goldens` in a child process with `CLEF_TT_GOLDEN=1`, the
/// profiles and goldens to score, and `mutation` if any, working in the scratch folder `name`:
/// (succeeded, stdout + stderr).
fn run_child(name: &str, spec: &str, mutation: Option<&str>) -> (bool, String) {
    let _turn = Turn::take();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_scores_the_goldens",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, spec)
    .env("CLEF_TT_GOLDEN", "1")
    .env(
        "TT_METAL_MOCK_CLUSTER_DESC_PATH",
        Path::new(env!("CARGO_MANIFEST_DIR")).join("ffi/ttnn-mock/blackhole_2xP150.yaml"),
    )
    .env("TT_LOGGER_LEVEL", "warn")
    .env_remove("CLEF_TT_GOLDEN_MUTATE")
    // ttnn writes `generated/` into the working directory.
    .current_dir(scratch(name));
    match mutation {
        Some(m) => cmd.env("CLEF_TT_GOLDEN_MUTATE", m),
        // Each profile's shadow calls per op (golden function or own shadow) when it closes.
        None => cmd.env("CLEF_TT_GOLDEN_REPORT", "1"),
    };
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}the child ended with {}\n",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status
    );
    (out.status.success(), text)
}

/// Why a child failed, in a few lines: the records it held to the band that failed, else its
/// panic (the line after "panicked at" and the message), else its last lines.
fn failure_summary(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let failed: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("golden-shadow FAILED"))
        .copied()
        .collect();
    if !failed.is_empty() {
        return failed.join("\n");
    }
    if let Some(i) = lines.iter().position(|l| l.contains("panicked at")) {
        return lines[i..(i + 4).min(lines.len())].join("\n");
    }
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// Whether a failed child failed by an error (a record whose decision failed, a panic, a crash)
/// rather than by answers outside the band.
fn failed_by_error(text: &str) -> bool {
    !text
        .lines()
        .any(|l| l.starts_with("golden-shadow FAILED") && !l.contains(": error: "))
}

/// Lines of a child's output that carry its scores.
fn scores(text: &str) -> String {
    text.lines()
        .filter(|l| {
            (l.starts_with("golden-shadow") && !l.contains(": worst probability"))
                || l.contains("outside the bf16 band")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_golden_is_within_the_bf16_band_through_ttnn_golden_functions() {
    if kit().is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    // The `selected` profile's media goldens are scored and reported, not held to the band: its
    // bfp8_b vision tower leaves it on the CPU mesh too (img_wide_1024x96_text: 0.061), and
    // tests/media.rs holds only the bf16 profile's media goldens to it.
    // `cached+-` before `goldens+-`: the first refused batch turns packing off for good.
    // One child per fixture, both at once (each keeps one core busy).
    let runs = [
        (
            "plain",
            "bf16:goldens,goldens-media,goldens=,goldens-media=,cached+-,goldens+-;\
             selected:goldens,goldens-media~",
        ),
        (
            "plain-g27",
            "tiny-clef-g27/bf16:goldens,goldens-media,goldens=,goldens-media=,goldens+,\
             goldens-media+,cached+;tiny-clef-g27/selected:goldens",
        ),
    ];
    let outcomes: Vec<Result<String, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|&(name, spec)| scope.spawn(move || plain_run(name, spec)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failed = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(text) => eprintln!("{}", scores(&text)),
            Err(why) => failed.push(why),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    eprintln!(
        "golden-shadow: both fixtures and profiles scored in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
}

/// One unmutated child over `spec` in the scratch folder `name`: its output, or why it failed.
/// A run that failed by an error rather than by its answers runs once more in a new process
/// (answers outside the band are never retried); the first attempt stays on record, in the
/// failure if the second fails too and in a file either way.
fn plain_run(name: &str, spec: &str) -> Result<String, String> {
    let first_log = scratch(name).join("first-attempt-output.txt");
    // An earlier run's first attempt is not this run's.
    let _ = std::fs::remove_file(&first_log);
    let (mut ok, mut text) = run_child(name, spec, None);
    let mut first_error = String::new();
    if !ok && failed_by_error(&text) {
        first_error = failure_summary(&text);
        std::fs::write(&first_log, &text).unwrap();
        eprintln!(
            "golden-shadow {name}: the run failed by an error, not by its answers ({}): once \
             more\n{first_error}",
            first_log.display(),
        );
        (ok, text) = run_child(name, spec, None);
    }
    if ok {
        return Ok(text);
    }
    // What failed first (CI shows the head of a failing test's output), the whole output in a
    // file beside the child's working directory.
    let log = scratch(name).join("child-output.txt");
    std::fs::write(&log, &text).unwrap();
    Err(format!(
        "the golden-shadow run {name} failed: {}\n{}\nthe child's whole output: {}{}",
        failure_summary(&text),
        scores(&text),
        log.display(),
        if first_error.is_empty() {
            String::new()
        } else {
            format!("\nthe first attempt had failed too, by an error:\n{first_error}")
        }
    ))
}

/// A convention change in the mapping that the host backend could not see moves the answers
/// out of the band, on tiny-clef's fine-op path: the delta rule's log-decay with the wrong sign
/// (g >= 0: the state grows without bound, the answers become NaN) and, with finite answers,
/// the zero-centred norms' raw weight w where ttnn's rms_norm needs 1 + w (golden/mutate.py).
/// The mutations of tiny-clef-g27's paths (the fused rope's cos and sin swapped, q and k swapped
/// in the flat delta rule, the vision heads cut from the wrong end of their padding, a kept
/// prefix state taken at its block's end, a replay's rows not written, and the rest) are
/// caught at the layer they first touch by tests/compare_layers.rs, which runs them all.
#[test]
fn a_changed_op_convention_leaves_the_band() {
    if kit().is_none() {
        return;
    }
    for (mutation, spec) in [("gate_sign", "bf16:goldens"), ("raw_gamma", "bf16:goldens")] {
        let (ok, text) = run_child(mutation, spec, Some(mutation));
        eprintln!("{mutation}: {}", scores(&text));
        assert!(
            !ok,
            "with the mutation {mutation} the goldens still passed:\n{text}"
        );
        assert!(
            text.contains("outside the bf16 band"),
            "the run with the mutation {mutation} failed otherwise than by its answers:\n{text}"
        );
    }
}

/// Whether the reference's top two logits tie at bf16 resolution (within one ulp).
fn tied(logits: &[f64]) -> bool {
    let mut l = logits.to_vec();
    l.sort_by(|a, b| b.partial_cmp(a).unwrap());
    if l.len() < 2 {
        return false;
    }
    let m = l[0].abs().max(l[1].abs());
    let ulp = if m > 0.0 {
        2f64.powi(m.log2().floor() as i32 - 7)
    } else {
        0.0
    };
    l[0] - l[1] <= ulp
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].partial_cmp(&v[b]).unwrap_or(std::cmp::Ordering::Less))
        .unwrap_or(0)
}

/// The goldens' decisions through `Pipeline::decide_pack`, in packs of `PACK` in file order,
/// by id (a request the parser or validator refuses is left out: it never reaches a worker).
fn packed_decisions<B: clef_device::MeshOps>(
    pipeline: &clef_tt::engine::Pipeline<B>,
    dir: &str,
) -> std::collections::HashMap<String, Result<clef_tt::engine::Decision, String>> {
    const PACK: usize = 4;
    let requests = jsonl(dir, "requests.jsonl");
    let mut jobs = Vec::new();
    for exp in jsonl(dir, "expected_bf16.jsonl") {
        if exp["entry"] != "systemone" || exp["status"] != "ok" {
            continue;
        }
        let req = requests.iter().find(|r| r["id"] == exp["id"]).unwrap();
        let body = req["body"].as_str().unwrap().as_bytes();
        let Ok(valid) = clef_tt::request::parse_body(body)
            .and_then(|parsed| clef_tt::request::validate(&parsed, None))
        else {
            continue;
        };
        let rule = LengthRule::Reference {
            max_length: exp["max_length"].as_u64().unwrap() as usize,
        };
        jobs.push((exp["id"].as_str().unwrap().to_string(), valid, rule));
    }
    let mut out = std::collections::HashMap::new();
    for pack in jobs.chunks(PACK) {
        let members: Vec<_> = pack.iter().map(|(_, r, rule)| (r, *rule)).collect();
        pipeline.decide_pack(&members, 4096, &|_| false, &mut |i, r| {
            out.insert(pack[i].0.clone(), r.map_err(|e| e.to_string()));
        });
    }
    out
}

/// Every `status: ok` golden of `dir` through `pipeline`: (records, worst difference, failures,
/// records answered from a pass of more than one request); `first_failure` stops after the
/// first record outside the band. `packed`: the decisions of [`packed_decisions`] instead of
/// one request at a time.
fn score<B: clef_device::MeshOps>(
    pipeline: &clef_tt::engine::Pipeline<B>,
    dir: &str,
    label: &str,
    first_failure: bool,
    packed: bool,
) -> (usize, f64, Vec<String>, usize) {
    let requests = jsonl(dir, "requests.jsonl");
    let f32_runs = jsonl(dir, "expected_f32.jsonl");
    let mut packs = match packed {
        true => packed_decisions(pipeline, dir),
        false => Default::default(),
    };
    let (mut answered, mut worst, mut failures, mut shared) = (0, 0.0f64, Vec::new(), 0);
    for exp in jsonl(dir, "expected_bf16.jsonl") {
        let id = exp["id"].as_str().unwrap();
        if exp["entry"] != "systemone" || exp["status"] != "ok" {
            continue;
        }
        let req = requests.iter().find(|r| r["id"] == exp["id"]).unwrap();
        let rule = LengthRule::Reference {
            max_length: exp["max_length"].as_u64().unwrap() as usize,
        };
        // An error or other input ids is a failure of this record; the others are still scored,
        // so one run shows every record that fails and why.
        let decision = match packed {
            true => packs
                .remove(id)
                .unwrap_or_else(|| Err("not answered in its pack".into())),
            false => pipeline
                .decide_body(req["body"].as_str().unwrap().as_bytes(), rule, None)
                .map_err(|e| e.to_string()),
        };
        let decided = match decision {
            Err(e) => Err(format!("{label} {id}: error: {e}")),
            Ok(d) if serde_json::json!(d.record.input_ids) != exp["input_ids"] => Err(format!(
                "{label} {id}: input ids differ from the reference's"
            )),
            Ok(d) => Ok(d),
        };
        let d = match decided {
            Ok(d) => {
                shared += usize::from(d.pass_requests > 1);
                d
            }
            Err(why) => {
                failures.push(why);
                answered += 1;
                if first_failure {
                    break;
                }
                continue;
            }
        };
        let exp32 = f32_runs.iter().find(|r| r["id"] == exp["id"]).unwrap();
        let mut here = 0.0f64;
        for (k, q) in exp["questions"].as_array().unwrap().iter().enumerate() {
            let want = common::expected_probabilities(q);
            let want32 = common::expected_probabilities(&exp32["questions"][k]);
            let got: Vec<f64> = d.probabilities[k].iter().map(|&p| f64::from(p)).collect();
            assert_eq!(got.len(), want.len(), "{label} {id} q{k}");
            let mut qdiff = 0.0f64;
            for ((a, b), c) in got.iter().zip(&want).zip(&want32) {
                let mut diff = (a - b).abs();
                if diff > BAND && (b - c).abs() > BAND - 1e-2 {
                    // A tie at bf16 resolution: the f32 run's side of it.
                    diff = diff.min((a - c).abs());
                }
                qdiff = qdiff.max(if diff.is_nan() { f64::INFINITY } else { diff });
            }
            here = here.max(qdiff);
            if qdiff > BAND {
                failures.push(format!(
                    "{label} {id} {}: {got:.4?} vs {want:.4?} outside the bf16 band",
                    q["question_id"]
                ));
            }
            let logits: Vec<f64> = q["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            // question_type 0 is noul: its answer is the value, checked by the band above.
            if q["question_type"] != 0 && !tied(&logits) && argmax(&got) != argmax(&want) {
                failures.push(format!(
                    "{label} {id} {}: top option {} vs the reference's {} (outside the bf16 \
                     band's answers)",
                    q["question_id"],
                    q["option_ids"][argmax(&got)],
                    q["option_ids"][argmax(&want)]
                ));
            }
        }
        println!("golden-shadow {label} {id}: worst probability difference {here:.4}");
        worst = worst.max(here);
        answered += 1;
        if first_failure && !failures.is_empty() {
            break;
        }
    }
    (answered, worst, failures, shared)
}

/// The child's body (see the module docs): `CLEF_TT_GOLDEN_CHILD` is
/// `[FIXTURE/]PROFILE:DIR,DIR;...` (FIXTURE a folder of tests/fixtures, `tiny-clef` if none), a DIR
/// ending in `~` scored and reported but not held to the band. A DIR ending in `+` is scored
/// through packs of 4 (`decide_pack`), which must run as batched passes on the mesh; `+-`, the same
/// packs, which the mesh must refuse to batch for the model's shapes (they then run one by one).
/// `cached+` (`cached+-`: refused as a batch) is not a folder: it runs [`cached_packs::run`] (the
/// cache stays on for what follows it). Fails at the end if any golden held to the band was outside
/// it, or a pack ran other than required (with a mutation: at the first).
#[test]
fn child_scores_the_goldens() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mutated = std::env::var_os("CLEF_TT_GOLDEN_MUTATE").is_some();
    let shim = Shim::load(Some(Path::new(clef_tt_abi::TTNN_SHIM))).unwrap();
    let mut failures = Vec::new();
    'profiles: for group in spec.split(';') {
        let (profile, dirs) = group.split_once(':').unwrap();
        let (fixture, profile) = profile.rsplit_once('/').unwrap_or(("tiny-clef", profile));
        let t0 = std::time::Instant::now();
        let fixture_label = if fixture == "tiny-clef" { "" } else { "g27 " };
        let mut pipeline = common::fixture_pipeline_on(fixture, profile, |n| {
            TtMesh::open(&shim, MeshPlacement::direct(MeshShape::PAIR), n).unwrap()
        });
        for dir in dirs.split(',') {
            if let Some(dir) = dir.strip_suffix('=') {
                let set = dir.trim_start_matches("goldens").trim_start_matches('-');
                let label = format!(
                    "{fixture_label}{profile} {} replayed",
                    if set.is_empty() { "text" } else { set }
                );
                let at = format!("{fixture}/{dir}");
                let (records, replayed, bad) = traced::run(
                    &pipeline,
                    &jsonl(&at, "requests.jsonl"),
                    &jsonl(&at, "expected_bf16.jsonl"),
                    &label,
                );
                let runs = fixture != "tiny-clef";
                println!(
                    "golden-shadow {label}: {records} records, {replayed} passes replayed, {} \
                     differing from the eager passes",
                    bad.len()
                );
                let mut bad = bad;
                if runs != (replayed > 0) {
                    bad.push(format!(
                        "{label}: {replayed} passes replayed, expected {}",
                        if runs {
                            "some"
                        } else {
                            "none (layer by layer)"
                        }
                    ));
                }
                for b in &bad {
                    println!("golden-shadow FAILED {b}");
                }
                failures.extend(bad);
                if mutated && !failures.is_empty() {
                    break 'profiles;
                }
                continue;
            }
            if let Some(form) = dir.strip_prefix("cached+") {
                let label = format!("{fixture_label}{profile} cached packs");
                let bad;
                (pipeline, bad) = cached_packs::run(pipeline, &label, form != "-");
                println!(
                    "golden-shadow {label}: {} outside the band or off plan",
                    bad.len()
                );
                for b in &bad {
                    println!("golden-shadow FAILED {b}");
                }
                failures.extend(bad);
                continue;
            }
            let (dir, held) = match dir.strip_suffix('~') {
                Some(d) => (d, false),
                None => (dir, true),
            };
            let (dir, batched) = match (dir.strip_suffix("+-"), dir.strip_suffix('+')) {
                (Some(d), _) => (d, Some(false)),
                (None, Some(d)) => (d, Some(true)),
                (None, None) => (dir, None),
            };
            let set = dir.trim_start_matches("goldens").trim_start_matches('-');
            let label = format!(
                "{fixture_label}{profile} {}{}",
                if set.is_empty() { "text" } else { set },
                if batched.is_some() { " packed" } else { "" }
            );
            let (answered, worst, mut bad, shared) = score(
                &pipeline,
                &format!("{fixture}/{dir}"),
                &label,
                mutated,
                batched.is_some(),
            );
            if let Some(want) = batched {
                // A refused batch turns the pipeline's packing off for good.
                let ran = pipeline.packs() && shared > 0;
                println!(
                    "golden-shadow {label}: packs {} ({shared} of {answered} records from a \
                     shared pass)",
                    if ran {
                        "ran as batched passes"
                    } else {
                        "refused, run one by one"
                    }
                );
                if ran != want {
                    bad.push(format!(
                        "{label}: packs were {} a batch, expected {}",
                        if ran { "run as" } else { "refused as" },
                        if want { "batched passes" } else { "a refusal" }
                    ));
                }
            }
            println!(
                "golden-shadow {label}: {answered} records, worst probability difference \
                 {worst:.4}, {} outside the band{}",
                bad.len(),
                if held {
                    ""
                } else {
                    " (reported, not held to the band)"
                }
            );
            if held {
                for b in &bad {
                    println!("golden-shadow FAILED {b}");
                }
                failures.extend(bad);
            } else {
                for b in &bad {
                    println!("golden-shadow (reported) {b}");
                }
            }
            if mutated && !failures.is_empty() {
                break 'profiles;
            }
        }
        println!(
            "golden-shadow {fixture_label}{profile}: scored in {:.0} s",
            t0.elapsed().as_secs_f64()
        );
    }
    let shown: Vec<&String> = failures.iter().take(12).collect();
    assert!(
        failures.is_empty(),
        "{} answers outside the bf16 band, the first:\n{}",
        failures.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
