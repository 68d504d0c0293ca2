//! `clef-tt serve` as a supervisor (tt-model's container) sees it: the port is taken before
//! anything loads, the ready line (`CLEF_READY_MESSAGE`) comes once /health answers 200, the
//! tensor cache under `TT_CACHE_PATH` is converted on the first start and loaded afterwards
//! (and converted again when stale), and a binary outside a checkout has no built-in model and
//! says what to pass instead.

mod common;

use common::process::{clef_tt, free_port, Server};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clef-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn health(port: u16) -> Option<u16> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    agent
        .get(&format!("http://127.0.0.1:{port}/health"))
        .call()
        .ok()
        .map(|r| r.status().as_u16())
}

/// `serve` with `env`, its stderr read until `line` appears; the server and the time it took.
fn serve_until(env: &[(&str, &str)], line: &str) -> (Server, u16) {
    let port = free_port();
    let mut cmd = clef_tt();
    cmd.args(["serve", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no {line:?} in time");
        match lines.next() {
            Some(Ok(l)) if l.trim_end() == line => break,
            Some(Ok(_)) => {}
            _ => panic!("serve ended before {line:?}"),
        }
    }
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (server, port)
}

#[test]
fn a_taken_port_fails_the_start_before_the_model_is_opened() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    // A folder that is no checkpoint: opening it would fail too, but only after the bind.
    let not_a_model = scratch("not-a-model");
    let out = clef_tt()
        .args(["serve", "--host", "0.0.0.0", "--port", &port.to_string()])
        .arg("--model")
        .arg(&not_a_model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("binding"), "{err}");
    assert!(
        !err.contains("config.json"),
        "the model was opened first: {err}"
    );
    std::fs::remove_dir_all(&not_a_model).unwrap();
}

#[test]
fn the_ready_line_comes_when_health_answers_200() {
    let (server, port) = serve_until(
        &[("CLEF_READY_MESSAGE", "READY-FOR-TEST")],
        "READY-FOR-TEST",
    );
    assert_eq!(health(port), Some(200));
    drop(server);
}

fn cache_manifest(root: &Path) -> PathBuf {
    root.join("clef-tt/cpu-1x1-f32/manifest.json")
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn the_tensor_cache_under_tt_cache_path_is_written_once_and_then_loaded() {
    let root = scratch("tt-cache");
    let root_s = root.to_str().unwrap().to_string();
    let env = [
        ("TT_CACHE_PATH", root_s.as_str()),
        ("CLEF_READY_MESSAGE", "READY"),
    ];
    let answer = |port: u16| {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let body = r#"{"model":"clef","state":"Orders are blocked.","questions":{"outage":{"type":"noul","instructions":"Is a service down?"}}}"#;
        let mut r = agent
            .post(&format!("http://127.0.0.1:{port}/v1/systemone"))
            .header("content-type", "application/json")
            .send(body.as_bytes())
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        v["answers"].clone()
    };

    // First start: converted.
    let (first, port) = serve_until(&env, "READY");
    let manifest = cache_manifest(&root);
    assert!(manifest.is_file(), "no cache at {}", manifest.display());
    let written = modified(&manifest);
    let fresh = answer(port);
    drop(first);

    // Second start: loaded, not rewritten, same answers.
    let (second, port) = serve_until(&env, "READY");
    assert_eq!(
        modified(&manifest),
        written,
        "the second start rewrote the cache"
    );
    assert_eq!(answer(port), fresh);
    drop(second);

    // A cache that no longer matches is converted again.
    std::fs::write(&manifest, "{}").unwrap();
    let (third, port) = serve_until(&env, "READY");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"entries\""), "not rewritten: {text}");
    assert_eq!(answer(port), fresh);
    drop(third);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_binary_outside_a_checkout_has_no_built_in_model() {
    // As installed (a wheel puts it in a virtualenv's bin/): a copy outside target/.
    let dir = scratch("installed");
    let exe = dir.join("clef-tt");
    std::fs::copy(env!("CARGO_BIN_EXE_clef-tt"), &exe).unwrap();
    let out = std::process::Command::new(&exe)
        .arg("inspect")
        .env_remove("CLEF_DEFAULT_MODEL")
        .env_remove("CLEF_MODEL")
        .env_remove("HF_MODEL")
        .env_remove("CARGO_MANIFEST_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no built-in demo model"), "{err}");
    assert!(err.contains("HF_MODEL"), "{err}");
    // The model named as tt-model names it works.
    let out = std::process::Command::new(&exe)
        .arg("inspect")
        .env("HF_MODEL", common::fixtures().join("tiny-clef"))
        .output()
        .unwrap();
    common::process::assert_succeeded(&out);
    // The built-in serve profiles need no profiles/ folder.
    let out = std::process::Command::new(&exe)
        .args(["serve", "--settings", "p150x2", "--help"])
        .output()
        .unwrap();
    common::process::assert_succeeded(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}
