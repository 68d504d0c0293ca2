//! The op trait: everything a Qwen3.5 prefill asks of a mesh, at ttnn granularity.
//!
//! Placement rules every backend follows:
//! - a *replicated* tensor holds the same `[rows, cols]` on every device;
//! - a *sharded* tensor holds a different part per device (a column block of activations, or a
//!   per-device state such as KV heads or DeltaNet value heads);
//! - a *partial* tensor holds per-device partial sums that an [`MeshOps::all_reduce`] completes.
//!
//! Weights are uploaded already split per device ([`MeshOps::upload_weight`] takes one part per
//! device); which split a weight gets is decided by the caller's tensor-parallel plan.

use crate::fine_call::FineCall;
use crate::{
    HostTensor, HostWeight, MeshShape, PassOutput, PassStats, PrefillPass, Result, WeightBytes,
    WeightFormat, WeightKind,
};

/// Which way per-device shards are joined when a sharded tensor is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatherAxis {
    Rows,
    Cols,
}

/// Rotary embedding of one projection: partial, interleaved M-RoPE (rotate-half layout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    /// Heads per device in the tensor being rotated.
    pub heads: usize,
    pub head_dim: usize,
    /// Leading channels of each head that are rotated (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    pub theta: f64,
    /// Frequency slots per axis (t, h, w); slot j uses h if j%3==1 and j<3*s[1], w if j%3==2
    /// and j<3*s[2], else t.
    pub mrope_section: [usize; 3],
}

/// The GELU variants of the vision tower: tanh-approximated in the blocks' MLP, exact (erf) in
/// the merger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Tanh,
    Erf,
}

impl Gelu {
    /// The kind's code in the C ABI (`clef_tt_gelu_kind`).
    pub fn code(self) -> u32 {
        match self {
            Gelu::Tanh => clef_tt_abi::CLEF_TT_GELU_TANH,
            Gelu::Erf => clef_tt_abi::CLEF_TT_GELU_ERF,
        }
    }

    /// The kind of an ABI code.
    pub fn from_code(code: u32) -> Option<Gelu> {
        [Gelu::Tanh, Gelu::Erf]
            .into_iter()
            .find(|g| g.code() == code)
    }
}

/// Per-device shape of a gated attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Per-device shape of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetSpec {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
}

impl DeltaNetSpec {
    /// Channels of the fused q|k|v projection (the conv runs over all of them).
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// What a device backend reports of the memory it holds (per device) and the tensors alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUsage {
    pub device_ids: Vec<u32>,
    pub bytes_per_device: Vec<u64>,
    pub live_tensors: u64,
}

/// Calls a backend made to its runtime for one op name (ttnn ops under the Tenstorrent shim).
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeCalls {
    pub op: String,
    pub calls: u64,
    /// Host time spent in those calls.
    pub seconds: f64,
}

/// A whole gated-attention sublayer of the text backbone, as a layer op takes it: the input
/// norm, q|gate/k/v projections, q/k norms, rope, the KV append, causal attention, the gate,
/// o_proj, its all-reduce and the residual add.
pub struct AttentionLayer<'a, T, W> {
    /// The residual stream `[rows, hidden]`, replicated.
    pub h: &'a T,
    pub norm: &'a W,
    pub qkv: &'a W,
    pub q_norm: &'a W,
    pub k_norm: &'a W,
    pub o_proj: &'a W,
    /// The layer's keys and values from earlier chunks.
    pub cache: Option<(&'a T, &'a T)>,
    pub positions: &'a [[u32; 3]],
    pub spec: AttentionSpec,
    /// The rope of the query heads.
    pub rope: RopeSpec,
    pub eps: f32,
    /// Whether o_proj's partial sums are all-reduced (a tensor-parallel plan) or complete.
    pub all_reduce: bool,
}

/// A whole Gated DeltaNet sublayer: the input norm, the fused in_proj, the causal conv, the
/// gates, the chunked delta rule, the gated norm, out_proj, its all-reduce and the residual add.
pub struct DeltaNetLayer<'a, T, W> {
    pub h: &'a T,
    pub norm: &'a W,
    pub in_proj: &'a W,
    pub conv: &'a W,
    pub a_log: &'a W,
    pub dt_bias: &'a W,
    pub gated_norm: &'a W,
    pub out_proj: &'a W,
    /// The conv carry and the recurrent state from earlier chunks.
    pub carried: Option<(&'a T, &'a T)>,
    pub spec: DeltaNetSpec,
    pub eps: f32,
    pub all_reduce: bool,
}

/// A batched pass ([`MeshOps::attention_layer_batched`], [`MeshOps::delta_net_layer_batched`]):
/// requests in blocks of `each` rows, request `i`'s `lengths[i]` rows at the front of block
/// `i` and at least [`RowBatch::pad_rows`] rows after them. The mixers run over a batch of
/// blocks, every row-wise op over all rows once. Fresh requests (the layer given no cache or
/// carried state) may keep the state of a request's first `keep[i]` rows (a multiple of 32;
/// 0: none): the layer's state a pass of those rows alone would leave (a prefix-cache miss's
/// prefix). Given a cache or carried state, every block continues it (hits of one slot) and
/// keeps nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowBatch {
    pub lengths: Vec<usize>,
    pub each: usize,
    pub keep: Vec<usize>,
}

/// A batched sublayer's new residual stream and each kept prefix's layer state, in block
/// order: keys and values, or conv carry and recurrent state.
pub type BatchedLayer<T> = (T, Vec<[T; 2]>);

impl RowBatch {
    /// Rows a block keeps after its request: the conv's history, so that the next block's
    /// conv starts from zeros.
    pub fn pad_rows(conv_kernel: usize) -> usize {
        conv_kernel.saturating_sub(1)
    }

    /// The batch of `lengths`: blocks of the longest plus the pad rows, to a multiple of 32
    /// rows (a tile).
    pub fn of(lengths: &[usize], conv_kernel: usize) -> Self {
        let longest = lengths.iter().copied().max().unwrap_or(0);
        RowBatch {
            lengths: lengths.to_vec(),
            each: (longest + Self::pad_rows(conv_kernel)).div_ceil(32) * 32,
            keep: vec![0; lengths.len()],
        }
    }

    /// The prefixes whose state the pass keeps.
    pub fn kept(&self) -> impl Iterator<Item = usize> + '_ {
        self.keep.iter().copied().filter(|&n| n > 0)
    }

    /// Rows of the whole pass.
    pub fn rows(&self) -> usize {
        self.each * self.lengths.len()
    }
}

/// A whole MLP sublayer: the post-attention norm, gate|up, SwiGLU, down, its all-reduce and the
/// residual add.
pub struct MlpLayer<'a, T, W> {
    pub h: &'a T,
    pub norm: &'a W,
    pub gate_up: &'a W,
    pub down: &'a W,
    pub eps: f32,
    pub all_reduce: bool,
}

/// The operations of a Qwen3.5 prefill over a mesh.
///
/// The layer ops at the end ([`MeshOps::attention_layer`] and the others) are fixed sequences
/// of the ops that always run together. A backend may run one in a single call, in its own
/// layouts; by default, and wherever a backend returns `None`, the caller composes the ops
/// (the text backbone is the definition, and the layer ops are tested against it).
pub trait MeshOps: Sync {
    /// A tensor on the mesh (replicated, sharded or partial).
    type Tensor: Clone + Send + Sync;
    /// A weight already split per device.
    type Weight: Send + Sync;

    fn mesh(&self) -> MeshShape;

    /// Upload the same host tensor to every device.
    fn replicate(&self, host: &HostTensor) -> Result<Self::Tensor>;
    /// Upload one host tensor per device.
    fn shard(&self, parts: Vec<HostTensor>) -> Result<Self::Tensor>;
    /// Read a tensor back: a replicated one from the first device, a sharded one joined along
    /// `axis`, a partial one reduced.
    fn gather(&self, t: &Self::Tensor, axis: GatherAxis) -> Result<HostTensor>;
    /// Read each device's part back (for snapshots and tests).
    fn device_parts(&self, t: &Self::Tensor) -> Result<Vec<HostTensor>>;
    /// Bytes of device memory the tensor occupies on all devices together.
    fn tensor_bytes(&self, t: &Self::Tensor) -> usize;
    /// Bytes one device holds for a `[rows, cols]` tensor of `class` (f32 rows unless the
    /// backend pads or packs them, or keeps the class in bf16).
    fn held_bytes(&self, rows: usize, cols: usize, class: crate::Held) -> usize {
        let _ = class;
        rows * cols * 4
    }

    /// The backend's name (`cpu`, `tt`), recorded by tensor caches.
    fn backend_name(&self) -> &'static str;
    /// Device memory and live tensors, for backends that track them (the Tenstorrent shim).
    fn usage(&self) -> Option<DeviceUsage> {
        None
    }
    /// The calls the backend made to its runtime since the last take, per op (most host time
    /// first); empty for backends without one (the CPU mesh).
    fn take_runtime_calls(&self) -> Vec<RuntimeCalls> {
        Vec::new()
    }
    /// A placed weight's parts as bytes in this backend's layout, for a tensor cache.
    fn export_weight(&self, w: &Self::Weight) -> Result<Vec<WeightBytes>>;
    /// A weight from parts [`MeshOps::export_weight`] wrote (checked against their shapes).
    fn import_weight(&self, parts: Vec<WeightBytes>) -> Result<Self::Weight>;

    /// Upload a weight: one `[out, in]` part per device. A matrix is held in `format`; a
    /// vector in f32.
    fn upload_weight(
        &self,
        parts: Vec<HostWeight>,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<Self::Weight>;
    /// Bytes the weight occupies on all devices together.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;

    /// Run one fine op (fine_call.rs): the tt mesh hands it to the shim's `clef_tt_op`, the CPU
    /// mesh runs its maths for the op. The fine ops below build the call in their default
    /// bodies, so a backend implements this one method for all of them.
    fn fine_op(&self, call: &FineCall<'_, Self::Tensor, Self::Weight>)
        -> Result<Vec<Self::Tensor>>;

    // The fine ops, generated from the shim's op table (fine_ops.rs): each default body builds
    // the op's call for `fine_op` above.
    crate::fine_ops::fine_ops!();

    /// Whether the backend runs packed passes: several requests' rows in one tensor, with
    /// [`MeshOps::slice_rows`] and [`MeshOps::concat_rows`] parting and joining them around
    /// the ops that mix tokens over time (the backbone's `prefill_segments`).
    fn packs_rows(&self) -> bool {
        false
    }
    /// Rows `rows` of every device's part, placement kept (one request of a packed pass).
    fn slice_rows(&self, x: &Self::Tensor, rows: std::ops::Range<usize>) -> Result<Self::Tensor> {
        let _ = (x, rows);
        Err(crate::DeviceError::Unsupported {
            op: "slice_rows",
            backend: self.backend_name(),
        })
    }
    /// Every device's parts stacked by rows in order, of one placement (a packed pass's
    /// requests joined again).
    fn concat_rows(&self, parts: &[Self::Tensor]) -> Result<Self::Tensor> {
        let _ = parts;
        Err(crate::DeviceError::Unsupported {
            op: "concat_rows",
            backend: self.backend_name(),
        })
    }

    /// Requests a batched pass may hold for DeltaNet layers of `spec` (per device, as the
    /// layer ops take it); 0 or 1: the backend runs no batched passes.
    fn batch_limit(&self, spec: &DeltaNetSpec) -> usize {
        let _ = spec;
        0
    }
    /// An attention sublayer of a batched pass in one call (`layer.h` of `batch.rows()` rows,
    /// `layer.positions` one block's or every block's; `layer.cache` continued by every
    /// block): the new residual stream and each kept prefix's keys and values; `None` when
    /// the backend does not run it for these shapes.
    fn attention_layer_batched(
        &self,
        layer: &AttentionLayer<'_, Self::Tensor, Self::Weight>,
        batch: &RowBatch,
    ) -> Option<Result<BatchedLayer<Self::Tensor>>> {
        let _ = (layer, batch);
        None
    }
    /// A DeltaNet sublayer of a batched pass in one call (`layer.carried` continued by every
    /// block): the new residual stream and each kept prefix's conv carry and recurrent state;
    /// `None` when the backend does not run it for these shapes.
    fn delta_net_layer_batched(
        &self,
        layer: &DeltaNetLayer<'_, Self::Tensor, Self::Weight>,
        batch: &RowBatch,
    ) -> Option<Result<BatchedLayer<Self::Tensor>>> {
        let _ = (layer, batch);
        None
    }

    /// An attention sublayer in one call: the new residual stream, keys and values; `None` when
    /// the backend does not run it for these shapes.
    fn attention_layer(
        &self,
        layer: &AttentionLayer<'_, Self::Tensor, Self::Weight>,
    ) -> Option<Result<[Self::Tensor; 3]>> {
        let _ = layer;
        None
    }
    /// A DeltaNet sublayer in one call: the new residual stream, conv carry and recurrent
    /// state; `None` when the backend does not run it for these shapes.
    fn delta_net_layer(
        &self,
        layer: &DeltaNetLayer<'_, Self::Tensor, Self::Weight>,
    ) -> Option<Result<[Self::Tensor; 3]>> {
        let _ = layer;
        None
    }
    /// An MLP sublayer in one call: the new residual stream; `None` when the backend does not
    /// run it for these shapes.
    fn mlp_layer(
        &self,
        layer: &MlpLayer<'_, Self::Tensor, Self::Weight>,
    ) -> Option<Result<Self::Tensor>> {
        let _ = layer;
        None
    }

    /// A whole prefill pass in one call (crate::pass): its final rows and every layer's new
    /// state; `None` when the backend does not run passes, or not this one (its shapes, its
    /// states), and the caller runs the layers.
    fn prefill_pass(
        &self,
        pass: &PrefillPass<'_, Self::Tensor, Self::Weight>,
    ) -> Option<Result<PassOutput<Self::Tensor>>> {
        let _ = pass;
        None
    }
    /// Room for `kv_tokens` tokens of KV in the whole passes' state (before the first pass).
    fn configure_passes(&self, kv_tokens: usize) -> Result<()> {
        let _ = kv_tokens;
        Ok(())
    }
    /// What the backend's whole passes did, if it runs them.
    fn pass_stats(&self) -> Option<PassStats> {
        None
    }
}
