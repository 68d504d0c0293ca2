//! The checkpoint readers on malformed files: `config.json`, `joint_head_config.json`, a
//! safetensors file (header and data), and a whole snapshot directory whose weights file is the
//! input. The first byte picks the reader; every outcome is a value or an error, never a panic.
#![no_main]

use clef_tt::checkpoint::{Checkpoint, JointHeadConfig, ModelConfig, TensorStore};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-clef");

/// A scratch snapshot per process: the fixture's small files, the weights replaced per input.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("clef-fuzz-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        for entry in std::fs::read_dir(FIXTURE).expect("fixture") {
            let entry = entry.expect("fixture entry");
            let name = entry.file_name();
            let name_text = name.to_string_lossy();
            if entry.path().is_file()
                && !name_text.ends_with(".safetensors")
                && !name_text.ends_with(".index.json")
            {
                std::fs::copy(entry.path(), dir.join(&name)).expect("copy fixture file");
            }
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    match which % 4 {
        0 => {
            let _ = ModelConfig::parse(&String::from_utf8_lossy(rest));
        }
        1 => {
            let path = dir.join("fuzz-head").join("joint_head_config.json");
            std::fs::create_dir_all(path.parent().expect("parent")).expect("head dir");
            std::fs::write(&path, rest).expect("write head config");
            let _ = JointHeadConfig::read(path.parent().expect("parent"));
        }
        2 => {
            let path = dir.join("fuzz.safetensors");
            std::fs::write(&path, rest).expect("write safetensors");
            if let Ok(store) = TensorStore::open_files(&[path]) {
                // Every tensor the index lists can be read in full.
                for (_, info) in store.iter() {
                    let _ = store.read_f32(info, 0, info.elements());
                }
            }
        }
        _ => {
            std::fs::write(dir.join("model.safetensors"), rest).expect("write weights");
            let _ = Checkpoint::open(dir);
        }
    }
});
