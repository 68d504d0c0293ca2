//! `clef-tt compare-layers` (src/compare) on the mock P150x2 in golden-shadow mode against the
//! CPU, layer by layer (needs the mock kit with torch; passes with a note elsewhere, and CI
//! requires it with `CLEF_REQUIRE_TT_GOLDEN=1`):
//! - unmutated, both fixtures under `bf16` and `selected`, a text request and two media ones
//!   (an image; an image and two videos): exit 0, every quantity within its tolerance, alone,
//!   continued, served (a replayed pass) and packed (a batched pass keeping a prefix);
//! - every planted mutation of the golden-test set (golden/mutate.py) on tiny-clef-g27 (Clef
//!   27B's per-head geometry), under one profile each (`bf16` and `selected` in turn: a
//!   mutation changes an op's convention, which both profiles run alike, and the unmutated runs
//!   hold each profile's own paths): exit 1, and the first quantity outside its tolerance sits
//!   at the layer the mutation first touches, with a relative error at least 5x the unmutated
//!   run's there;
//! - a line that is not a request: exit 2.
//!
//! tiny-clef-g27's layers: 0-2 Gated DeltaNet, 3 attention; its tower: blocks 0 and 1.

mod common;

use common::golden_kit::kit;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each mutation, the request it runs on and the prefix of the first quantity it must break.
const MUTATIONS: [(&str, Request, &str); 11] = [
    ("gate_sign", Request::Text, "alone.layer.0."),
    ("raw_gamma", Request::Text, "alone.layer.0."),
    ("qk_swap", Request::Text, "alone.layer.0."),
    ("drop_silu", Request::Text, "alone.layer.0."),
    ("carry_row", Request::Text, "alone.layer.0."),
    ("rope_swap", Request::Text, "alone.layer.3."),
    ("rope_channels", Request::Text, "alone.layer.3."),
    ("qg_order", Request::Text, "alone.layer.3."),
    ("vision_pad", Request::Image, "vision.image.block.0"),
    ("keep_unmasked", Request::Text, "packed.kept.layer.0."),
    ("stale_input", Request::Text, "served.layer.0."),
];

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Request {
    Text,
    Image,
    ImageAndVideos,
}

/// The request bodies, from the fixtures' goldens.
fn body(request: Request) -> String {
    let (dir, id) = match request {
        Request::Text => ("goldens", "triage_readme"),
        Request::Image => ("goldens-media", "img_333x217_gradient_shapes"),
        Request::ImageAndVideos => ("goldens-media", "image_and_two_videos"),
    };
    let path = common::fixtures()
        .join("tiny-clef-g27")
        .join(dir)
        .join("requests.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let record: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["id"] == id)
        .unwrap();
    record["body"].as_str().unwrap().to_string()
}

fn scratch(name: &str) -> PathBuf {
    common::golden_kit::scratch("compare_layers", name)
}

/// `compare-layers` on `model` under `profile` over `requests` (a line each), with
/// `mutation` if any: (exit code, stdout, stderr).
fn compare(
    shim: &str,
    model: &str,
    profile: &str,
    requests: &[Request],
    mutation: Option<&str>,
) -> (i32, String, String) {
    let name = format!("{model}-{profile}-{}", mutation.unwrap_or("plain"));
    let dir = scratch(&name);
    let file = dir.join("requests.jsonl");
    let lines: Vec<String> = requests.iter().map(|&r| body(r)).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_clef-tt"));
    cmd.args([
        "compare-layers",
        "--device",
        "tt",
        "--mesh",
        "1x2",
        "--tt-shim",
        shim,
    ])
    .arg("--model")
    .arg(common::fixtures().join(model))
    .args(["--precision", profile])
    .arg(&file)
    .env("CLEF_TT_GOLDEN", "1")
    .env(
        "TT_METAL_MOCK_CLUSTER_DESC_PATH",
        Path::new(env!("CARGO_MANIFEST_DIR")).join("ffi/ttnn-mock/blackhole_2xP150.yaml"),
    )
    .env("TT_LOGGER_LEVEL", "warn")
    .env("CLEF_LOG", "warn")
    .env_remove("CLEF_TT_GOLDEN_MUTATE")
    .current_dir(&dir);
    if let Some(m) = mutation {
        cmd.env("CLEF_TT_GOLDEN_MUTATE", m);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A report's rows per request line: (quantity, relative error, within its tolerance).
fn rows(stdout: &str) -> HashMap<usize, Vec<(String, f64, bool)>> {
    let mut out: HashMap<usize, Vec<_>> = HashMap::new();
    let mut line = 0;
    for l in stdout.lines() {
        if let Some(rest) = l.strip_prefix("request at line ") {
            line = rest.split(' ').next().unwrap().parse().unwrap();
            continue;
        }
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        if cells.len() == 8 && cells[2].parse::<f64>().is_ok() {
            let within = match cells[6] {
                "ok" => true,
                "OUTSIDE" => false,
                other => panic!("a row marked {other:?}: {l}"),
            };
            let rel = cells[2].parse().unwrap();
            out.entry(line)
                .or_default()
                .push((cells[1].to_string(), rel, within));
        }
    }
    out
}

#[test]
fn the_mock_matches_the_cpu_layer_by_layer_and_every_mutation_fails_at_its_first_layer() {
    let Some(shim) = kit() else {
        return;
    };
    let all = [Request::Text, Request::Image, Request::ImageAndVideos];
    // Every run first, two at a time (each child keeps about one core busy), then the checks.
    let mut jobs: Vec<(&str, &str, Vec<Request>, Option<&str>)> = Vec::new();
    for model in ["tiny-clef-g27", "tiny-clef"] {
        for profile in ["bf16", "selected"] {
            jobs.push((model, profile, all.to_vec(), None));
        }
    }
    for (i, (mutation, request, _)) in MUTATIONS.into_iter().enumerate() {
        let profile = ["bf16", "selected"][i % 2];
        jobs.push(("tiny-clef-g27", profile, vec![request], Some(mutation)));
    }
    let outputs = run_two_at_a_time(&jobs, |(model, profile, requests, mutation)| {
        compare(shim, model, profile, requests, *mutation)
    });
    // Unmutated: per profile, tiny-clef-g27's rows by (request, quantity), for the ratios.
    let mut plain: HashMap<(&str, Request), HashMap<String, f64>> = HashMap::new();
    let done = jobs.iter().zip(&outputs);
    for ((model, profile, _, _), (code, stdout, stderr)) in done.clone().take(4) {
        assert_eq!(*code, 0, "{model} {profile} unmutated:\n{stdout}\n{stderr}");
        let reports = rows(stdout);
        assert_eq!(reports.len(), all.len(), "{stdout}");
        for (i, &request) in all.iter().enumerate() {
            let report = &reports[&(i + 1)];
            // tiny-clef's shapes run no batched pass (its packs run one by one).
            let runs: &[&str] = match *model {
                "tiny-clef" => &["alone.", "continued.", "served."],
                _ => &["alone.", "continued.", "served.", "packed.", "packed.kept."],
            };
            for run in runs {
                assert!(
                    report.iter().any(|(name, _, _)| name.starts_with(run)),
                    "{model} {profile}: no {run} rows for {request:?}"
                );
            }
            if request != Request::Text {
                assert!(report.iter().any(|(n, _, _)| n.ends_with("block.0")));
            }
            assert!(report.iter().all(|(_, _, ok)| *ok));
            if *model == "tiny-clef-g27" {
                let by_name = report.iter().map(|(n, rel, _)| (n.clone(), *rel));
                plain.insert((profile, request), by_name.collect());
            }
        }
    }
    let mutated = done.skip(4).zip(MUTATIONS.iter());
    for (((_, profile, requests, mutation), (code, stdout, stderr)), (_, _, first)) in mutated {
        let mutation = mutation.unwrap_or_default();
        assert_eq!(*code, 1, "{mutation} {profile}:\n{stdout}\n{stderr}");
        let report = &rows(stdout)[&1];
        let (name, rel, _) = report.iter().find(|(_, _, ok)| !ok).unwrap();
        assert!(
            name.starts_with(first),
            "{mutation} {profile}: first outside at {name}, expected {first}*"
        );
        let before = plain[&(*profile, requests[0])][name];
        assert!(
            *rel >= 5.0 * before,
            "{mutation} {profile}: {name} at {rel:.2e}, unmutated {before:.2e}"
        );
        assert!(
            stderr.contains(&format!("outside tolerance: line 1: {name}")),
            "{stderr}"
        );
        eprintln!("{mutation} {profile}: {name} {rel:.2e} (unmutated {before:.2e})");
    }
}

/// `run` over every job, two threads taking the next job in turn; the outputs in job order.
fn run_two_at_a_time<J: Sync, O: Send>(jobs: &[J], run: impl Fn(&J) -> O + Sync) -> Vec<O> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outputs: Vec<std::sync::Mutex<Option<O>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                *outputs[i].lock().unwrap() = Some(run(job));
            });
        }
    });
    outputs
        .into_iter()
        .map(|o| o.into_inner().unwrap().unwrap())
        .collect()
}

/// `compare-layers` on the CPU against itself, tiny-clef under `f32`, over `lines`.
fn on_the_cpu(name: &str, lines: &str) -> std::process::Output {
    let dir = scratch(name);
    let file = dir.join("requests.jsonl");
    std::fs::write(&file, lines).unwrap();
    Command::new(env!("CARGO_BIN_EXE_clef-tt"))
        .args(["compare-layers", "--device", "cpu", "--precision", "f32"])
        .arg("--model")
        .arg(common::fixtures().join("tiny-clef"))
        .arg(&file)
        .current_dir(&dir)
        .output()
        .unwrap()
}

/// The CPU against itself (no kit needed): within every tolerance under `f32`, its packed
/// run as row segments; a line that is not a request: exit 2.
#[test]
fn the_cpu_against_itself_is_within_tolerance_and_a_bad_line_exits_2() {
    let out = on_the_cpu("cpu", &(body(Request::Text) + "\n"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let report = &rows(&stdout)[&1];
    assert!(report
        .iter()
        .any(|(n, _, _)| n == "packed.layer.7.residual"));
    assert!(report.iter().all(|(_, _, ok)| *ok));
    let out = on_the_cpu("bad-line", "{\"state\": 3}\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}
