//! Every fine op of the C ABI is present in every place that must have it ("Adding an op" in
//! ffi/README.md lists them). The header (`include/clef_tt.h`) declares the fine ops: the
//! `int clef_tt_<op>(clef_tt_mesh *mesh, ...)` entries of its "ops:" sections, the layer-op
//! entry aside. Each must then be bound (`src/bindings.rs`), defined by the core
//! (`shim/core/abi_ops.cpp`), a `DeviceMesh` virtual (`shim/backend.hpp`) overridden by the host
//! backend (`shim/host/host_backend.cpp`) and forwarded by the ttnn backend
//! (`shim/ttnn/python_backend.cpp`) to a method of the op package (`shim/ttnn/clef_tt_ttnn/`),
//! called by clef-device's tt mesh (`device/src/tt/ops.rs`), and exercised by the op batteries
//! (`device/tests/tt_mesh.rs` against the CPU mesh, `shim/ttnn/tests/test_ops_mock.py` on the
//! mock P150x2). The other way round, the core defines and clef-device calls no `clef_tt_*`
//! function the header lacks. Text checks only: a missing place fails here by name instead of
//! at link time, at load time, or never.

use std::path::{Path, PathBuf};

fn ffi() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `clef_tt_<name>` after every `prefix` in `text`, e.g. the functions a file defines.
fn entries(text: &str, prefix: &str) -> Vec<String> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest[name.len()..]
                .starts_with('(')
                .then(|| name.trim_start_matches("clef_tt_").to_string())
        })
        .collect()
}

/// The fine ops the header declares: its `int clef_tt_<op>(clef_tt_mesh *mesh` entries after
/// the first "---- ops:" marker, but the layer-op entry.
fn declared_ops() -> Vec<String> {
    let header = read(&ffi().join("include/clef_tt.h"));
    let ops_at = header
        .find("---- ops:")
        .expect("clef_tt.h has no \"---- ops:\" section");
    let ops: Vec<String> = entries(&header[ops_at..], "int clef_tt_")
        .into_iter()
        .filter(|name| name != "layer_op")
        .collect();
    assert!(ops.len() >= 20, "the header declares only {ops:?}");
    ops
}

/// The op package's sources, as one text.
fn op_package() -> String {
    let dir = ffi().join("shim/ttnn/clef_tt_ttnn");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    files.sort();
    files.iter().map(|p| read(p)).collect()
}

#[test]
fn every_fine_op_is_in_every_place_the_boundary_needs_it() {
    let root = ffi().join("..");
    // (where, its text, what it holds for an op: `{op}` stands for the op's name)
    let places: Vec<(&str, String, &str)> = vec![
        (
            "ffi/src/bindings.rs (run ffi/regenerate-bindings.sh)",
            read(&ffi().join("src/bindings.rs")),
            "clef_tt_{op}:",
        ),
        (
            "ffi/shim/core/abi_ops.cpp (the core's entry point)",
            read(&ffi().join("shim/core/abi_ops.cpp")),
            "int clef_tt_{op}(clef_tt_mesh* mesh",
        ),
        (
            "ffi/shim/backend.hpp (a DeviceMesh virtual)",
            read(&ffi().join("shim/backend.hpp")),
            " {op}(",
        ),
        (
            "ffi/shim/host/host_backend.cpp (the host backend)",
            read(&ffi().join("shim/host/host_backend.cpp")),
            " {op}(",
        ),
        (
            "ffi/shim/ttnn/python_backend.cpp (the forward to Python)",
            read(&ffi().join("shim/ttnn/python_backend.cpp")),
            "attr(\"{op}\")",
        ),
        (
            "ffi/shim/ttnn/clef_tt_ttnn/ (the op package's method)",
            op_package(),
            "def {op}(self",
        ),
        (
            "device/src/tt/ops.rs (clef-device's call)",
            read(&root.join("device/src/tt/ops.rs")),
            "clef_tt_{op}(",
        ),
        (
            "device/tests/tt_mesh.rs (the battery against the CPU mesh)",
            read(&root.join("device/tests/tt_mesh.rs")),
            "{op}(",
        ),
        (
            "ffi/shim/ttnn/tests/test_ops_mock.py (the battery on the mock P150x2)",
            read(&ffi().join("shim/ttnn/tests/test_ops_mock.py")),
            "\"{op}\"",
        ),
    ];
    let mut missing = Vec::new();
    for op in declared_ops() {
        for (place, text, needle) in &places {
            if !text.contains(&needle.replace("{op}", &op)) {
                missing.push(format!("{op}: not in {place}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fine ops declared in include/clef_tt.h but missing elsewhere (ffi/README.md, \"Adding an \
         op\"):\n{}",
        missing.join("\n")
    );
}

#[test]
fn nothing_defines_or_calls_an_entry_the_header_lacks() {
    let header = read(&ffi().join("include/clef_tt.h"));
    let known = entries(&header, "clef_tt_");
    let root = ffi().join("..");
    let mut unknown = Vec::new();
    for (place, prefix) in [
        (ffi().join("shim/core/abi_ops.cpp"), "int clef_tt_"),
        (root.join("device/src/tt/ops.rs"), ".clef_tt_"),
    ] {
        for name in entries(&read(&place), prefix) {
            if !known.contains(&name) {
                unknown.push(format!("clef_tt_{name} in {}", place.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "not declared in include/clef_tt.h: {unknown:?}"
    );
}

#[test]
fn the_declared_ops_are_the_fine_ops_of_the_header() {
    // The parse above finds what a reader of the header finds: the first and last op of each
    // section (a parse that stopped early, or ran into the layer-op entry, fails here).
    let ops = declared_ops();
    for op in ["linear", "gated_rms_norm", "layer_norm", "fold_rows"] {
        assert!(ops.contains(&op.to_string()), "{op} not in {ops:?}");
    }
    assert!(!ops.contains(&"layer_op".to_string()));
}
