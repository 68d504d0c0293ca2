//! The CPU mesh's `MeshOps`, one module per op family; `cpu/mod.rs` forwards each trait
//! method here. The kernels they call (and their ISA variants) live beside, in `cpu/`.

pub(super) mod attention;
pub(super) mod deltanet;
pub(super) mod dense;
pub(super) mod norms;
pub(super) mod pointwise;
pub(super) mod positions;
pub(super) mod storage;
