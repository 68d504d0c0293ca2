//! Every fine op is present in every place that must have it ("Adding an op" in ffi/README.md).
//! The op table declares the fine ops (`shim/core/op_table.cpp`; the shim lists it at run time
//! through `clef_tt_op_table`). Each declared op must then be computed by the host backend (its
//! kernel table in `shim/host/host_backend.cpp`) and by the op package (a method of the same
//! name in `shim/ttnn/clef_tt_ttnn/`), have a kernel of the CPU mesh (its family's `kernel` in
//! `device/src/cpu/ops/`), and be exercised by the op batteries (`device/tests/tt_mesh.rs`
//! against the CPU mesh, `shim/ttnn/tests/test_ops_mock.py` on the mock P150x2). The other way
//! round, clef-device builds no call of an op the table lacks. Text checks beside the table the
//! shim gives: a missing place fails here by name instead of at run time, or never.
//!
//! Its `MeshOps` method is generated from the table (`generate/mod.rs` renders
//! `device/src/fine_ops.rs`); a test here fails while the checked-in file differs, and
//! `CLEF_TT_REGENERATE=1` makes it write the file instead.

mod generate;

use std::ffi::c_char;
use std::path::{Path, PathBuf};

fn ffi() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir` ending in `ext`, as one text.
fn sources(dir: &Path, ext: &str) -> String {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == ext) {
                files.push(path);
            }
        }
    }
    files.sort();
    files.iter().map(|p| read(p)).collect()
}

/// The op table as the host shim lists it (`clef_tt_op_table`), or None where no host shim was
/// built (no C++ compiler).
fn op_table_json() -> Option<String> {
    if clef_tt_abi::HOST_SHIM.is_empty() {
        return None;
    }
    // SAFETY: the host shim exports the whole ABI (checked by the crate's own tests); the
    // buffer outlives the call and its capacity is passed.
    unsafe {
        let lib = clef_tt_abi::ClefTtLibrary::new(clef_tt_abi::HOST_SHIM).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut len = 0usize;
        let status = lib.clef_tt_op_table(buf.as_mut_ptr().cast::<c_char>(), buf.len(), &mut len);
        assert_eq!(status, 0, "clef_tt_op_table failed");
        buf.truncate(len);
        Some(String::from_utf8(buf).unwrap())
    }
}

/// The names of the ops of the table's JSON (each op object is `{"name":"...","inputs":...`).
fn op_names(json: &str) -> Vec<String> {
    json.split("{\"name\":\"")
        .skip(1)
        .filter_map(|rest| {
            let (name, after) = rest.split_once('"')?;
            after.starts_with(",\"inputs\"").then(|| name.to_string())
        })
        .collect()
}

/// The op names clef-device builds calls of (`FineCall::new("...")`).
fn called_ops(device_src: &str) -> Vec<String> {
    let prefix = "FineCall::new(\"";
    device_src
        .match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &device_src[at + prefix.len()..];
            rest.split_once('"').map(|(name, _)| name.to_string())
        })
        .collect()
}

#[test]
fn every_declared_op_is_in_every_place_that_needs_it() {
    let Some(json) = op_table_json() else {
        eprintln!("no host shim was built (no C++ compiler): the op table cannot be listed");
        return;
    };
    let ops = op_names(&json);
    assert!(ops.len() >= 21, "the op table lists only {ops:?}");
    let root = ffi().join("..");
    // (where, its text, what it holds for an op: `{op}` stands for the op's name)
    let places: Vec<(&str, String, &str)> = vec![
        (
            "ffi/shim/host/host_backend.cpp (the host backend's kernel table)",
            read(&ffi().join("shim/host/host_backend.cpp")),
            "{\"{op}\",",
        ),
        (
            "ffi/shim/ttnn/clef_tt_ttnn/ (the op package's method)",
            sources(&ffi().join("shim/ttnn/clef_tt_ttnn"), "py"),
            "def {op}(self",
        ),
        (
            "device/src/cpu/ops/ (the CPU mesh's kernel, in its family's `kernel`)",
            sources(&root.join("device/src/cpu/ops"), "rs"),
            "\"{op}\" =>",
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
    for op in &ops {
        for (place, text, needle) in &places {
            if !text.contains(&needle.replace("{op}", op)) {
                missing.push(format!("{op}: not in {place}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ops of the op table (ffi/shim/core/op_table.cpp) missing elsewhere (ffi/README.md, \
         \"Adding an op\"):\n{}",
        missing.join("\n")
    );
    let called = called_ops(&sources(&root.join("device/src"), "rs"));
    assert!(called.len() >= ops.len(), "too few calls found: {called:?}");
    let unknown: Vec<&String> = called.iter().filter(|op| !ops.contains(op)).collect();
    assert!(
        unknown.is_empty(),
        "device/src builds calls of ops the op table does not declare: {unknown:?}"
    );
}

#[test]
fn the_table_lists_each_op_with_its_operands_parameters_and_results() {
    let Some(json) = op_table_json() else {
        return;
    };
    // The parse above finds what the table holds: ops of both sections, no operand or
    // parameter name taken for an op.
    let ops = op_names(&json);
    for op in ["linear", "gated_rms_norm", "layer_norm", "fold_rows"] {
        assert!(ops.contains(&op.to_string()), "{op} not in {ops:?}");
    }
    for not_op in ["x", "w", "group", "eps"] {
        assert!(
            !ops.contains(&not_op.to_string()),
            "{not_op} taken for an op"
        );
    }
    let table: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rms_norm = table
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["name"] == "rms_norm")
        .unwrap();
    assert_eq!(
        rms_norm["inputs"],
        serde_json::json!([
            {"name": "x", "kind": "activation", "optional": false},
            {"name": "w", "kind": "vector", "optional": false},
        ])
    );
    assert_eq!(
        rms_norm["params"],
        serde_json::json!([
            {"name": "group", "type": "u32", "from_profile": false},
            {"name": "eps", "type": "f32", "from_profile": false},
            {"name": "one_plus", "type": "flag", "from_profile": false},
        ])
    );
    assert_eq!(rms_norm["list"], serde_json::Value::Null);
    assert_eq!(rms_norm["results"], serde_json::json!(["out"]));
    assert_eq!(rms_norm["results_per_list_entry"], false);
    assert!(rms_norm["doc"]
        .as_str()
        .unwrap()
        .starts_with("RMSNorm over groups"));
}

#[test]
fn the_mesh_ops_fine_methods_are_the_ones_the_table_gives() {
    let Some(json) = op_table_json() else {
        return;
    };
    let path = ffi().join("../device/src/fine_ops.rs");
    let rendered = generate::fine_ops_rs(&json);
    if std::env::var_os("CLEF_TT_REGENERATE").is_some() {
        std::fs::write(&path, &rendered).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == rendered,
        "device/src/fine_ops.rs is not what the op table gives (ffi/shim/core/op_table.cpp \
         changed?): regenerate it with `CLEF_TT_REGENERATE=1 cargo test -p clef-tt-abi --test \
         op_declarations`"
    );
    // Every op of the table has its method there.
    for op in op_names(&json) {
        assert!(
            rendered.contains(&format!("fn {op}(")),
            "{op}: no method rendered"
        );
    }
}
