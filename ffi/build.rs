//! Builds the shims of the C ABI into the target directory (`target/<profile>/`) with the system
//! C++ compiler (`CXX`, else `c++`; Debian's g++), no network:
//!
//! - `libclef_tt_host.so`: the shared C++ core (`shim/core`) with the host backend
//!   (`shim/host`). Without a C++ compiler the build goes on with a warning: clef-tt still builds
//!   and serves on the CPU.
//! - `libclef_tt_ttnn.so`: the core with the ttnn backend (`shim/ttnn`): an embedded CPython
//!   (pybind11) calling the op package `clef_tt_ttnn`, which drives ttnn 0.81.1 through its
//!   Python API; the package is copied beside the library. Built when a CPython 3.12 or 3.10
//!   with its headers, a shared libpython and pybind11 is found: the interpreter named by
//!   `CLEF_TT_PYTHON` (a venv with ttnn and pybind11, as `ffi/ttnn-mock/setup.sh` makes), else
//!   `python3.12` / `python3.10` on PATH or under pyenv. Otherwise one warning says what was
//!   tried, and `--device tt` uses the host shim.
//!
//! Their paths are compiled into the crate (`clef_tt_abi::HOST_SHIM`, `TTNN_SHIM`, empty when
//! not built) so `clef-tt --device tt` finds them by default.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Sources of the shared core, relative to `shim/`.
const CORE: [&str; 7] = [
    "core/abi_library.cpp",
    "core/abi_layers.cpp",
    "core/abi_ops.cpp",
    "core/op_table.cpp",
    "core/call.cpp",
    "core/handles.cpp",
    "core/rope.cpp",
];
/// The host backend's sources.
const HOST: [&str; 3] = ["host/host_backend.cpp", "host/math.cpp", "host/tiles.cpp"];
/// The ttnn backend's sources (the C++ half; the op bodies are the Python package).
const TTNN: [&str; 2] = ["ttnn/interpreter.cpp", "ttnn/python_backend.cpp"];
/// The op package, copied beside `libclef_tt_ttnn.so`.
const PACKAGE: &str = "ttnn/clef_tt_ttnn";

/// The host shim is built for the machine that builds it (`-march=native`: it is a test and
/// bring-up backend, not a redistributable) but without AVX-512, which valgrind (CI runs the
/// shim under memcheck) cannot execute; `-ffp-contract=off` keeps its roundings the same on
/// every CPU (no fused multiply-adds), so only its speed depends on the machine.
const FLAGS: [&str; 10] = [
    "-std=c++20",
    "-O3",
    "-march=native",
    "-mno-avx512f",
    "-ffp-contract=off",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-fno-strict-aliasing",
    "-g1",
];
/// The ttnn backend's bridge: portable code (it marshals calls, and widens a chunk's bf16 rows
/// to f32 on the way out: -O3 vectorizes that loop), hidden symbols as pybind11 asks.
const BRIDGE_FLAGS: [&str; 7] = [
    "-std=c++20",
    "-O3",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-fvisibility=hidden",
    "-g1",
];

fn main() {
    println!("cargo:rerun-if-changed=include/clef_tt.h");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-env-changed=CXX");
    println!("cargo:rerun-if-env-changed=CLEF_TT_PYTHON");
    println!("cargo:rerun-if-env-changed=PYENV_ROOT");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    // OUT_DIR is target/<profile>/build/clef-tt-abi-<hash>/out.
    let target_dir = out_dir.ancestors().nth(3).map(Path::to_path_buf);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut host = String::new();
    let mut ttnn = String::new();
    if let Some(dir) = &target_dir {
        let core = compile(&cxx, &manifest, &out_dir, &CORE, &FLAGS, &[], "host shim");
        if let Some(core) = core {
            let backend = compile(&cxx, &manifest, &out_dir, &HOST, &FLAGS, &[], "host shim");
            if let Some(backend) = backend {
                let lib = dir.join("libclef_tt_host.so");
                let objects: Vec<PathBuf> = core.iter().chain(&backend).cloned().collect();
                if link(&cxx, &objects, &[], &out_dir, &lib, "host shim") {
                    host = lib.display().to_string();
                }
            }
            match find_python() {
                Ok(py) => {
                    if let Some(lib) = build_ttnn_shim(&cxx, &manifest, &out_dir, dir, &core, &py) {
                        ttnn = lib.display().to_string();
                    }
                }
                Err(tried) => println!(
                    "cargo:warning=ttnn shim not built: no CPython 3.12 or 3.10 with headers, a shared libpython and pybind11 ({tried}); set CLEF_TT_PYTHON to a Python with ttnn and pybind11 (ffi/ttnn-mock/setup.sh makes one) for --device tt on ttnn"
                ),
            }
        }
    }
    println!("cargo:rustc-env=CLEF_TT_HOST_SHIM={host}");
    println!("cargo:rustc-env=CLEF_TT_TTNN_SHIM={ttnn}");
}

/// A CPython the ttnn shim can embed.
struct Python {
    /// The interpreter as named (a venv's python keeps its environment).
    executable: String,
    /// "3.12" or "3.10".
    version: String,
    include: String,
    libdir: String,
    /// `python3.12` for `-lpython3.12`.
    lib: String,
    pybind11: String,
}

/// What a candidate interpreter says of itself, one value a line.
const PROBE: &str = r#"
import sys, sysconfig
try:
    import pybind11
    pb = pybind11.get_include()
except Exception:
    pb = ""
print("%d.%d" % sys.version_info[:2])
print(sysconfig.get_paths()["include"])
print(sysconfig.get_config_var("LIBDIR") or "")
print(sysconfig.get_config_var("LDLIBRARY") or "")
print(pb)
"#;

fn probe(executable: &str) -> Result<Python, String> {
    let out = Command::new(executable)
        .args(["-c", PROBE])
        .output()
        .map_err(|e| format!("{executable}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{executable}: does not run"));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = text.lines().collect();
    let [version, include, libdir, ldlibrary, pybind11] = v[..] else {
        return Err(format!("{executable}: unexpected answer"));
    };
    if version != "3.12" && version != "3.10" {
        return Err(format!(
            "{executable}: CPython {version} (ttnn 0.81.1 has wheels for 3.12 and 3.10)"
        ));
    }
    if !Path::new(include).join("Python.h").is_file() {
        return Err(format!("{executable}: no Python.h in {include}"));
    }
    let shared = ldlibrary.ends_with(".so") || ldlibrary.contains(".so.");
    if !shared || !Path::new(libdir).join(ldlibrary).exists() {
        return Err(format!(
            "{executable}: no shared libpython ({libdir}/{ldlibrary})"
        ));
    }
    if pybind11.is_empty() {
        return Err(format!("{executable}: no pybind11 (pip install pybind11)"));
    }
    Ok(Python {
        executable: executable.to_string(),
        version: version.to_string(),
        include: include.to_string(),
        libdir: libdir.to_string(),
        lib: format!("python{version}"),
        pybind11: pybind11.to_string(),
    })
}

/// `CLEF_TT_PYTHON`, else `python3.12`, `python3.10` on PATH or under pyenv; the reasons the
/// candidates were refused otherwise.
fn find_python() -> Result<Python, String> {
    if let Ok(p) = std::env::var("CLEF_TT_PYTHON") {
        return probe(&p).map_err(|e| format!("CLEF_TT_PYTHON: {e}"));
    }
    let mut candidates = vec!["python3.12".to_string(), "python3.10".to_string()];
    let pyenv = std::env::var("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".pyenv")
        });
    for minor in ["3.12", "3.10"] {
        if let Ok(entries) = std::fs::read_dir(pyenv.join("versions")) {
            let mut found: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{minor}.")))
                })
                .map(|p| p.join("bin").join(format!("python{minor}")))
                .collect();
            found.sort();
            candidates.extend(found.into_iter().rev().map(|p| p.display().to_string()));
        }
    }
    let mut tried = Vec::new();
    for c in candidates {
        match probe(&c) {
            Ok(py) => return Ok(py),
            Err(e) => tried.push(e),
        }
    }
    Err(format!("tried {}", tried.join("; ")))
}

/// Compiles the bridge, links it with the core objects and libpython, and copies the op
/// package beside it; `None` (with a warning) when that fails.
fn build_ttnn_shim(
    cxx: &str,
    manifest: &Path,
    out_dir: &Path,
    target_dir: &Path,
    core: &[PathBuf],
    py: &Python,
) -> Option<PathBuf> {
    let defines = [
        format!("-DCLEF_TT_PY_VERSION=\"{}\"", py.version),
        format!("-DCLEF_TT_BUILD_PYTHON=\"{}\"", py.executable),
        format!("-I{}", py.include),
        format!("-I{}", py.pybind11),
    ];
    let bridge = compile(
        cxx,
        manifest,
        out_dir,
        &TTNN,
        &BRIDGE_FLAGS,
        &defines,
        "ttnn shim",
    )?;
    let lib = target_dir.join("libclef_tt_ttnn.so");
    let objects: Vec<PathBuf> = core.iter().chain(&bridge).cloned().collect();
    let libs = [
        format!("-L{}", py.libdir),
        format!("-l{}", py.lib),
        format!("-Wl,-rpath,{}", py.libdir),
        "-ldl".to_string(),
    ];
    if !link(cxx, &objects, &libs, out_dir, &lib, "ttnn shim") {
        return None;
    }
    if let Err(e) = copy_package(&manifest.join("shim").join(PACKAGE), target_dir) {
        println!("cargo:warning=ttnn shim not usable: copying its op package failed ({e})");
        return None;
    }
    Some(lib)
}

/// The op package's `.py` files (subpackages included) into `target_dir/clef_tt_ttnn/`,
/// replacing what was there.
fn copy_package(src: &Path, target_dir: &Path) -> std::io::Result<()> {
    let dst = target_dir.join("clef_tt_ttnn");
    if dst.exists() {
        std::fs::remove_dir_all(&dst)?;
    }
    copy_py_tree(src, &dst)
}

fn copy_py_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        if path.is_dir() && name != "__pycache__" {
            copy_py_tree(&path, &dst.join(name))?;
        } else if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, dst.join(name))?;
        }
    }
    Ok(())
}

/// Compiles `sources` (relative to `shim/`) in parallel; `None` (with a warning naming `what`)
/// when the compiler is missing or fails.
fn compile(
    cxx: &str,
    manifest: &Path,
    out_dir: &Path,
    sources: &[&str],
    flags: &[&str],
    extra: &[String],
    what: &str,
) -> Option<Vec<PathBuf>> {
    let shim = manifest.join("shim");
    let include = manifest.join("include");
    let mut jobs = Vec::new();
    let mut objects = Vec::new();
    for src in sources {
        let object = out_dir.join(src.replace('/', "_")).with_extension("o");
        let child = Command::new(cxx)
            .args(flags)
            .args(extra)
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(&shim)
            .arg("-c")
            .arg(shim.join(src))
            .arg("-o")
            .arg(&object)
            .stderr(std::process::Stdio::piped())
            .spawn();
        match child {
            Ok(c) => jobs.push((src, c)),
            Err(e) => {
                println!("cargo:warning={what} not built: cannot run the C++ compiler {cxx:?} ({e}); install g++ (Debian: apt install g++)");
                return None;
            }
        }
        objects.push(object);
    }
    let mut ok = true;
    for (src, child) in jobs {
        match child.wait_with_output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stderr);
                let first = text.lines().find(|l| l.contains("error")).unwrap_or("");
                println!("cargo:warning={what} not built: {cxx} failed on shim/{src}: {first}");
                ok = false;
            }
            Err(e) => {
                println!("cargo:warning={what} not built: {cxx} on shim/{src}: {e}");
                ok = false;
            }
        }
    }
    ok.then_some(objects)
}

/// Links `objects` into `lib`, exporting only the C ABI.
fn link(
    cxx: &str,
    objects: &[PathBuf],
    libs: &[String],
    out_dir: &Path,
    lib: &Path,
    what: &str,
) -> bool {
    let version_script = out_dir.join("clef_tt.map");
    if std::fs::write(&version_script, "{ global: clef_tt_*; local: *; };\n").is_err() {
        return false;
    }
    let status = Command::new(cxx)
        .arg("-shared")
        .args(objects)
        .args(libs)
        .arg(format!("-Wl,--version-script={}", version_script.display()))
        .arg("-Wl,--no-undefined")
        .arg("-o")
        .arg(lib)
        .status();
    match status {
        Ok(s) if s.success() => true,
        _ => {
            println!(
                "cargo:warning={what} not built: linking {} failed",
                lib.display()
            );
            false
        }
    }
}
