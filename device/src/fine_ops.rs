//! The fine ops of [`MeshOps`](crate::MeshOps), generated from the shim's op table
//! (`ffi/shim/core/op_table.cpp`, listed by `clef_tt_op_table`) by
//! `ffi/tests/generate/mod.rs`. Do not edit: change the table, then regenerate with
//! `CLEF_TT_REGENERATE=1 cargo test -p clef-tt-abi --test op_declarations` (the same test fails
//! while this file differs from what the table gives).
//!
//! Each method's default body is the op's encoding: its operands and parameters in the order
//! the table declares them, handed to the backend's one method `MeshOps::fine_op`.

/// The fine-op methods, expanded inside the `MeshOps` trait (ops.rs).
#[rustfmt::skip]
macro_rules! fine_ops {
    () => {
        /// `x · Wᵀ` per device. A replicated `x` against a column-split weight gives a sharded
        /// result; a sharded `x` against a row-split weight gives partial sums. The matmul numerics
        /// are the backend's: the tt mesh sets the four parameters from its profile, the CPU mesh
        /// computes in its own.
        fn linear(&self, x: &Self::Tensor, w: &Self::Weight) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("linear")
                .tensor(x)
                .weight(w)
                .profile("fidelity")
                .profile("fp32_dest_acc")
                .profile("bf16_activations")
                .profile("packer_l1_acc");
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Sum the per-device partial sums and replicate the result (reduce-scatter followed by
        /// all-gather, as the Tenstorrent port does it). The CPU mesh sums in f32; the ttnn backend
        /// holds the partial sums in the activation dtype (bf16 collectives, as the port). A
        /// replicated `x` stays as it is.
        fn all_reduce(&self, x: &Self::Tensor) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("all_reduce")
                .tensor(x);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Split the columns of every device's part into consecutive blocks of the given widths,
        /// one result per width.
        fn split_cols(
            &self,
            x: &Self::Tensor,
            widths: &[u32],
        ) -> $crate::Result<Vec<Self::Tensor>> {
            let call = $crate::fine_call::FineCall::new("split_cols")
                .tensor(x)
                .list(widths.to_vec())
                .results(widths.len());
            self.fine_op(&call)
        }
        /// `a + b` elementwise.
        fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("add")
                .tensor(a)
                .tensor(b);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
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
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("rms_norm")
                .tensor(x)
                .weight(w)
                .size(group)
                .real(f64::from(eps))
                .flag(one_plus);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// `silu(gate) * up` where each device part is `[gate | up]` in two equal halves.
        fn swiglu(&self, gate_up: &Self::Tensor) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("swiglu")
                .tensor(gate_up);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Split per-head `[query(head_dim) | gate(head_dim)]` columns of `heads` heads into a
        /// query tensor and a gate tensor.
        fn split_query_gate(
            &self,
            qg: &Self::Tensor,
            heads: usize,
            head_dim: usize,
        ) -> $crate::Result<(Self::Tensor, Self::Tensor)> {
            let call = $crate::fine_call::FineCall::new("split_query_gate")
                .tensor(qg)
                .size(heads)
                .size(head_dim)
                .results(2);
            $crate::fine_call::two(call.op, self.fine_op(&call)?)
        }
        /// Rotate the leading `rotary_dim` channels of each of `heads` heads (partial, interleaved
        /// M-RoPE in the rotate-half layout, base `theta`); `positions` holds a (t, h, w) triple
        /// per row. Frequency slot j follows h if j%3==1 and j<3*section_h, w if j%3==2 and
        /// j<3*section_w, else t.
        #[allow(clippy::too_many_arguments)]
        fn rope(
            &self,
            x: &Self::Tensor,
            heads: usize,
            head_dim: usize,
            rotary_dim: usize,
            section_t: usize,
            section_h: usize,
            section_w: usize,
            theta: f64,
            positions: &[u32],
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("rope")
                .tensor(x)
                .size(heads)
                .size(head_dim)
                .size(rotary_dim)
                .size(section_t)
                .size(section_h)
                .size(section_w)
                .real(theta)
                .list(positions.to_vec());
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Append `rows` to a per-device cache of `heads` heads (KV pages, which a backend may hold
        /// paged per head); an absent `cache` starts one from `rows`.
        fn append_rows(
            &self,
            cache: Option<&Self::Tensor>,
            rows: &Self::Tensor,
            heads: usize,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("append_rows")
                .optional(cache)
                .tensor(rows)
                .size(heads);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Causal softmax attention of the queries (absolute positions `start..start+T`) over the
        /// cached keys and values (positions `0..start+T`): `heads` query heads over `kv_heads`
        /// key/value heads (GQA) of `head_dim`, scale `head_dim^-0.5`, fp32.
        fn causal_attention(
            &self,
            q: &Self::Tensor,
            keys: &Self::Tensor,
            values: &Self::Tensor,
            heads: usize,
            kv_heads: usize,
            head_dim: usize,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("causal_attention")
                .tensor(q)
                .tensor(keys)
                .tensor(values)
                .size(heads)
                .size(kv_heads)
                .size(head_dim);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// `x * sigmoid(gate)` elementwise.
        fn mul_sigmoid(
            &self,
            x: &Self::Tensor,
            gate: &Self::Tensor,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("mul_sigmoid")
                .tensor(x)
                .tensor(gate);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Causal depthwise conv over time plus SiLU. `w` is `[channels, kernel]` per device;
        /// `carry` holds the last `kernel-1` inputs of the previous chunk (absent = zeros). Gives
        /// the output and the new carry.
        fn causal_conv1d_silu(
            &self,
            x: &Self::Tensor,
            w: &Self::Weight,
            carry: Option<&Self::Tensor>,
            kernel: usize,
        ) -> $crate::Result<(Self::Tensor, Self::Tensor)> {
            let call = $crate::fine_call::FineCall::new("causal_conv1d_silu")
                .tensor(x)
                .weight(w)
                .optional(carry)
                .size(kernel)
                .results(2);
            $crate::fine_call::two(call.op, self.fine_op(&call)?)
        }
        /// DeltaNet gates: `g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, fp32.
        /// `a_log` and `dt_bias` are `[value_heads, 1]` weights per device.
        fn delta_gates(
            &self,
            a: &Self::Tensor,
            b: &Self::Tensor,
            a_log: &Self::Weight,
            dt_bias: &Self::Weight,
        ) -> $crate::Result<(Self::Tensor, Self::Tensor)> {
            let call = $crate::fine_call::FineCall::new("delta_gates")
                .tensor(a)
                .tensor(b)
                .weight(a_log)
                .weight(dt_bias)
                .results(2);
            $crate::fine_call::two(call.op, self.fine_op(&call)?)
        }
        /// The chunked gated delta rule (q/k L2-normalised inside, q scaled by `key_dim^-0.5`, key
        /// heads shared by consecutive value heads). `qkv` is the conv output `[q | k | v]`;
        /// `state` is `[value_heads * key_dim, value_dim]` per device (absent = zeros). Gives the
        /// core output `[T, value_heads * value_dim]` and the final state.
        #[allow(clippy::too_many_arguments)]
        fn gated_delta_rule(
            &self,
            qkv: &Self::Tensor,
            g: &Self::Tensor,
            beta: &Self::Tensor,
            state: Option<&Self::Tensor>,
            key_heads: usize,
            value_heads: usize,
            key_dim: usize,
            value_dim: usize,
        ) -> $crate::Result<(Self::Tensor, Self::Tensor)> {
            let call = $crate::fine_call::FineCall::new("gated_delta_rule")
                .tensor(qkv)
                .tensor(g)
                .tensor(beta)
                .optional(state)
                .size(key_heads)
                .size(value_heads)
                .size(key_dim)
                .size(value_dim)
                .results(2);
            $crate::fine_call::two(call.op, self.fine_op(&call)?)
        }
        /// Gated RMSNorm per group of `group` channels: `w * x / rms(x) * silu(z)` (plain `w`).
        fn gated_rms_norm(
            &self,
            x: &Self::Tensor,
            z: &Self::Tensor,
            w: &Self::Weight,
            group: usize,
            eps: f32,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("gated_rms_norm")
                .tensor(x)
                .tensor(z)
                .weight(w)
                .size(group)
                .real(f64::from(eps));
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// LayerNorm over each row: `(x - mean) / sqrt(var + eps) * w + b`; `w` and `b` are `[cols,
        /// 1]` weights, the same on every device.
        fn layer_norm(
            &self,
            x: &Self::Tensor,
            w: &Self::Weight,
            b: &Self::Weight,
            eps: f32,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("layer_norm")
                .tensor(x)
                .weight(w)
                .weight(b)
                .real(f64::from(eps));
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Add a bias row to every row. `b` is each device's `[cols, 1]` part: split like the
        /// columns of a sharded `x`, whole for a replicated one.
        fn add_bias(&self, x: &Self::Tensor, b: &Self::Weight) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("add_bias")
                .tensor(x)
                .weight(b);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// GELU elementwise, tanh-approximated or exact (erf) as `kind` says.
        fn gelu(&self, x: &Self::Tensor, kind: $crate::Gelu) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("gelu")
                .tensor(x)
                .code(kind.code());
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Rotate-half rotary embedding over whole heads (`heads` of `head_dim`) with tables `cos`,
        /// `sin` (replicated, `[rows, head_dim]`, the same for every head): `x * cos +
        /// rotate_half(x) * sin`.
        fn rotary(
            &self,
            x: &Self::Tensor,
            cos: &Self::Tensor,
            sin: &Self::Tensor,
            heads: usize,
            head_dim: usize,
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("rotary")
                .tensor(x)
                .tensor(cos)
                .tensor(sin)
                .size(heads)
                .size(head_dim);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Bidirectional softmax attention (scale `head_dim^-0.5`, fp32) in which the rows of each
        /// segment attend only to the rows of the same segment (one image, or one pair of video
        /// frames). `q`, `k`, `v` are `[rows, heads * head_dim]` per device; `segments` holds each
        /// segment's first row and end row, the segments covering the rows in order.
        fn segment_attention(
            &self,
            q: &Self::Tensor,
            k: &Self::Tensor,
            v: &Self::Tensor,
            heads: usize,
            head_dim: usize,
            segments: &[u32],
        ) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("segment_attention")
                .tensor(q)
                .tensor(k)
                .tensor(v)
                .size(heads)
                .size(head_dim)
                .list(segments.to_vec());
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
        /// Join every `group` consecutive rows into one row (`[rows, cols]` to `[rows/group,
        /// cols*group]`, a reshape).
        fn fold_rows(&self, x: &Self::Tensor, group: usize) -> $crate::Result<Self::Tensor> {
            let call = $crate::fine_call::FineCall::new("fold_rows")
                .tensor(x)
                .size(group);
            $crate::fine_call::one(call.op, self.fine_op(&call)?)
        }
    };
}

pub(crate) use fine_ops;
