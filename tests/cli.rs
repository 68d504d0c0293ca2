//! The binary's commands: `inspect` on the built-in model, and a random checkpoint written by
//! `make-random` that opens, inspects clean and runs a finite prefill.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::backbone::Backbone;
use clef_tt::checkpoint::Checkpoint;
use std::path::Path;
use std::process::Command;

use common::process::{assert_succeeded, clef_tt, post_json, refused, spawn_server};

#[test]
fn inspect_reports_the_built_in_model_from_any_directory() {
    let out = clef_tt()
        .arg("inspect")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("hidden 64, 8 layers (6 Gated DeltaNet + 2 full attention)"),
        "{text}"
    );
    assert!(text.contains("122 tensors"), "{text}");
    assert!(text.contains("<|im_start|>=248045"), "{text}");
    assert!(text.trim_end().ends_with("ok"));
}

#[test]
fn hf_model_names_the_model_when_clef_model_is_unset() {
    let dir = common::fixtures().join("tiny-qwen35/checkpoint");
    let out = clef_tt()
        .arg("inspect")
        .env_remove("CLEF_MODEL")
        .env("HF_MODEL", &dir)
        .output()
        .unwrap();
    // A bare backbone has no joint head: the error names the directory HF_MODEL gave.
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tiny-qwen35/checkpoint"));
}

#[test]
fn inspect_fails_on_an_inconsistent_checkpoint() {
    let dir = std::env::temp_dir().join(format!("clef-tt-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = common::fixtures().join("tiny-clef");
    for f in std::fs::read_dir(&src).unwrap() {
        let p = f.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    // The config names another image token than the tokenizer's <|image_pad|>.
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"image_token_id\": 248056", "\"image_token_id\": 7"),
    )
    .unwrap();
    let out = clef_tt()
        .args(["inspect", "--model"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("image_token_id is 7"), "{err}");
    let out = clef_tt()
        .args(["inspect", "--model", "Nobody/nothing-here"])
        .env("HF_HOME", &dir)
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("never downloads"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn make_random_writes_a_checkpoint_that_loads_and_runs() {
    let dir = std::env::temp_dir().join(format!("clef-tt-random-{}", std::process::id()));
    let out = clef_tt()
        .args(["make-random", "--shape", "tiny", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_succeeded(&out);
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.head.as_ref().unwrap().tensors.iter().count(), 122);
    let bb = Backbone::load(&ckpt, CpuMesh::new(MeshShape::PAIR), WeightFormat::Bf16).unwrap();
    let ids: Vec<u32> = (0..300).map(|i| (i * 7919 % 200_000) as u32).collect();
    let (hidden, _) = bb.prefill(&ids, None).unwrap();
    assert!(hidden.data.iter().all(|v| v.is_finite()));
    let out = clef_tt()
        .args(["inspect", "--model"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_succeeded(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_and_exits_zero() {
    let (mut child, base, agent) = spawn_server(&["--warmup", "0"], &[]);
    // A request of about 6,000 tokens, so it is still running when the signal arrives.
    let body = format!(
        r#"{{"model":"m","state":"{}","questions":{{"q":{{"type":"noul"}}}}}}"#,
        "long text ".repeat(3000)
    );
    let in_flight = {
        let (agent, base) = (agent.clone(), base.clone());
        std::thread::spawn(move || post_json(&agent, &base, body.as_bytes()))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, text) = in_flight.join().unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"usage\""), "{text}");
    let exit = child.0.wait().unwrap();
    assert!(exit.success(), "serve exited with {exit:?}");
    // Nothing listens any more.
    assert!(agent.get(&format!("{base}/health")).call().is_err());
}

#[test]
fn sigterm_under_load_finishes_what_was_accepted_and_refuses_new_requests() {
    let (mut child, base, agent) = spawn_server(
        &["--warmup", "0", "--workers", "1", "--max-queue", "8"],
        &[],
    );
    // One request runs and three wait in the queue when the signal arrives.
    let body = format!(
        r#"{{"model":"m","state":"{}","questions":{{"q":{{"type":"noul"}}}}}}"#,
        "queued text ".repeat(1500)
    );
    let in_flight: Vec<_> = (0..4)
        .map(|_| {
            let (agent, base, body) = (agent.clone(), base.clone(), body.clone());
            std::thread::spawn(move || post_json(&agent, &base, body.as_bytes()))
        })
        .collect();
    // Until all four are accepted (one running, the rest queued).
    let mut accepted = false;
    for _ in 0..500 {
        let mut r = agent.get(&format!("{base}/metrics")).call().unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        if text.contains("clef_queue_depth 3") {
            accepted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        accepted,
        "the four requests were not in the server together"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(std::time::Duration::from_millis(200));
    // A new client (new connection) is refused while the accepted ones finish.
    let fresh: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into();
    let late = fresh
        .post(&format!("{base}/v1/systemone"))
        .header("content-type", "application/json")
        .send(body.as_bytes());
    assert!(late.is_err(), "a request after SIGTERM was accepted");
    for t in in_flight {
        let (status, text) = t.join().unwrap();
        assert_eq!(status, 200, "{text}");
    }
    let exit = child.0.wait().unwrap();
    assert!(exit.success(), "serve exited with {exit:?}");
}

#[test]
fn media_limits_are_configurable_and_shown_in_the_card() {
    let (_child, base, agent) = spawn_server(&["--warmup", "0"], &[("CLEF_MAX_IMAGES", "1")]);
    let mut r = agent.get(&format!("{base}/v1/models")).call().unwrap();
    let card: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let media = &card["models"][0]["limits"]["media"];
    assert_eq!(media["enabled"], true);
    assert_eq!(media["max_images"], 1);
    assert_eq!(media["max_video_frames"], 32);
    let requests =
        std::fs::read_to_string(common::fixtures().join("tiny-clef/goldens-media/requests.jsonl"))
            .unwrap();
    let two = requests
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["id"] == "img_two_same_size")
        .unwrap();
    let (status, text) = post_json(&agent, &base, two["body"].as_str().unwrap().as_bytes());
    assert_eq!(status, 422);
    assert!(text.contains("at most 1 are allowed"), "{text}");
}

#[test]
fn decide_url_prints_what_the_local_mode_prints() {
    let (server, base, _) = spawn_server(&[], &[("CLEF_API_KEY", "sesame")]);
    let dir = std::env::temp_dir().join(format!("clef-tt-decide-url-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("requests.jsonl");
    let requests =
        std::fs::read_to_string(common::fixtures().join("tiny-clef/goldens/requests.jsonl"))
            .unwrap();
    let mut lines: Vec<String> = requests
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["entry"] == "systemone")
        .filter_map(|v| v["body"].as_str().map(str::to_string))
        .take(6)
        .collect();
    lines.push("{not json".into());
    std::fs::write(&file, lines.join("\n")).unwrap();
    let remote = clef_tt()
        .args(["decide", "--url", &base, file.to_str().unwrap()])
        .env("CLEF_API_KEY", "sesame")
        .output()
        .unwrap();
    assert_succeeded(&remote);
    let local = clef_tt()
        .args(["decide", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_succeeded(&local);
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&local.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&remote.stdout).lines().count(), 7);
    // Without the key every line is the server's 401.
    let refused = clef_tt()
        .args(["decide", "--url", &base, file.to_str().unwrap()])
        .env_remove("CLEF_API_KEY")
        .output()
        .unwrap();
    assert_succeeded(&refused);
    assert!(String::from_utf8_lossy(&refused.stdout)
        .lines()
        .all(|l| l.starts_with("{\"status\":401")));
    // The HTTP bench runs its whole protocol at small counts against the same server.
    let json = dir.join("bench.json");
    let bench = clef_tt()
        .args([
            "bench",
            "http",
            "--url",
            &base,
            "--samples",
            "2",
            "--warmup",
            "1",
            "--long-tokens",
            "300",
            "--limit-samples",
            "1",
            "--limit-warmup",
            "0",
            "--clients",
            "1,3",
            "--requests",
            "6",
            "--states",
            "2",
            "--json",
            json.to_str().unwrap(),
        ])
        .env("CLEF_API_KEY", "sesame")
        .output()
        .unwrap();
    assert_succeeded(&bench);
    let table = String::from_utf8_lossy(&bench.stdout);
    assert!(table.contains("| 300-token state | 5 |"), "{table}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let latency = report["latency"].as_array().unwrap();
    assert_eq!(latency.len(), 3);
    // New states miss, repeated ones hit (the short one is under one cache block).
    assert_eq!(latency[1]["new_state"]["cache"]["miss"], 2);
    assert_eq!(latency[1]["repeated_state"]["cache"]["hit"], 2);
    assert_eq!(latency[2]["repeated_state"]["cache"]["hit"], 1);
    assert_eq!(latency[0]["new_state"]["cache"]["uncacheable"], 2);
    let throughput = report["throughput"].as_array().unwrap();
    assert_eq!(throughput.len(), 2);
    assert!(throughput.iter().all(|t| t["ok"] == 6));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eval_scores_profiles_against_the_f32_reference() {
    let goldens = common::fixtures().join("tiny-clef/goldens");
    let run = |profile: &str| {
        let out = clef_tt()
            .args([
                "eval",
                "--goldens",
                goldens.to_str().unwrap(),
                "--precision",
                profile,
            ])
            .output()
            .unwrap();
        assert_succeeded(&out);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .to_string()
    };
    let f32 = run("f32");
    let rest = f32
        .strip_prefix("profile f32: top-option agreement ")
        .unwrap();
    let (agree, rest) = rest.split_once(", max |dp| ").unwrap();
    let (a, n) = agree.split_once('/').unwrap();
    assert_eq!(a, n, "{f32}");
    assert!(n.parse::<usize>().unwrap() > 50);
    let max_dp: f64 = rest.split_once(',').unwrap().0.parse().unwrap();
    assert!(max_dp <= 1e-3, "{f32}");
    let selected = run("selected");
    assert!(
        selected.starts_with("profile selected: top-option agreement "),
        "{selected}"
    );
}

#[test]
fn serve_maps_a_converted_tensor_cache_and_refuses_a_mismatched_one() {
    let dir = std::env::temp_dir().join(format!("clef-tt-cli-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("cache");
    let out = clef_tt()
        .args([
            "convert",
            "--precision",
            "selected",
            "--mesh",
            "1x2",
            "--out",
            cache.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_succeeded(&out);
    assert!(cache.join("manifest.json").exists() && cache.join("weights.bin").exists());
    // Served from the cache, the answers equal a local run with the same profile and mesh.
    let file = dir.join("requests.jsonl");
    let requests =
        std::fs::read_to_string(common::fixtures().join("tiny-clef/goldens/requests.jsonl"))
            .unwrap();
    let lines: Vec<String> = requests
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["entry"] == "systemone")
        .filter_map(|v| v["body"].as_str().map(str::to_string))
        .take(4)
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let args = ["--precision", "selected", "--mesh", "1x2"];
    let (server, base, _) = spawn_server(
        &[&args[..], &["--tensor-cache", cache.to_str().unwrap()]].concat(),
        &[],
    );
    let remote = clef_tt()
        .args(["decide", "--url", &base, file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_succeeded(&remote);
    let local = clef_tt()
        .args(["decide"])
        .args(args)
        .arg(file.to_str().unwrap())
        .output()
        .unwrap();
    assert_succeeded(&local);
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&local.stdout)
    );
    drop(server);
    // Another profile: refused at start, saying how to rebuild.
    let serve = [
        "serve",
        "--port",
        "0",
        "--precision",
        "f32",
        "--mesh",
        "1x2",
    ];
    let err = refused(
        &[&serve[..], &["--tensor-cache", cache.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(
        err.contains("clef-tt convert") && err.contains("profile selected"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_settings_file_fills_what_flags_and_environment_leave_unset() {
    let settings = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/p150x4.toml");
    // The profile says 2 workers of a 1x2 mesh with `selected`; the environment overrides the
    // precision and the flag the port (spawn_server passes --port).
    let (server, base, agent) = spawn_server(
        &["--settings", settings.to_str().unwrap(), "--warmup", "0"],
        &[("CLEF_PRECISION", "bf16")],
    );
    let mut r = agent.get(&format!("{base}/v1/models")).call().unwrap();
    let card: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let m = &card["models"][0];
    assert_eq!(m["mesh"], "1x2");
    assert_eq!(m["workers"], 2);
    assert_eq!(m["precision"]["profile"], "bf16");
    drop(server);
    // A variable serve does not read is refused.
    let dir = std::env::temp_dir().join(format!("clef-tt-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[env]\nCLEF_TURBO = \"1\"\n").unwrap();
    let out = clef_tt()
        .args(["serve", "--port", "0", "--settings", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CLEF_TURBO is not a setting"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The package pins the weights it was published with: tt-model leaves an existing `refs/main`
/// alone, so the serve environment names the revision (`CLEF_REVISION`, the manifest's
/// `weights.revision`), and `/v1/models` reports the commit actually opened. Served from a
/// Hugging Face cache whose `refs/main` points at another snapshot.
#[test]
fn the_package_serves_its_pinned_weights_whatever_refs_main_names() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tt_kernel_manifest.json"),
    )
    .unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let published = manifest["weights"]["revision"].as_str().unwrap();
    let pinned = manifest["container"]["serve"]["env"]["CLEF_REVISION"]
        .as_str()
        .unwrap();
    assert_eq!(
        pinned, published,
        "the serve env pins the published weights"
    );
    let repo_id = manifest["weights"]["repo"].as_str().unwrap();
    let (org, name) = repo_id.split_once('/').unwrap();

    let home = std::env::temp_dir().join(format!("clef-tt-pin-{}", std::process::id()));
    let repo = home.join(format!("hub/models--{org}--{name}"));
    let other = "1111111111111111111111111111111111111111";
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots")).unwrap();
    let fixture = common::fixtures().join("tiny-clef");
    for commit in [published, other] {
        std::os::unix::fs::symlink(&fixture, repo.join("snapshots").join(commit)).unwrap();
    }
    std::fs::write(repo.join("refs/main"), other).unwrap();
    let home_str = home.to_str().unwrap();
    let weights = |env: &[(&str, &str)]| {
        let mut all = vec![("HF_HOME", home_str), ("HF_MODEL", repo_id)];
        all.extend_from_slice(env);
        let (server, base, agent) = spawn_server(&["--warmup", "0"], &all);
        let mut r = agent.get(&format!("{base}/v1/models")).call().unwrap();
        let card: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        drop(server);
        card["models"][0]["weights"].clone()
    };
    let served = weights(&[("CLEF_REVISION", pinned)]);
    assert_eq!(served["revision"], published, "{served}");
    assert_eq!(served["requested_revision"], published);
    assert!(served["path"].as_str().unwrap().ends_with(published));
    // Without the pin, refs/main's snapshot is what opens.
    let unpinned = weights(&[]);
    assert_eq!(unpinned["revision"], other, "{unpinned}");
    assert!(unpinned["requested_revision"].is_null());
    let _ = std::fs::remove_dir_all(&home);
}
