//! The Qwen3.5 prefill against Hugging Face's own tensors: layer by layer on `tiny-qwen35`,
//! end to end on `tiny-clef`'s golden hidden rows, on the 1x1 and the 1x2 CPU mesh; the 1x2
//! mesh and a split prefix + tail pass against the single 1x1 pass.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::backbone::{Backbone, HfLayerState, LayerState};
use clef_tt::checkpoint::Checkpoint;
use common::{fixtures, max_rel_row_error, read_tensors};

fn backbone(dir: &str, shape: MeshShape) -> Backbone<CpuMesh> {
    let ckpt = Checkpoint::open_text(&fixtures().join(dir)).unwrap();
    Backbone::load(&ckpt, CpuMesh::new(shape), WeightFormat::F32).unwrap()
}

fn check_against_reference(shape: MeshShape) {
    let reference = read_tensors(&fixtures().join("tiny-qwen35/reference.safetensors"));
    let ids: Vec<u32> = reference["input_ids"].1.iter().map(|&v| v as u32).collect();
    let bb = backbone("tiny-qwen35/checkpoint", shape);
    let embedded = bb.embed(&ids).unwrap();
    let positions = Backbone::<CpuMesh>::text_positions(0, ids.len());
    let mut traced: Vec<(String, Vec<f32>, usize)> = Vec::new();
    let mut tracer =
        |name: &str, t: clef_device::HostTensor| traced.push((name.to_string(), t.data, t.cols));
    let (hidden, state) = bb
        .prefill_embedded(&embedded, &positions, None, Some(&mut tracer))
        .unwrap();
    let mut compared = 0;
    for (name, got, cols) in &traced {
        let Some((_, want)) = reference.get(name) else {
            continue;
        };
        let err = max_rel_row_error(got, want, *cols);
        assert!(
            err <= 1e-4,
            "{shape}: {name}: max |Δ| is {err} × the row's RMS"
        );
        compared += 1;
    }
    // Every layer output plus the traced sub-blocks of layers 0 and 3.
    assert!(
        compared >= 8 + 20,
        "{shape}: only {compared} reference tensors compared"
    );
    let err = max_rel_row_error(&hidden.data, &reference["final_hidden"].1, hidden.cols);
    assert!(err <= 1e-4, "{shape}: final_hidden off by {err} × RMS");

    // The caches after prefill.
    for (i, layer) in state.layers.iter().enumerate() {
        match bb.export_state(layer).unwrap() {
            HfLayerState::Attention { keys, values } => {
                let d = 64;
                assert!(
                    max_rel_row_error(&keys, &reference[&format!("cache.{i}.key")].1, d) <= 1e-4
                );
                assert!(
                    max_rel_row_error(&values, &reference[&format!("cache.{i}.value")].1, d)
                        <= 1e-4
                );
            }
            HfLayerState::DeltaNet { conv, recurrent } => {
                // HF keeps the last 4 pre-conv inputs; the carry is the last 3 of them.
                let want = &reference[&format!("cache.{i}.conv_state")].1;
                let want_last3: Vec<f32> = want.chunks(4).flat_map(|r| r[1..].to_vec()).collect();
                assert!(
                    max_rel_row_error(&conv, &want_last3, 3 * 272) <= 1e-4,
                    "conv state {i}"
                );
                let want = &reference[&format!("cache.{i}.recurrent_state")].1;
                assert!(
                    max_rel_row_error(&recurrent, want, 24 * 32) <= 1e-4,
                    "recurrent state {i}"
                );
            }
        }
    }
}

#[test]
fn tiny_qwen35_matches_hugging_face_layer_by_layer_on_1x1() {
    check_against_reference(MeshShape::ONE);
}

#[test]
fn tiny_qwen35_matches_hugging_face_layer_by_layer_on_1x2() {
    check_against_reference(MeshShape::PAIR);
}

#[test]
fn tiny_clef_final_hidden_rows_match_the_golden_records() {
    let goldens = read_tensors(&fixtures().join("tiny-clef/goldens/tensors_f32.safetensors"));
    let one = backbone("tiny-clef", MeshShape::ONE);
    let pair = backbone("tiny-clef", MeshShape::PAIR);
    for case in ["triage_readme", "json_state_unicode", "many_questions_24"] {
        let ids: Vec<u32> = goldens[&format!("{case}.input_ids")]
            .1
            .iter()
            .map(|&v| v as u32)
            .collect();
        let want = &goldens[&format!("{case}.final_hidden")].1;
        let (h1, _) = one.prefill(&ids, None).unwrap();
        let err = max_rel_row_error(&h1.data, want, 64);
        assert!(err <= 1e-4, "{case} 1x1: {err} × RMS");
        let (h2, _) = pair.prefill(&ids, None).unwrap();
        let err = max_rel_row_error(&h2.data, want, 64);
        assert!(err <= 1e-4, "{case} 1x2: {err} × RMS");
        let err = max_rel_row_error(&h2.data, &h1.data, 64);
        assert!(err <= 1e-5, "{case}: 1x2 differs from 1x1 by {err} × RMS");
    }
}

/// The three golden records' final rows through the Tenstorrent C ABI (host shim) on 1x1 and
/// 1x2: within 1e-5 × RMS of the CPU mesh (and so of the reference).
#[test]
fn tiny_clef_final_hidden_rows_through_the_tt_shim_equal_the_cpu_mesh() {
    let goldens = read_tensors(&fixtures().join("tiny-clef/goldens/tensors_f32.safetensors"));
    let ckpt = Checkpoint::open_text(&fixtures().join("tiny-clef")).unwrap();
    let cpu = backbone("tiny-clef", MeshShape::ONE);
    for shape in [MeshShape::ONE, MeshShape::PAIR] {
        let tt = Backbone::load(
            &ckpt,
            common::tt_mesh(shape, Default::default()),
            WeightFormat::F32,
        )
        .unwrap();
        for case in ["triage_readme", "json_state_unicode", "many_questions_24"] {
            let ids: Vec<u32> = goldens[&format!("{case}.input_ids")]
                .1
                .iter()
                .map(|&v| v as u32)
                .collect();
            let (want, _) = cpu.prefill(&ids, None).unwrap();
            let (got, _) = tt.prefill(&ids, None).unwrap();
            let err = max_rel_row_error(&got.data, &want.data, 64);
            eprintln!("{case} through the shim on {shape}: {err:.2e} × RMS of the CPU mesh");
            assert!(err <= 1e-5, "{case} {shape}: {err} × RMS");
            let err = max_rel_row_error(&got.data, &goldens[&format!("{case}.final_hidden")].1, 64);
            assert!(err <= 1e-4, "{case} {shape}: {err} × RMS of the reference");
        }
    }
}

#[test]
fn a_prefix_pass_and_a_tail_pass_equal_the_single_pass() {
    let goldens = read_tensors(&fixtures().join("tiny-clef/goldens/tensors_f32.safetensors"));
    let ids: Vec<u32> = goldens["json_state_unicode.input_ids"]
        .1
        .iter()
        .map(|&v| v as u32)
        .collect();
    for shape in [MeshShape::ONE, MeshShape::PAIR] {
        let bb = backbone("tiny-clef", shape);
        let (whole, whole_state) = bb.prefill(&ids, None).unwrap();
        // 128 is the cache's alignment; 100 puts the boundary inside a delta-rule chunk.
        for split in [128usize, 100] {
            let (head, state) = bb.prefill(&ids[..split], None).unwrap();
            assert_eq!(state.position, split);
            let (tail, end_state) = bb.prefill(&ids[split..], Some(&state)).unwrap();
            let mut joined = head.data.clone();
            joined.extend_from_slice(&tail.data);
            let err = max_rel_row_error(&joined, &whole.data, 64);
            assert!(err <= 1e-5, "{shape} split at {split}: {err} × RMS");
            assert_eq!(end_state.position, ids.len());
            for (a, b) in end_state.layers.iter().zip(&whole_state.layers) {
                match (bb.export_state(a).unwrap(), bb.export_state(b).unwrap()) {
                    (
                        HfLayerState::Attention { keys: k1, .. },
                        HfLayerState::Attention { keys: k2, .. },
                    ) => {
                        assert!(max_rel_row_error(&k1, &k2, 32) <= 1e-5)
                    }
                    (
                        HfLayerState::DeltaNet { recurrent: r1, .. },
                        HfLayerState::DeltaNet { recurrent: r2, .. },
                    ) => {
                        assert!(max_rel_row_error(&r1, &r2, 12) <= 1e-4)
                    }
                    _ => panic!("layer kinds differ"),
                }
            }
            assert!(matches!(end_state.layers[3], LayerState::Attention { .. }));
        }
    }
}

#[test]
fn bf16_weights_stay_close_to_f32() {
    let goldens = read_tensors(&fixtures().join("tiny-clef/goldens/tensors_f32.safetensors"));
    let ids: Vec<u32> = goldens["triage_readme.input_ids"]
        .1
        .iter()
        .map(|&v| v as u32)
        .collect();
    let ckpt = Checkpoint::open_text(&fixtures().join("tiny-clef")).unwrap();
    // The fixture's weights are exactly bf16, so holding them as bf16 changes nothing.
    let bb = Backbone::load(&ckpt, CpuMesh::new(MeshShape::ONE), WeightFormat::Bf16).unwrap();
    let (h, _) = bb.prefill(&ids, None).unwrap();
    let err = max_rel_row_error(&h.data, &goldens["triage_readme.final_hidden"].1, 64);
    assert!(err <= 1e-4, "{err}");
}
