//! The tensor cache on the tiny fixture: a converted cache places the same weights (the prefill
//! is bitwise equal to loading from safetensors) on the CPU mesh and through the Tenstorrent
//! shim, and a mismatched (another backend, mesh or profile), stale, truncated or corrupted
//! cache is refused with a message saying how to rebuild it.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{MeshOps, MeshShape};
use clef_tt::backbone::Backbone;
use clef_tt::checkpoint::Checkpoint;
use clef_tt::precision::Precision;
use clef_tt::tensor_cache::{convert, CacheError, TensorCache};
use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clef-tt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn open_for(
    backend: &str,
    dir: &std::path::Path,
    ckpt: &Checkpoint,
    mesh: &str,
    profile: &Precision,
) -> Result<TensorCache, CacheError> {
    TensorCache::open(dir, ckpt, backend, mesh, profile)
}

fn open(
    dir: &std::path::Path,
    ckpt: &Checkpoint,
    mesh: &str,
    profile: &Precision,
) -> Result<TensorCache, CacheError> {
    open_for("cpu", dir, ckpt, mesh, profile)
}

/// Converts for meshes `make(shape)` gives, loads from the cache and checks the prefill is
/// bitwise the one of weights placed from the checkpoint.
fn cache_round_trip<B: MeshOps>(name: &str, make: impl Fn(MeshShape) -> B) {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let out = temp(name);
    for (profile, mesh) in [("selected", MeshShape::PAIR), ("f32", MeshShape::ONE)] {
        let p = Precision::resolve(profile, |_| None).unwrap();
        let manifest = convert(&ckpt, &make(mesh), &p, &out, &|_, _| {}).unwrap();
        assert!(manifest.entries.iter().all(|e| e.offset % 64 == 0));
        let backend = make(mesh).backend_name();
        assert_eq!(manifest.backend, backend);
        let cache = open_for(backend, &out, &ckpt, &mesh.to_string(), &p).unwrap();
        let cached = cache
            .load_backbone(&ckpt, make(mesh), &p, &|_, _| {})
            .unwrap();
        let direct = Backbone::load_with(&ckpt, make(mesh), &p).unwrap();
        assert_eq!(cached.weight_bytes(), direct.weight_bytes());
        let ids: Vec<u32> = (0..40).map(|i| 1000 + i * 37).collect();
        let (a, _) = cached.prefill(&ids, None).unwrap();
        let (b, _) = direct.prefill(&ids, None).unwrap();
        assert_eq!(a, b, "{backend} {profile} on {mesh}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_cache_places_the_same_weights_as_the_checkpoint() {
    cache_round_trip("tensor-cache", CpuMesh::new);
}

#[test]
fn a_tt_cache_uploads_the_same_weights_as_the_checkpoint() {
    cache_round_trip("tensor-cache-tt", |shape| {
        common::tt_mesh(shape, Default::default())
    });
}

#[test]
fn a_cache_of_one_backend_is_refused_by_the_other_naming_the_command() {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let p = Precision::resolve("selected", |_| None).unwrap();
    let out = temp("tensor-cache-backend");
    let tt = common::tt_mesh(MeshShape::ONE, Default::default());
    convert(&ckpt, &tt, &p, &out, &|_, _| {}).unwrap();
    let e = match open_for("cpu", &out, &ckpt, "1x1", &p) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a tt cache was accepted for the cpu backend"),
    };
    assert!(e.contains("built for backend tt, asked for cpu"), "{e}");
    assert!(
        e.contains("clef-tt convert") && !e.contains("--device"),
        "{e}"
    );
    convert(&ckpt, &CpuMesh::new(MeshShape::ONE), &p, &out, &|_, _| {}).unwrap();
    let e = match open_for("tt", &out, &ckpt, "1x1", &p) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a cpu cache was accepted for the tt backend"),
    };
    assert!(e.contains("built for backend cpu, asked for tt"), "{e}");
    assert!(e.contains("--device tt"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn mismatched_stale_truncated_and_corrupted_caches_are_refused() {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let out = temp("tensor-cache-bad");
    let selected = Precision::resolve("selected", |_| None).unwrap();
    convert(
        &ckpt,
        &CpuMesh::new(MeshShape::PAIR),
        &selected,
        &out,
        &|_, _| {},
    )
    .unwrap();
    let refused = |r: Result<TensorCache, CacheError>| match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a bad cache was accepted"),
    };
    // Another mesh or profile.
    let e = refused(open(&out, &ckpt, "1x1", &selected));
    assert!(
        e.contains("built for mesh 1x2, asked for 1x1") && e.contains("clef-tt convert"),
        "{e}"
    );
    let f32 = Precision::resolve("f32", |_| None).unwrap();
    let e = refused(open(&out, &ckpt, "1x2", &f32));
    assert!(e.contains("profile selected"), "{e}");
    // A knob overridden since.
    let overridden = Precision::resolve("selected", |v| {
        (v == "QWEN36_MLP_GATE_UP_DTYPE").then(|| "bfp4".into())
    })
    .unwrap();
    let e = refused(open(&out, &ckpt, "1x2", &overridden));
    assert!(e.contains("weight formats"), "{e}");
    // The checkpoint changed since (its recorded fingerprint no longer matches).
    let manifest_path = out.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&original).unwrap();
    m["source"][0]["fingerprint"] = "0".into();
    std::fs::write(&manifest_path, m.to_string()).unwrap();
    let e = refused(open(&out, &ckpt, "1x2", &selected));
    assert!(e.contains("changed since it was built"), "{e}");
    std::fs::write(&manifest_path, &original).unwrap();
    // A flipped byte: caught by the entry's checksum while placing.
    let bin = out.join("weights.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&bin, &bytes).unwrap();
    let cache = open(&out, &ckpt, "1x2", &selected).unwrap();
    let err = cache
        .load_backbone(&ckpt, CpuMesh::new(MeshShape::PAIR), &selected, &|_, _| {})
        .err()
        .expect("a corrupted cache was placed");
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    // Truncated.
    drop(cache);
    std::fs::write(&bin, &bytes[..at]).unwrap();
    let e = refused(open(&out, &ckpt, "1x2", &selected));
    assert!(e.contains("truncated"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_failed_conversion_leaves_nothing() {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let blocker = temp("tensor-cache-blocker");
    std::fs::write(&blocker, b"a file where a directory should go").unwrap();
    let out = blocker.join("cache");
    let p = Precision::resolve("f32", |_| None).unwrap();
    assert!(convert(&ckpt, &CpuMesh::new(MeshShape::ONE), &p, &out, &|_, _| {}).is_err());
    assert!(!out.exists());
    let _ = std::fs::remove_file(&blocker);
}
