//! Every [`MeshOps`] op of [`TtMesh`] as its C ABI call: a fine op's call (built by the
//! trait's default body, generated from the op table: fine_ops.rs) through the generic
//! `clef_tt_op` as it is, a layer op through `clef_tt_layer_op` (layers.rs). The shim checks
//! the arguments against its op table (ffi/shim/core/op_table.cpp) and computes placements (the
//! same rules as the CPU mesh), so these are thin: call, own the results.
//!
//! SAFETY (all blocks below): every tensor pointer comes from a live handle of this mesh that
//! outlives the call, every parameter struct or slice outlives the call, and the output
//! pointers are the call helpers' locals.

use super::layers::{stream_and_pairs, three, Input};
use super::{dim, TtMesh, TtTensor, TtWeight};
use crate::fine_call::{one, FineCall};
use crate::{
    AttentionLayer, BatchedLayer, DeltaNetLayer, DeltaNetSpec, DeviceError, GatherAxis, HostTensor,
    HostWeight, MeshOps, MeshShape, MlpLayer, Numerics, PassOutput, PassStats, PrefillPass, Result,
    RowBatch, WeightBytes, WeightFormat, WeightKind,
};
use clef_tt_abi as sys;
use serde_json::{json, Value};
use std::borrow::Cow;
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

/// The value of a parameter the op table leaves to the mesh's profile, by its name there (an
/// op whose table entry names one this mesh does not know is unsupported here).
fn profile_param(n: &Numerics, op: &'static str, name: &str) -> Result<u32> {
    let [fidelity, fp32_dest_acc, bf16_activations, packer_l1_acc] = matmul_numerics(n);
    match name {
        "fidelity" => Ok(fidelity),
        "fp32_dest_acc" => Ok(fp32_dest_acc),
        "bf16_activations" => Ok(bf16_activations),
        "packer_l1_acc" => Ok(packer_l1_acc),
        _ => Err(DeviceError::Unsupported { op, backend: "tt" }),
    }
}

impl TtMesh {
    /// One call of `clef_tt_op`: `op`'s tensors and parameters in the order its declaration in
    /// the shim's op table gives them (ffi/shim/core/op_table.cpp), its list of numbers, and
    /// `results` results.
    fn call_op(
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

    // The fine ops: each is its call (the default bodies of MeshOps, fine_ops.rs), passed to
    // clef_tt_op with the parameters it leaves to the mesh's profile filled in (linear's
    // matmul numerics); all_reduce leaves a replicated tensor as it is.
    fn fine_op(&self, call: &FineCall<'_, TtTensor, TtWeight>) -> Result<Vec<TtTensor>> {
        let mut params = Cow::Borrowed(&call.params);
        for &(i, name) in &call.profile {
            let value = f64::from(profile_param(&self.numerics, call.op, name)?);
            // A place past the parameters (never built so) stays out: the shim refuses the count.
            if let Some(slot) = params.to_mut().get_mut(i) {
                *slot = value;
            }
        }
        self.call_op(call.op, &call.operands, &params, &call.list, call.results)
    }

    fn all_reduce(&self, x: &TtTensor) -> Result<TtTensor> {
        if Self::placement_of(x)? == sys::CLEF_TT_REPLICATED {
            return Ok(x.clone());
        }
        let call = FineCall::new("all_reduce").tensor(x);
        one(call.op, self.fine_op(&call)?)
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
