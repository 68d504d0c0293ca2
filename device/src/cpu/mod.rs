//! The CPU backend: every device shard is host memory, ops run one rayon task per device, and
//! collectives are real reductions between the shards. This is the numerical reference of
//! clef-tt and the backend of tests, CI and small deployments.

mod activations;
mod attention;
pub mod delta_rule;
mod denormals;
pub mod exp;
pub mod matmul;
mod peak;
mod profile;
pub use peak::fma_peak_gflops;

use crate::{
    AttentionSpec, DeltaNetSpec, DeviceError, GatherAxis, Gelu, HostTensor, HostWeight, MeshOps,
    MeshShape, Result, RopeSpec, SharedBytes, WeightBytes, WeightFormat, WeightKind,
};
use activations::{gelu_erf, gelu_tanh_in_place, sigmoid, silu, softplus};
use matmul::PackedWeight;
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
        Ok(CpuTensor {
            placement: Placement::Replicated,
            shards: vec![host.clone(); self.devices()],
        })
    }

    fn shard(&self, parts: Vec<HostTensor>) -> Result<CpuTensor> {
        if parts.len() != self.devices() {
            return Err(DeviceError::Parts {
                op: "shard",
                got: parts.len(),
                devices: self.devices(),
            });
        }
        Ok(CpuTensor {
            placement: Placement::Sharded,
            shards: parts,
        })
    }

    fn gather(&self, t: &CpuTensor, axis: GatherAxis) -> Result<HostTensor> {
        match t.placement {
            Placement::Replicated => Ok(t.shards[0].clone()),
            Placement::Partial => Ok(self.all_reduce(t)?.shards[0].clone()),
            Placement::Sharded => match axis {
                GatherAxis::Rows => {
                    let cols = t.shards[0].cols;
                    if t.shards.iter().any(|s| s.cols != cols) {
                        return Err(shape("gather", "shards of different widths".into()));
                    }
                    let rows = t.shards.iter().map(|s| s.rows).sum();
                    let data = t
                        .shards
                        .iter()
                        .flat_map(|s| s.data.iter().copied())
                        .collect();
                    Ok(HostTensor::new(rows, cols, data))
                }
                GatherAxis::Cols => {
                    let rows = t.shards[0].rows;
                    if t.shards.iter().any(|s| s.rows != rows) {
                        return Err(shape("gather", "shards of different heights".into()));
                    }
                    let cols: usize = t.shards.iter().map(|s| s.cols).sum();
                    let mut data = Vec::with_capacity(rows * cols);
                    for r in 0..rows {
                        for s in &t.shards {
                            data.extend_from_slice(s.row(r));
                        }
                    }
                    Ok(HostTensor::new(rows, cols, data))
                }
            },
        }
    }

    fn device_parts(&self, t: &CpuTensor) -> Result<Vec<HostTensor>> {
        Ok(t.shards.clone())
    }

    fn tensor_bytes(&self, t: &CpuTensor) -> usize {
        t.shards.iter().map(|s| s.data.len() * 4).sum()
    }

    fn upload_weight(
        &self,
        parts: Vec<HostWeight>,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<CpuWeight> {
        if parts.len() != self.devices() {
            return Err(DeviceError::Parts {
                op: "upload_weight",
                got: parts.len(),
                devices: self.devices(),
            });
        }
        let parts = parts
            .into_par_iter()
            .map(|p| match kind {
                WeightKind::Matrix => CpuWeightPart::Matrix(PackedWeight::pack(&p, format)),
                WeightKind::Vector => CpuWeightPart::Vector(p.to_f32()),
            })
            .collect();
        Ok(CpuWeight { parts })
    }

    fn backend_name(&self) -> &'static str {
        "cpu"
    }

    fn export_weight(&self, w: &CpuWeight) -> Result<Vec<WeightBytes>> {
        Ok(w.parts
            .iter()
            .map(|p| match p {
                CpuWeightPart::Matrix(m) => WeightBytes {
                    kind: WeightKind::Matrix,
                    format: m.format(),
                    rows: m.n,
                    cols: m.k,
                    data: SharedBytes::owned(m.to_bytes()),
                },
                CpuWeightPart::Vector(v) => WeightBytes {
                    kind: WeightKind::Vector,
                    format: WeightFormat::F32,
                    rows: v.len(),
                    cols: 1,
                    data: SharedBytes::owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                },
            })
            .collect())
    }

    fn import_weight(&self, parts: Vec<WeightBytes>) -> Result<CpuWeight> {
        if parts.len() != self.devices() {
            return Err(DeviceError::Parts {
                op: "import_weight",
                got: parts.len(),
                devices: self.devices(),
            });
        }
        let parts = parts
            .into_par_iter()
            .map(|p| {
                let bad = || {
                    shape(
                        "import_weight",
                        format!(
                            "{} bytes do not hold a {}x{} {} {:?}",
                            p.data.len(),
                            p.rows,
                            p.cols,
                            p.format.name(),
                            p.kind
                        ),
                    )
                };
                match p.kind {
                    WeightKind::Matrix => {
                        PackedWeight::from_bytes(p.rows, p.cols, p.format, p.data.clone())
                            .map(CpuWeightPart::Matrix)
                            .ok_or_else(bad)
                    }
                    WeightKind::Vector if p.data.len() == p.rows * 4 => Ok(CpuWeightPart::Vector(
                        p.data
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    )),
                    WeightKind::Vector => Err(bad()),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuWeight { parts })
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.parts
            .iter()
            .map(|p| match p {
                CpuWeightPart::Matrix(m) => m.bytes(),
                CpuWeightPart::Vector(v) => v.len() * 4,
            })
            .sum()
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
        let _t = self.timer("linear");
        let placement = match x.placement {
            Placement::Replicated => Placement::Sharded,
            Placement::Sharded => Placement::Partial,
            Placement::Partial => return Err(layout("linear", "complete", x.placement)),
        };
        // A replicated input against a replicated (1-device) plan stays replicated.
        let placement = if self.devices() == 1 && x.placement == Placement::Replicated {
            Placement::Replicated
        } else {
            placement
        };
        let shards = self.per_device(|d| {
            let xs = &x.shards[d];
            let CpuWeightPart::Matrix(wp) = &w.parts[d] else {
                return Err(shape("linear", "a vector weight used as a matrix".into()));
            };
            if xs.cols != wp.k {
                return Err(shape(
                    "linear",
                    format!("input width {} vs weight [{}, {}]", xs.cols, wp.n, wp.k),
                ));
            }
            Ok(HostTensor::new(
                xs.rows,
                wp.n,
                matmul::linear_with(&xs.data, xs.rows, wp, &self.numerics),
            ))
        })?;
        Ok(CpuTensor { placement, shards })
    }

    fn all_reduce(&self, x: &CpuTensor) -> Result<CpuTensor> {
        let _t = self.timer("all_reduce");
        match x.placement {
            Placement::Replicated => Ok(x.clone()),
            Placement::Sharded => Err(layout("all_reduce", "partial", x.placement)),
            Placement::Partial => {
                let first = &x.shards[0];
                let mut sum = first.clone();
                for s in &x.shards[1..] {
                    Self::same_shape("all_reduce", first, s)?;
                    sum.data.iter_mut().zip(&s.data).for_each(|(a, b)| *a += b);
                }
                self.replicate(&sum)
            }
        }
    }

    fn split_cols(&self, x: &CpuTensor, widths: &[usize]) -> Result<Vec<CpuTensor>> {
        let _t = self.timer("split_cols");
        if x.placement == Placement::Partial {
            return Err(layout("split_cols", "complete", x.placement));
        }
        let total: usize = widths.iter().sum();
        let mut outs: Vec<CpuTensor> = widths
            .iter()
            .map(|_| CpuTensor {
                placement: x.placement,
                shards: Vec::with_capacity(x.shards.len()),
            })
            .collect();
        for s in &x.shards {
            if s.cols != total {
                return Err(shape(
                    "split_cols",
                    format!("{} columns split as {widths:?}", s.cols),
                ));
            }
            let mut start = 0;
            for (out, &w) in outs.iter_mut().zip(widths) {
                let mut data = Vec::with_capacity(s.rows * w);
                for r in 0..s.rows {
                    data.extend_from_slice(&s.row(r)[start..start + w]);
                }
                out.shards.push(HostTensor::new(s.rows, w, data));
                start += w;
            }
        }
        Ok(outs)
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        let _t = self.timer("add");
        self.elementwise("add", &[a, b], |_, p| {
            Self::same_shape("add", p[0], p[1])?;
            let data = p[0]
                .data
                .iter()
                .zip(&p[1].data)
                .map(|(x, y)| x + y)
                .collect();
            Ok(HostTensor::new(p[0].rows, p[0].cols, data))
        })
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        group: usize,
        eps: f32,
        one_plus: bool,
    ) -> Result<CpuTensor> {
        let _t = self.timer("rms_norm");
        self.elementwise("rms_norm", &[x], |d, p| {
            let offset = if one_plus { 1.0 } else { 0.0 };
            let w: Vec<f32> = Self::vector("rms_norm", w, d, group)?
                .iter()
                .map(|v| v + offset)
                .collect();
            if group == 0 || !p[0].cols.is_multiple_of(group) {
                return Err(shape(
                    "rms_norm",
                    format!("{} columns in groups of {group}", p[0].cols),
                ));
            }
            let mut out = p[0].clone();
            out.data
                .par_chunks_mut(group * ROW_BLOCK.div_ceil(group).max(1))
                .for_each(|block| {
                    for g in block.chunks_mut(group) {
                        let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
                        let inv = 1.0 / (ms + eps).sqrt();
                        g.iter_mut().zip(&w).for_each(|(v, wv)| *v = *v * inv * wv);
                    }
                });
            Ok(out)
        })
    }

    fn swiglu(&self, gate_up: &CpuTensor) -> Result<CpuTensor> {
        let _t = self.timer("swiglu");
        self.elementwise("swiglu", &[gate_up], |_, p| {
            let s = p[0];
            if !s.cols.is_multiple_of(2) {
                return Err(shape(
                    "swiglu",
                    format!("{} columns are not [gate | up]", s.cols),
                ));
            }
            let half = s.cols / 2;
            let mut data = vec![0.0f32; s.rows * half];
            data.par_chunks_mut(half).enumerate().for_each(|(r, out)| {
                let row = s.row(r);
                for ((o, g), u) in out.iter_mut().zip(&row[..half]).zip(&row[half..]) {
                    *o = silu(*g) * u;
                }
            });
            Ok(HostTensor::new(s.rows, half, data))
        })
    }

    fn split_query_gate(
        &self,
        qg: &CpuTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<(CpuTensor, CpuTensor)> {
        let _t = self.timer("split_query_gate");
        let q = self.elementwise("split_query_gate", &[qg], |_, p| {
            pick_half(p[0], heads, head_dim, 0)
        })?;
        let g = self.elementwise("split_query_gate", &[qg], |_, p| {
            pick_half(p[0], heads, head_dim, 1)
        })?;
        Ok((q, g))
    }

    fn rope(&self, x: &CpuTensor, spec: &RopeSpec, positions: &[[u32; 3]]) -> Result<CpuTensor> {
        let _t = self.timer("rope");
        let half = spec.rotary_dim / 2;
        // Inverse frequencies in f32, as PyTorch computes them.
        let inv: Vec<f32> = (0..half)
            .map(|j| {
                let exponent = (2 * j) as f32 / spec.rotary_dim as f32;
                1.0 / (spec.theta as f32).powf(exponent)
            })
            .collect();
        let axis: Vec<usize> = (0..half)
            .map(|j| {
                if j % 3 == 1 && j < 3 * spec.mrope_section[1] {
                    1
                } else if j % 3 == 2 && j < 3 * spec.mrope_section[2] {
                    2
                } else {
                    0
                }
            })
            .collect();
        self.elementwise("rope", &[x], |_, p| {
            let s = p[0];
            if s.cols != spec.heads * spec.head_dim || s.rows != positions.len() {
                return Err(shape(
                    "rope",
                    format!(
                        "{}x{} for {} positions of {} heads x {}",
                        s.rows,
                        s.cols,
                        positions.len(),
                        spec.heads,
                        spec.head_dim
                    ),
                ));
            }
            let mut out = s.clone();
            let mut cos = vec![0.0f32; half];
            let mut sin = vec![0.0f32; half];
            for (r, pos) in positions.iter().enumerate() {
                for j in 0..half {
                    let angle = pos[axis[j]] as f32 * inv[j];
                    cos[j] = angle.cos();
                    sin[j] = angle.sin();
                }
                let row = &mut out.data[r * s.cols..(r + 1) * s.cols];
                for head in row.chunks_mut(spec.head_dim) {
                    for j in 0..half {
                        let (a, b) = (head[j], head[j + half]);
                        head[j] = a * cos[j] - b * sin[j];
                        head[j + half] = b * cos[j] + a * sin[j];
                    }
                }
            }
            Ok(out)
        })
    }

    fn append_rows(
        &self,
        cache: Option<&CpuTensor>,
        new: &CpuTensor,
        _heads: usize,
    ) -> Result<CpuTensor> {
        let _t = self.timer("append_rows");
        let Some(cache) = cache else {
            return Ok(new.clone());
        };
        self.elementwise("append_rows", &[cache, new], |_, p| {
            if p[0].cols != p[1].cols {
                return Err(shape(
                    "append_rows",
                    format!("{} vs {} columns", p[0].cols, p[1].cols),
                ));
            }
            let mut data = Vec::with_capacity(p[0].data.len() + p[1].data.len());
            data.extend_from_slice(&p[0].data);
            data.extend_from_slice(&p[1].data);
            Ok(HostTensor::new(p[0].rows + p[1].rows, p[0].cols, data))
        })
    }

    fn causal_attention(
        &self,
        q: &CpuTensor,
        keys: &CpuTensor,
        values: &CpuTensor,
        spec: &AttentionSpec,
    ) -> Result<CpuTensor> {
        let _t = self.timer("causal_attention");
        self.elementwise("causal_attention", &[q, keys, values], |_, p| {
            let (q, k, v) = (p[0], p[1], p[2]);
            let kvw = spec.kv_heads * spec.head_dim;
            if q.cols != spec.heads * spec.head_dim
                || k.cols != kvw
                || v.cols != kvw
                || k.rows != v.rows
                || k.rows < q.rows
                || spec.kv_heads == 0
                || !spec.heads.is_multiple_of(spec.kv_heads)
            {
                return Err(shape(
                    "causal_attention",
                    format!(
                        "q {}x{}, k {}x{}, v {}x{}",
                        q.rows, q.cols, k.rows, k.cols, v.rows, v.cols
                    ),
                ));
            }
            let out = attention::causal(&q.data, &k.data, &v.data, k.rows, spec);
            Ok(HostTensor::new(q.rows, q.cols, out))
        })
    }

    fn mul_sigmoid(&self, x: &CpuTensor, gate: &CpuTensor) -> Result<CpuTensor> {
        let _t = self.timer("mul_sigmoid");
        self.elementwise("mul_sigmoid", &[x, gate], |_, p| {
            Self::same_shape("mul_sigmoid", p[0], p[1])?;
            let data = p[0]
                .data
                .iter()
                .zip(&p[1].data)
                .map(|(x, g)| x * sigmoid(*g))
                .collect();
            Ok(HostTensor::new(p[0].rows, p[0].cols, data))
        })
    }

    fn causal_conv1d_silu(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        carry: Option<&CpuTensor>,
        kernel: usize,
    ) -> Result<(CpuTensor, CpuTensor)> {
        let _t = self.timer("causal_conv1d_silu");
        let keep = kernel.saturating_sub(1);
        let pairs = self.per_device(|d| {
            let xs = &x.shards[d];
            let ch = xs.cols;
            let wv = Self::vector("causal_conv1d_silu", w, d, ch * kernel)?;
            let zeros = HostTensor::zeros(keep, ch);
            let prev = carry.map(|c| &c.shards[d]).unwrap_or(&zeros);
            if prev.rows != keep || prev.cols != ch {
                return Err(shape(
                    "causal_conv1d_silu",
                    format!("carry {}x{} for {keep}x{ch}", prev.rows, prev.cols),
                ));
            }
            // The input extended in time by the carried rows.
            let ext = |t: usize| -> &[f32] {
                if t < keep {
                    prev.row(t)
                } else {
                    xs.row(t - keep)
                }
            };
            // Taps transposed to [kernel, channels] so the inner loop runs along channels.
            let taps: Vec<f32> = (0..kernel)
                .flat_map(|j| (0..ch).map(move |c| (c, j)))
                .map(|(c, j)| wv[c * kernel + j])
                .collect();
            let mut out = vec![0.0f32; xs.rows * ch];
            out.par_chunks_mut(ch).enumerate().for_each(|(t, o)| {
                for j in 0..kernel {
                    let src = ext(t + j);
                    let tap = &taps[j * ch..(j + 1) * ch];
                    for ((oc, xc), w) in o.iter_mut().zip(src).zip(tap) {
                        *oc += w * xc;
                    }
                }
                o.iter_mut().for_each(|v| *v = silu(*v));
            });
            let total = keep + xs.rows;
            let mut next = Vec::with_capacity(keep * ch);
            for t in total - keep..total {
                next.extend_from_slice(ext(t));
            }
            Ok((
                HostTensor::new(xs.rows, ch, out),
                HostTensor::new(keep, ch, next),
            ))
        })?;
        let (outs, carries): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        let placement = if x.placement == Placement::Replicated && self.devices() == 1 {
            Placement::Replicated
        } else {
            Placement::Sharded
        };
        Ok((
            CpuTensor {
                placement,
                shards: outs,
            },
            CpuTensor {
                placement,
                shards: carries,
            },
        ))
    }

    fn delta_gates(
        &self,
        a: &CpuTensor,
        b: &CpuTensor,
        a_log: &CpuWeight,
        dt_bias: &CpuWeight,
    ) -> Result<(CpuTensor, CpuTensor)> {
        let _t = self.timer("delta_gates");
        let g = self.elementwise("delta_gates", &[a], |d, p| {
            let nv = p[0].cols;
            let alog = Self::vector("delta_gates", a_log, d, nv)?;
            let bias = Self::vector("delta_gates", dt_bias, d, nv)?;
            let mut out = p[0].clone();
            for row in out.data.chunks_mut(nv) {
                for (h, v) in row.iter_mut().enumerate() {
                    *v = -alog[h].exp() * softplus(*v + bias[h]);
                }
            }
            Ok(out)
        })?;
        let beta = self.elementwise("delta_gates", &[b], |_, p| {
            let mut out = p[0].clone();
            out.data.iter_mut().for_each(|v| *v = sigmoid(*v));
            Ok(out)
        })?;
        Ok((g, beta))
    }

    fn gated_delta_rule(
        &self,
        qkv: &CpuTensor,
        g: &CpuTensor,
        beta: &CpuTensor,
        state: Option<&CpuTensor>,
        spec: &DeltaNetSpec,
    ) -> Result<(CpuTensor, CpuTensor)> {
        let _t = self.timer("gated_delta_rule");
        let pairs = self.per_device(|d| {
            delta_rule_device(
                &qkv.shards[d],
                &g.shards[d],
                &beta.shards[d],
                state.map(|s| &s.shards[d]),
                spec,
            )
        })?;
        let (outs, states): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        let placement = if self.devices() == 1 {
            qkv.placement
        } else {
            Placement::Sharded
        };
        Ok((
            CpuTensor {
                placement,
                shards: outs,
            },
            CpuTensor {
                placement,
                shards: states,
            },
        ))
    }

    fn gated_rms_norm(
        &self,
        x: &CpuTensor,
        z: &CpuTensor,
        w: &CpuWeight,
        group: usize,
        eps: f32,
    ) -> Result<CpuTensor> {
        let _t = self.timer("gated_rms_norm");
        self.elementwise("gated_rms_norm", &[x, z], |d, p| {
            Self::same_shape("gated_rms_norm", p[0], p[1])?;
            let w = Self::vector("gated_rms_norm", w, d, group)?;
            if group == 0 || !p[0].cols.is_multiple_of(group) {
                return Err(shape(
                    "gated_rms_norm",
                    format!("{} columns in groups of {group}", p[0].cols),
                ));
            }
            let mut out = p[0].clone();
            let block = group * ROW_BLOCK.div_ceil(group).max(1);
            out.data
                .par_chunks_mut(block)
                .zip(p[1].data.par_chunks(block))
                .for_each(|(xb, zb)| {
                    for (g, zg) in xb.chunks_mut(group).zip(zb.chunks(group)) {
                        let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
                        let inv = 1.0 / (ms + eps).sqrt();
                        for ((v, wv), zv) in g.iter_mut().zip(w).zip(zg) {
                            *v = wv * (*v * inv) * silu(*zv);
                        }
                    }
                });
            Ok(out)
        })
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        b: &CpuWeight,
        eps: f32,
    ) -> Result<CpuTensor> {
        let _t = self.timer("layer_norm");
        self.elementwise("layer_norm", &[x], |d, p| {
            let n = p[0].cols;
            let (w, b) = (
                Self::vector("layer_norm", w, d, n)?,
                Self::vector("layer_norm", b, d, n)?,
            );
            let mut out = p[0].clone();
            out.data
                .par_chunks_mut(n * ROW_BLOCK.div_ceil(n.max(1)).max(1))
                .for_each(|block| {
                    for row in block.chunks_mut(n) {
                        let mean = row.iter().sum::<f32>() / n as f32;
                        let var =
                            row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                        let inv = 1.0 / (var + eps).sqrt();
                        for ((v, wv), bv) in row.iter_mut().zip(w).zip(b) {
                            *v = (*v - mean) * inv * wv + bv;
                        }
                    }
                });
            Ok(out)
        })
    }

    fn add_bias(&self, x: &CpuTensor, b: &CpuWeight) -> Result<CpuTensor> {
        let _t = self.timer("add_bias");
        self.elementwise("add_bias", &[x], |d, p| {
            let n = p[0].cols;
            let b = Self::vector("add_bias", b, d, n)?;
            let mut out = p[0].clone();
            out.data.par_chunks_mut(n.max(1)).for_each(|row| {
                row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
            });
            Ok(out)
        })
    }

    fn gelu(&self, x: &CpuTensor, kind: Gelu) -> Result<CpuTensor> {
        let _t = self.timer("gelu");
        self.elementwise("gelu", &[x], |_, p| {
            let mut out = p[0].clone();
            out.data.par_chunks_mut(ROW_BLOCK).for_each(|c| match kind {
                Gelu::Tanh => gelu_tanh_in_place(c),
                Gelu::Erf => c.iter_mut().for_each(|v| *v = gelu_erf(*v)),
            });
            Ok(out)
        })
    }

    fn rotary(
        &self,
        x: &CpuTensor,
        cos: &CpuTensor,
        sin: &CpuTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<CpuTensor> {
        let _t = self.timer("rotary");
        if cos.placement != Placement::Replicated || sin.placement != Placement::Replicated {
            return Err(layout("rotary", "replicated tables", cos.placement));
        }
        self.elementwise("rotary", &[x], |d, p| {
            let (s, cos, sin) = (p[0], &cos.shards[d], &sin.shards[d]);
            if s.cols != heads * head_dim
                || !head_dim.is_multiple_of(2)
                || cos.rows != s.rows
                || cos.cols != head_dim
                || sin.rows != s.rows
                || sin.cols != head_dim
            {
                return Err(shape(
                    "rotary",
                    format!(
                        "{}x{} for {heads} heads x {head_dim} with tables {}x{}",
                        s.rows, s.cols, cos.rows, cos.cols
                    ),
                ));
            }
            let half = head_dim / 2;
            let mut out = s.clone();
            out.data
                .par_chunks_mut(s.cols.max(1))
                .enumerate()
                .for_each(|(r, row)| {
                    let (c, sn) = (cos.row(r), sin.row(r));
                    for head in row.chunks_mut(head_dim) {
                        for j in 0..half {
                            let (a, b) = (head[j], head[j + half]);
                            head[j] = a * c[j] - b * sn[j];
                            head[j + half] = b * c[j + half] + a * sn[j + half];
                        }
                    }
                });
            Ok(out)
        })
    }

    fn segment_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        heads: usize,
        head_dim: usize,
        segments: &[std::ops::Range<usize>],
    ) -> Result<CpuTensor> {
        let _t = self.timer("segment_attention");
        self.elementwise("segment_attention", &[q, k, v], |_, p| {
            let (q, k, v) = (p[0], p[1], p[2]);
            let width = heads * head_dim;
            let mut next = 0;
            let tiled = segments.iter().all(|s| {
                let ok = s.start == next && s.end > s.start;
                next = s.end;
                ok
            }) && next == q.rows;
            if q.cols != width
                || k.cols != width
                || v.cols != width
                || k.rows != q.rows
                || v.rows != q.rows
                || !tiled
            {
                return Err(shape(
                    "segment_attention",
                    format!(
                        "q {}x{}, k {}x{}, v {}x{} for {heads} heads x {head_dim}, segments {segments:?}",
                        q.rows, q.cols, k.rows, k.cols, v.rows, v.cols
                    ),
                ));
            }
            let out = attention::segments(&q.data, &k.data, &v.data, heads, head_dim, segments);
            Ok(HostTensor::new(q.rows, width, out))
        })
    }

    fn fold_rows(&self, x: &CpuTensor, group: usize) -> Result<CpuTensor> {
        let _t = self.timer("fold_rows");
        self.elementwise("fold_rows", &[x], |_, p| {
            let s = p[0];
            if group == 0 || !s.rows.is_multiple_of(group) {
                return Err(shape(
                    "fold_rows",
                    format!("{} rows in groups of {group}", s.rows),
                ));
            }
            Ok(HostTensor::new(
                s.rows / group,
                s.cols * group,
                s.data.clone(),
            ))
        })
    }
}

/// Columns `[half*d, (half+1)*d)` of every head's `2d` slice.
fn pick_half(s: &HostTensor, heads: usize, d: usize, half: usize) -> Result<HostTensor> {
    if s.cols != heads * 2 * d {
        return Err(shape(
            "split_query_gate",
            format!(
                "{} columns for {heads} heads of [query | gate] x {d}",
                s.cols
            ),
        ));
    }
    let mut data = Vec::with_capacity(s.rows * heads * d);
    for r in 0..s.rows {
        let row = s.row(r);
        for h in 0..heads {
            let at = h * 2 * d + half * d;
            data.extend_from_slice(&row[at..at + d]);
        }
    }
    Ok(HostTensor::new(s.rows, heads * d, data))
}

/// One device's delta rule: split q|k|v, L2-normalise, expand key heads, run every value head.
fn delta_rule_device(
    qkv: &HostTensor,
    g: &HostTensor,
    beta: &HostTensor,
    state: Option<&HostTensor>,
    spec: &DeltaNetSpec,
) -> Result<(HostTensor, HostTensor)> {
    let (nk, nv, dk, dv) = (
        spec.key_heads,
        spec.value_heads,
        spec.key_dim,
        spec.value_dim,
    );
    let t = qkv.rows;
    if qkv.cols != spec.conv_channels()
        || g.cols != nv
        || beta.cols != nv
        || g.rows != t
        || beta.rows != t
        || nk == 0
        || !nv.is_multiple_of(nk)
    {
        return Err(shape(
            "gated_delta_rule",
            format!(
                "qkv {}x{}, g {}x{}, beta {}x{}",
                qkv.rows, qkv.cols, g.rows, g.cols, beta.rows, beta.cols
            ),
        ));
    }
    if let Some(s) = state {
        if s.rows != nv * dk || s.cols != dv {
            return Err(shape(
                "gated_delta_rule",
                format!("state {}x{}", s.rows, s.cols),
            ));
        }
    }
    let ratio = nv / nk;
    let q_scale = (dk as f32).powf(-0.5);
    // Per key head, normalised q and k laid out [head][t][dk].
    let norm_heads = |offset: usize, scale: f32| -> Vec<Vec<f32>> {
        (0..nk)
            .map(|h| {
                let mut m = Vec::with_capacity(t * dk);
                for r in 0..t {
                    let x = &qkv.row(r)[offset + h * dk..offset + (h + 1) * dk];
                    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
                    m.extend(x.iter().map(|v| v * inv * scale));
                }
                m
            })
            .collect()
    };
    let qs = norm_heads(0, q_scale);
    let ks = norm_heads(nk * dk, 1.0);
    let v_off = 2 * nk * dk;
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..nv)
        .into_par_iter()
        .map(|h| {
            let kh = h / ratio;
            let mut v = Vec::with_capacity(t * dv);
            for r in 0..t {
                v.extend_from_slice(&qkv.row(r)[v_off + h * dv..v_off + (h + 1) * dv]);
            }
            let gh: Vec<f32> = (0..t).map(|r| g.data[r * nv + h]).collect();
            let bh: Vec<f32> = (0..t).map(|r| beta.data[r * nv + h]).collect();
            let mut s = match state {
                Some(s) => s.data[h * dk * dv..(h + 1) * dk * dv].to_vec(),
                None => vec![0.0; dk * dv],
            };
            let mut o = vec![0.0; t * dv];
            let inputs = delta_rule::HeadInputs {
                q: &qs[kh],
                k: &ks[kh],
                v: &v,
                g: &gh,
                beta: &bh,
                key_dim: dk,
                value_dim: dv,
            };
            delta_rule::chunked(&inputs, &mut s, &mut o);
            (o, s)
        })
        .collect();
    let mut out = vec![0.0f32; t * nv * dv];
    let mut next = Vec::with_capacity(nv * dk * dv);
    for (h, (o, s)) in per_head.iter().enumerate() {
        for r in 0..t {
            out[r * nv * dv + h * dv..r * nv * dv + (h + 1) * dv]
                .copy_from_slice(&o[r * dv..(r + 1) * dv]);
        }
        next.extend_from_slice(s);
    }
    Ok((
        HostTensor::new(t, nv * dv, out),
        HostTensor::new(nv * dk, dv, next),
    ))
}
