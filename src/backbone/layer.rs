//! One decoder layer of the prefill: its mixer sublayer (gated attention or Gated DeltaNet) and
//! its MLP sublayer, each from its input norm to its residual add.
//!
//! A sublayer is first offered to the mesh as a layer op ([`MeshOps::attention_layer`] and the
//! others: one backend call, in the backend's own layouts). Where the mesh has none for these
//! shapes, or intermediates are traced, it is composed from the fine ops
//! ([`Backbone::attention`], [`Backbone::delta_net`] and the MLP below), which are the
//! definition the layer ops are tested against.

use super::weights::{LayerWeights, MixerWeights};
use super::{Backbone, Collective, LayerState, Mixed, PrefillError, TraceFn};
use clef_device::{AttentionLayer, DeltaNetLayer, GatherAxis, MeshOps, MlpLayer};

type Prev<'a, T> = Option<&'a LayerState<T>>;
/// What each request of a pass gives one layer: that layer's state, if any.
type Prevs<'a, 'b, T> = &'b [Prev<'a, T>];

impl<B: MeshOps> Backbone<B> {
    /// Whether layer `i`'s row-parallel outputs are all-reduced.
    pub(super) fn all_reduces(&self, i: usize) -> bool {
        self.plan.layers[i].reduce == Collective::AllReduce
    }

    /// Layer `i`'s attention sublayer as a layer op over `h`, continuing `cache` (its keys and
    /// values); `None` for a DeltaNet layer.
    pub(super) fn attention_op<'a>(
        &'a self,
        i: usize,
        h: &'a B::Tensor,
        lw: &'a LayerWeights<B::Weight>,
        cache: Option<(&'a B::Tensor, &'a B::Tensor)>,
        positions: &'a [[u32; 3]],
    ) -> Option<AttentionLayer<'a, B::Tensor, B::Weight>> {
        let (qkv, q_norm, k_norm, o_proj) = lw.mixer.attention()?;
        let spec = self.attention_spec();
        Some(AttentionLayer {
            h,
            norm: &lw.input_norm,
            qkv,
            q_norm,
            k_norm,
            o_proj,
            cache,
            positions,
            spec,
            rope: self.rope_spec(spec.heads),
            eps: self.config.rms_norm_eps,
            all_reduce: self.all_reduces(i),
        })
    }

    /// Layer `i`'s DeltaNet sublayer as a layer op over `h`, continuing `carried` (its conv
    /// carry and recurrent state); `None` for an attention layer.
    pub(super) fn delta_net_op<'a>(
        &'a self,
        i: usize,
        h: &'a B::Tensor,
        lw: &'a LayerWeights<B::Weight>,
        carried: Option<(&'a B::Tensor, &'a B::Tensor)>,
    ) -> Option<DeltaNetLayer<'a, B::Tensor, B::Weight>> {
        let (in_proj, conv, a_log, dt_bias, norm, out_proj) = lw.mixer.delta_net()?;
        Some(DeltaNetLayer {
            h,
            norm: &lw.input_norm,
            in_proj,
            conv,
            a_log,
            dt_bias,
            gated_norm: norm,
            out_proj,
            carried,
            spec: self.delta_spec(),
            eps: self.config.rms_norm_eps,
            all_reduce: self.all_reduces(i),
        })
    }

    /// Layer `i`'s input norm (fine path), traced.
    fn norm_traced(
        &self,
        name: String,
        h: &B::Tensor,
        w: &B::Weight,
        trace: &mut TraceFn,
    ) -> Result<B::Tensor, PrefillError> {
        let m = &self.mesh;
        let cfg = &self.config;
        let x = m.rms_norm(h, w, cfg.hidden_size, cfg.rms_norm_eps, true)?;
        trace(name, &|| m.gather(&x, GatherAxis::Cols));
        Ok(x)
    }

    /// Layer `i`'s mixer sublayer on the residual stream `h` of the requests at `ranges`
    /// (`prev`: each one's earlier state of the layer): the new stream and each request's
    /// state of the layer. `layer_ops`: offer a pass of one request to the mesh as a layer op
    /// first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mixer(
        &self,
        i: usize,
        h: &B::Tensor,
        lw: &LayerWeights<B::Weight>,
        prev: Prevs<'_, '_, B::Tensor>,
        ranges: &[std::ops::Range<usize>],
        positions: &[[u32; 3]],
        layer_ops: bool,
        trace: &mut TraceFn,
    ) -> Result<Mixed<B::Tensor>, PrefillError> {
        let m = &self.mesh;
        let wrong = |what: &str| {
            PrefillError::State(format!(
                "layer {i}: a {what} state for a layer of another kind"
            ))
        };
        let (mixed, state) = match &lw.mixer {
            MixerWeights::Attention {
                qkv,
                q_norm,
                k_norm,
                o_proj,
            } => {
                let caches = prev
                    .iter()
                    .map(|p| match p {
                        Some(LayerState::Attention { keys, values }) => Ok(Some((keys, values))),
                        None => Ok(None),
                        Some(_) => Err(wrong("DeltaNet")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if let (true, [cache]) = (layer_ops, &caches[..]) {
                    let op = self.attention_op(i, h, lw, *cache, positions);
                    if let Some(done) = op.and_then(|layer| m.attention_layer(&layer)) {
                        let [h, keys, values] = done?;
                        return Ok((h, vec![LayerState::Attention { keys, values }]));
                    }
                }
                let x = self.norm_traced(
                    format!("layers.{i}.input_layernorm"),
                    h,
                    &lw.input_norm,
                    trace,
                )?;
                self.attention(
                    i, &x, qkv, q_norm, k_norm, o_proj, &caches, ranges, positions, trace,
                )?
            }
            MixerWeights::DeltaNet {
                in_proj,
                conv,
                a_log,
                dt_bias,
                norm,
                out_proj,
            } => {
                let carried = prev
                    .iter()
                    .map(|p| match p {
                        Some(LayerState::DeltaNet { conv, recurrent }) => {
                            Ok(Some((conv, recurrent)))
                        }
                        None => Ok(None),
                        Some(_) => Err(wrong("attention")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if let (true, [carried]) = (layer_ops, &carried[..]) {
                    let op = self.delta_net_op(i, h, lw, *carried);
                    if let Some(done) = op.and_then(|layer| m.delta_net_layer(&layer)) {
                        let [h, conv, recurrent] = done?;
                        return Ok((h, vec![LayerState::DeltaNet { conv, recurrent }]));
                    }
                }
                let x = self.norm_traced(
                    format!("layers.{i}.input_layernorm"),
                    h,
                    &lw.input_norm,
                    trace,
                )?;
                self.delta_net(
                    i, &x, in_proj, conv, a_log, dt_bias, norm, out_proj, &carried, ranges, trace,
                )?
            }
        };
        Ok((m.add(h, &mixed)?, state))
    }

    /// Layer `i`'s MLP sublayer on the residual stream `h`: the new stream.
    pub(super) fn mlp(
        &self,
        i: usize,
        h: &B::Tensor,
        lw: &LayerWeights<B::Weight>,
        layer_ops: bool,
        trace: &mut TraceFn,
    ) -> Result<B::Tensor, PrefillError> {
        let m = &self.mesh;
        if layer_ops {
            let layer = MlpLayer {
                h,
                norm: &lw.post_norm,
                gate_up: &lw.gate_up,
                down: &lw.down,
                eps: self.config.rms_norm_eps,
                all_reduce: self.all_reduces(i),
            };
            if let Some(done) = m.mlp_layer(&layer) {
                return Ok(done?);
            }
        }
        let x = self.norm_traced(
            format!("layers.{i}.post_attention_layernorm"),
            h,
            &lw.post_norm,
            trace,
        )?;
        let gu = m.linear(&x, &lw.gate_up)?;
        let act = m.swiglu(&gu)?;
        let down = self.reduce(i, m.linear(&act, &lw.down)?)?;
        trace(format!("layers.{i}.mlp"), &|| {
            m.gather(&down, GatherAxis::Cols)
        });
        Ok(m.add(h, &down)?)
    }
}
