//! The CPU backend: every device shard is host memory, ops run one rayon task per device, and
//! collectives are real reductions between the shards. This is the numerical reference of
//! clef-tt and the backend of tests, CI and small deployments.
//!
//! Layout: this module holds the tensor and weight types and implements `MeshOps`: the fine
//! ops through `fine_op`, which runs the kernel of the op's family in `ops/` (dense, norms,
//! pointwise, positions, attention, deltanet), the rest forwarded to `ops/` (storage, row
//! slicing). The kernels those call sit beside, one module per family, each with its ISA
//! paths, chosen once per process by [`isa`]: `matmul/` (packed panels: `avx512.rs`,
//! `avx2.rs`, portable `gemm`; the small dense products of attention and the delta rule too),
//! `exp.rs` (one loop built for AVX-512, AVX2 and portable code), `attention.rs` and
//! `delta_rule.rs` (their products through `matmul::small_matmul`, their `exp` through
//! `exp.rs`), `activations.rs`, `peak.rs` (the FMA-peak probe for AVX-512 and AVX2).

mod activations;
mod attention;
pub mod delta_rule;
mod denormals;
pub mod exp;
pub mod isa;
pub mod matmul;
mod ops;
mod peak;
mod profile;
pub use peak::fma_peak_gflops;

use crate::fine_call::FineCall;
use crate::{
    DeviceError, GatherAxis, HostTensor, HostWeight, MeshOps, MeshShape, Result, WeightBytes,
    WeightFormat, WeightKind,
};
use matmul::PackedWeight;
use ops::{dense, storage};
use rayon::prelude::*;

/// Where a tensor's shards stand relative to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Replicated,
    Sharded,
    Partial,
}

impl Placement {
    fn name(&self) -> &'static str {
        match self {
            Placement::Replicated => "replicated",
            Placement::Sharded => "sharded",
            Placement::Partial => "partial",
        }
    }
}

/// A mesh tensor on the CPU: one host matrix per device.
#[derive(Clone, Debug)]
pub struct CpuTensor {
    pub placement: Placement,
    pub shards: Vec<HostTensor>,
}

/// One device's part of a weight.
enum CpuWeightPart {
    /// Packed for [`matmul::linear`].
    Matrix(PackedWeight),
    /// Plain f32 values.
    Vector(Vec<f32>),
}

/// A weight on the CPU: one part per device.
pub struct CpuWeight {
    parts: Vec<CpuWeightPart>,
}

impl CpuWeight {
    /// Device `d`'s part of a matrix weight.
    pub fn matrix(&self, d: usize) -> Option<&matmul::PackedWeight> {
        match self.parts.get(d) {
            Some(CpuWeightPart::Matrix(m)) => Some(m),
            _ => None,
        }
    }
}

/// A CPU mesh of `shape.devices()` simulated devices.
#[derive(Clone, Debug)]
pub struct CpuMesh {
    shape: MeshShape,
    profile: Option<std::sync::Arc<profile::OpProfile>>,
    numerics: matmul::Numerics,
}

impl CpuMesh {
    pub fn new(shape: MeshShape) -> Self {
        CpuMesh {
            shape,
            profile: None,
            numerics: matmul::Numerics::default(),
        }
    }

    /// A mesh that adds up the wall time of every op (`CpuMesh::profile_report` reads it).
    pub fn with_profile(shape: MeshShape) -> Self {
        CpuMesh {
            profile: Some(Default::default()),
            ..CpuMesh::new(shape)
        }
    }

    /// Imitate the device's matrix engine in every `linear` (see [`matmul::Numerics`]).
    pub fn with_numerics(self, numerics: matmul::Numerics) -> Self {
        CpuMesh { numerics, ..self }
    }

    pub fn numerics(&self) -> matmul::Numerics {
        self.numerics
    }

    /// Seconds per op since the mesh was made, largest first (empty without profiling).
    pub fn profile_report(&self) -> Vec<(&'static str, f64, u64)> {
        self.profile
            .as_ref()
            .map(|p| p.report())
            .unwrap_or_default()
    }

    fn timer(&self, op: &'static str) -> Option<profile::Timer<'_>> {
        self.profile.as_deref().map(|p| p.start(op))
    }

    fn devices(&self) -> usize {
        self.shape.devices()
    }

    /// Run `f` on every device's shard (one rayon task per device).
    fn per_device<T: Send>(&self, f: impl Fn(usize) -> Result<T> + Sync + Send) -> Result<Vec<T>> {
        if self.devices() == 1 {
            return Ok(vec![f(0)?]);
        }
        (0..self.devices()).into_par_iter().map(f).collect()
    }

    /// A result whose placement follows the input's (partial sums stay partial only for linear).
    fn elementwise(
        &self,
        op: &'static str,
        inputs: &[&CpuTensor],
        f: impl Fn(usize, &[&HostTensor]) -> Result<HostTensor> + Sync + Send,
    ) -> Result<CpuTensor> {
        let placement = inputs[0].placement;
        for t in inputs {
            if t.placement == Placement::Partial {
                return Err(layout(op, "complete", t.placement));
            }
            if t.shards.len() != self.devices() {
                return Err(DeviceError::Parts {
                    op,
                    got: t.shards.len(),
                    devices: self.devices(),
                });
            }
        }
        let placement = if inputs.iter().any(|t| t.placement == Placement::Sharded) {
            Placement::Sharded
        } else {
            placement
        };
        let shards = self.per_device(|d| {
            let parts: Vec<&HostTensor> = inputs.iter().map(|t| &t.shards[d]).collect();
            f(d, &parts)
        })?;
        Ok(CpuTensor { placement, shards })
    }

    fn same_shape(op: &'static str, a: &HostTensor, b: &HostTensor) -> Result<()> {
        if a.rows != b.rows || a.cols != b.cols {
            return Err(shape(
                op,
                format!("{}x{} vs {}x{}", a.rows, a.cols, b.rows, b.cols),
            ));
        }
        Ok(())
    }

    fn vector<'a>(op: &'static str, w: &'a CpuWeight, d: usize, len: usize) -> Result<&'a [f32]> {
        match &w.parts[d] {
            CpuWeightPart::Vector(v) if v.len() == len => Ok(v),
            CpuWeightPart::Vector(v) => Err(shape(
                op,
                format!("weight of {} values, expected {len}", v.len()),
            )),
            CpuWeightPart::Matrix(_) => Err(shape(op, "a matrix weight used as a vector".into())),
        }
    }
}

/// Elements per rayon task in row-wise elementwise ops.
const ROW_BLOCK: usize = 1 << 14;

fn shape(op: &'static str, detail: String) -> DeviceError {
    DeviceError::Shape { op, detail }
}

fn layout(op: &'static str, expected: &'static str, got: Placement) -> DeviceError {
    DeviceError::Layout {
        op,
        expected,
        got: got.name(),
    }
}

impl MeshOps for CpuMesh {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;

    fn mesh(&self) -> MeshShape {
        self.shape
    }

    fn replicate(&self, host: &HostTensor) -> Result<CpuTensor> {
        storage::replicate(self, host)
    }

    fn shard(&self, parts: Vec<HostTensor>) -> Result<CpuTensor> {
        storage::shard(self, parts)
    }

    fn gather(&self, t: &CpuTensor, axis: GatherAxis) -> Result<HostTensor> {
        storage::gather(self, t, axis)
    }

    fn device_parts(&self, t: &CpuTensor) -> Result<Vec<HostTensor>> {
        storage::device_parts(self, t)
    }

    fn tensor_bytes(&self, t: &CpuTensor) -> usize {
        storage::tensor_bytes(self, t)
    }

    fn upload_weight(
        &self,
        parts: Vec<HostWeight>,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<CpuWeight> {
        storage::upload_weight(self, parts, format, kind)
    }

    fn backend_name(&self) -> &'static str {
        "cpu"
    }

    fn export_weight(&self, w: &CpuWeight) -> Result<Vec<WeightBytes>> {
        storage::export_weight(self, w)
    }

    fn import_weight(&self, parts: Vec<WeightBytes>) -> Result<CpuWeight> {
        storage::import_weight(self, parts)
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        storage::weight_bytes(self, w)
    }

    /// Every fine op: its family's kernel for the call (ops/mod.rs).
    fn fine_op(&self, call: &FineCall<'_, CpuTensor, CpuWeight>) -> Result<Vec<CpuTensor>> {
        ops::run(self, call)
    }

    fn packs_rows(&self) -> bool {
        true
    }

    fn slice_rows(&self, x: &CpuTensor, rows: std::ops::Range<usize>) -> Result<CpuTensor> {
        dense::slice_rows(self, x, rows)
    }

    fn concat_rows(&self, parts: &[CpuTensor]) -> Result<CpuTensor> {
        dense::concat_rows(self, parts)
    }
}
