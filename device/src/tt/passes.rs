//! [`TtMesh`]'s whole prefill pass (crate::pass): the layer op "pass" of the shim
//! (`clef_tt_layer_op`; its body in ffi/shim/ttnn/clef_tt_ttnn/passes.py, replayed there from a
//! ttnn trace per bucket of rows), and the backend's trace facts through the mesh command
//! channel ({"trace": "facts" | "configure"}). A shim without the op answers UNSUPPORTED and
//! the caller runs the layers.

use super::layers::{optional_input, Input};
use super::{TtMesh, TtTensor, TtWeight};
use crate::{
    DeviceError, GatherAxis, MeshOps, PassMixer, PassOutput, PassStats, PrefillPass, Result,
};
use clef_tt_abi as sys;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

impl TtMesh {
    /// One pass through the shim; `Ok(None)` when it does not run this one.
    pub(super) fn pass_call(
        &self,
        pass: &PrefillPass<'_, TtTensor, TtWeight>,
    ) -> Result<Option<PassOutput<TtTensor>>> {
        if self.shim().backend() != "ttnn" {
            return Ok(None);
        }
        let t = pass.rows.rows;
        let rows = self.replicate(pass.rows)?;
        let mut inputs = vec![Input::Tensor(&rows), Input::Weight(pass.final_norm)];
        let mut layers = Vec::with_capacity(pass.layers.len());
        let mut results = vec![(t, pass.rows.cols, sys::CLEF_TT_REPLICATED)];
        // The rows of each state a layer leaves: its one request's (start + T), or each kept
        // prefix's of a batch.
        let kept: Vec<usize> = match pass.batch {
            None => vec![pass.start + t],
            Some(b) => b.kept().collect(),
        };
        let mut rope = None;
        let per_device = self.per_device();
        for l in &pass.layers {
            let state = match &l.mixer {
                PassMixer::Attention {
                    norm,
                    qkv,
                    q_norm,
                    k_norm,
                    o_proj,
                    cache,
                    spec,
                    rope: r,
                    all_reduce,
                } => {
                    rope.get_or_insert(*r);
                    inputs.extend([*norm, *qkv, *q_norm, *k_norm, *o_proj].map(Input::Weight));
                    for &n in &kept {
                        let kv = (n, spec.kv_heads * spec.head_dim, per_device);
                        results.extend([kv, kv]);
                    }
                    layers.push(json!({
                        "kind": "attention",
                        "mixer": {
                            "heads": spec.heads, "kv_heads": spec.kv_heads,
                            "head_dim": spec.head_dim, "eps": pass.eps, "reduce": all_reduce,
                        },
                        "mlp": {"eps": pass.eps, "reduce": l.mlp_all_reduce},
                    }));
                    cache
                }
                PassMixer::DeltaNet {
                    norm,
                    in_proj,
                    conv,
                    a_log,
                    dt_bias,
                    gated_norm,
                    out_proj,
                    carried,
                    spec,
                    all_reduce,
                } => {
                    inputs.extend(
                        [
                            *norm,
                            *in_proj,
                            *conv,
                            *a_log,
                            *dt_bias,
                            *gated_norm,
                            *out_proj,
                        ]
                        .map(Input::Weight),
                    );
                    let carry = (
                        spec.conv_kernel.saturating_sub(1),
                        spec.conv_channels(),
                        per_device,
                    );
                    let state = (spec.value_heads * spec.key_dim, spec.value_dim, per_device);
                    for _ in &kept {
                        results.extend([carry, state]);
                    }
                    layers.push(json!({
                        "kind": "delta_net",
                        "mixer": {
                            "key_heads": spec.key_heads, "value_heads": spec.value_heads,
                            "key_dim": spec.key_dim, "value_dim": spec.value_dim,
                            "conv_kernel": spec.conv_kernel, "eps": pass.eps,
                            "reduce": all_reduce,
                        },
                        "mlp": {"eps": pass.eps, "reduce": l.mlp_all_reduce},
                    }));
                    carried
                }
            };
            inputs.extend([l.post_norm, l.gate_up, l.down].map(Input::Weight));
            inputs.push(optional_input(state.map(|s| s.0)));
            inputs.push(optional_input(state.map(|s| s.1)));
        }
        let Some(rope) = rope else {
            return Ok(None);
        };
        let mut params = json!({
            "layers": layers, "eps": pass.eps, "start": pass.start, "consume": pass.consume,
        });
        if let Some(b) = pass.batch {
            params["batch"] = json!({
                "requests": b.lengths.len(), "lengths": b.lengths, "keep": b.keep,
            });
        }
        let Some(out) = self.layer_op(
            "pass",
            &inputs,
            params,
            Some((&rope, pass.positions)),
            &results,
        )?
        else {
            self.mesh.refused_passes.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let mut out = out.into_iter();
        let hidden = out.next().ok_or_else(|| short("the final rows"))?;
        let hidden = self.gather(&hidden, GatherAxis::Cols)?;
        let mut states = Vec::with_capacity(pass.layers.len());
        while let (Some(a), Some(b)) = (out.next(), out.next()) {
            states.push([a, b]);
        }
        if states.len() != pass.layers.len() * kept.len() {
            return Err(short("every state the pass leaves"));
        }
        Ok(Some(PassOutput { hidden, states }))
    }

    /// The backend's facts of its passes ({"trace": "facts"}); `None` for a shim without
    /// them.
    pub(super) fn trace_facts(&self) -> Option<PassStats> {
        let facts: Value =
            serde_json::from_str(&self.command(r#"{"trace":"facts"}"#).ok()?).ok()?;
        let count = |k: &str| facts[k].as_u64().unwrap_or(0);
        let mut eager: Vec<(String, u64)> = facts["passes"]["eager"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        // Chunks the shim's pass did not take ran layer by layer, op by op.
        eager.push((
            "layer by layer".into(),
            self.mesh.refused_passes.load(Ordering::Relaxed),
        ));
        Some(PassStats {
            tracing: facts["mode"] == "traced",
            traced: facts["passes"]["traced"].as_u64().unwrap_or(0),
            eager,
            forms: count("forms"),
            traces: count("traces"),
            captures: count("captures"),
            replays: count("replays"),
            trace_region_bytes: count("trace_region_bytes"),
            reserved_bytes: count("plug_bytes"),
            buckets: facts["buckets"]
                .as_array()
                .map(|b| {
                    b.iter()
                        .filter_map(|v| v.as_u64())
                        .map(|v| v as usize)
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// How the shim runs whole passes from now on ({"trace": "configure"}): "traced" (the
    /// default), "eager" (every op dispatched: to check replays against) or "off" (the layers
    /// one by one); the default comes from `CLEF_TT_TRACE` where the shim starts.
    pub fn set_pass_mode(&self, mode: &str) -> Result<()> {
        self.command(&json!({"trace": "configure", "mode": mode}).to_string())
            .map(|_| ())
    }

    /// Room for `kv_tokens` tokens in the passes' KV pools ({"trace": "configure"}); a shim
    /// without passes ignores it.
    pub(super) fn trace_configure(&self, kv_tokens: usize) -> Result<()> {
        let request = json!({"trace": "configure", "kv_tokens": kv_tokens}).to_string();
        match self.command(&request) {
            Err(DeviceError::Shim {
                status: "unsupported",
                ..
            })
            | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn short(what: &str) -> DeviceError {
    DeviceError::Shape {
        op: "pass",
        detail: format!("the shim returned too few results: no {what}"),
    }
}
