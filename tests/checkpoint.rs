//! The checkpoint loader: the copied fixtures are byte-identical, a real snapshot opens, a hub
//! id resolves in a local cache, and every corruption is refused naming file, tensor and what
//! was expected.

mod common;

use clef_tt::checkpoint::{resolve_in_cache, Checkpoint, CheckpointError};
use common::fixtures;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_tiny_clef_copy_matches_the_digests_recorded_with_its_goldens() {
    let dir = fixtures().join("tiny-clef");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens/manifest.json")).unwrap())
            .unwrap();
    let digests = manifest["fixture_files_sha256"].as_object().unwrap();
    assert!(digests.len() >= 11);
    for (file, want) in digests {
        assert_eq!(&sha256(&dir.join(file)), want, "{file}");
    }
}

#[test]
fn every_copied_fixture_equals_shared_when_present() {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
    if !shared.is_dir() {
        eprintln!("../shared is absent: only the recorded digests are checked");
        return;
    }
    let ours = fixtures();
    let mut compared = 0;
    for theirs in files_under(&shared) {
        let rel = theirs.strip_prefix(&shared).unwrap();
        let mine = ours.join(rel);
        assert!(
            mine.is_file(),
            "{} is not copied into tests/fixtures",
            rel.display()
        );
        assert_eq!(sha256(&mine), sha256(&theirs), "{}", rel.display());
        compared += 1;
    }
    assert!(compared > 20);
}

#[test]
fn the_tiny_clef_snapshot_opens_with_its_head_and_tokenizer() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-clef")).unwrap();
    let t = &ckpt.config.text;
    assert_eq!(
        (t.hidden_size, t.vocab_size, t.layers.len()),
        (64, 248_320, 8)
    );
    assert_eq!(t.rotary_dim(), 8);
    let head = ckpt.head.as_ref().unwrap();
    assert_eq!(head.tensors.iter().count(), 122);
    assert!((head.config.attention_scale() - 1.0 / 12f32.sqrt()).abs() < 1e-7);
    assert!((head.config.routing_scale() - 1.0 / 48f32.sqrt()).abs() < 1e-7);
    let lm = ckpt.lm_head().unwrap();
    assert_eq!((lm.rows(), lm.cols()), (248_320, 64));
    assert!(matches!(
        lm.row_f32(248_320),
        Err(clef_tt::checkpoint::RowError::OutOfRange { row: 248_320, .. })
    ));
    let tok = ckpt.tokenizer().unwrap();
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(248_045));
}

/// A scratch copy of a fixture directory; big untouched files are linked, not copied.
struct Scratch(PathBuf);

impl Scratch {
    fn of(src: &Path, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("clef-tt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
            }
        }
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rewrite a safetensors file through `edit` (name, shape, bytes).
fn rewrite(path: &Path, edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open_text(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_tensor_is_refused_by_name() {
    let s = Scratch::of(&fixtures().join("tiny-qwen35/checkpoint"), "missing");
    let name = "model.language_model.layers.3.self_attn.k_norm.weight";
    rewrite(&s.0.join("model.safetensors"), |t| {
        t.retain(|x| x.0 != name)
    });
    let e = open_err(&s.0);
    assert!(
        e.contains(name) && e.contains("missing") && e.contains("[64]"),
        "{e}"
    );
}

#[test]
fn a_wrong_shape_is_refused_with_both_shapes() {
    let s = Scratch::of(&fixtures().join("tiny-qwen35/checkpoint"), "shape");
    let name = "model.language_model.layers.0.linear_attn.in_proj_z.weight";
    rewrite(&s.0.join("model.safetensors"), |t| {
        let e = t.iter_mut().find(|x| x.0 == name).unwrap();
        e.1 = vec![128, 144]; // transposed
    });
    let e = open_err(&s.0);
    assert!(
        e.contains(name) && e.contains("[128, 144]") && e.contains("expected [144, 128]"),
        "{e}"
    );
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn a_truncated_shard_is_refused() {
    let s = Scratch::of(&fixtures().join("tiny-qwen35/checkpoint"), "truncated");
    let path = s.0.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 1000).unwrap();
    let e = open_err(&s.0);
    assert!(
        e.contains("truncated") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn an_index_naming_an_absent_tensor_is_refused() {
    let src = fixtures().join("tiny-clef");
    let s = Scratch::of(&src, "index");
    let index = s.0.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["weight_map"]["model.language_model.layers.99.mlp.up_proj.weight"] =
        "model-00001-of-00002.safetensors".into();
    std::fs::write(&index, json.to_string()).unwrap();
    let e = open_err(&s.0);
    assert!(
        e.contains("layers.99.mlp.up_proj") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn a_head_missing_a_tensor_or_with_an_extra_one_is_refused() {
    let s = Scratch::of(&fixtures().join("tiny-clef"), "head");
    let head = s.0.join("joint_head.safetensors");
    rewrite(&head, |t| t.retain(|x| x.0 != "residual_gate"));
    let e = Checkpoint::open(&s.0).err().unwrap().to_string();
    assert!(e.contains("residual_gate") && e.contains("missing"), "{e}");
    rewrite(&head, |t| {
        t.push(("residual_gate".into(), vec![], vec![0, 0]));
        t.push(("bonus.weight".into(), vec![1], vec![0, 0]));
    });
    let e = Checkpoint::open(&s.0).err().unwrap().to_string();
    assert!(
        e.contains("bonus.weight") && e.contains("unexpected"),
        "{e}"
    );
}

#[test]
fn a_hub_id_resolves_in_the_local_cache_and_nothing_is_downloaded() {
    let cache = std::env::temp_dir().join(format!("clef-tt-hub-{}", std::process::id()));
    let repo = cache.join("models--Cloudflare--clef");
    let commit = "2f3de3dd85f379784083b0814d997ab627200f0c";
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let got = resolve_in_cache("Cloudflare/clef", None, &cache).unwrap();
    assert_eq!(got, repo.join("snapshots").join(commit));
    assert_eq!(
        resolve_in_cache("Cloudflare/clef", Some(commit), &cache).unwrap(),
        got
    );
    let e = resolve_in_cache("Cloudflare/clef", Some("deadbeef"), &cache).unwrap_err();
    assert!(matches!(e, CheckpointError::Resolve { .. }) && e.to_string().contains("deadbeef"));
    let e = resolve_in_cache("Cloudflare/clef-flash", None, &cache).unwrap_err();
    assert!(e.to_string().contains("never downloads"), "{e}");
    let _ = std::fs::remove_dir_all(&cache);
}

/// A vision config the processor or the tower cannot serve stops the load with a message that
/// names it: other patch sizes, a merger width that is not the text model's, heads that do
/// not split over the mesh, a position table narrower than the configured width.
#[test]
fn vision_configs_the_tower_cannot_serve_are_refused_at_load() {
    let src = common::fixtures().join("tiny-clef");
    for (key, value, message) in [
        ("patch_size", 14, "14-pixel patches"),
        ("out_hidden_size", 32, "out_hidden_size 32"),
        ("num_heads", 1, "num_heads (1)"),
        ("hidden_size", 64, "32 columns for hidden size 64"),
    ] {
        let scratch = Scratch::of(&src, &format!("vision-{key}"));
        let path = scratch.0.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config["vision_config"][key] = serde_json::json!(value);
        std::fs::write(&path, config.to_string()).unwrap();
        let ckpt = Checkpoint::open(&scratch.0).unwrap();
        let mesh = clef_device::cpu::CpuMesh::new(clef_device::MeshShape::PAIR);
        let e = match clef_tt::media::load_tower(&ckpt, &mesh, clef_device::WeightFormat::F32) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{key}: loaded"),
        };
        assert!(e.contains(message), "{key}: {e}");
    }
}
