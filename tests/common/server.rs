//! A clef-tt server on a loopback port for the HTTP tests, and a small blocking client.

use super::fixtures;
use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::api::server::{router, AppState, ServerSettings};
use clef_tt::checkpoint::Checkpoint;
use clef_tt::encode::json::dumps;
use clef_tt::encode::LengthRule;
use clef_tt::engine::worker::{Engine, Packing};
use clef_tt::engine::Pipeline;
use clef_tt::media::MediaLimits;
use clef_tt::request::HostLimits;
use serde_json::{json, Value};
use std::time::Duration;

pub const RULE: LengthRule = LengthRule::Server {
    max_state: 16384,
    max_tail: 4096,
    truncate: false,
};

pub fn pipeline() -> Pipeline<CpuMesh> {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-clef")).unwrap();
    Pipeline::new(&ckpt, CpuMesh::new(MeshShape::ONE), WeightFormat::F32).unwrap()
}

/// One fixture pipeline per test binary, for tests that answer many bodies in-process.
pub fn shared_pipeline() -> &'static Pipeline<CpuMesh> {
    static PIPELINE: std::sync::OnceLock<Pipeline<CpuMesh>> = std::sync::OnceLock::new();
    PIPELINE.get_or_init(pipeline)
}

pub fn settings() -> ServerSettings {
    ServerSettings {
        api_key: None,
        model_names: vec![],
        max_body_bytes: 13 << 20,
        refused_body_drain: clef_tt::api::DrainBounds::for_limit(13 << 20),
        demo: true,
        rule: RULE,
        limits: HostLimits::default(),
        card: json!({"name": "clef-test", "description": "test", "release_date": "2026-11-29"}),
        media: Some(MediaLimits::default()),
        account_id: None,
    }
}

/// Start a server on an ephemeral loopback port; returns its base URL.
pub fn start(settings: ServerSettings, workers: usize, queue: usize) -> String {
    start_with(settings, (0..workers).map(|_| pipeline()).collect(), queue)
}

pub fn start_with<B: clef_device::MeshOps + Send + 'static>(
    settings: ServerSettings,
    pipelines: Vec<Pipeline<B>>,
    queue: usize,
) -> String
where
    B::Tensor: Send,
{
    start_packing(settings, pipelines, queue, Packing::OFF)
}

/// [`start_with`] whose workers pack queued requests as `packing` says.
pub fn start_packing<B: clef_device::MeshOps + Send + 'static>(
    settings: ServerSettings,
    pipelines: Vec<Pipeline<B>>,
    queue: usize,
    packing: Packing,
) -> String
where
    B::Tensor: Send,
{
    let engine = Engine::start(pipelines, queue, None, None, packing);
    let state = AppState::new(engine, settings);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, router(state)).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    let base = format!("http://{addr}");
    // Wait until the workers are ready.
    for _ in 0..200 {
        if get(&base, "/health").0 == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    base
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// The value of one `/metrics` sample (`name` with its trailing space or labels), if present.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

pub fn get(base: &str, path: &str) -> (u16, String) {
    let mut r = agent().get(&format!("{base}{path}")).call().unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// POST a body; returns status, headers of interest and the body text.
pub fn post(
    base: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    let mut req = agent().post(&format!("{base}/v1/systemone"));
    let mut has_type = false;
    for (k, v) in headers {
        has_type |= k.eq_ignore_ascii_case("content-type");
        req = req.header(*k, *v);
    }
    if !has_type {
        req = req.header("content-type", "application/json");
    }
    let mut r = req.send(body).unwrap();
    let hs = [
        "x-request-id",
        "x-typesafe-request-id",
        "retry-after",
        "x-clef-prefix-cache",
        "x-clef-state-key",
    ]
    .iter()
    .filter_map(|h| {
        r.headers()
            .get(*h)
            .map(|v| (h.to_string(), v.to_str().unwrap_or("").to_string()))
    })
    .collect();
    (
        r.status().as_u16(),
        hs,
        r.body_mut().read_to_string().unwrap(),
    )
}

pub fn golden_bodies() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(fixtures().join("tiny-clef/goldens/requests.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                v["body"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub fn triage() -> String {
    golden_bodies()
        .into_iter()
        .find(|(id, _)| id == "triage_readme")
        .unwrap()
        .1
}

pub fn strip_latency(text: &str) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    if let Some(o) = v.as_object_mut() {
        o.remove("latency_ms");
    }
    dumps(&v, false)
}
