//! clef-tt through the ttnn shim on the real ttnn 0.81.1 runtime in tt-metal's mock mode: a
//! mock P150 and P150x2 (ffi/ttnn-mock). What a mock device can tell is checked: the meshes open
//! as the port opens them, every op of every golden request (text and media, under `selected`
//! and `bf16`, new and repeated states) is accepted by ttnn's own validation, dispatched and
//! allocated by its runtime, every request is answered with the golden's questions and option
//! sets, and a call ttnn refuses becomes a 500 naming ttnn's failed condition after which the
//! worker goes on. What it cannot tell: the values (device data are not computed in mock mode,
//! so answers are compared in structure only) and speed.
//!
//! Runs where the ttnn shim was built (`CLEF_TT_PYTHON` at build time) and the kit's environment
//! is set (`ffi/ttnn-mock/setup.sh DIR && source DIR/env.sh`); otherwise each test says why it
//! is skipped and passes, unless `CLEF_REQUIRE_TT_MOCK=1` (CI), which makes that a failure.

mod common;

use common::process::{assert_succeeded, clef_tt, spawn_logged, Server};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The ttnn shim, when it and the mock kit are there.
fn kit() -> Option<&'static str> {
    let shim = clef_tt_abi::TTNN_SHIM;
    let env = std::env::var_os("TT_METAL_MOCK_CLUSTER_DESC_PATH").is_some();
    let why = if shim.is_empty() || !Path::new(shim).is_file() {
        "the ttnn shim was not built (CLEF_TT_PYTHON unset at build time)"
    } else if !env {
        "the mock kit's environment is not set (source DIR/env.sh of ffi/ttnn-mock/setup.sh)"
    } else {
        return Some(shim);
    };
    assert!(
        std::env::var("CLEF_REQUIRE_TT_MOCK").as_deref() != Ok("1"),
        "CLEF_REQUIRE_TT_MOCK=1: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// A cluster descriptor of the kit: `blackhole_P150.yaml` or `blackhole_2xP150.yaml`.
fn descriptor(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("ffi/ttnn-mock")
        .join(name)
        .display()
        .to_string()
}

fn log_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tt_mock");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// tt-metal's own log of the server logging to `log`: beside it (tt-metal opens its file
/// truncating: sent to the server's log it would cut what came before).
fn tt_metal_log(log: &Path) -> PathBuf {
    log.with_extension("tt-metal.log")
}

/// A server on the mock P150x2 logging to `log`, tt-metal's own log beside it.
fn spawn_mock(args: &[&str], env: &[(&str, &str)], log: &Path) -> (Server, String, ureq::Agent) {
    let p150x2 = descriptor("blackhole_2xP150.yaml");
    let tt_log = tt_metal_log(log).display().to_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("TT_METAL_MOCK_CLUSTER_DESC_PATH", p150x2.as_str()),
        ("TT_LOGGER_FILE", tt_log.as_str()),
    ];
    all.extend_from_slice(env);
    spawn_logged(args, &all, log)
}

#[test]
fn devices_opens_the_mock_p150_and_p150x2_as_the_port_does() {
    let Some(shim) = kit() else { return };
    for (chips, file) in [(1, "blackhole_P150.yaml"), (2, "blackhole_2xP150.yaml")] {
        let out = clef_tt()
            .args(["devices", "--device", "tt", "--tt-shim", shim])
            .env("TT_METAL_MOCK_CLUSTER_DESC_PATH", descriptor(file))
            .output()
            .unwrap();
        assert_succeeded(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        for want in [
            "backend: ttnn",
            "hardware: mock",
            "runtime: ttnn 0.81.1",
            &format!("devices visible: {chips}"),
            "1x1 mesh: opens (devices [0]), compute grid 11x10, DRAM",
        ] {
            assert!(text.contains(want), "{chips} chips: no {want:?} in\n{text}");
        }
        let pair = if chips == 2 {
            "1x2 mesh: opens (devices [0, 1]), compute grid 11x10, DRAM"
        } else {
            "1x2 mesh: needs 2 devices, 1 visible"
        };
        assert!(text.contains(pair), "{text}");
    }
}

/// `decide --device tt` prints only its JSON lines on stdout, one per request: tt-metal's log
/// goes to a file in clef-tt's state directory (its path on stderr) and tt-metal's generated
/// files there too, so the working directory is left as it was. `devices` likewise prints
/// only its report.
#[test]
fn tt_commands_print_only_their_output_and_leave_the_working_directory_alone() {
    let Some(shim) = kit() else { return };
    let scratch = log_path("clean-stdout");
    let _ = std::fs::remove_dir_all(&scratch);
    let (cwd, state) = (scratch.join("cwd"), scratch.join("state"));
    std::fs::create_dir_all(&cwd).unwrap();
    let requests = goldens("tiny-clef/goldens")
        .into_iter()
        .take(3)
        .map(|(_, body)| body)
        .collect::<Vec<_>>();
    let file = scratch.join("requests.jsonl");
    std::fs::write(&file, requests.join("\n")).unwrap();
    let run = |args: &[&str]| {
        let out = clef_tt()
            .args(args)
            .args(["--device", "tt", "--tt-shim", shim])
            .current_dir(&cwd)
            .env(
                "TT_METAL_MOCK_CLUSTER_DESC_PATH",
                descriptor("blackhole_2xP150.yaml"),
            )
            .env("XDG_STATE_HOME", &state)
            .env_remove("TT_LOGGER_FILE")
            .env_remove("TT_METAL_LOGS_PATH")
            .output()
            .unwrap();
        assert_succeeded(&out);
        out
    };
    let out = run(&["decide", file.to_str().unwrap(), "--mesh", "1x2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), requests.len(), "{stdout}");
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.is_object(), "{line}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = stderr
        .lines()
        .find_map(|l| l.strip_prefix("tt-metal's log: "))
        .unwrap_or_else(|| panic!("no log path on stderr:\n{stderr}"));
    assert!(
        Path::new(log).starts_with(state.join("clef-tt/tt-metal")),
        "{log}"
    );
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains("mock cluster"),
        "tt-metal's log has its lines:\n{text}"
    );
    assert!(state.join("clef-tt/generated").is_dir());
    let report = run(&["devices"]);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.starts_with("device: tt\n") && !text.contains(" | info "),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
    assert!(left.is_empty(), "the working directory got {left:?}");
}

/// The device deadline on the mock P150x2: the shim core's fault `CLEF_TT_HANG` stops the 3rd
/// linear of the first request for good (`tests/common/hang.rs`).
#[test]
fn a_hung_device_on_the_mock_p150x2_is_answered_503_and_ends_the_process() {
    let Some(shim) = kit() else { return };
    let log = log_path("serve-hang.log");
    let p150x2 = descriptor("blackhole_2xP150.yaml");
    let tt_log = tt_metal_log(&log).display().to_string();
    let body = goldens("tiny-clef/goldens").remove(0).1;
    common::hang::a_hung_device_is_refused_reported_and_exited(
        &["--device", "tt", "--tt-shim", shim, "--mesh", "1x2"],
        &[
            ("TT_METAL_MOCK_CLUSTER_DESC_PATH", p150x2.as_str()),
            ("TT_LOGGER_FILE", tt_log.as_str()),
        ],
        "linear:3",
        &body,
        &log,
    );
}

/// Every golden request of a fixture: (id, body).
fn goldens(dir: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(common::fixtures().join(dir).join("requests.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["entry"] == "systemone")
        .map(|v| {
            let id = v["id"].as_str().unwrap_or_default().to_string();
            (id, v["body"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// Status, body and `x-clef-prefix-cache` of one request.
fn post(agent: &ureq::Agent, base: &str, body: &str) -> (u16, Value, String) {
    let mut r = agent
        .post(&format!("{base}/v1/systemone"))
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .unwrap();
    let cache = r
        .headers()
        .get("x-clef-prefix-cache")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
        cache,
    )
}

/// The questions, answer types and option sets of an answer (not its values).
fn structure(answer: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(answers) = answer["answers"].as_object() {
        for (q, a) in answers {
            let options: Vec<&String> = a["probabilities"]
                .as_object()
                .map(|p| p.keys().collect())
                .unwrap_or_default();
            out.push(format!("{q}:{}:{options:?}", a["type"]));
        }
    }
    out
}

/// `runtime_calls=N` of every "device runtime calls" line of a server's log.
fn runtime_calls(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("device runtime calls"))
        .filter_map(|l| l.split("runtime_calls=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Each request twice in a row, a new state then the same state again (a prefix-cache hit for
/// those long enough to cache: the slot's KV pages, DeltaNet states and conv carries on the
/// device), each answered with `want`'s status and answer shape; the hits on the repeats.
fn answer_twice(
    agent: &ureq::Agent,
    base: &str,
    all: &[&(String, String)],
    want: &[(u16, Vec<String>)],
    label: &str,
) -> usize {
    let mut hits = 0;
    for ((id, body), (status, shape)) in all.iter().map(|r| (&r.0, &r.1)).zip(want) {
        for pass in ["new", "repeated"] {
            let (got, answer, cache) = post(agent, base, body);
            assert_eq!(got, *status, "{label} {pass} {id}: {answer}");
            if got == 200 {
                assert_eq!(&structure(&answer), shape, "{label} {pass} {id}");
            }
            hits += usize::from(pass == "repeated" && cache == "hit");
        }
    }
    hits
}

#[test]
fn every_golden_is_served_on_the_mock_p150x2_under_selected_and_bf16() {
    let Some(shim) = kit() else { return };
    let text = goldens("tiny-clef/goldens");
    let media = goldens("tiny-clef/goldens-media");
    let all: Vec<&(String, String)> = text.iter().chain(&media).collect();
    // The reference for statuses and answer structure: the CPU device.
    let (_cpu, cpu_base, agent) = common::process::spawn_server(&["--warmup", "0"], &[]);
    let want: Vec<(u16, Vec<String>)> = all
        .iter()
        .map(|(_, body)| {
            let (status, answer, _) = post(&agent, &cpu_base, body);
            (status, structure(&answer))
        })
        .collect();
    for profile in ["selected", "bf16"] {
        let log = log_path(&format!("serve-{profile}.log"));
        let (server, base, agent) = spawn_mock(
            &[
                "--device",
                "tt",
                "--tt-shim",
                shim,
                "--mesh",
                "1x2",
                "--precision",
                profile,
            ],
            &[],
            &log,
        );
        let hits = answer_twice(&agent, &base, &all, &want, profile);
        drop::<Server>(server);
        let text = std::fs::read_to_string(&log).unwrap();
        let tt_log = tt_metal_log(&log);
        let tt_text = std::fs::read_to_string(&tt_log).unwrap_or_default();
        for (path, text) in [(&log, &text), (&tt_log, &tt_text)] {
            assert!(
                !text.contains("TT_FATAL"),
                "{profile}: a TT_FATAL in {}",
                path.display()
            );
            // ttnn's own deprecation warning ("... args are deprecated and will be removed");
            // a cold kernel cache also logs compiler flags such as -Wno-error=deprecated-….
            assert!(
                !text.contains("deprecated and will be removed"),
                "{profile}: the backend passes ttnn an argument it deprecates: {}",
                path.display()
            );
        }
        assert!(
            !text.contains("panicked"),
            "{profile}: a panic in {}",
            log.display()
        );
        // 2 text and 7 media goldens are long enough to cache.
        assert!(
            hits >= 9,
            "{profile}: {hits} prefix-cache hits on the repeated states"
        );
        let calls = runtime_calls(&text);
        assert!(!calls.is_empty(), "{profile}: no runtime calls logged");
        let mean = calls.iter().sum::<u64>() as f64 / calls.len() as f64;
        eprintln!(
            "{profile}: {} requests answered twice on the mock P150x2, {hits} prefix-cache hits on the repeats, ttnn calls per request: mean {mean:.0}, max {}",
            all.len(),
            calls.iter().max().unwrap_or(&0)
        );
    }
}

/// A metric of `/metrics` by its name and labels (`name{labels}` as exposed), 0 if absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn metrics(agent: &ureq::Agent, base: &str) -> String {
    agent
        .get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// `tiny-clef-g27` (Clef 27B's per-head geometry: its chunks run as whole passes) served on the
/// mock P150x2 with tracing on (the default): warm-up captures every bucket's passes before
/// /health answers 200; every text and media golden is answered (a new state, then the same
/// state again: prefix-cache misses, hits and uncacheable states) with the CPU's statuses and
/// answer shapes; then two bursts of 20 short requests at once (packed into batched passes).
/// From the warm-up on, no chunk runs eagerly but the first of each new form of pass: every
/// other chunk replays a trace (`/metrics`).
#[test]
fn tiny_clef_g27_is_served_from_traces_on_the_mock_p150x2() {
    let Some(shim) = kit() else { return };
    let model = common::fixtures().join("tiny-clef-g27");
    let model = model.to_str().unwrap();
    let text = goldens("tiny-clef-g27/goldens");
    let media = goldens("tiny-clef-g27/goldens-media");
    let all: Vec<&(String, String)> = text.iter().chain(&media).collect();
    let (_cpu, cpu_base, cpu) =
        common::process::spawn_server(&["--model", model, "--warmup", "0"], &[]);
    let log = log_path("serve-traced.log");
    let (server, base, agent) = spawn_mock(
        &[
            "--model",
            model,
            "--device",
            "tt",
            "--tt-shim",
            shim,
            "--mesh",
            "1x2",
            "--precision",
            "bf16",
        ],
        &[],
        &log,
    );
    let started = std::fs::read_to_string(&log).unwrap();
    assert!(
        started.contains("prefill passes traced"),
        "no traced warm-up in the log:\n{started}"
    );
    let warm = metrics(&agent, &base);
    assert!(metric(&warm, "clef_traces{worker=\"0\"}") >= 8, "{warm}");
    let want: Vec<(u16, Vec<String>)> = all
        .iter()
        .map(|(_, body)| {
            let (status, answer, _) = post(&cpu, &cpu_base, body);
            (status, structure(&answer))
        })
        .collect();
    let hits = answer_twice(&agent, &base, &all, &want, "bf16");
    assert!(hits >= 9, "{hits} prefix-cache hits on the repeated states");
    let eager = |t: &str, why: &str| {
        metric(
            t,
            &format!("clef_prefill_chunks_total{{worker=\"0\",path=\"eager\",reason=\"{why}\"}}"),
        )
    };
    let traced = |t: &str| {
        metric(
            t,
            "clef_prefill_chunks_total{worker=\"0\",path=\"traced\",reason=\"\"}",
        )
    };
    let before = metrics(&agent, &base);
    let burst: Vec<String> = (0..20)
        .map(|i| {
            format!(
                r#"{{"model":"clef","state":"Ticket {i}: the dashboard shows error {code} after the update.","questions":{{"urgent":{{"type":"noul","instructions":"Is it urgent?"}}}}}}"#,
                code = 400 + i * 7
            )
        })
        .collect();
    // Twice: how a burst is packed depends on timing, and the second meets forms the first
    // captured.
    for _ in 0..2 {
        std::thread::scope(|s| {
            for body in &burst {
                let (agent, base) = (&agent, &base);
                s.spawn(move || {
                    let (status, answer, _) = post(agent, base, body);
                    assert_eq!(status, 200, "{answer}");
                });
            }
        });
    }
    let after = metrics(&agent, &base);
    let forms = |t: &str| metric(t, "clef_prefill_forms{worker=\"0\"}");
    eprintln!(
        "2 bursts of 20: {} chunks replayed, {} eager (the first of {} new forms)",
        traced(&after) - traced(&before),
        eager(&after, "warming") - eager(&before, "warming"),
        forms(&after) - forms(&before),
    );
    // From the warm-up on: chunks replayed, and none eager but the first of each form.
    assert!(traced(&after) > traced(&warm), "{after}");
    assert_eq!(
        eager(&after, "warming") - eager(&warm, "warming"),
        forms(&after) - forms(&warm),
        "a chunk ran eagerly although its form was traced:\n{after}"
    );
    for why in ["untraceable", "layer by layer"] {
        assert_eq!(eager(&after, why), eager(&warm, why), "{why}:\n{after}");
    }
    drop::<Server>(server);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("panicked"), "a panic in {}", log.display());
    assert!(
        !text.contains("TT_FATAL"),
        "a TT_FATAL in {}",
        log.display()
    );
}

#[test]
fn a_call_ttnn_refuses_is_a_500_naming_its_condition_and_the_worker_goes_on() {
    let Some(shim) = kit() else { return };
    let log = log_path("serve-refuse.log");
    // The dispatcher's test hook: the 3rd ttnn.linear call becomes a product ttnn refuses.
    let (_server, base, agent) = spawn_mock(
        &[
            "--device",
            "tt",
            "--tt-shim",
            shim,
            "--mesh",
            "1x2",
            "--warmup",
            "0",
        ],
        &[("CLEF_TT_TTNN_REFUSE", "linear:3")],
        &log,
    );
    let body = common::server::triage();
    let (status, answer, _) = post(&agent, &base, &body);
    assert_eq!(status, 500, "{answer}");
    let message = answer.to_string();
    assert!(
        message.contains("TT_FATAL") && message.contains("a_shape[-1] == b_shape[-2]"),
        "{message}"
    );
    let (status, answer, _) = post(&agent, &base, &body);
    assert_eq!(status, 200, "the next request: {answer}");
}

/// `clef-tt ARGS` with `env` on the mock P150x2: whether it succeeded, and its stdout and
/// stderr.
fn on_mock_p150x2(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> (bool, String) {
    let out = clef_tt()
        .args(args)
        .envs(env.iter().copied())
        .env(
            "TT_METAL_MOCK_CLUSTER_DESC_PATH",
            descriptor("blackhole_2xP150.yaml"),
        )
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `clef-tt plan --on-device` on the mock P150x2 (the real allocator), its rows as
/// (class, plan GiB, allocator GiB), and its output.
fn plan_on_device(
    shim: &str,
    profile: &str,
    env: &[(&str, &str)],
) -> (bool, Vec<(String, f64, f64)>, String) {
    let args = [
        "plan",
        "--shape",
        "clef-27b",
        "--mesh",
        "1x2",
        "--precision",
        profile,
        "--on-device",
        "--tt-shim",
        shim,
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let (ok, text) = on_mock_p150x2(&args, env);
    let rows = text
        .split("## On the device")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let gib = |s: &str| s.trim_matches('*').parse::<f64>().ok();
            match cells[..] {
                [class, _, plan, held] => Some((class.to_string(), gib(plan)?, gib(held)?)),
                _ => None,
            }
        })
        .collect();
    (ok, rows, text)
}

#[test]
fn clef_27b_is_placed_on_the_mock_p150x2_by_its_allocator_an_f32_kv_cache_is_refused_and_f32_weights_do_not_fit(
) {
    let Some(shim) = kit() else { return };
    let (ok, rows, text) = plan_on_device(shim, "selected", &[]);
    assert!(ok, "{text}");
    // Every matrix and activation class is held as its tensor specs' packed size (whole tiles
    // in every DRAM bank); vectors are row-major f32 rows of one value, a page each.
    for (class, plan, held) in &rows {
        if class.starts_with("norms") || class.starts_with("**") {
            assert!(held >= plan, "{class}: {held} < {plan}");
        } else {
            assert!(
                (held - plan).abs() <= 0.002,
                "{class}: plan {plan} GiB, held {held} GiB"
            );
        }
    }
    let classes: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    for want in [
        "deltanet",
        "mlp_gate_up",
        "mlp_down",
        "attention",
        "vision",
        "prefix cache: 4 slots x 16384 tokens",
        "traced passes: KV of 2 prompts of 20480 tokens in flight",
        "traced passes: live DeltaNet state",
        "traces: their intermediates' arena (1024-row pass)",
        "one 1024-token chunk",
        "**total**",
    ] {
        assert!(classes.contains(&want), "no {want} in {classes:?}\n{text}");
    }
    assert!(text.contains("GiB left after the weights"), "{text}");
    // The trace region traced passes replay from, reserved at open (the allocator's figure).
    assert!(
        text.contains("The trace region, reserved at open"),
        "{text}"
    );
    // The f32 profile keeps its KV cache in f32, which the ttnn backend cannot (its attention
    // reads bf16 K/V): the mesh refuses to open, naming the override.
    let (ok, _, text) = plan_on_device(shim, "f32", &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("the KV cache cannot be kept in f32") && text.contains("CLEF_KV_DTYPE=bf16"),
        "{text}"
    );
    // With a bf16 KV cache, f32 weights (~50 GiB per device) overflow a 32 GB chip: refused,
    // naming the class.
    let (ok, _, text) = plan_on_device(shim, "f32", &[("CLEF_KV_DTYPE", "bf16")]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("does not fit") && text.contains("Out of Memory"),
        "{text}"
    );
}

#[test]
fn the_f32_profile_is_refused_at_start_on_the_mock_p150x2_saying_why_and_runs_with_a_bf16_kv_cache()
{
    let Some(shim) = kit() else { return };
    let body = std::env::temp_dir().join(format!("clef-tt-kv-{}.json", std::process::id()));
    std::fs::write(
        &body,
        r#"{"state":"a short state","questions":{"ok":{"type":"noul","instructions":"Is it?"}}}"#,
    )
    .unwrap();
    let args = [
        "decide",
        "--device",
        "tt",
        "--tt-shim",
        shim,
        "--precision",
        "f32",
        "--mesh",
        "1x2",
    ];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.push(body.as_os_str());
    let decide = |env: &[(&str, &str)]| on_mock_p150x2(&args, env);
    let (ok, text) = decide(&[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("the KV cache cannot be kept in f32") && text.contains("CLEF_KV_DTYPE=bf16"),
        "{text}"
    );
    let (ok, text) = decide(&[("CLEF_KV_DTYPE", "bf16")]);
    let _ = std::fs::remove_file(&body);
    assert!(ok, "{text}");
    assert!(text.contains("answered 1 requests"), "{text}");
}
