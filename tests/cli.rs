//! The binary's commands: `inspect` on the built-in model, and a random checkpoint written by
//! `make-random` that opens, inspects clean and runs a finite prefill.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::backbone::Backbone;
use clef_tt::checkpoint::Checkpoint;
use std::process::Command;

fn clef_tt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_clef-tt"))
}

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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
