//! Reliability: arbitrary valid requests always get probabilities that sum to 1 and arbitrary
//! invalid ones a 4xx naming the field (proptest); a worker that panics fails that request
//! alone and is replaced; a burst of clients that hang up leaves the queue and the prefix cache
//! consistent; a model directory changed under a running server does not crash it; and a
//! bounded load test at four times the capacity answers every request with 200 or 429, equal to
//! the solo answers, without growing the resident memory; a burst of 128 with packing on
//! likewise loses nothing.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::checkpoint::Checkpoint;
use clef_tt::engine::prefix_cache::{PrefixCacheConfig, PrefixCacheStats};
use clef_tt::engine::worker::Packing;
use clef_tt::engine::{Pipeline, INJECTED_FAULT};
use clef_tt::request::{parse_body, validate, HostLimits};
use common::server::*;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- Property tests -------------------------------------------------------------------------

fn words() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9 ,.?!'éßü日本-]{0,30}"
}

fn option_id() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,10}"
}

fn json_state() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn question() -> impl Strategy<Value = Value> {
    prop_oneof![
        (words(), prop::collection::vec((option_id(), words()), 1..6)).prop_map(
            |(instructions, options)| {
                let criteria: Map<String, Value> = options
                    .into_iter()
                    .map(|(k, v)| (k, Value::from(v)))
                    .collect();
                json!({"type": "choice", "instructions": instructions, "criteria": criteria})
            }
        ),
        (words(), prop::collection::vec(words(), 1..6)).prop_map(|(instructions, levels)| {
            json!({"type": "score", "instructions": instructions, "criteria": levels})
        }),
        words().prop_map(|instructions| json!({"type": "noul", "instructions": instructions})),
    ]
}

fn valid_request() -> impl Strategy<Value = Value> {
    (
        prop_oneof!["\\PC{0,300}".prop_map(Value::from), json_state()],
        prop::collection::vec(question(), 1..7),
    )
        .prop_map(|(state, questions)| {
            let questions: Map<String, Value> = questions
                .into_iter()
                .enumerate()
                .map(|(i, q)| (format!("q{i}"), q))
                .collect();
            json!({"model": "clef", "state": state, "questions": questions})
        })
}

/// A valid request broken in one way, and the field its error must name.
fn invalid_request() -> impl Strategy<Value = (Value, &'static str)> {
    (valid_request(), 0usize..11, any::<u8>()).prop_map(|(mut body, how, n)| {
        let q0 = &mut body["questions"]["q0"];
        let named = match how {
            0 => {
                body.as_object_mut().map(|o| o.remove("questions"));
                "questions"
            }
            1 => {
                body["questions"] = json!(n);
                "questions"
            }
            2 => {
                body["questions"] = json!({});
                "questions"
            }
            3 => {
                q0["type"] = json!(format!("kind{n}"));
                "q0"
            }
            4 => {
                *q0 = json!({"type": "choice", "instructions": "Pick", "criteria": {}});
                "q0"
            }
            5 => {
                *q0 = json!({"type": "score", "instructions": "Rate", "criteria": []});
                "q0"
            }
            6 => {
                body.as_object_mut().map(|o| o.remove("state"));
                "state"
            }
            7 => {
                body["model"] = json!(n);
                "model"
            }
            8 => {
                *q0 = json!(n);
                "q0"
            }
            9 => {
                let many: Map<String, Value> = (0..65)
                    .map(|i| {
                        (
                            format!("x{i}"),
                            json!({"type": "noul", "instructions": "Yes?"}),
                        )
                    })
                    .collect();
                body["questions"] = Value::Object(many);
                "questions"
            }
            _ => {
                let long = "k".repeat(1025);
                body["questions"] = json!({ long: {"type": "noul", "instructions": "Yes?"} });
                "questions"
            }
        };
        (body, named)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn valid_requests_get_probabilities_that_sum_to_one(body in valid_request()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let decision = shared_pipeline()
            .decide_body(&bytes, RULE, Some(&HostLimits::default()))
            .map_err(|e| TestCaseError::fail(format!("{} {}: {body}", e.status, e.msg)))?;
        prop_assert_eq!(decision.probabilities.len(), body["questions"].as_object().unwrap().len());
        for p in &decision.probabilities {
            let sum: f32 = p.iter().sum();
            prop_assert!((sum - 1.0).abs() <= 1e-3, "sum {} of {:?}", sum, p);
            prop_assert!(p.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn invalid_requests_get_a_4xx_naming_the_field((body, named) in invalid_request()) {
        let value = parse_body(&serde_json::to_vec(&body).unwrap()).unwrap();
        let err = match validate(&value, Some(&HostLimits::default())) {
            Ok(_) => return Err(TestCaseError::fail(format!("accepted: {body}"))),
            Err(e) => e,
        };
        prop_assert!((400..500).contains(&err.status), "{}", err.status);
        let detail = clef_tt::api::error_body(&err)["detail"][0].clone();
        let loc: Vec<String> = detail["loc"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()))
            .collect();
        prop_assert!(
            loc.iter().any(|l| l == named),
            "loc {:?} does not name {} ({})",
            loc,
            named,
            detail["msg"]
        );
    }
}

// ---- Faults --------------------------------------------------------------------------------

/// A state of about 400 tokens (cacheable), optionally marked to trip the fault switch.
fn long_state_body(marker: &str) -> String {
    json!({
        "model": "clef",
        "state": format!("{marker}{}", "The payment service returned errors for several minutes. ".repeat(40)),
        "questions": {"outage": {"type": "noul", "instructions": "Is a service down?"},
                      "team": {"type": "choice", "instructions": "Which team?",
                               "criteria": {"billing": "Payments", "technical": "Outages"}}}
    })
    .to_string()
}

fn cached_pipeline(stats: &Arc<PrefixCacheStats>) -> Pipeline<CpuMesh> {
    pipeline().with_prefix_cache(
        PrefixCacheConfig {
            slots: 4,
            ..Default::default()
        },
        stats.clone(),
    )
}

fn metric(base: &str, name: &str) -> f64 {
    let (_, text) = get(base, "/metrics");
    metric_value(&text, name).unwrap_or(f64::NAN)
}

fn wait_idle(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let (status, text) = get(base, "/health");
        let health: Value = serde_json::from_str(&text).unwrap();
        if status == 200 && health["queued"] == 0 && metric(base, "clef_requests_running") == 0.0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not become idle");
}

#[test]
fn a_panicking_request_fails_alone_and_its_worker_is_replaced() {
    let stats = Arc::new(PrefixCacheStats::default());
    let faulty = cached_pipeline(&stats).with_fault_switch(Arc::new(|req| {
        req.state.as_str().is_some_and(|s| s.starts_with("PANIC"))
    }));
    let base = start_with(settings(), vec![faulty], 8);
    let good = long_state_body("");
    let solo = shared_pipeline()
        .decide_body(good.as_bytes(), RULE, None)
        .unwrap()
        .response;
    for round in 1..=2 {
        // The failing request runs the model (its prefix lands in the cache) and then panics.
        let (status, _, text) = post(&base, long_state_body("PANIC ").as_bytes(), &[]);
        assert_eq!(status, 500, "{text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(INJECTED_FAULT),
            "{text}"
        );
        assert_eq!(metric(&base, "clef_worker_panics_total"), round as f64);
        // The replaced worker starts with an empty cache and answers the next request.
        wait_idle(&base);
        let (status, headers, text) = post(&base, good.as_bytes(), &[]);
        assert_eq!(status, 200, "{text}");
        assert_eq!(strip_latency(&text), strip_latency(&solo.to_string()));
        let cache = headers.iter().find(|(k, _)| k == "x-clef-prefix-cache");
        assert_eq!(cache.map(|(_, v)| v.as_str()), Some("miss"));
        let (_, _, again) = post(&base, good.as_bytes(), &[]);
        assert_eq!(strip_latency(&again), strip_latency(&solo.to_string()));
    }
}

#[test]
fn a_burst_of_disconnecting_clients_leaves_queue_and_cache_consistent() {
    let stats = Arc::new(PrefixCacheStats::default());
    let base = start_with(settings(), vec![cached_pipeline(&stats)], 32);
    let impatient: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(40)))
        .build()
        .into();
    let clients: Vec<_> = (0..24)
        .map(|i| {
            let (agent, base) = (impatient.clone(), base.clone());
            let body = long_state_body(&format!("client {} ", i % 3));
            std::thread::spawn(move || {
                let _ = agent
                    .post(&format!("{base}/v1/systemone"))
                    .header("content-type", "application/json")
                    .send(body.as_bytes());
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    wait_idle(&base);
    let models: Value = serde_json::from_str(&get(&base, "/v1/models").1).unwrap();
    let counters = &models["models"][0]["counters"];
    assert_eq!(counters["queued"], 0);
    // Whatever stayed in the cache is whole: a repeated state hits and answers as a fresh model.
    let body = long_state_body("client 1 ");
    let solo = shared_pipeline()
        .decide_body(body.as_bytes(), RULE, None)
        .unwrap()
        .response;
    for _ in 0..2 {
        let (status, _, text) = post(&base, body.as_bytes(), &[]);
        assert_eq!(status, 200, "{text}");
        assert_eq!(strip_latency(&text), strip_latency(&solo.to_string()));
    }
    let (_, headers, _) = post(&base, body.as_bytes(), &[]);
    assert!(headers.contains(&("x-clef-prefix-cache".into(), "hit".into())));
    let gone = metric(&base, "clef_abandoned_total") + metric(&base, "clef_cancelled_total");
    assert!(gone >= 1.0, "no request was dropped or cancelled");
}

/// A copy of the tiny checkpoint to change under a running server.
fn scratch_model(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clef-tt-moving-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(common::fixtures().join("tiny-clef")).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    dir
}

/// The shard holding `tensor`, from the index.
fn shard_of(dir: &Path, tensor: &str) -> PathBuf {
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    dir.join(index["weight_map"][tensor].as_str().unwrap())
}

#[test]
fn a_model_directory_changed_under_the_server_does_not_crash_it() {
    let dir = scratch_model("dir");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let served = Pipeline::new(&ckpt, CpuMesh::new(MeshShape::ONE), WeightFormat::F32).unwrap();
    drop(ckpt);
    let base = start_with(settings(), vec![served], 8);
    let body = triage();
    let solo = shared_pipeline()
        .decide_body(body.as_bytes(), RULE, None)
        .unwrap()
        .response;
    let same = |what: &str| {
        let (status, _, text) = post(&base, body.as_bytes(), &[]);
        assert_eq!(status, 200, "after {what}: {text}");
        assert_eq!(
            strip_latency(&text),
            strip_latency(&solo.to_string()),
            "after {what}"
        );
    };
    same("start");
    // Replaced the way the Hugging Face cache and `clef-tt convert` do: new files renamed over
    // the old ones. The server keeps the files it opened.
    let lm_shard = shard_of(&dir, "lm_head.weight");
    let embed_shard = shard_of(&dir, "model.language_model.embed_tokens.weight");
    for shard in [&lm_shard, &embed_shard] {
        let fresh = shard.with_extension("new");
        std::fs::write(&fresh, b"not a safetensors file").unwrap();
        std::fs::rename(&fresh, shard).unwrap();
    }
    same("renaming new shards into place");
    // Small files rewritten in place or deleted are never read after loading.
    std::fs::write(dir.join("config.json"), b"{broken").unwrap();
    std::fs::write(dir.join("tokenizer.json"), b"").unwrap();
    std::fs::remove_file(dir.join("joint_head.safetensors")).unwrap();
    same("rewriting config and tokenizer and deleting the head");

    // In place: a second server whose weights file is truncated under it. Reading through a
    // memory map would kill the process; the row tables notice and answer 500 instead.
    let dir2 = scratch_model("inplace");
    let ckpt = Checkpoint::open(&dir2).unwrap();
    let served = Pipeline::new(&ckpt, CpuMesh::new(MeshShape::ONE), WeightFormat::F32).unwrap();
    drop(ckpt);
    let base2 = start_with(settings(), vec![served], 8);
    assert_eq!(post(&base2, body.as_bytes(), &[]).0, 200);
    let shard = shard_of(&dir2, "lm_head.weight");
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&shard)
        .unwrap();
    for _ in 0..2 {
        let (status, _, text) = post(&base2, body.as_bytes(), &[]);
        assert_eq!(status, 500, "{text}");
        assert!(text.contains("changed on disk"), "{text}");
    }
    assert_eq!(get(&base2, "/health").0, 200);
    // The first server is unaffected by all of it.
    same("the other server's truncation");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

// ---- Bounded load --------------------------------------------------------------------------

/// Every client sends `per_client` requests (cycling through `bodies`); returns
/// (status, body index, response text, seconds) per request.
fn load(
    base: &str,
    bodies: &[String],
    clients: usize,
    per_client: usize,
) -> Vec<(u16, usize, String, f64)> {
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let base = base.to_string();
            let bodies = bodies.to_vec();
            std::thread::spawn(move || {
                (0..per_client)
                    .map(|i| {
                        let which = (c + i) % bodies.len();
                        let t0 = Instant::now();
                        let (status, _, text) = post(&base, bodies[which].as_bytes(), &[]);
                        (status, which, text, t0.elapsed().as_secs_f64())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

#[test]
fn load_at_four_times_capacity_answers_200_or_429_equal_to_solo_answers() {
    let _alone = one_load_at_a_time();
    let (workers, queue) = (2, 4);
    let clients = 4 * (workers + queue);
    let base = start(settings(), workers, queue);
    bounded_load(&base, clients, 10, workers, queue, true);
}

/// A burst of 128 requests (16 clients x 8) with packing on: every one answered, 200 or 429,
/// each 200 equal to its solo answer, and some of them from packed passes.
#[test]
fn a_burst_of_128_with_packing_on_loses_nothing() {
    let _alone = one_load_at_a_time();
    let (workers, queue) = (1, 16);
    let packing = Packing {
        tokens: 4096,
        max_jobs: 16,
        wait: Duration::from_millis(2),
    };
    let base = common::server::start_packing(settings(), vec![pipeline()], queue, packing);
    // Resident memory is the first load's check: a pass of 16 packed requests raises the
    // allocator's high-water mark once, and the other tests of this binary run beside it.
    bounded_load(&base, 16, 8, workers, queue, false);
    assert!(
        metric(&base, "clef_packed_requests_total") > 0.0,
        "nothing was packed"
    );
}

/// The resident-memory check of [`bounded_load`] reads the whole process: a load test holds
/// this from before its server starts until it is done.
fn one_load_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE_LOAD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_LOAD.lock().unwrap_or_else(|e| e.into_inner())
}

/// `clients` x `per_client` requests over three golden bodies against a server of `workers`
/// and `queue`: every request answered, 200 (equal to the solo answer) or 429, and with
/// `check_memory` resident memory flat.
fn bounded_load(
    base: &str,
    clients: usize,
    per_client: usize,
    workers: usize,
    queue: usize,
    check_memory: bool,
) {
    let bodies: Vec<String> = golden_bodies()
        .into_iter()
        .filter(|(id, _)| {
            [
                "triage_readme",
                "string_state_one_noul",
                "string_state_whitespace",
            ]
            .contains(&id.as_str())
        })
        .map(|(_, b)| b)
        .collect();
    let solo: Vec<String> = bodies
        .iter()
        .map(|b| {
            strip_latency(
                &shared_pipeline()
                    .decide_body(b.as_bytes(), RULE, None)
                    .unwrap()
                    .response
                    .to_string(),
            )
        })
        .collect();
    // One round first, so thread stacks and allocator pools exist before the baseline.
    load(base, &bodies, clients, 1);
    wait_idle(base);
    let before = common::process::resident_kib("self");
    let t0 = Instant::now();
    let results = load(base, &bodies, clients, per_client);
    let seconds = t0.elapsed().as_secs_f64();
    wait_idle(base);
    let after = common::process::resident_kib("self");

    assert_eq!(results.len(), clients * per_client, "a request was lost");
    let mut ok_ms: Vec<f64> = Vec::new();
    let mut refused = 0;
    for (status, which, text, secs) in &results {
        match status {
            200 => {
                assert_eq!(&strip_latency(text), &solo[*which]);
                ok_ms.push(secs * 1e3);
            }
            429 => refused += 1,
            other => panic!("status {other}: {text}"),
        }
    }
    assert!(!ok_ms.is_empty());
    ok_ms.sort_by(f64::total_cmp);
    let pct = |q: f64| ok_ms[((ok_ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "load: {clients} clients x {per_client} requests, {workers} workers + queue {queue}: {} ok, {refused} 429 in {seconds:.2} s ({:.1} requests/s answered, {:.1} of them 200/s), 200s p50 {:.0} ms, p99 {:.0} ms, RSS {} -> {} MiB",
        ok_ms.len(),
        results.len() as f64 / seconds,
        ok_ms.len() as f64 / seconds,
        pct(0.5),
        pct(0.99),
        before / 1024,
        after / 1024
    );
    assert!(
        !check_memory || (after as f64) <= before as f64 * 1.10,
        "resident memory grew from {before} KiB to {after} KiB"
    );
}
