//! `tt-metal-sys`: the C ABI clef-tt's Tenstorrent shim implements (`include/clef_tt.h`).
//!
//! Today this crate carries the header and its version only: the shim is loaded at run time
//! (so clef-tt builds and runs without tt-metal) and its Rust bindings will be generated from
//! the header with bindgen when the `tt` feature builds the shim.

/// The ABI version this build of clef-tt expects from the shim.
pub const ABI_VERSION: u32 = 1;

/// The header text, for tools that generate bindings or check the version.
pub const HEADER: &str = include_str!("../include/clef_tt.h");

#[cfg(test)]
mod tests {
    #[test]
    fn the_header_declares_the_same_abi_version() {
        let line = format!("#define CLEF_TT_ABI_VERSION {}", super::ABI_VERSION);
        assert!(super::HEADER.contains(&line));
    }
}
