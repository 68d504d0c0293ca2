//! Loading a shim: stand-in libraries compiled here with the system C compiler — one of another
//! ABI version, one with the version but not the ops, one that is no shim at all — and files
//! that are no libraries are each refused with an error naming the path and the reason.

use clef_device::tt::{Shim, ShimError};
use std::path::{Path, PathBuf};
use std::process::Command;

fn stand_in(name: &str, source: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tt_loader");
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join(format!("{name}.c"));
    let so = dir.join(format!("lib{name}.so"));
    std::fs::write(&c, source).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

#[test]
fn a_shim_of_another_abi_version_is_refused_naming_both_versions() {
    let so = stand_in(
        "old_shim",
        "unsigned clef_tt_abi_version(void) { return 1; }\n",
    );
    match Shim::load(Some(&so)) {
        Err(ShimError::Version {
            found, expected, ..
        }) => {
            assert_eq!((found, expected), (1, clef_tt_abi::ABI_VERSION));
        }
        other => panic!("{other:?}"),
    }
    let text = Shim::load(Some(&so)).err().unwrap().to_string();
    assert!(
        text.contains("ABI version 1")
            && text.contains(&format!("needs version {}", clef_tt_abi::ABI_VERSION)),
        "{text}"
    );
}

#[test]
fn libraries_that_are_not_shims_are_refused() {
    let none = stand_in("not_a_shim", "int something_else(void) { return 0; }\n");
    let text = Shim::load(Some(&none)).err().unwrap().to_string();
    assert!(
        text.contains("is not a clef-tt shim") && text.contains("clef_tt_abi_version"),
        "{text}"
    );
    let partial = stand_in(
        "partial_shim",
        &format!(
            "unsigned clef_tt_abi_version(void) {{ return {}; }}\n",
            clef_tt_abi::ABI_VERSION
        ),
    );
    let text = Shim::load(Some(&partial)).err().unwrap().to_string();
    assert!(text.contains("is not a clef-tt shim"), "{text}");
    assert!(
        text.contains("clef_tt_"),
        "names the missing symbol: {text}"
    );
}

#[test]
fn missing_files_and_non_libraries_are_refused_with_the_path() {
    let missing = Path::new("/nonexistent/libclef_tt.so");
    let text = Shim::load(Some(missing)).err().unwrap().to_string();
    assert!(
        text.contains("/nonexistent/libclef_tt.so") && text.contains("no such file"),
        "{text}"
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tt_loader");
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("libjunk.so");
    std::fs::write(&junk, b"this is not an ELF file").unwrap();
    let text = Shim::load(Some(&junk)).err().unwrap().to_string();
    assert!(
        text.contains("cannot load the Tenstorrent shim") && text.contains("libjunk.so"),
        "{text}"
    );
}

#[test]
fn the_default_shim_is_the_ttnn_shim_this_build_made_else_the_host_shim() {
    let built = if clef_tt_abi::TTNN_SHIM.is_empty() {
        clef_tt_abi::HOST_SHIM
    } else {
        clef_tt_abi::TTNN_SHIM
    };
    assert_eq!(Shim::locate(None).unwrap(), Path::new(built));
    let shim = Shim::load(Some(Path::new(clef_tt_abi::HOST_SHIM))).unwrap();
    assert_eq!(shim.backend(), "host");
    assert_eq!(shim.version(), clef_tt_abi::ABI_VERSION);
    assert!(shim.describe().unwrap().contains("\"hardware\": \"host\""));
}
