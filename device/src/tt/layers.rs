//! The one call behind [`TtMesh`]'s layer ops (`MeshOps::attention_layer` and the others, in
//! ops.rs): the shim's generic entry `clef_tt_layer_op`, given the op's name, its tensors in order, its sizes as JSON,
//! the rope of its rows, and the shape of each result. A layer op is written once in the
//! backend (ffi/shim/ttnn/clef_tt_ttnn/layers.py) and called once in ops.rs; the C ABI, the
//! shim's core and the bridge need no change per op. A backend that does not run an op for the given
//! shapes answers `CLEF_TT_UNSUPPORTED` before computing anything, and the caller composes the
//! layer from the fine ops.
//!
//! SAFETY (the one block below): every tensor pointer comes from a live handle of this mesh
//! that outlives the call, the strings, the rope spec, the positions and the result specs are
//! locals that outlive it, and the output pointers are the locals adopted after it.

use super::ops::matmul_numerics;
use super::{dim, TtMesh, TtTensor, TtWeight};
use crate::fine_call::Operand;
use crate::{AttentionLayer, BatchedLayer, DeltaNetLayer, DeviceError, Result, RopeSpec, RowBatch};
use clef_tt_abi as sys;
use serde_json::{json, Value};
use std::ffi::CString;
use std::ptr::null_mut;

/// One input of an op on this mesh: a tensor, a weight or an absent optional tensor (a fine
/// op's call holds the same, fine_call.rs).
pub(super) type Input<'a> = Operand<'a, TtTensor, TtWeight>;

impl Input<'_> {
    pub(super) fn raw(&self) -> *const sys::clef_tt_tensor {
        match self {
            Input::Tensor(t) => t.raw(),
            Input::Weight(w) => w.raw(),
            Input::Absent => std::ptr::null(),
        }
    }
}

pub(super) fn optional_input(t: Option<&TtTensor>) -> Input<'_> {
    t.map_or(Input::Absent, Input::Tensor)
}

impl TtMesh {
    /// One call of `clef_tt_layer_op`: `Ok(None)` when the shim does not run `op` for these
    /// arguments. `results` are (rows, cols, placement) per result.
    pub(super) fn layer_op(
        &self,
        op: &'static str,
        inputs: &[Input<'_>],
        params: Value,
        rope: Option<(&RopeSpec, &[[u32; 3]])>,
        results: &[(usize, usize, u32)],
    ) -> Result<Option<Vec<TtTensor>>> {
        let name = CString::new(op).map_err(|_| DeviceError::Shape {
            op,
            detail: "a layer op name with a NUL".into(),
        })?;
        let mut params = params;
        params["config"] = matmul_params(&self.numerics);
        let params = CString::new(params.to_string()).map_err(|_| DeviceError::Shape {
            op,
            detail: "parameters with a NUL".into(),
        })?;
        let raw: Vec<*const sys::clef_tt_tensor> = inputs.iter().map(Input::raw).collect();
        let specs = results
            .iter()
            .map(|&(rows, cols, placement)| {
                Ok(sys::clef_tt_result_spec {
                    rows: dim(op, "result rows", rows)?,
                    cols: dim(op, "result columns", cols)?,
                    placement,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (spec, positions) = match rope {
            Some((s, p)) => (Some(rope_spec(op, s)?), p),
            None => (None, &[][..]),
        };
        let rows = dim(op, "positions", positions.len())?;
        let mut outs = vec![null_mut(); results.len()];
        self.count_call();
        // SAFETY: see the module header.
        let status = unsafe {
            self.shim().lib.clef_tt_layer_op(
                self.raw(),
                name.as_ptr(),
                raw.as_ptr(),
                dim(op, "inputs", raw.len())?,
                params.as_ptr(),
                spec.as_ref().map_or(std::ptr::null(), |s| s as *const _),
                positions.as_ptr().cast::<u32>(),
                rows,
                specs.as_ptr(),
                dim(op, "results", specs.len())?,
                outs.as_mut_ptr(),
            )
        };
        if status as u32 == sys::CLEF_TT_UNSUPPORTED {
            return Ok(None);
        }
        self.shim().check(status)?;
        outs.into_iter()
            .map(|raw| self.adopt(raw))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Placement of a per-device state (KV heads, DeltaNet channels): sharded over a mesh.
    pub(super) fn per_device(&self) -> u32 {
        if self.devices() > 1 {
            sys::CLEF_TT_SHARDED
        } else {
            sys::CLEF_TT_REPLICATED
        }
    }

    pub(super) fn rows_of(&self, t: &TtTensor) -> Result<usize> {
        Ok(t.0.info()?.rows as usize)
    }

    pub(super) fn cols_of(&self, t: &TtTensor) -> Result<usize> {
        Ok(t.0.info()?.cols as usize)
    }
}

pub(super) fn three(v: Vec<TtTensor>) -> Option<[TtTensor; 3]> {
    <[TtTensor; 3]>::try_from(v).ok()
}

/// A batched layer op's results: the stream, then a pair per kept prefix.
pub(super) fn stream_and_pairs(v: Vec<TtTensor>) -> Option<BatchedLayer<TtTensor>> {
    let mut v = v.into_iter();
    let stream = v.next()?;
    let rest: Vec<TtTensor> = v.collect();
    if !rest.len().is_multiple_of(2) {
        return None;
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    let mut rest = rest.into_iter();
    while let (Some(a), Some(b)) = (rest.next(), rest.next()) {
        pairs.push([a, b]);
    }
    Some((stream, pairs))
}

/// The matmul numerics as the backend's `linear` takes them (the op `linear`'s parameters).
fn matmul_params(n: &crate::Numerics) -> Value {
    let [fidelity, fp32_dest_acc, bf16_activations, packer_l1_acc] = matmul_numerics(n);
    json!({
        "fidelity": fidelity, "fp32_dest_acc": fp32_dest_acc,
        "bf16_activations": bf16_activations, "packer_l1_acc": packer_l1_acc,
    })
}

pub(super) fn rope_spec(op: &'static str, spec: &RopeSpec) -> Result<sys::clef_tt_rope_spec> {
    Ok(sys::clef_tt_rope_spec {
        heads: dim(op, "heads", spec.heads)?,
        head_dim: dim(op, "head dim", spec.head_dim)?,
        rotary_dim: dim(op, "rotary dim", spec.rotary_dim)?,
        mrope_section: [
            dim(op, "section", spec.mrope_section[0])?,
            dim(op, "section", spec.mrope_section[1])?,
            dim(op, "section", spec.mrope_section[2])?,
        ],
        theta: spec.theta,
    })
}

/// The batched pass's parameters as the layer ops take them (layers.py).
fn batch_params(params: &mut Value, batch: Option<&RowBatch>) {
    if let Some(b) = batch {
        params["batch"] = json!({
            "requests": b.lengths.len(), "lengths": b.lengths, "keep": b.keep,
        });
    }
}

impl TtMesh {
    /// The attention layer op: the stream, keys and values; a batched pass, the stream and
    /// each kept prefix's keys and values.
    pub(super) fn attention_call(
        &self,
        l: &AttentionLayer<'_, TtTensor, TtWeight>,
        batch: Option<&RowBatch>,
    ) -> Result<Option<Vec<TtTensor>>> {
        let rows = self.rows_of(l.h)?;
        let start = l.cache.map_or(Ok(0), |(k, _)| self.rows_of(k))?;
        let kv_cols = l.spec.kv_heads * l.spec.head_dim;
        let inputs = [
            Input::Tensor(l.h),
            Input::Weight(l.norm),
            Input::Weight(l.qkv),
            Input::Weight(l.q_norm),
            Input::Weight(l.k_norm),
            Input::Weight(l.o_proj),
            optional_input(l.cache.map(|c| c.0)),
            optional_input(l.cache.map(|c| c.1)),
        ];
        let mut params = json!({
            "heads": l.spec.heads, "kv_heads": l.spec.kv_heads, "head_dim": l.spec.head_dim,
            "eps": l.eps, "reduce": l.all_reduce,
        });
        batch_params(&mut params, batch);
        let stream = (rows, self.cols_of(l.h)?, sys::CLEF_TT_REPLICATED);
        let kv = (start + rows, kv_cols, self.per_device());
        let results = match batch {
            Some(b) => std::iter::once(stream)
                .chain(b.kept().flat_map(|n| [(n, kv_cols, self.per_device()); 2]))
                .collect(),
            None => vec![stream, kv, kv],
        };
        self.layer_op(
            "attention",
            &inputs,
            params,
            Some((&l.rope, l.positions)),
            &results,
        )
    }

    /// The DeltaNet layer op: the stream, conv carry and state; a batched pass, the stream and
    /// each kept prefix's conv carry and state.
    pub(super) fn delta_net_call(
        &self,
        l: &DeltaNetLayer<'_, TtTensor, TtWeight>,
        batch: Option<&RowBatch>,
    ) -> Result<Option<Vec<TtTensor>>> {
        let s = &l.spec;
        let inputs = [
            Input::Tensor(l.h),
            Input::Weight(l.norm),
            Input::Weight(l.in_proj),
            Input::Weight(l.conv),
            Input::Weight(l.a_log),
            Input::Weight(l.dt_bias),
            Input::Weight(l.gated_norm),
            Input::Weight(l.out_proj),
            optional_input(l.carried.map(|c| c.0)),
            optional_input(l.carried.map(|c| c.1)),
        ];
        let mut params = json!({
            "key_heads": s.key_heads, "value_heads": s.value_heads, "key_dim": s.key_dim,
            "value_dim": s.value_dim, "conv_kernel": s.conv_kernel, "eps": l.eps,
            "reduce": l.all_reduce,
        });
        batch_params(&mut params, batch);
        let stream = (
            self.rows_of(l.h)?,
            self.cols_of(l.h)?,
            sys::CLEF_TT_REPLICATED,
        );
        let carry = (
            s.conv_kernel.saturating_sub(1),
            s.conv_channels(),
            self.per_device(),
        );
        let state = (s.value_heads * s.key_dim, s.value_dim, self.per_device());
        let results = match batch {
            Some(b) => std::iter::once(stream)
                .chain(b.kept().flat_map(|_| [carry, state]))
                .collect(),
            None => vec![stream, carry, state],
        };
        self.layer_op("delta_net", &inputs, params, None, &results)
    }
}
