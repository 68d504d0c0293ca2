//! Helpers shared by the integration tests: fixture paths, f32 tensors from safetensors, the
//! fixture's pipeline under a precision profile.
#![allow(dead_code)]

pub mod golden_kit;
pub mod hang;
pub mod process;
pub mod server;

use std::path::PathBuf;

/// A golden question's expected probabilities (`"probabilities"` of an expected record's
/// question, as the reference wrote them).
pub fn expected_probabilities(question: &serde_json::Value) -> Vec<f64> {
    question["probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("no probabilities in {question}"))
        .iter()
        .map(|v| v.as_f64().unwrap_or_else(|| panic!("{v} is not a number")))
        .collect()
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn tiny_clef() -> clef_tt::checkpoint::Checkpoint {
    clef_tt::checkpoint::Checkpoint::open(&fixtures().join("tiny-clef")).unwrap()
}

/// A Tenstorrent mesh of `shape` through the host shim this build made (simulated devices).
pub fn tt_mesh(
    shape: clef_device::MeshShape,
    numerics: clef_device::Numerics,
) -> clef_device::tt::TtMesh {
    let host = std::path::Path::new(clef_tt_abi::HOST_SHIM);
    let shim =
        clef_device::tt::Shim::load(Some(host)).expect("the host shim (built by cargo build)");
    clef_device::tt::TtMesh::open(
        &shim,
        clef_device::tt::MeshPlacement::direct(shape),
        numerics,
    )
    .unwrap()
}

/// The tiny fixture's pipeline under precision profile `profile` (weight formats and the
/// matrix engine's numerics) on the mesh `mesh(numerics)` makes.
pub fn profile_pipeline_on<B: clef_device::MeshOps>(
    profile: &str,
    mesh: impl FnOnce(clef_device::Numerics) -> B,
) -> clef_tt::engine::Pipeline<B> {
    fixture_pipeline_on("tiny-clef", profile, mesh)
}

/// [`profile_pipeline_on`] for the checkpoint in `tests/fixtures/{fixture}` (`tiny-clef-g27`).
pub fn fixture_pipeline_on<B: clef_device::MeshOps>(
    fixture: &str,
    profile: &str,
    mesh: impl FnOnce(clef_device::Numerics) -> B,
) -> clef_tt::engine::Pipeline<B> {
    let profile = clef_tt::precision::Precision::resolve(profile, |_| None).unwrap();
    let ckpt = clef_tt::checkpoint::Checkpoint::open(&fixtures().join(fixture)).unwrap();
    clef_tt::engine::Pipeline::load(&ckpt, mesh(profile.numerics()), &profile).unwrap()
}

/// [`profile_pipeline_on`] a CPU mesh of `shape`.
pub fn profile_pipeline(
    profile: &str,
    shape: clef_device::MeshShape,
) -> clef_tt::engine::Pipeline<clef_device::cpu::CpuMesh> {
    profile_pipeline_on(profile, |n| {
        clef_device::cpu::CpuMesh::new(shape).with_numerics(n)
    })
}

/// [`profile_pipeline_on`] a host-shim Tenstorrent mesh of `shape`.
pub fn tt_profile_pipeline(
    profile: &str,
    shape: clef_device::MeshShape,
) -> clef_tt::engine::Pipeline<clef_device::tt::TtMesh> {
    profile_pipeline_on(profile, |n| tt_mesh(shape, n))
}

/// Every tensor of a safetensors file, as (shape, f32 values) — i64, f64 and u8 tensors are
/// converted too.
pub fn read_tensors(
    path: &std::path::Path,
) -> std::collections::HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::I64 => view
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect(),
                safetensors::Dtype::F64 => view
                    .data()
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect(),
                safetensors::Dtype::U8 => view.data().iter().map(|&b| f32::from(b)).collect(),
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (name, (view.shape().to_vec(), data))
        })
        .collect()
}

/// Largest `|got - want| / rms(want row)` over rows of `cols` values.
pub fn max_rel_row_error(got: &[f32], want: &[f32], cols: usize) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.chunks(cols)
        .zip(want.chunks(cols))
        .map(|(g, w)| {
            let rms = (w.iter().map(|v| v * v).sum::<f32>() / cols as f32)
                .sqrt()
                .max(1e-12);
            g.iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
                / rms
        })
        .fold(0.0f32, f32::max)
}

/// A state of roughly `words` words (about one token each), different per `seed`: the
/// prefix-cache and packing tests' long states.
pub fn state_words(words: usize, seed: usize) -> String {
    const WORDS: [&str; 12] = [
        "ticket", "customer", "refund", "outage", "invoice", "login", "urgent", "billing", "team",
        "error", "payment", "server",
    ];
    (0..words)
        .map(|i| WORDS[(i * 7 + seed * 5 + i / 13) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}
