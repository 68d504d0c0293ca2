//! Builds the host shim: the C ABI's shared C++ core (`shim/core`) with the host backend
//! (`shim/host`) as `libclef_tt_host.so` in the target directory (`target/<profile>/`), with the
//! system C++ compiler (`CXX`, else `c++`; Debian's g++), no network. Its path is compiled into
//! the crate (`tt_metal_sys::HOST_SHIM`) so `clef-tt --device tt` finds it by default.
//!
//! Without a C++ compiler the build goes on with a warning and `HOST_SHIM` is empty: clef-tt
//! still builds and serves on the CPU; `--device tt` then needs `--tt-shim`.
//!
//! Feature `tt` also builds the ttnn shim `libclef_tt.so` (the core with `shim/ttnn`) with
//! CMake (`shim/CMakeLists.txt`) against an installed tt-metal, into the same directory, where
//! `clef-tt --device tt` looks first. Without tt-metal the build stops with one message naming
//! what is missing and where it looked.

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
    println!("cargo:rerun-if-env-changed=TT_METAL_INSTALL_DIR");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    // OUT_DIR is target/<profile>/build/tt-metal-sys-<hash>/out.
    let target_dir = out_dir.ancestors().nth(3).map(Path::to_path_buf);
    let built = target_dir
        .as_ref()
        .and_then(|dir| build_host_shim(&manifest, &out_dir, dir));
    let path = built.map(|p| p.display().to_string()).unwrap_or_default();
    println!("cargo:rustc-env=CLEF_TT_HOST_SHIM={path}");
    if std::env::var_os("CARGO_FEATURE_TT").is_some() {
        let target_dir = target_dir.unwrap_or_else(|| out_dir.clone());
        if let Err(msg) = build_ttnn_shim(&manifest, &out_dir, &target_dir) {
            eprintln!("error: feature `tt`: {msg}");
            std::process::exit(1);
        }
    }
}

/// Where tt-metal is: a CMake install prefix holding the TT-NN package, or a built tree.
enum TtMetal {
    Prefix(PathBuf),
    Tree(PathBuf),
}

/// Prefixes searched for an installed tt-metal when no variable names one.
const PREFIXES: [&str; 3] = ["/usr/local", "/opt/tt-metal", "/opt/tenstorrent"];

fn has_ttnn_package(prefix: &Path) -> bool {
    ["lib/cmake/TT-NN", "lib64/cmake/TT-NN", "lib/cmake/tt-nn"]
        .iter()
        .any(|p| prefix.join(p).is_dir())
}

fn locate_tt_metal() -> Result<TtMetal, String> {
    let install = std::env::var_os("TT_METAL_INSTALL_DIR").map(PathBuf::from);
    let home = std::env::var_os("TT_METAL_HOME").map(PathBuf::from);
    let mut looked = Vec::new();
    match &install {
        Some(p) if has_ttnn_package(p) => return Ok(TtMetal::Prefix(p.clone())),
        Some(p) => looked.push(format!(
            "TT_METAL_INSTALL_DIR={} (no lib/cmake/TT-NN)",
            p.display()
        )),
        None => looked.push("TT_METAL_INSTALL_DIR (unset)".into()),
    }
    match &home {
        Some(p) if p.join("build/lib").is_dir() => return Ok(TtMetal::Tree(p.clone())),
        Some(p) => looked.push(format!(
            "TT_METAL_HOME={} (no build/lib: build tt-metal there first)",
            p.display()
        )),
        None => looked.push("TT_METAL_HOME (unset)".into()),
    }
    for p in PREFIXES {
        if has_ttnn_package(Path::new(p)) {
            return Ok(TtMetal::Prefix(PathBuf::from(p)));
        }
    }
    looked.push(format!(
        "the CMake package TT-NN under {}",
        PREFIXES.join(", ")
    ));
    Err(format!(
        "the ttnn shim needs an installed tt-metal (ttnn 0.81.x, C++ headers and _ttnncpp.so), and none was found; looked at {}. See ffi/BRINGUP.md; `cargo build` without the feature still builds the host shim",
        looked.join("; ")
    ))
}

/// Configures, builds and installs `libclef_tt.so` into `target_dir` with CMake.
fn build_ttnn_shim(manifest: &Path, out_dir: &Path, target_dir: &Path) -> Result<(), String> {
    let tt = locate_tt_metal()?;
    let build = out_dir.join("ttnn-shim");
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(manifest.join("shim"))
        .arg("-B")
        .arg(&build)
        .arg("-DCMAKE_BUILD_TYPE=Release")
        .arg(format!("-DCLEF_TT_INSTALL_DIR={}", target_dir.display()));
    match &tt {
        TtMetal::Prefix(p) => configure.arg(format!("-DCMAKE_PREFIX_PATH={}", p.display())),
        TtMetal::Tree(p) => configure.env("TT_METAL_HOME", p),
    };
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("{what} failed ({s})")),
            Err(e) => Err(format!("{what}: cannot run cmake ({e}); install cmake")),
        }
    };
    run(&mut configure, "configuring shim/CMakeLists.txt")?;
    run(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--parallel", "2"]),
        "building the ttnn shim",
    )?;
    run(
        Command::new("cmake").arg("--install").arg(&build),
        "installing libclef_tt.so",
    )
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
