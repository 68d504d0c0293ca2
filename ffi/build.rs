//! Builds the host shim: the C ABI's shared C++ core (`shim/core`) with the host backend
//! (`shim/host`) as `libclef_tt_host.so` in the target directory (`target/<profile>/`), with the
//! system C++ compiler (`CXX`, else `c++`; Debian's g++), no network. Its path is compiled into
//! the crate (`tt_metal_sys::HOST_SHIM`) so `clef-tt --device tt` finds it by default.
//!
//! Without a C++ compiler the build goes on with a warning and `HOST_SHIM` is empty: clef-tt
//! still builds and serves on the CPU; `--device tt` then needs `--tt-shim`.
//!
//! Feature `tt` (the ttnn backend) needs a tt-metal install and is not part of this build yet.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Sources of the host shim, relative to `shim/`.
const SOURCES: [&str; 8] = [
    "core/abi_library.cpp",
    "core/abi_ops.cpp",
    "core/call.cpp",
    "core/handles.cpp",
    "core/rope.cpp",
    "host/host_backend.cpp",
    "host/math.cpp",
    "host/tiles.cpp",
];

/// The host shim is built for the machine that builds it (`-march=native`: it is a test and
/// bring-up backend, not a redistributable); `-ffp-contract=off` keeps its roundings the same
/// on every CPU (no fused multiply-adds), so only its speed depends on the machine.
const FLAGS: [&str; 9] = [
    "-std=c++20",
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-fno-strict-aliasing",
    "-g1",
];

fn main() {
    println!("cargo:rerun-if-changed=include/clef_tt.h");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-env-changed=CXX");
    println!("cargo:rerun-if-env-changed=TT_METAL_HOME");
    if std::env::var_os("CARGO_FEATURE_TT").is_some() {
        println!(
            "cargo:warning=feature `tt`: the ttnn backend of the shim is not part of this build yet; only the host shim is built"
        );
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    // OUT_DIR is target/<profile>/build/tt-metal-sys-<hash>/out.
    let target_dir = out_dir.ancestors().nth(3).map(Path::to_path_buf);
    let built = target_dir.and_then(|dir| build_host_shim(&manifest, &out_dir, &dir));
    let path = built.map(|p| p.display().to_string()).unwrap_or_default();
    println!("cargo:rustc-env=CLEF_TT_HOST_SHIM={path}");
}

/// Compiles and links the host shim; `None` (with a warning) when that is not possible.
fn build_host_shim(manifest: &Path, out_dir: &Path, target_dir: &Path) -> Option<PathBuf> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let shim = manifest.join("shim");
    let include = manifest.join("include");
    let mut jobs = Vec::new();
    let mut objects = Vec::new();
    for src in SOURCES {
        let object = out_dir.join(src.replace('/', "_")).with_extension("o");
        let child = Command::new(&cxx)
            .args(FLAGS)
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(&shim)
            .arg("-c")
            .arg(shim.join(src))
            .arg("-o")
            .arg(&object)
            .spawn();
        match child {
            Ok(c) => jobs.push((src, c)),
            Err(e) => {
                println!("cargo:warning=host shim not built: cannot run the C++ compiler {cxx:?} ({e}); install g++ (Debian: apt install g++) for --device tt");
                return None;
            }
        }
        objects.push(object);
    }
    let mut ok = true;
    for (src, child) in jobs {
        match child.wait_with_output() {
            Ok(out) if out.status.success() => {}
            Ok(_) | Err(_) => {
                println!("cargo:warning=host shim not built: {cxx} failed on shim/{src}");
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    // Only the C ABI is exported.
    let version_script = out_dir.join("clef_tt.map");
    std::fs::write(&version_script, "{ global: clef_tt_*; local: *; };\n").ok()?;
    let lib = target_dir.join("libclef_tt_host.so");
    let status = Command::new(&cxx)
        .arg("-shared")
        .args(&objects)
        .arg(format!("-Wl,--version-script={}", version_script.display()))
        .arg("-Wl,--no-undefined")
        .arg("-o")
        .arg(&lib)
        .status();
    match status {
        Ok(s) if s.success() => Some(lib),
        _ => {
            println!(
                "cargo:warning=host shim not built: linking {} failed",
                lib.display()
            );
            None
        }
    }
}
