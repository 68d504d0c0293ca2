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

use crate::fine_call::{list_u32, one, two, FineCall};
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

    // The fine ops. Each default body is the op's encoding: its operands and parameters in
    // the order the shim's op table declares them (ffi/shim/core/op_table.cpp).

    /// `x · Wᵀ` per device. A replicated `x` against a column-split weight gives a sharded
    /// result; a sharded `x` against a row-split weight gives partial sums. The matmul numerics
    /// are the backend's: the tt mesh adds its profile's (the table's four parameters), the CPU
    /// mesh computes in its own.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor> {
        let call = FineCall::new("linear").tensor(x).weight(w);
        one(call.op, self.fine_op(&call)?)
    }
    /// Sum the per-device partial sums and replicate the result (reduce-scatter followed by
    /// all-gather, as the Tenstorrent port does it). The CPU mesh sums in f32; the ttnn backend
    /// holds the partial sums in the activation dtype (bf16 collectives, as the port).
    fn all_reduce(&self, x: &Self::Tensor) -> Result<Self::Tensor> {
        let call = FineCall::new("all_reduce").tensor(x);
        one(call.op, self.fine_op(&call)?)
    }
    /// Split the columns of every device's part into consecutive blocks of the given widths.
    fn split_cols(&self, x: &Self::Tensor, widths: &[usize]) -> Result<Vec<Self::Tensor>> {
        let list = list_u32("split_cols", "width", widths.iter().copied())?;
        let call = FineCall::new("split_cols")
            .tensor(x)
            .results(list.len())
            .list(list);
        self.fine_op(&call)
    }

    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor> {
        let call = FineCall::new("add").tensor(a).tensor(b);
        one(call.op, self.fine_op(&call)?)
    }
    /// RMSNorm over groups of `group` consecutive channels: `x / rms(x) * (1 + w)` when
    /// `one_plus`, else `* w`. `w` is a `[group, 1]` weight, the same on every device.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        group: usize,
        eps: f32,
        one_plus: bool,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("rms_norm")
            .tensor(x)
            .weight(w)
            .size(group)
            .real(f64::from(eps))
            .flag(one_plus);
        one(call.op, self.fine_op(&call)?)
    }
    /// `silu(gate) * up` where each device part is `[gate | up]` in two equal halves.
    fn swiglu(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor> {
        let call = FineCall::new("swiglu").tensor(gate_up);
        one(call.op, self.fine_op(&call)?)
    }

    /// Split per-head `[query(d) | gate(d)]` columns into a query tensor and a gate tensor.
    fn split_query_gate(
        &self,
        qg: &Self::Tensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let call = FineCall::new("split_query_gate")
            .tensor(qg)
            .size(heads)
            .size(head_dim)
            .results(2);
        two(call.op, self.fine_op(&call)?)
    }
    /// Rotate the leading `rotary_dim` channels of every head; `positions[t]` is (t, h, w).
    fn rope(
        &self,
        x: &Self::Tensor,
        spec: &RopeSpec,
        positions: &[[u32; 3]],
    ) -> Result<Self::Tensor> {
        let [t, h, w] = spec.mrope_section;
        let call = FineCall::new("rope")
            .tensor(x)
            .size(spec.heads)
            .size(spec.head_dim)
            .size(spec.rotary_dim)
            .size(t)
            .size(h)
            .size(w)
            .real(spec.theta)
            .list(positions.as_flattened().to_vec());
        one(call.op, self.fine_op(&call)?)
    }
    /// Append rows to a per-device cache of `heads` heads (KV pages, which a backend may hold
    /// paged per head); `None` starts a cache from `new`.
    fn append_rows(
        &self,
        cache: Option<&Self::Tensor>,
        new: &Self::Tensor,
        heads: usize,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("append_rows")
            .optional(cache)
            .tensor(new)
            .size(heads);
        one(call.op, self.fine_op(&call)?)
    }
    /// Causal softmax attention of the queries (absolute positions `start..start+T`) over the
    /// cached keys and values (positions `0..start+T`), GQA, scale `head_dim^-0.5`, fp32.
    fn causal_attention(
        &self,
        q: &Self::Tensor,
        keys: &Self::Tensor,
        values: &Self::Tensor,
        spec: &AttentionSpec,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("causal_attention")
            .tensor(q)
            .tensor(keys)
            .tensor(values)
            .size(spec.heads)
            .size(spec.kv_heads)
            .size(spec.head_dim);
        one(call.op, self.fine_op(&call)?)
    }
    /// `x * sigmoid(gate)` elementwise.
    fn mul_sigmoid(&self, x: &Self::Tensor, gate: &Self::Tensor) -> Result<Self::Tensor> {
        let call = FineCall::new("mul_sigmoid").tensor(x).tensor(gate);
        one(call.op, self.fine_op(&call)?)
    }

    /// Causal depthwise conv over time plus SiLU. `w` is `[channels, kernel]` per device;
    /// `carry` holds the last `kernel-1` inputs of the previous chunk (`None` = zeros). Returns
    /// the output and the new carry.
    fn causal_conv1d_silu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        carry: Option<&Self::Tensor>,
        kernel: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let call = FineCall::new("causal_conv1d_silu")
            .tensor(x)
            .weight(w)
            .optional(carry)
            .size(kernel)
            .results(2);
        two(call.op, self.fine_op(&call)?)
    }
    /// DeltaNet gates: `beta = sigmoid(b)`, `g = -exp(A_log) * softplus(a + dt_bias)`, fp32.
    /// `a_log` and `dt_bias` are `[value_heads, 1]` weights per device.
    fn delta_gates(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        a_log: &Self::Weight,
        dt_bias: &Self::Weight,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let call = FineCall::new("delta_gates")
            .tensor(a)
            .tensor(b)
            .weight(a_log)
            .weight(dt_bias)
            .results(2);
        two(call.op, self.fine_op(&call)?)
    }
    /// The chunked gated delta rule (q/k L2-normalised inside, q scaled by `key_dim^-0.5`,
    /// key heads shared by consecutive value heads). `qkv` is the conv output `[q | k | v]`;
    /// `state` is `[value_heads * key_dim, value_dim]` per device (`None` = zeros). Returns the
    /// core output `[T, value_heads * value_dim]` and the final state.
    fn gated_delta_rule(
        &self,
        qkv: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        state: Option<&Self::Tensor>,
        spec: &DeltaNetSpec,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let call = FineCall::new("gated_delta_rule")
            .tensor(qkv)
            .tensor(g)
            .tensor(beta)
            .optional(state)
            .size(spec.key_heads)
            .size(spec.value_heads)
            .size(spec.key_dim)
            .size(spec.value_dim)
            .results(2);
        two(call.op, self.fine_op(&call)?)
    }
    /// Gated RMSNorm per group: `w * x / rms(x) * silu(z)` (plain `w`).
    fn gated_rms_norm(
        &self,
        x: &Self::Tensor,
        z: &Self::Tensor,
        w: &Self::Weight,
        group: usize,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("gated_rms_norm")
            .tensor(x)
            .tensor(z)
            .weight(w)
            .size(group)
            .real(f64::from(eps));
        one(call.op, self.fine_op(&call)?)
    }

    /// LayerNorm over each row: `(x - mean) / sqrt(var + eps) * w + b`; `w` and `b` are
    /// `[cols, 1]` weights, the same on every device.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("layer_norm")
            .tensor(x)
            .weight(w)
            .weight(b)
            .real(f64::from(eps));
        one(call.op, self.fine_op(&call)?)
    }
    /// Add a bias row to every row. `b` is each device's `[cols, 1]` part: split like the
    /// columns of a sharded `x`, whole for a replicated one.
    fn add_bias(&self, x: &Self::Tensor, b: &Self::Weight) -> Result<Self::Tensor> {
        let call = FineCall::new("add_bias").tensor(x).weight(b);
        one(call.op, self.fine_op(&call)?)
    }
    /// GELU elementwise.
    fn gelu(&self, x: &Self::Tensor, kind: Gelu) -> Result<Self::Tensor> {
        let call = FineCall::new("gelu").tensor(x).code(kind.code());
        one(call.op, self.fine_op(&call)?)
    }
    /// Rotate-half rotary embedding over whole heads with tables `cos`, `sin` (replicated,
    /// `[rows, head_dim]`, the same for every head): `x * cos + rotate_half(x) * sin`.
    fn rotary(
        &self,
        x: &Self::Tensor,
        cos: &Self::Tensor,
        sin: &Self::Tensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<Self::Tensor> {
        let call = FineCall::new("rotary")
            .tensor(x)
            .tensor(cos)
            .tensor(sin)
            .size(heads)
            .size(head_dim);
        one(call.op, self.fine_op(&call)?)
    }
    /// Bidirectional softmax attention (scale `head_dim^-0.5`, fp32) in which the rows of each
    /// segment attend only to the rows of the same segment (one image, or one pair of video
    /// frames). `q`, `k`, `v` are `[rows, heads*head_dim]` per device, the segments cover the
    /// rows in order.
    fn segment_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        heads: usize,
        head_dim: usize,
        segments: &[std::ops::Range<usize>],
    ) -> Result<Self::Tensor> {
        let bounds = segments.iter().flat_map(|s| [s.start, s.end]);
        let call = FineCall::new("segment_attention")
            .tensor(q)
            .tensor(k)
            .tensor(v)
            .size(heads)
            .size(head_dim)
            .list(list_u32("segment_attention", "segment bound", bounds)?);
        one(call.op, self.fine_op(&call)?)
    }
    /// Join every `group` consecutive rows into one row (`[rows, cols]` →
    /// `[rows/group, cols*group]`, a reshape).
    fn fold_rows(&self, x: &Self::Tensor, group: usize) -> Result<Self::Tensor> {
        let call = FineCall::new("fold_rows").tensor(x).size(group);
        one(call.op, self.fine_op(&call)?)
    }

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
