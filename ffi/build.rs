//! Builds nothing unless feature `tt` is on: the C++ shim over ttnn needs a tt-metal install
//! (headers at its release tag, `_ttnncpp.so`, `libtt_metal.so`), which only Tenstorrent hosts
//! have. With the feature on, the missing shim source is reported instead of a silent no-op.

fn main() {
    println!("cargo:rerun-if-changed=include/clef_tt.h");
    println!("cargo:rerun-if-env-changed=TT_METAL_HOME");
    if std::env::var_os("CARGO_FEATURE_TT").is_some() {
        match std::env::var("TT_METAL_HOME") {
            Ok(home) => println!(
                "cargo:warning=feature `tt`: the C++ shim is not written yet; TT_METAL_HOME={home} is unused"
            ),
            Err(_) => println!("cargo:warning=feature `tt` needs TT_METAL_HOME (a built tt-metal tree)"),
        }
    }
}
