//! Every [`MeshOps`] op of [`TtMesh`] as its C ABI call: a fine op through the generic
//! `clef_tt_op` (its tensors and parameters in the order the shim's op table declares them,
//! ffi/shim/core/op_table.cpp), a layer op through `clef_tt_layer_op` (layers.rs). The shim
//! checks the arguments and computes placements (the same rules as the CPU mesh), so these are
//! thin: convert the parameters, call, own the results.
//!
//! SAFETY (all blocks below): every tensor pointer comes from a live handle of this mesh that
//! outlives the call, every parameter struct or slice outlives the call, and the output
//! pointers are the call helpers' locals.

use super::layers::{optional_input, stream_and_pairs, three, Input};
use super::{dim, TtMesh, TtTensor, TtWeight};
use crate::{
    AttentionLayer, AttentionSpec, BatchedLayer, DeltaNetLayer, DeltaNetSpec, GatherAxis, Gelu,
    HostTensor, HostWeight, MeshOps, MeshShape, MlpLayer, Numerics, PassOutput, PassStats,
    PrefillPass, Result, RopeSpec, RowBatch, WeightBytes, WeightFormat, WeightKind,
};
use clef_tt_abi as sys;
use serde_json::{json, Value};
use std::ffi::CString;
use std::ptr::{null, null_mut};

/// The matmul numerics as the op `linear` takes them: fidelity, fp32_dest_acc,
/// bf16_activations, packer_l1_acc (the ABI's fidelity values; flags 0 or 1).
pub(super) fn matmul_numerics(n: &Numerics) -> [u32; 4] {
    use crate::Fidelity;
    let fidelity = match n.fidelity {
        Fidelity::Exact => sys::CLEF_TT_EXACT,
        Fidelity::LoFi => sys::CLEF_TT_LOFI,
        Fidelity::HiFi2 => sys::CLEF_TT_HIFI2,
        Fidelity::HiFi3 => sys::CLEF_TT_HIFI3,
        Fidelity::HiFi4 => sys::CLEF_TT_HIFI4,
    };
    [
        fidelity,
        u32::from(!n.bf16_accumulation),
        u32::from(n.bf16_activations),
        1,
    ]
}

/// A result the shim did not give (it gives every result or fails).
fn missing_result(op: &'static str) -> crate::DeviceError {
    crate::DeviceError::Shape {
        op,
        detail: "the shim gave fewer results than asked".into(),
    }
}

/// A flag parameter as the ABI takes it.
fn flag(b: bool) -> f64 {
    f64::from(u8::from(b))
}

impl TtMesh {
    /// One call of `clef_tt_op`: `op`'s tensors and parameters in the order its declaration in
    /// the shim's op table gives them (ffi/shim/core/op_table.cpp), its list of numbers, and
    /// `results` results.
    fn fine_op(
        &self,
        op: &'static str,
        inputs: &[Input<'_>],
        params: &[f64],
        list: &[u32],
        results: usize,
    ) -> Result<Vec<TtTensor>> {
        let name = CString::new(op).map_err(|_| crate::DeviceError::Shape {
            op,
            detail: "an op name with a NUL".into(),
        })?;
        let raw: Vec<*const sys::clef_tt_tensor> = inputs.iter().map(Input::raw).collect();
        let (n_inputs, n_params) = (
            dim(op, "inputs", raw.len())?,
            dim(op, "params", params.len())?,
        );
        let (n_list, n_outs) = (dim(op, "list", list.len())?, dim(op, "results", results)?);
        let list_ptr = if list.is_empty() {
            null()
        } else {
            list.as_ptr()
        };
        let mut outs = vec![null_mut(); results];
        self.count_call();
        self.shim().check(unsafe {
            self.shim().lib.clef_tt_op(
                self.raw(),
                name.as_ptr(),
                raw.as_ptr(),
                n_inputs,
                params.as_ptr(),
                n_params,
                list_ptr,
                n_list,
                outs.as_mut_ptr(),
                n_outs,
            )
        })?;
        outs.into_iter().map(|r| self.adopt(r)).collect()
    }

    /// A fine op of one result.
    fn op1(&self, op: &'static str, inputs: &[Input<'_>], params: &[f64]) -> Result<TtTensor> {
        self.fine_op(op, inputs, params, &[], 1)?
            .pop()
            .ok_or_else(|| missing_result(op))
    }

    /// A fine op of two results.
    fn op2(
        &self,
        op: &'static str,
        inputs: &[Input<'_>],
        params: &[f64],
    ) -> Result<(TtTensor, TtTensor)> {
        let mut out = self.fine_op(op, inputs, params, &[], 2)?;
        match (out.pop(), out.pop()) {
            (Some(second), Some(first)) => Ok((first, second)),
            _ => Err(missing_result(op)),
        }
    }
}

impl MeshOps for TtMesh {
    type Tensor = TtTensor;
    type Weight = TtWeight;

    fn mesh(&self) -> MeshShape {
        self.placement.shape
    }

    fn replicate(&self, host: &HostTensor) -> Result<TtTensor> {
        self.upload_rows(&[host], sys::CLEF_TT_REPLICATED)
    }

    fn shard(&self, parts: Vec<HostTensor>) -> Result<TtTensor> {
        if parts.len() != self.devices() {
            return Err(crate::DeviceError::Parts {
                op: "shard",
                got: parts.len(),
                devices: self.devices(),
            });
        }
        let refs: Vec<&HostTensor> = parts.iter().collect();
        self.upload_rows(&refs, sys::CLEF_TT_SHARDED)
    }

    fn gather(&self, t: &TtTensor, axis: GatherAxis) -> Result<HostTensor> {
        self.gather_rows(t, axis)
    }

    fn device_parts(&self, t: &TtTensor) -> Result<Vec<HostTensor>> {
        (0..self.devices())
            .map(|d| self.download(&t.0, d))
            .collect()
    }

    fn tensor_bytes(&self, t: &TtTensor) -> usize {
        t.0.info().map_or(0, |i| i.device_bytes as usize)
    }

    fn backend_name(&self) -> &'static str {
        "tt"
    }

    /// Tiles (32x32, padded): bf16 where ttnn keeps the class in bf16; the host shim keeps
    /// everything as f32 tiles (it rounds what is kept as bf16).
    fn held_bytes(&self, rows: usize, cols: usize, class: crate::Held) -> usize {
        use crate::formats::{packed_bytes, TileFormat};
        let bf16 = self.numerics().kept(class) == crate::Kept::Bf16;
        let format = if bf16 && self.shim().backend() == "ttnn" {
            TileFormat::Bf16
        } else {
            TileFormat::F32
        };
        packed_bytes(rows, cols, format)
    }

    fn usage(&self) -> Option<crate::DeviceUsage> {
        self.status().ok()
    }

    fn take_runtime_calls(&self) -> Vec<crate::RuntimeCalls> {
        self.take_op_stats()
            .ok()
            .map(|json| super::runtime_calls(&json))
            .unwrap_or_default()
    }

    fn export_weight(&self, w: &TtWeight) -> Result<Vec<WeightBytes>> {
        self.export(w)
    }

    fn import_weight(&self, parts: Vec<WeightBytes>) -> Result<TtWeight> {
        self.import(parts)
    }

    fn upload_weight(
        &self,
        parts: Vec<HostWeight>,
        format: WeightFormat,
        kind: WeightKind,
    ) -> Result<TtWeight> {
        self.upload_weight_parts(parts, format, kind)
    }

    fn weight_bytes(&self, w: &TtWeight) -> usize {
        w.handle.info().map_or(0, |i| i.device_bytes as usize)
    }

    // The fine ops: one clef_tt_op call each, the arguments in the order the shim's op table
    // declares them (ffi/shim/core/op_table.cpp).
    fn linear(&self, x: &TtTensor, w: &TtWeight) -> Result<TtTensor> {
        let numerics = matmul_numerics(&self.numerics).map(f64::from);
        self.op1("linear", &[Input::Tensor(x), Input::Weight(w)], &numerics)
    }

    fn all_reduce(&self, x: &TtTensor) -> Result<TtTensor> {
        if Self::placement_of(x)? == sys::CLEF_TT_REPLICATED {
            return Ok(x.clone());
        }
        self.op1("all_reduce", &[Input::Tensor(x)], &[])
    }

    fn split_cols(&self, x: &TtTensor, widths: &[usize]) -> Result<Vec<TtTensor>> {
        let w: Vec<u32> = widths
            .iter()
            .map(|&v| dim("split_cols", "width", v))
            .collect::<Result<_>>()?;
        self.fine_op("split_cols", &[Input::Tensor(x)], &[], &w, w.len())
    }

    fn add(&self, a: &TtTensor, b: &TtTensor) -> Result<TtTensor> {
        self.op1("add", &[Input::Tensor(a), Input::Tensor(b)], &[])
    }

    fn rms_norm(
        &self,
        x: &TtTensor,
        w: &TtWeight,
        group: usize,
        eps: f32,
        one_plus: bool,
    ) -> Result<TtTensor> {
        let group = dim("rms_norm", "group", group)?;
        let params = [f64::from(group), f64::from(eps), flag(one_plus)];
        self.op1("rms_norm", &[Input::Tensor(x), Input::Weight(w)], &params)
    }

    fn swiglu(&self, gate_up: &TtTensor) -> Result<TtTensor> {
        self.op1("swiglu", &[Input::Tensor(gate_up)], &[])
    }

    fn split_query_gate(
        &self,
        qg: &TtTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<(TtTensor, TtTensor)> {
        let (h, d) = (
            dim("split_query_gate", "heads", heads)?,
            dim("split_query_gate", "head dim", head_dim)?,
        );
        let params = [f64::from(h), f64::from(d)];
        self.op2("split_query_gate", &[Input::Tensor(qg)], &params)
    }

    fn rope(&self, x: &TtTensor, spec: &RopeSpec, positions: &[[u32; 3]]) -> Result<TtTensor> {
        let c = super::layers::rope_spec("rope", spec)?;
        let [t, h, w] = c.mrope_section.map(f64::from);
        let params = [
            f64::from(c.heads),
            f64::from(c.head_dim),
            f64::from(c.rotary_dim),
            t,
            h,
            w,
            c.theta,
        ];
        let flat = positions.as_flattened();
        let mut out = self.fine_op("rope", &[Input::Tensor(x)], &params, flat, 1)?;
        out.pop().ok_or_else(|| missing_result("rope"))
    }

    fn append_rows(
        &self,
        cache: Option<&TtTensor>,
        new: &TtTensor,
        heads: usize,
    ) -> Result<TtTensor> {
        let heads = dim("append_rows", "heads", heads)?;
        let inputs = [optional_input(cache), Input::Tensor(new)];
        self.op1("append_rows", &inputs, &[f64::from(heads)])
    }

    fn causal_attention(
        &self,
        q: &TtTensor,
        keys: &TtTensor,
        values: &TtTensor,
        spec: &AttentionSpec,
    ) -> Result<TtTensor> {
        let op = "causal_attention";
        let params = [
            f64::from(dim(op, "heads", spec.heads)?),
            f64::from(dim(op, "kv heads", spec.kv_heads)?),
            f64::from(dim(op, "head dim", spec.head_dim)?),
        ];
        let inputs = [Input::Tensor(q), Input::Tensor(keys), Input::Tensor(values)];
        self.op1(op, &inputs, &params)
    }

    fn mul_sigmoid(&self, x: &TtTensor, gate: &TtTensor) -> Result<TtTensor> {
        self.op1("mul_sigmoid", &[Input::Tensor(x), Input::Tensor(gate)], &[])
    }

    fn causal_conv1d_silu(
        &self,
        x: &TtTensor,
        w: &TtWeight,
        carry: Option<&TtTensor>,
        kernel: usize,
    ) -> Result<(TtTensor, TtTensor)> {
        let kernel = dim("causal_conv1d_silu", "kernel", kernel)?;
        let inputs = [Input::Tensor(x), Input::Weight(w), optional_input(carry)];
        self.op2("causal_conv1d_silu", &inputs, &[f64::from(kernel)])
    }

    fn delta_gates(
        &self,
        a: &TtTensor,
        b: &TtTensor,
        a_log: &TtWeight,
        dt_bias: &TtWeight,
    ) -> Result<(TtTensor, TtTensor)> {
        let inputs = [
            Input::Tensor(a),
            Input::Tensor(b),
            Input::Weight(a_log),
            Input::Weight(dt_bias),
        ];
        self.op2("delta_gates", &inputs, &[])
    }

    fn gated_delta_rule(
        &self,
        qkv: &TtTensor,
        g: &TtTensor,
        beta: &TtTensor,
        state: Option<&TtTensor>,
        spec: &DeltaNetSpec,
    ) -> Result<(TtTensor, TtTensor)> {
        let op = "gated_delta_rule";
        let params = [
            f64::from(dim(op, "key heads", spec.key_heads)?),
            f64::from(dim(op, "value heads", spec.value_heads)?),
            f64::from(dim(op, "key dim", spec.key_dim)?),
            f64::from(dim(op, "value dim", spec.value_dim)?),
        ];
        let inputs = [
            Input::Tensor(qkv),
            Input::Tensor(g),
            Input::Tensor(beta),
            optional_input(state),
        ];
        self.op2(op, &inputs, &params)
    }

    fn gated_rms_norm(
        &self,
        x: &TtTensor,
        z: &TtTensor,
        w: &TtWeight,
        group: usize,
        eps: f32,
    ) -> Result<TtTensor> {
        let group = dim("gated_rms_norm", "group", group)?;
        let inputs = [Input::Tensor(x), Input::Tensor(z), Input::Weight(w)];
        self.op1(
            "gated_rms_norm",
            &inputs,
            &[f64::from(group), f64::from(eps)],
        )
    }

    fn layer_norm(&self, x: &TtTensor, w: &TtWeight, b: &TtWeight, eps: f32) -> Result<TtTensor> {
        let inputs = [Input::Tensor(x), Input::Weight(w), Input::Weight(b)];
        self.op1("layer_norm", &inputs, &[f64::from(eps)])
    }

    fn add_bias(&self, x: &TtTensor, b: &TtWeight) -> Result<TtTensor> {
        self.op1("add_bias", &[Input::Tensor(x), Input::Weight(b)], &[])
    }

    fn gelu(&self, x: &TtTensor, kind: Gelu) -> Result<TtTensor> {
        let kind = match kind {
            Gelu::Tanh => sys::CLEF_TT_GELU_TANH,
            Gelu::Erf => sys::CLEF_TT_GELU_ERF,
        };
        self.op1("gelu", &[Input::Tensor(x)], &[f64::from(kind)])
    }

    fn rotary(
        &self,
        x: &TtTensor,
        cos: &TtTensor,
        sin: &TtTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<TtTensor> {
        let params = [
            f64::from(dim("rotary", "heads", heads)?),
            f64::from(dim("rotary", "head dim", head_dim)?),
        ];
        let inputs = [Input::Tensor(x), Input::Tensor(cos), Input::Tensor(sin)];
        self.op1("rotary", &inputs, &params)
    }

    fn segment_attention(
        &self,
        q: &TtTensor,
        k: &TtTensor,
        v: &TtTensor,
        heads: usize,
        head_dim: usize,
        segments: &[std::ops::Range<usize>],
    ) -> Result<TtTensor> {
        let op = "segment_attention";
        let params = [
            f64::from(dim(op, "heads", heads)?),
            f64::from(dim(op, "head dim", head_dim)?),
        ];
        let bounds: Vec<u32> = segments
            .iter()
            .flat_map(|s| [s.start, s.end])
            .map(|v| dim(op, "segment bound", v))
            .collect::<Result<_>>()?;
        let inputs = [Input::Tensor(q), Input::Tensor(k), Input::Tensor(v)];
        let mut out = self.fine_op(op, &inputs, &params, &bounds, 1)?;
        out.pop().ok_or_else(|| missing_result(op))
    }

    fn fold_rows(&self, x: &TtTensor, group: usize) -> Result<TtTensor> {
        let group = dim("fold_rows", "group", group)?;
        self.op1("fold_rows", &[Input::Tensor(x)], &[f64::from(group)])
    }

    // The layer ops: one clef_tt_layer_op call each (layers.rs); None where the shim does
    // not run them.
    fn batch_limit(&self, spec: &DeltaNetSpec) -> usize {
        // The backend's cores for batch x value heads (0: no batched layer ops on this mesh).
        let cores = self
            .describe()
            .ok()
            .and_then(|d| serde_json::from_str::<Value>(&d).ok())
            .and_then(|d| d["batch_cores"].as_u64())
            .unwrap_or(0) as usize;
        cores.checked_div(spec.value_heads).unwrap_or(0)
    }

    fn attention_layer_batched(
        &self,
        l: &AttentionLayer<'_, TtTensor, TtWeight>,
        batch: &RowBatch,
    ) -> Option<Result<BatchedLayer<TtTensor>>> {
        self.attention_call(l, Some(batch))
            .map(|out| out.and_then(stream_and_pairs))
            .transpose()
    }

    fn delta_net_layer_batched(
        &self,
        l: &DeltaNetLayer<'_, TtTensor, TtWeight>,
        batch: &RowBatch,
    ) -> Option<Result<BatchedLayer<TtTensor>>> {
        self.delta_net_call(l, Some(batch))
            .map(|out| out.and_then(stream_and_pairs))
            .transpose()
    }

    fn attention_layer(
        &self,
        l: &AttentionLayer<'_, TtTensor, TtWeight>,
    ) -> Option<Result<[TtTensor; 3]>> {
        self.attention_call(l, None)
            .map(|out| out.and_then(three))
            .transpose()
    }

    fn delta_net_layer(
        &self,
        l: &DeltaNetLayer<'_, TtTensor, TtWeight>,
    ) -> Option<Result<[TtTensor; 3]>> {
        self.delta_net_call(l, None)
            .map(|out| out.and_then(three))
            .transpose()
    }

    fn mlp_layer(&self, l: &MlpLayer<'_, TtTensor, TtWeight>) -> Option<Result<TtTensor>> {
        let run = || -> Result<Option<TtTensor>> {
            let inputs = [
                Input::Tensor(l.h),
                Input::Weight(l.norm),
                Input::Weight(l.gate_up),
                Input::Weight(l.down),
            ];
            let params = json!({"eps": l.eps, "reduce": l.all_reduce});
            let results = [(
                self.rows_of(l.h)?,
                self.cols_of(l.h)?,
                sys::CLEF_TT_REPLICATED,
            )];
            let out = self.layer_op("mlp", &inputs, params, None, &results)?;
            Ok(out.and_then(|v| v.into_iter().next()))
        };
        run().transpose()
    }

    // Whole passes (passes.rs).
    fn prefill_pass(
        &self,
        pass: &PrefillPass<'_, TtTensor, TtWeight>,
    ) -> Option<Result<PassOutput<TtTensor>>> {
        self.pass_call(pass).transpose()
    }

    fn configure_passes(&self, kv_tokens: usize) -> Result<()> {
        self.trace_configure(kv_tokens)
    }

    fn pass_stats(&self) -> Option<PassStats> {
        self.trace_facts()
    }
}
