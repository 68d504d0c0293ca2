//! `clef-tt` on `--device tt` (the host shim) as a user runs it: `serve` answers the goldens as
//! `serve --device cpu` does, `/v1/models` and `/metrics` report the shim and device memory, a
//! failing device op is a 500 with the shim's message after which the worker answers as a
//! fresh model and no device buffer is left behind, and a missing, foreign, outdated or too
//! small device is a clear error at start. Also `devices` and `convert --device tt`.

mod common;

use common::process::{assert_succeeded, clef_tt, post_json, refused, spawn_server};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The golden request bodies of the fixture.
fn golden_bodies() -> Vec<String> {
    std::fs::read_to_string(common::fixtures().join("tiny-clef/goldens/requests.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["entry"] == "systemone")
        .filter_map(|v| v["body"].as_str().map(str::to_string))
        .collect()
}

/// Equal JSON but for `latency_ms`; numbers within one unit of the 4th decimal (a value that
/// sits on a rounding boundary may round either way after a different summation order).
fn same_answer(a: &Value, b: &Value, path: &str) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let kx: Vec<_> = x.keys().filter(|k| *k != "latency_ms").collect();
            let ky: Vec<_> = y.keys().filter(|k| *k != "latency_ms").collect();
            assert_eq!(kx, ky, "{path}");
            for k in kx {
                same_answer(&x[k], &y[k], &format!("{path}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                same_answer(p, q, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(p), Value::Number(q)) => {
            let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
            assert!((p - q).abs() <= 1.0001e-4, "{path}: {p} vs {q}");
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

fn get_json(agent: &ureq::Agent, url: &str) -> Value {
    let text = agent
        .get(url)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `clef_device_live_tensors` of worker 0 from `/metrics`.
fn live_tensors(agent: &ureq::Agent, base: &str) -> u64 {
    let text = agent
        .get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("clef_device_live_tensors{worker=\"0\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the metrics report the device's live tensors")
}

#[test]
fn serve_on_the_tt_device_answers_the_goldens_as_the_cpu_device_does() {
    let f32 = ["--precision", "f32", "--mesh", "1x2"];
    let (_cpu, cpu_base, agent) = spawn_server(&f32, &[]);
    let (_tt, tt_base, _) = spawn_server(&[&f32[..], &["--device", "tt"]].concat(), &[]);
    let mut answered = 0;
    for body in golden_bodies() {
        let (cs, ct) = post_json(&agent, &cpu_base, body.as_bytes());
        let (ts, tt) = post_json(&agent, &tt_base, body.as_bytes());
        assert_eq!(cs, ts, "{body}: {ct} vs {tt}");
        let (c, t): (Value, Value) = (
            serde_json::from_str(&ct).unwrap(),
            serde_json::from_str(&tt).unwrap(),
        );
        if cs == 200 {
            same_answer(&t, &c, "response");
            answered += 1;
        } else {
            assert_eq!(c["detail"], t["detail"], "{body}");
        }
    }
    assert!(answered >= 30, "{answered}");
    // The card names the shim; the device's memory is reported.
    let models = get_json(&agent, &format!("{tt_base}/v1/models"));
    let card = &models["models"][0];
    assert_eq!(card["device"], "tt");
    assert_eq!(card["device_backend"]["backend"], "host");
    assert_eq!(
        card["device_backend"]["abi_version"],
        clef_tt_abi::ABI_VERSION
    );
    assert_eq!(card["device_backend"]["hardware"], "host");
    assert!(card["device_backend"]["shim"]
        .as_str()
        .unwrap()
        .ends_with("libclef_tt_host.so"));
    let usage = &card["counters"]["device"][0];
    assert_eq!(usage["device_ids"], serde_json::json!([0, 1]));
    assert!(usage["bytes_in_use"][1].as_u64().unwrap() > 0);
    assert!(usage["live_tensors"].as_u64().unwrap() > 0);
    // Packing is shown as it runs: the host shim runs no batched layer ops (only the ttnn
    // backend does, `batch_cores` in its description), so this mesh cannot pack; the CPU's
    // default is off.
    assert_eq!(card["limits"]["pack_tokens"], 0);
    let cpu_card = get_json(&agent, &format!("{cpu_base}/v1/models"));
    assert_eq!(cpu_card["models"][0]["device"], "cpu");
    assert_eq!(cpu_card["models"][0]["limits"]["pack_tokens"], 0);
}

#[test]
fn a_failing_device_op_is_a_500_and_leaves_no_device_buffer_behind() {
    // The 5th matmul of the first request fails, then the 10th delta-rule call (in the third
    // request); the prefix cache is off so every request must return to the baseline.
    let (_server, base, agent) = spawn_server(
        &[
            "--device",
            "tt",
            "--precision",
            "f32",
            "--mesh",
            "1x2",
            "--warmup",
            "0",
            "--prefix-cache",
            "0",
        ],
        &[("CLEF_TT_HOST_FAIL", "linear:5,gated_delta_rule:10")],
    );
    let body = golden_bodies().remove(0);
    let baseline = live_tensors(&agent, &base);
    assert!(baseline > 0, "the weights are on the device");
    let library = {
        let pipeline = common::tt_profile_pipeline("f32", clef_device::MeshShape::PAIR);
        pipeline
            .decide_body(body.as_bytes(), common::server::RULE, None)
            .unwrap()
            .response
    };
    let mut failed = Vec::new();
    for _ in 0..4 {
        let (status, text) = post_json(&agent, &base, body.as_bytes());
        assert_eq!(
            live_tensors(&agent, &base),
            baseline,
            "after a {status}: {text}"
        );
        let reply: Value = serde_json::from_str(&text).unwrap();
        match status {
            200 => same_answer(&reply, &library, "response"),
            500 => {
                let msg = reply["error"]["message"].as_str().unwrap().to_string();
                assert!(msg.contains("injected fault"), "{msg}");
                failed.push(msg);
            }
            other => panic!("{other}: {text}"),
        }
    }
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].contains("call 5 of linear"), "{failed:?}");
    assert!(
        failed[1].contains("call 10 of gated_delta_rule"),
        "{failed:?}"
    );
    // The server is still healthy.
    assert_eq!(
        agent
            .get(&format!("{base}/health"))
            .call()
            .unwrap()
            .status(),
        200
    );
}

/// `clef-tt serve --device tt` that must fail at start; its stderr.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let serve = ["serve", "--port", "0", "--device", "tt", "--warmup", "0"];
    refused(&[&serve[..], args].concat(), env)
}

fn stand_in(name: &str, source: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tt_device");
    std::fs::create_dir_all(&dir).unwrap();
    let (c, so) = (
        dir.join(format!("{name}.c")),
        dir.join(format!("lib{name}.so")),
    );
    std::fs::write(&c, source).unwrap();
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .unwrap();
    assert_succeeded(&out);
    so
}

#[test]
fn a_missing_foreign_outdated_or_too_small_device_is_a_clear_error_at_start() {
    let e = refused_start(&["--tt-shim", "/nonexistent/libclef_tt.so"], &[]);
    assert!(
        e.contains("cannot load the Tenstorrent shim /nonexistent/libclef_tt.so"),
        "{e}"
    );
    let old = stand_in("old", "unsigned clef_tt_abi_version(void) { return 1; }\n");
    let e = refused_start(&["--tt-shim", old.to_str().unwrap()], &[]);
    assert!(
        e.contains("ABI version 1")
            && e.contains(&format!("needs version {}", clef_tt_abi::ABI_VERSION)),
        "{e}"
    );
    let foreign = stand_in("foreign", "int answer(void) { return 42; }\n");
    let e = refused_start(&["--tt-shim", foreign.to_str().unwrap()], &[]);
    assert!(e.contains("is not a clef-tt shim"), "{e}");
    let e = refused_start(&["--mesh", "1x2"], &[("CLEF_TT_HOST_DEVICES", "1")]);
    assert!(
        e.contains("a 1x2 mesh needs 2 devices; this process sees 1"),
        "{e}"
    );
    let e = refused_start(
        &["--workers", "2", "--mesh", "1x2"],
        &[("CLEF_TT_HOST_DEVICES", "2")],
    );
    assert!(e.contains("a 1x4 mesh needs 4 devices"), "{e}");
    let e = refused_start(&[], &[("CLEF_TT_HOST_FAIL", "upload:3")]);
    assert!(e.contains("injected fault: call 3 of upload"), "{e}");
}

#[test]
fn devices_reports_the_shim_and_which_meshes_open() {
    let out = clef_tt()
        .args(["devices", "--device", "tt"])
        .output()
        .unwrap();
    assert_succeeded(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let abi = format!("abi version: {}", clef_tt_abi::ABI_VERSION);
    for want in [
        "shim: ",
        "libclef_tt_host.so",
        &abi,
        "backend: host",
        "hardware: host",
        "devices visible: 4",
        "1x1 mesh: opens (devices [0])",
        "1x2 mesh: opens (devices [0, 1])",
        "1x2 submesh of a 1x4 parent: opens (devices [0, 1])",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let out = clef_tt()
        .args(["devices", "--device", "tt"])
        .env("CLEF_TT_HOST_DEVICES", "1")
        .output()
        .unwrap();
    // One device: the 1x2 mesh is reported as not available, not as a failure.
    assert_succeeded(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("1x2 mesh: needs 2 devices, 1 visible"),
        "{text}"
    );
    let out = clef_tt().args(["devices"]).output().unwrap();
    assert_succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("device: cpu"));
}

#[test]
fn a_tt_tensor_cache_is_served_by_the_tt_device_and_refused_by_the_cpu() {
    let dir = std::env::temp_dir().join(format!("clef-tt-tt-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache");
    let out = clef_tt()
        .args(["convert", "--device", "tt", "--mesh", "1x2", "--out"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_succeeded(&out);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["backend"], "tt");
    // The device's default profile is `selected`.
    assert_eq!(manifest["profile"], "selected");
    let cached = ["--device", "tt", "--mesh", "1x2", "--tensor-cache"];
    let (_server, base, agent) =
        spawn_server(&[&cached[..], &[cache.to_str().unwrap()]].concat(), &[]);
    let (plain, plain_base, _) = spawn_server(&["--device", "tt", "--mesh", "1x2"], &[]);
    for body in golden_bodies().iter().take(3) {
        let a = post_json(&agent, &base, body.as_bytes());
        let b = post_json(&agent, &plain_base, body.as_bytes());
        assert_eq!(a.0, b.0);
        same_answer(
            &serde_json::from_str(&a.1).unwrap(),
            &serde_json::from_str(&b.1).unwrap(),
            "response",
        );
    }
    drop(plain);
    let serve_cpu = [
        "serve",
        "--port",
        "0",
        "--precision",
        "selected",
        "--mesh",
        "1x2",
    ];
    let err = refused(
        &[&serve_cpu[..], &["--tensor-cache", cache.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(err.contains("built for backend tt, asked for cpu"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The device deadline on the host shim: the shim core's fault `CLEF_TT_HANG` stops the 3rd
/// linear of the first request for good (`tests/common/hang.rs`).
#[test]
fn a_hung_device_is_answered_503_reported_on_health_and_ends_the_process() {
    let host = Path::new(env!("CARGO_BIN_EXE_clef-tt")).with_file_name("libclef_tt_host.so");
    let log = std::env::temp_dir().join(format!("clef-tt-hang-host-{}.log", std::process::id()));
    common::hang::a_hung_device_is_refused_reported_and_exited(
        &["--device", "tt", "--tt-shim", host.to_str().unwrap()],
        &[],
        "linear:3",
        &golden_bodies()[0],
        &log,
    );
    let _ = std::fs::remove_file(&log);
}
