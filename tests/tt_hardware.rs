//! The goldens, the media goldens and the prefix cache on Tenstorrent hardware through the ttnn
//! shim, with the device bands of the Tenstorrent port against the reference's bf16 run: the
//! same top option everywhere, max |dp| ≤ 0.1, and no flip where the reference's top option
//! leads by 0.05 or more; plus the meshes a P150x2 / P150x4 box opens.
//!
//! They run only with `CLEF_TT_HARDWARE_TESTS=1` (and the ttnn shim: `cargo build` with
//! `CLEF_TT_PYTHON` naming a Python with ttnn and pybind11, or `CLEF_TT_SHIM`); otherwise each
//! test prints why it was skipped and passes.
//! `CLEF_TT_HARDWARE_TESTS=host` runs the suite itself on the host shim (a check of the suite,
//! not of a device). None of them has run on a device yet.

mod common;

use clef_device::tt::{MeshPlacement, Shim, TtMesh};
use clef_device::{MeshShape, Numerics};
use clef_tt::encode::LengthRule;
use clef_tt::engine::prefix_cache::{CacheUse, PrefixCacheConfig, PrefixCacheStats};
use clef_tt::engine::Pipeline;
use serde_json::Value;
use std::sync::Arc;

/// The band of the port's device tests.
const MAX_DP: f64 = 0.1;
const FLIP_MARGIN: f64 = 0.05;

fn hardware() -> Option<Arc<Shim>> {
    let mode = std::env::var("CLEF_TT_HARDWARE_TESTS").unwrap_or_default();
    if mode != "1" && mode != "host" {
        eprintln!(
            "skipped: set CLEF_TT_HARDWARE_TESTS=1 on a Tenstorrent host with the ttnn shim built (CLEF_TT_PYTHON at build time; see ffi/BRINGUP.md)"
        );
        return None;
    }
    let path = std::env::var_os("CLEF_TT_SHIM").map(std::path::PathBuf::from);
    let path = match (mode.as_str(), path) {
        (_, Some(p)) => Some(p),
        ("host", None) => Some(std::path::PathBuf::from(clef_tt_abi::HOST_SHIM)),
        _ => None,
    };
    let shim = Shim::load(path.as_deref()).expect("the ttnn shim");
    let want = if mode == "host" { "host" } else { "ttnn" };
    assert_eq!(
        shim.backend(),
        want,
        "{} is not the {want} shim",
        shim.path().display()
    );
    Some(shim)
}

fn pipeline(shim: &Arc<Shim>, profile: &str, shape: MeshShape) -> Pipeline<TtMesh> {
    common::profile_pipeline_on(profile, |n| {
        TtMesh::open(shim, MeshPlacement::direct(shape), n).unwrap()
    })
}

fn jsonl(path: &str) -> Vec<Value> {
    std::fs::read_to_string(common::fixtures().join(path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn top(p: &[f64]) -> usize {
    p.iter()
        .enumerate()
        .fold(0, |best, (i, v)| if *v > p[best] { i } else { best })
}

/// What the band saw over a set of questions.
#[derive(Default, Debug)]
struct Band {
    questions: usize,
    agreeing: usize,
    max_dp: f64,
    flips_at_margin: usize,
}

impl Band {
    fn add(&mut self, ours: &[f32], want: &[f64]) {
        let ours: Vec<f64> = ours.iter().map(|&p| f64::from(p)).collect();
        self.questions += 1;
        let (t, w) = (top(&ours), top(want));
        if t == w {
            self.agreeing += 1;
        } else {
            let mut sorted = want.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted.len() < 2 || sorted[0] - sorted[1] >= FLIP_MARGIN {
                self.flips_at_margin += 1;
            }
        }
        for (a, b) in ours.iter().zip(want) {
            self.max_dp = self.max_dp.max((a - b).abs());
        }
    }

    fn check(&self, what: &str) {
        eprintln!("{what}: {self:?}");
        assert!(self.questions > 0, "{what}: nothing was compared");
        assert!(self.max_dp <= MAX_DP, "{what}: max |dp| {}", self.max_dp);
        assert_eq!(
            self.flips_at_margin, 0,
            "{what}: top options flipped at a margin ≥ {FLIP_MARGIN}"
        );
    }
}

/// Every answered record of `requests` against `expected` (the reference's bf16 run).
fn band_of(p: &Pipeline<TtMesh>, requests: &str, expected: &str) -> Band {
    let requests = jsonl(requests);
    let mut band = Band::default();
    for exp in jsonl(expected) {
        let Some(req) = requests.iter().find(|r| r["id"] == exp["id"]) else {
            continue;
        };
        if req["entry"] == "encode_record" || exp["status"] == "error" || exp["error"].is_object() {
            continue;
        }
        let rule = LengthRule::Reference {
            max_length: exp["max_length"].as_u64().unwrap() as usize,
        };
        let d = p
            .decide_body(req["body"].as_str().unwrap().as_bytes(), rule, None)
            .unwrap_or_else(|e| panic!("{}: {e}", exp["id"]));
        for (k, q) in exp["questions"].as_array().unwrap().iter().enumerate() {
            let want = common::expected_probabilities(q);
            band.add(&d.probabilities[k], &want);
        }
    }
    band
}

#[test]
fn the_meshes_of_a_p150_box_open() {
    let Some(shim) = hardware() else { return };
    let visible = shim.visible_devices().unwrap() as usize;
    eprintln!("{visible} devices visible");
    for shape in [MeshShape::ONE, MeshShape::PAIR] {
        let m = TtMesh::open(
            &shim,
            MeshPlacement::direct(shape),
            Numerics::default().with_bf16_kv(),
        )
        .unwrap();
        let s = m.status().unwrap();
        eprintln!(
            "{shape}: devices {:?}, {:?} bytes in use",
            s.device_ids, s.bytes_per_device
        );
    }
    if visible >= 4 {
        let sub = |offset| MeshPlacement {
            shape: MeshShape::PAIR,
            parent_cols: Some(4),
            submesh_offset: offset,
        };
        let a = TtMesh::open(&shim, sub(0), Numerics::default().with_bf16_kv()).unwrap();
        let b = TtMesh::open(&shim, sub(2), Numerics::default().with_bf16_kv()).unwrap();
        assert_ne!(
            a.status().unwrap().device_ids,
            b.status().unwrap().device_ids
        );
    }
}

#[test]
fn the_goldens_on_the_device_are_within_the_port_band() {
    let Some(shim) = hardware() else { return };
    for profile in ["selected", "bf16"] {
        let p = pipeline(&shim, profile, MeshShape::PAIR);
        band_of(
            &p,
            "tiny-clef/goldens/requests.jsonl",
            "tiny-clef/goldens/expected_bf16.jsonl",
        )
        .check(&format!("goldens, {profile}, 1x2"));
    }
    let p = pipeline(&shim, "selected", MeshShape::ONE);
    band_of(
        &p,
        "tiny-clef/goldens/requests.jsonl",
        "tiny-clef/goldens/expected_bf16.jsonl",
    )
    .check("goldens, selected, 1x1");
}

#[test]
fn the_media_goldens_on_the_device_are_within_the_port_band() {
    let Some(shim) = hardware() else { return };
    let p = pipeline(&shim, "selected", MeshShape::PAIR);
    band_of(
        &p,
        "tiny-clef/goldens-media/requests.jsonl",
        "tiny-clef/goldens-media/expected_bf16.jsonl",
    )
    .check("media goldens, selected, 1x2");
}

#[test]
fn a_prefix_cache_hit_on_the_device_answers_as_its_miss() {
    let Some(shim) = hardware() else { return };
    let stats = Arc::new(PrefixCacheStats::default());
    let p = pipeline(&shim, "selected", MeshShape::PAIR).with_prefix_cache(
        PrefixCacheConfig {
            slots: 2,
            ..Default::default()
        },
        stats,
    );
    let state = "The checkout service returns errors for every order since the deploy. ".repeat(60);
    let body = serde_json::json!({"model": "clef", "state": state, "questions": {
        "outage": {"type": "noul", "instructions": "Is a service down?"},
        "team": {"type": "choice", "instructions": "Who owns it?", "criteria": {"payments": "Payments", "web": "Web"}}}});
    let rule = LengthRule::Server {
        max_state: 16384,
        max_tail: 4096,
        truncate: false,
    };
    let req = clef_tt::request::validate(&body, None).unwrap();
    let miss = p.decide(&req, rule).unwrap();
    let hit = p.decide(&req, rule).unwrap();
    assert_eq!((miss.cache, hit.cache), (CacheUse::Miss, CacheUse::Hit));
    let mut band = Band::default();
    for (h, m) in hit.probabilities.iter().zip(&miss.probabilities) {
        band.add(h, &m.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
    }
    band.check("prefix cache hit vs miss, selected, 1x2");
}
