//! Every [`MeshOps`] op of [`TtMesh`] as its C ABI call. The shim checks the arguments and
//! computes placements (the same rules as the CPU mesh), so these are thin: convert the
//! parameters, call, own the results.
//!
//! SAFETY (all blocks below): every tensor pointer comes from a live handle of this mesh that
//! outlives the call, every parameter struct or slice outlives the call, and the output
//! pointers are the call helpers' locals.

use super::layers::{stream_and_pairs, three, Input};
use super::{dim, TtMesh, TtTensor, TtWeight};
use crate::{
    AttentionLayer, AttentionSpec, BatchedLayer, DeltaNetLayer, DeltaNetSpec, GatherAxis, Gelu,
    HostTensor, HostWeight, MeshOps, MeshShape, MlpLayer, Numerics, PassOutput, PassStats,
    PrefillPass, Result, RopeSpec, RowBatch, WeightBytes, WeightFormat, WeightKind,
};
use clef_tt_abi as sys;
use serde_json::{json, Value};
use std::ptr::null;

pub(super) fn matmul_config(n: &Numerics) -> sys::clef_tt_matmul_config {
    use crate::Fidelity;
    sys::clef_tt_matmul_config {
        fidelity: match n.fidelity {
            Fidelity::Exact => sys::CLEF_TT_EXACT,
            Fidelity::LoFi => sys::CLEF_TT_LOFI,
            Fidelity::HiFi2 => sys::CLEF_TT_HIFI2,
            Fidelity::HiFi3 => sys::CLEF_TT_HIFI3,
            Fidelity::HiFi4 => sys::CLEF_TT_HIFI4,
        },
        fp32_dest_acc: u32::from(!n.bf16_accumulation),
        bf16_activations: u32::from(n.bf16_activations),
        packer_l1_acc: 1,
    }
}

fn optional(t: Option<&TtTensor>) -> *const sys::clef_tt_tensor {
    t.map_or(null(), TtTensor::raw)
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

    fn linear(&self, x: &TtTensor, w: &TtWeight) -> Result<TtTensor> {
        let config = matmul_config(&self.numerics);
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_linear(self.raw(), x.raw(), w.raw(), &config, out)
        })
    }

    fn all_reduce(&self, x: &TtTensor) -> Result<TtTensor> {
        if Self::placement_of(x)? == sys::CLEF_TT_REPLICATED {
            return Ok(x.clone());
        }
        self.call1(|out| unsafe { self.shim().lib.clef_tt_all_reduce(self.raw(), x.raw(), out) })
    }

    fn split_cols(&self, x: &TtTensor, widths: &[usize]) -> Result<Vec<TtTensor>> {
        let w: Vec<u32> = widths
            .iter()
            .map(|&v| dim("split_cols", "width", v))
            .collect::<Result<_>>()?;
        let n = dim("split_cols", "blocks", w.len())?;
        let mut outs = vec![std::ptr::null_mut(); w.len()];
        self.count_call();
        self.shim().check(unsafe {
            self.shim().lib.clef_tt_split_cols(
                self.raw(),
                x.raw(),
                w.as_ptr(),
                n,
                outs.as_mut_ptr(),
            )
        })?;
        outs.into_iter().map(|raw| self.adopt(raw)).collect()
    }

    fn add(&self, a: &TtTensor, b: &TtTensor) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_add(self.raw(), a.raw(), b.raw(), out)
        })
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
        self.call1(|out| unsafe {
            self.shim().lib.clef_tt_rms_norm(
                self.raw(),
                x.raw(),
                w.raw(),
                group,
                eps,
                u32::from(one_plus),
                out,
            )
        })
    }

    fn swiglu(&self, gate_up: &TtTensor) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_swiglu(self.raw(), gate_up.raw(), out)
        })
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
        self.call2(|q, g| unsafe {
            self.shim()
                .lib
                .clef_tt_split_query_gate(self.raw(), qg.raw(), h, d, q, g)
        })
    }

    fn rope(&self, x: &TtTensor, spec: &RopeSpec, positions: &[[u32; 3]]) -> Result<TtTensor> {
        let c = super::layers::rope_spec("rope", spec)?;
        let rows = dim("rope", "rows", positions.len())?;
        // `[[u32; 3]]` is laid out as 3 * rows consecutive u32.
        let flat = positions.as_ptr().cast::<u32>();
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_rope(self.raw(), x.raw(), &c, flat, rows, out)
        })
    }

    fn append_rows(
        &self,
        cache: Option<&TtTensor>,
        new: &TtTensor,
        heads: usize,
    ) -> Result<TtTensor> {
        let heads = dim("append_rows", "heads", heads)?;
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_append_rows(self.raw(), optional(cache), new.raw(), heads, out)
        })
    }

    fn causal_attention(
        &self,
        q: &TtTensor,
        keys: &TtTensor,
        values: &TtTensor,
        spec: &AttentionSpec,
    ) -> Result<TtTensor> {
        let op = "causal_attention";
        let (h, kv, d) = (
            dim(op, "heads", spec.heads)?,
            dim(op, "kv heads", spec.kv_heads)?,
            dim(op, "head dim", spec.head_dim)?,
        );
        self.call1(|out| unsafe {
            self.shim().lib.clef_tt_causal_attention(
                self.raw(),
                q.raw(),
                keys.raw(),
                values.raw(),
                h,
                kv,
                d,
                out,
            )
        })
    }

    fn mul_sigmoid(&self, x: &TtTensor, gate: &TtTensor) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_mul_sigmoid(self.raw(), x.raw(), gate.raw(), out)
        })
    }

    fn causal_conv1d_silu(
        &self,
        x: &TtTensor,
        w: &TtWeight,
        carry: Option<&TtTensor>,
        kernel: usize,
    ) -> Result<(TtTensor, TtTensor)> {
        let kernel = dim("causal_conv1d_silu", "kernel", kernel)?;
        self.call2(|out, next| unsafe {
            self.shim().lib.clef_tt_causal_conv1d_silu(
                self.raw(),
                x.raw(),
                w.raw(),
                optional(carry),
                kernel,
                out,
                next,
            )
        })
    }

    fn delta_gates(
        &self,
        a: &TtTensor,
        b: &TtTensor,
        a_log: &TtWeight,
        dt_bias: &TtWeight,
    ) -> Result<(TtTensor, TtTensor)> {
        self.call2(|g, beta| unsafe {
            self.shim().lib.clef_tt_delta_gates(
                self.raw(),
                a.raw(),
                b.raw(),
                a_log.raw(),
                dt_bias.raw(),
                g,
                beta,
            )
        })
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
        let c = sys::clef_tt_delta_spec {
            key_heads: dim(op, "key heads", spec.key_heads)?,
            value_heads: dim(op, "value heads", spec.value_heads)?,
            key_dim: dim(op, "key dim", spec.key_dim)?,
            value_dim: dim(op, "value dim", spec.value_dim)?,
        };
        self.call2(|out, next| unsafe {
            self.shim().lib.clef_tt_gated_delta_rule(
                self.raw(),
                qkv.raw(),
                g.raw(),
                beta.raw(),
                optional(state),
                &c,
                out,
                next,
            )
        })
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
        self.call1(|out| unsafe {
            self.shim().lib.clef_tt_gated_rms_norm(
                self.raw(),
                x.raw(),
                z.raw(),
                w.raw(),
                group,
                eps,
                out,
            )
        })
    }

    fn layer_norm(&self, x: &TtTensor, w: &TtWeight, b: &TtWeight, eps: f32) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_layer_norm(self.raw(), x.raw(), w.raw(), b.raw(), eps, out)
        })
    }

    fn add_bias(&self, x: &TtTensor, b: &TtWeight) -> Result<TtTensor> {
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_add_bias(self.raw(), x.raw(), b.raw(), out)
        })
    }

    fn gelu(&self, x: &TtTensor, kind: Gelu) -> Result<TtTensor> {
        let kind = match kind {
            Gelu::Tanh => sys::CLEF_TT_GELU_TANH,
            Gelu::Erf => sys::CLEF_TT_GELU_ERF,
        };
        self.call1(|out| unsafe { self.shim().lib.clef_tt_gelu(self.raw(), x.raw(), kind, out) })
    }

    fn rotary(
        &self,
        x: &TtTensor,
        cos: &TtTensor,
        sin: &TtTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<TtTensor> {
        let (h, d) = (
            dim("rotary", "heads", heads)?,
            dim("rotary", "head dim", head_dim)?,
        );
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_rotary(self.raw(), x.raw(), cos.raw(), sin.raw(), h, d, out)
        })
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
        let (h, d) = (dim(op, "heads", heads)?, dim(op, "head dim", head_dim)?);
        let bounds: Vec<u32> = segments
            .iter()
            .flat_map(|s| [s.start, s.end])
            .map(|v| dim(op, "segment bound", v))
            .collect::<Result<_>>()?;
        let n = dim(op, "segments", segments.len())?;
        self.call1(|out| unsafe {
            self.shim().lib.clef_tt_segment_attention(
                self.raw(),
                q.raw(),
                k.raw(),
                v.raw(),
                h,
                d,
                bounds.as_ptr(),
                n,
                out,
            )
        })
    }

    fn fold_rows(&self, x: &TtTensor, group: usize) -> Result<TtTensor> {
        let group = dim("fold_rows", "group", group)?;
        self.call1(|out| unsafe {
            self.shim()
                .lib
                .clef_tt_fold_rows(self.raw(), x.raw(), group, out)
        })
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
