//! The mock kit with torch, for the tests that run ttnn's golden functions (tests/tt_golden.rs,
//! tests/compare_layers.rs): where it is missing they pass with a note, unless
//! `CLEF_REQUIRE_TT_GOLDEN=1` (CI) makes that a failure.

use std::path::Path;
use std::process::Command;

/// The Python the shim embeds (interpreter.cpp: CLEF_TT_PYTHON, else $VIRTUAL_ENV/bin/python).
pub fn shim_python() -> Option<String> {
    if let Ok(p) = std::env::var("CLEF_TT_PYTHON") {
        if !p.is_empty() {
            return Some(p);
        }
    }
    std::env::var("VIRTUAL_ENV")
        .ok()
        .map(|v| format!("{v}/bin/python"))
}

/// The ttnn shim, when it, the mock kit and torch are there.
pub fn kit() -> Option<&'static str> {
    let shim = clef_tt_abi::TTNN_SHIM;
    let why = if shim.is_empty() || !Path::new(shim).is_file() {
        "the ttnn shim was not built (CLEF_TT_PYTHON unset at build time)".to_string()
    } else if std::env::var_os("TT_METAL_MOCK_CLUSTER_DESC_PATH").is_none() {
        "the mock kit's environment is not set (source DIR/env.sh of ffi/ttnn-mock/setup.sh)"
            .to_string()
    } else {
        match shim_python() {
            None => "no CLEF_TT_PYTHON (the kit's env.sh sets it)".to_string(),
            Some(py) => match Command::new(&py).args(["-c", "import torch"]).output() {
                Ok(out) if out.status.success() => return Some(shim),
                _ => format!(
                    "torch does not import in {py} (the golden functions need it: \
                     ffi/ttnn-mock/setup.sh --golden DIR adds it, ~4 GB with its CUDA packages)"
                ),
            },
        }
    };
    assert!(
        std::env::var("CLEF_REQUIRE_TT_GOLDEN").as_deref() != Ok("1"),
        "CLEF_REQUIRE_TT_GOLDEN=1: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// A scratch folder `name` of test binary `test` under the target's test scratch space (ttnn
/// writes `generated/` into the working directory).
pub fn scratch(test: &str, name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(test).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
