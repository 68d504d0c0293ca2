//! `clef-device`: the device layer of clef-tt.
//!
//! A [`MeshShape`] names the devices a worker owns (1x1, 1x2, or a 1x2 submesh of a 1x4 parent).
//! Activations live in mesh tensors (replicated, sharded per device, or per-device partial sums);
//! weights are uploaded already split per device. The [`MeshOps`] trait lists the operations a
//! Qwen3.5 prefill needs at the granularity of ttnn ops; the backbone is written once against it.
//! [`cpu::CpuMesh`] is the reference backend: every shard is host memory, one rayon task per
//! device, collectives are real reductions between shards. [`tt::TtMesh`] drives a Tenstorrent
//! mesh through the C ABI of a shim library loaded at run time (the host shim in CI).
//! [`select`] is the backend a run chose and where its workers' meshes sit.

pub mod cpu;
mod error;
pub mod fine_call;
mod fine_ops;
pub mod formats;
mod host;
mod mesh;
pub mod numerics;
mod ops;
mod pass;
pub mod plan;
pub mod select;
pub mod tt;

pub use error::DeviceError;
pub use host::{
    HostTensor, HostWeight, SharedBytes, WeightBytes, WeightData, WeightFormat, WeightKind,
};
pub use mesh::MeshShape;
pub use numerics::{Fidelity, Held, Kept, Numerics};
pub use ops::{
    AttentionLayer, AttentionSpec, BatchedLayer, DeltaNetLayer, DeltaNetSpec, DeviceUsage,
    GatherAxis, Gelu, MeshOps, MlpLayer, RopeSpec, RowBatch, RuntimeCalls,
};
pub use pass::{PassLayer, PassMixer, PassOutput, PassStats, PrefillPass};

/// Result type of the device layer.
pub type Result<T> = std::result::Result<T, DeviceError>;
