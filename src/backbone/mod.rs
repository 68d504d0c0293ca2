//! The Qwen3.5 text prefill, written once against `clef-device`'s [`MeshOps`].
//!
//! `prefill` embeds the ids on the host, runs every decoder layer on the mesh (Gated DeltaNet
//! or gated attention, then the SwiGLU MLP, residual adds in between) and returns the final
//! RMS-normed hidden row of every token (Qwen3.5's architecture). It can start from the
//! state of an earlier pass at position P (KV rows of the attention layers, conv carry and
//! recurrent state of the DeltaNet layers) and returns the state at its end, so a prompt can be
//! computed as a prefix pass and a tail pass. A mesh that runs a whole chunk in one call (the
//! ttnn backend, replaying it from a trace) gets it as one ([`Backbone::prefill_chunk`]).

mod batched;
pub use batched::Batched;
mod layer;
mod passes;
pub mod plan;
mod weights;

pub use passes::PassWarmup;

pub use plan::{Collective, Split, TpPlan};
pub use weights::{device_parts, CheckpointSource, LoadError};

use crate::checkpoint::{Checkpoint, LayerKind, RowError, RowTable, TextConfig};
use crate::precision::Precision;
use clef_device::fine_call::list_u32;
use clef_device::formats::bf16;
use clef_device::{
    AttentionSpec, DeltaNetSpec, DeviceError, GatherAxis, Held, HostTensor, MeshOps, RopeSpec,
    WeightFormat,
};
use rayon::prelude::*;
use std::borrow::Cow;
use std::ops::Range;
pub use weights::{count_weights, visit_weights, PlacedWeights, WeightFormats};
use weights::{LayerWeights, MixerWeights};

/// Errors of a prefill.
#[derive(Debug, thiserror::Error)]
pub enum PrefillError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("token id {id} at position {at} is outside the vocabulary of {vocab}")]
    TokenId { id: u32, at: usize, vocab: usize },
    #[error("{0}")]
    State(String),
    #[error("embeddings: {0}")]
    Weights(String),
}

/// The per-layer state a prefill leaves behind, on the mesh.
pub enum LayerState<T> {
    /// Keys (after norm and RoPE) and values of every position so far, `[P, kv_heads*d]` per
    /// device.
    Attention { keys: T, values: T },
    /// The last `kernel-1` pre-conv inputs `[kernel-1, channels]` and the recurrent state
    /// `[value_heads*key_dim, value_dim]` per device.
    DeltaNet { conv: T, recurrent: T },
}

/// Everything needed to continue a prompt at `position`.
pub struct PrefillState<T> {
    pub position: usize,
    pub layers: Vec<LayerState<T>>,
}

/// One request's rows in a packed pass ([`Backbone::prefill_segments`]): `rows` consecutive
/// rows continuing `start` (the state its earlier rows left, or none at its first token).
pub struct Segment<'a, T> {
    pub rows: usize,
    pub start: Option<&'a PrefillState<T>>,
}

/// A sublayer's new residual stream and each request's state of the layer.
type Mixed<T> = (T, Vec<LayerState<T>>);
/// One request's rows out of a mixer and the layer state it leaves.
type RequestMix<T> = (T, LayerState<T>);
/// Each request's rows out of a mixer and the layer states they leave, in order.
type RequestsMix<T> = (Vec<T>, Vec<LayerState<T>>);

/// A pass's final rows and each request's state at its end.
pub type PassResult<T> = (HostTensor, Vec<PrefillState<T>>);

/// One layer's state in Hugging Face's layout (devices joined), for checks and snapshots.
#[derive(Clone, Debug, PartialEq)]
pub enum HfLayerState {
    /// `[kv_heads, P, d]` each.
    Attention { keys: Vec<f32>, values: Vec<f32> },
    /// conv `[conv_dim, kernel-1]` (oldest first) and recurrent `[value_heads, dk, dv]`.
    DeltaNet { conv: Vec<f32>, recurrent: Vec<f32> },
}

/// Receives named intermediate tensors in Hugging Face's layout (names as in the
/// `tiny-qwen35` fixture, e.g. `layers.0.linear_attn.in_proj_qkv`).
pub type Tracer<'a> = &'a mut dyn FnMut(&str, HostTensor);

/// Receives, after every layer of a pass run layer by layer, the layer's index, the residual
/// stream's rows (devices joined; a batched pass: each request's rows in order, pad rows
/// dropped) and the states the layer leaves (per request; a batched pass: per kept prefix).
/// For `clef-tt compare-layers` (`crate::compare`).
pub type LayerProbe<'a, T> =
    &'a mut dyn FnMut(usize, HostTensor, &[&LayerState<T>]) -> Result<(), DeviceError>;

/// A lazily computed tensor for the tracer (only evaluated when a tracer is attached).
type Lazy<'a> = &'a dyn Fn() -> Result<HostTensor, DeviceError>;
/// The internal tracing hook: a name and a lazily computed tensor.
type TraceFn<'a> = dyn FnMut(String, Lazy) + 'a;

/// The text backbone placed on a mesh.
pub struct Backbone<B: MeshOps> {
    mesh: B,
    config: TextConfig,
    plan: TpPlan,
    layers: Vec<LayerWeights<B::Weight>>,
    final_norm: B::Weight,
    /// The checkpoint's embedding table; none for a synthetic backbone (prefill from rows).
    embeddings: Option<RowTable>,
    /// Round embedding rows to bf16 (the device's embedding table).
    bf16_embeddings: bool,
}

impl<B: MeshOps> Backbone<B> {
    /// Place the checkpoint's text weights on `mesh` with matrices held in `format`.
    pub fn load(ckpt: &Checkpoint, mesh: B, format: WeightFormat) -> Result<Self, LoadError> {
        Self::load_with(ckpt, mesh, &Precision::uniform(format))
    }

    /// Place the weights as `precision` holds them: each class of matrices in its format, and
    /// embedding rows rounded to bf16 where it keeps them so. The mesh computes and keeps as
    /// `precision.numerics()` says (it was opened with them).
    pub fn load_with(ckpt: &Checkpoint, mesh: B, precision: &Precision) -> Result<Self, LoadError> {
        Self::load_reporting(ckpt, mesh, precision, &|_, _| {})
    }

    /// [`Backbone::load_with`], calling `progress(done, total)` after every weight.
    pub fn load_reporting(
        ckpt: &Checkpoint,
        mesh: B,
        precision: &Precision,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, LoadError> {
        let plan = TpPlan::new(&ckpt.config.text, mesh.mesh().devices())?;
        let t0 = std::time::Instant::now();
        let formats = precision.weight_formats();
        let placed = weights::load_layers(&mesh, &ckpt.tensors, &plan, &formats, progress)?;
        let bf16_embeddings = precision.bf16_embeddings();
        Self::from_placed(ckpt, mesh, plan, placed, bf16_embeddings, t0, "checkpoint")
    }

    /// The backbone around weights placed (by `plan`) from `source` since `t0` (logged):
    /// from the checkpoint here, or from a tensor cache (`crate::tensor_cache`).
    pub fn from_placed(
        ckpt: &Checkpoint,
        mesh: B,
        plan: TpPlan,
        (layers, final_norm): PlacedWeights<B::Weight>,
        bf16_embeddings: bool,
        t0: std::time::Instant,
        source: &'static str,
    ) -> Result<Self, LoadError> {
        tracing::info!(
            ms = t0.elapsed().as_millis() as u64,
            source,
            "weights placed on the mesh"
        );
        Ok(Backbone {
            mesh,
            config: ckpt.config.text.clone(),
            plan,
            layers,
            final_norm,
            embeddings: Some(ckpt.embeddings()?),
            bf16_embeddings,
        })
    }

    /// A backbone of `config` around weights placed without a checkpoint (synthetic weights
    /// for measuring the device path, `clef-tt bench prefill --shape`): it has no embedding
    /// table, so it prefills from embedding rows ([`Backbone::prefill_embedded`]) only.
    pub fn synthetic(
        config: TextConfig,
        mesh: B,
        plan: TpPlan,
        (layers, final_norm): PlacedWeights<B::Weight>,
    ) -> Self {
        Backbone {
            mesh,
            config,
            plan,
            layers,
            final_norm,
            embeddings: None,
            bf16_embeddings: false,
        }
    }

    pub fn config(&self) -> &TextConfig {
        &self.config
    }
    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }
    pub fn mesh(&self) -> &B {
        &self.mesh
    }

    /// Bytes of weights placed on the mesh (all devices together).
    pub fn weight_bytes(&self) -> usize {
        let m = &self.mesh;
        let mut total = m.weight_bytes(&self.final_norm);
        for l in &self.layers {
            total += m.weight_bytes(&l.input_norm)
                + m.weight_bytes(&l.post_norm)
                + m.weight_bytes(&l.gate_up)
                + m.weight_bytes(&l.down);
            total += match &l.mixer {
                MixerWeights::Attention {
                    qkv,
                    q_norm,
                    k_norm,
                    o_proj,
                } => {
                    m.weight_bytes(qkv)
                        + m.weight_bytes(q_norm)
                        + m.weight_bytes(k_norm)
                        + m.weight_bytes(o_proj)
                }
                MixerWeights::DeltaNet {
                    in_proj,
                    conv,
                    a_log,
                    dt_bias,
                    norm,
                    out_proj,
                } => {
                    m.weight_bytes(in_proj)
                        + m.weight_bytes(conv)
                        + m.weight_bytes(a_log)
                        + m.weight_bytes(dt_bias)
                        + m.weight_bytes(norm)
                        + m.weight_bytes(out_proj)
                }
            };
        }
        total
    }

    /// Bytes a prefill state holds on the mesh.
    pub fn state_bytes(&self, state: &PrefillState<B::Tensor>) -> usize {
        let m = &self.mesh;
        state
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { keys, values } => {
                    m.tensor_bytes(keys) + m.tensor_bytes(values)
                }
                LayerState::DeltaNet { conv, recurrent } => {
                    m.tensor_bytes(conv) + m.tensor_bytes(recurrent)
                }
            })
            .sum()
    }

    /// Bytes a prefill state at position `p` will hold on the mesh, from the configuration
    /// and the backend's storage of each kept class (every device owns whole KV
    /// and value heads, so nothing is stored twice): K and V rows of every attention layer,
    /// conv carry and recurrent state of every DeltaNet layer.
    pub fn state_bytes_at(&self, p: usize) -> usize {
        let c = &self.config;
        let tp = self.plan.devices;
        let m = &self.mesh;
        let kv = 2 * m.held_bytes(p, c.num_key_value_heads / tp * c.head_dim, Held::KvCache);
        let conv = m.held_bytes(
            c.linear_conv_kernel_dim - 1,
            c.conv_dim() / tp,
            Held::Activation,
        );
        let recurrent = m.held_bytes(
            c.linear_num_value_heads / tp * c.linear_key_head_dim,
            c.linear_value_head_dim,
            Held::DeltaNetState,
        );
        tp * (c.count(LayerKind::Attention) * kv
            + c.count(LayerKind::DeltaNet) * (conv + recurrent))
    }

    /// Embedding rows of `ids` (read from the checkpoint file, widened to f32).
    pub fn embed(&self, ids: &[u32]) -> Result<HostTensor, PrefillError> {
        let h = self.config.hidden_size;
        let rows: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
        let table = self.embeddings.as_ref().ok_or_else(|| {
            PrefillError::Weights("a synthetic backbone has no embedding table".into())
        })?;
        let mut data = table.rows_f32(&rows).map_err(|e| match e {
            RowError::OutOfRange { at, .. } => PrefillError::TokenId {
                id: ids[at],
                at,
                vocab: table.rows(),
            },
            other => PrefillError::Weights(other.to_string()),
        })?;
        if self.bf16_embeddings {
            data.iter_mut()
                .for_each(|v| *v = bf16::to_f32(bf16::from_f32(*v)));
        }
        Ok(HostTensor::new(ids.len(), h, data))
    }

    /// Text positions `start..start+len` on all three M-RoPE axes.
    pub fn text_positions(start: usize, len: usize) -> Vec<[u32; 3]> {
        (start..start + len).map(|p| [p as u32; 3]).collect()
    }

    /// Run the prefill of `ids` (text positions continuing from the state's position).
    pub fn prefill(
        &self,
        ids: &[u32],
        state: Option<&PrefillState<B::Tensor>>,
    ) -> Result<(HostTensor, PrefillState<B::Tensor>), PrefillError> {
        let start = state.map_or(0, |s| s.position);
        let positions = Self::text_positions(start, ids.len());
        let embedded = self.embed(ids)?;
        self.prefill_embedded(&embedded, &positions, state, None)
    }

    /// Run the prefill from embedding rows with explicit M-RoPE positions, optionally
    /// reporting intermediate tensors to `tracer`.
    pub fn prefill_embedded(
        &self,
        embedded: &HostTensor,
        positions: &[[u32; 3]],
        state: Option<&PrefillState<B::Tensor>>,
        tracer: Option<Tracer>,
    ) -> Result<(HostTensor, PrefillState<B::Tensor>), PrefillError> {
        let one = Segment {
            rows: embedded.rows,
            start: state,
        };
        let (hidden, mut states) =
            self.prefill_segments(embedded, positions, &[one], tracer, None)?;
        let state = states
            .pop()
            .ok_or_else(|| PrefillError::State("a pass without a state".into()))?;
        Ok((hidden, state))
    }

    /// One pass over the rows of several requests (`segments`, in row order; one segment is an
    /// ordinary prefill): every row-wise op (norms, projections, gates, the MLP) runs once
    /// over all rows, and the ops that mix tokens over time run per request on its own rows
    /// and state: the causal conv from its carry, the delta rule from its recurrent state,
    /// the KV append and causal attention over its own keys. Positions are per row. Returns
    /// the final rows of all segments and each segment's state. A pass of several segments
    /// needs a mesh that [`MeshOps::packs_rows`]; it composes the mixers from the fine ops.
    /// `probe` sees every layer's residual rows and states.
    pub fn prefill_segments(
        &self,
        embedded: &HostTensor,
        positions: &[[u32; 3]],
        segments: &[Segment<'_, B::Tensor>],
        mut tracer: Option<Tracer>,
        mut probe: Option<LayerProbe<'_, B::Tensor>>,
    ) -> Result<PassResult<B::Tensor>, PrefillError> {
        let m = &self.mesh;
        let cfg = &self.config;
        let t = embedded.rows;
        if positions.len() != t {
            return Err(PrefillError::State(format!(
                "{} positions for {t} tokens",
                positions.len()
            )));
        }
        let rows: usize = segments.iter().map(|s| s.rows).sum();
        if segments.is_empty() || rows != t || segments.iter().any(|s| s.rows == 0) {
            return Err(PrefillError::State(format!(
                "segments of {:?} rows for {t} tokens",
                segments.iter().map(|s| s.rows).collect::<Vec<_>>()
            )));
        }
        if segments.len() > 1 && !m.packs_rows() {
            return Err(PrefillError::State(format!(
                "the {} backend does not run packed passes",
                m.backend_name()
            )));
        }
        for s in segments.iter().filter_map(|s| s.start) {
            if s.layers.len() != self.layers.len() {
                return Err(PrefillError::State(format!(
                    "a state of {} layers for a model of {}",
                    s.layers.len(),
                    self.layers.len()
                )));
            }
        }
        let mut ranges = Vec::with_capacity(segments.len());
        let mut from = 0;
        for s in segments {
            ranges.push(from..from + s.rows);
            from += s.rows;
        }
        // Layer ops (one backend call per sublayer) unless intermediates are traced: the
        // tracer names the fine ops' results.
        let layer_ops = tracer.is_none();
        let mut trace = |name: String, f: &dyn Fn() -> Result<HostTensor, DeviceError>| {
            if let Some(tr) = tracer.as_mut() {
                if let Ok(v) = f() {
                    tr(&name, v);
                }
            }
        };
        let eps = cfg.rms_norm_eps;
        let mut h = m.replicate(embedded)?;
        let mut next: Vec<Vec<LayerState<B::Tensor>>> = segments
            .iter()
            .map(|_| Vec::with_capacity(self.layers.len()))
            .collect();
        for (i, lw) in self.layers.iter().enumerate() {
            let prev: Vec<_> = segments
                .iter()
                .map(|s| s.start.map(|s| &s.layers[i]))
                .collect();
            let (mixed_h, states) =
                self.mixer(i, &h, lw, &prev, &ranges, positions, layer_ops, &mut trace)?;
            h = self.mlp(i, &mixed_h, lw, layer_ops, &mut trace)?;
            trace(format!("layers.{i}.out"), &|| {
                m.gather(&h, GatherAxis::Cols)
            });
            if let Some(probe) = probe.as_mut() {
                probe(
                    i,
                    m.gather(&h, GatherAxis::Cols)?,
                    &states.iter().collect::<Vec<_>>(),
                )?;
            }
            for (n, state) in next.iter_mut().zip(states) {
                n.push(state);
            }
        }
        let y = m.rms_norm(&h, &self.final_norm, cfg.hidden_size, eps, true)?;
        let hidden = m.gather(&y, GatherAxis::Cols)?;
        let states = segments
            .iter()
            .zip(next)
            .map(|(s, layers)| PrefillState {
                position: s.start.map_or(0, |p| p.position) + s.rows,
                layers,
            })
            .collect();
        Ok((hidden, states))
    }

    /// Complete layer `i`'s row-parallel output with the collective the plan names.
    fn reduce(&self, i: usize, partial: B::Tensor) -> Result<B::Tensor, DeviceError> {
        match self.plan.layers[i].reduce {
            Collective::AllReduce => self.mesh.all_reduce(&partial),
            Collective::None => Ok(partial),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        i: usize,
        x: &B::Tensor,
        qkv: &B::Weight,
        q_norm: &B::Weight,
        k_norm: &B::Weight,
        o_proj: &B::Weight,
        caches: &[Option<(&B::Tensor, &B::Tensor)>],
        ranges: &[Range<usize>],
        positions: &[[u32; 3]],
        trace: &mut TraceFn,
    ) -> Result<Mixed<B::Tensor>, PrefillError> {
        let m = &self.mesh;
        let cfg = &self.config;
        let spec = self.attention_spec();
        let d = spec.head_dim;
        let p = format!("layers.{i}.self_attn");
        let fused = m.linear(x, qkv)?;
        let widths = [spec.heads * 2 * d, spec.kv_heads * d, spec.kv_heads * d];
        let parts = m.split_cols(&fused, &list_u32("split_cols", "width", widths)?)?;
        let (qg, k, v) = (&parts[0], &parts[1], &parts[2]);
        trace(format!("{p}.q_proj"), &|| m.gather(qg, GatherAxis::Cols));
        trace(format!("{p}.k_proj"), &|| m.gather(k, GatherAxis::Cols));
        trace(format!("{p}.v_proj"), &|| m.gather(v, GatherAxis::Cols));
        let (q, gate) = m.split_query_gate(qg, spec.heads, d)?;
        let q = m.rms_norm(&q, q_norm, d, cfg.rms_norm_eps, true)?;
        let k = m.rms_norm(k, k_norm, d, cfg.rms_norm_eps, true)?;
        trace(format!("{p}.q_norm"), &|| m.gather(&q, GatherAxis::Cols));
        trace(format!("{p}.k_norm"), &|| m.gather(&k, GatherAxis::Cols));
        let rope = |t: &B::Tensor, heads: usize| {
            let r = self.rope_spec(heads);
            let [t_pairs, h_pairs, w_pairs] = r.mrope_section;
            let positions = positions.as_flattened();
            let (dim, rotary, theta) = (r.head_dim, r.rotary_dim, r.theta);
            m.rope(
                t, heads, dim, rotary, t_pairs, h_pairs, w_pairs, theta, positions,
            )
        };
        let q = rope(&q, spec.heads)?;
        let k = rope(&k, spec.kv_heads)?;
        // Per request: its keys and values after its cached ones, its queries over them.
        let (outs, states) = self.per_request(caches, ranges, |cache, r| {
            let [q, k, v] = self.segment_rows([&q, &k, v], r, ranges.len())?;
            let keys = m.append_rows(cache.map(|c| c.0), &k, spec.kv_heads)?;
            let values = m.append_rows(cache.map(|c| c.1), &v, spec.kv_heads)?;
            let (heads, kv_heads) = (spec.heads, spec.kv_heads);
            let out = m.causal_attention(&q, &keys, &values, heads, kv_heads, d)?;
            Ok((out, LayerState::Attention { keys, values }))
        })?;
        let attn = self.join_rows(outs)?;
        let gated = m.mul_sigmoid(&attn, &gate)?;
        trace(format!("{p}.o_proj.in0"), &|| {
            m.gather(&gated, GatherAxis::Cols)
        });
        let out = self.reduce(i, m.linear(&gated, o_proj)?)?;
        trace(p.to_string(), &|| m.gather(&out, GatherAxis::Cols));
        Ok((out, states))
    }

    /// `mix` for each request of a pass (its earlier state and rows): the outputs and states in
    /// order. On a mesh that packs rows (the CPU) the requests of a pass run side by side (each
    /// op inside still spreads over the cores), so that one request's small ops fill the cores
    /// another leaves idle; each request's ops and values are exactly those of its pass alone.
    fn per_request<'p, S, F>(
        &self,
        prev: &[S],
        ranges: &[Range<usize>],
        mix: F,
    ) -> Result<RequestsMix<B::Tensor>, DeviceError>
    where
        S: Copy + Send + Sync + 'p,
        F: Fn(S, &Range<usize>) -> Result<RequestMix<B::Tensor>, DeviceError> + Sync,
    {
        let each: Vec<_> = if ranges.len() > 1 && self.mesh.packs_rows() {
            prev.par_iter()
                .zip(ranges)
                .map(|(&p, r)| mix(p, r))
                .collect::<Result<_, _>>()?
        } else {
            prev.iter()
                .zip(ranges)
                .map(|(&p, r)| mix(p, r))
                .collect::<Result<_, _>>()?
        };
        Ok(each.into_iter().unzip())
    }

    /// Rows `r` of each of `xs` for one request of a pass of `segments` requests (the
    /// tensors themselves when the pass has one).
    fn segment_rows<'t, const N: usize>(
        &self,
        xs: [&'t B::Tensor; N],
        r: &Range<usize>,
        segments: usize,
    ) -> Result<[Cow<'t, B::Tensor>; N], DeviceError> {
        let mut out = xs.map(Cow::Borrowed);
        if segments > 1 {
            for c in out.iter_mut() {
                *c = Cow::Owned(self.mesh.slice_rows(c.as_ref(), r.clone())?);
            }
        }
        Ok(out)
    }

    /// The per-request results of a pass joined by rows (the one result of a pass of one).
    fn join_rows(&self, mut parts: Vec<B::Tensor>) -> Result<B::Tensor, DeviceError> {
        if parts.len() == 1 {
            if let Some(one) = parts.pop() {
                return Ok(one);
            }
        }
        self.mesh.concat_rows(&parts)
    }

    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        i: usize,
        x: &B::Tensor,
        in_proj: &B::Weight,
        conv: &B::Weight,
        a_log: &B::Weight,
        dt_bias: &B::Weight,
        norm: &B::Weight,
        out_proj: &B::Weight,
        carried: &[Option<(&B::Tensor, &B::Tensor)>],
        ranges: &[Range<usize>],
        trace: &mut TraceFn,
    ) -> Result<Mixed<B::Tensor>, PrefillError> {
        let m = &self.mesh;
        let spec = self.delta_spec();
        let (kd, vd, nv) = (
            spec.key_heads * spec.key_dim,
            spec.value_heads * spec.value_dim,
            spec.value_heads,
        );
        let p = format!("layers.{i}.linear_attn");
        let fused = m.linear(x, in_proj)?;
        let widths = list_u32("split_cols", "width", [2 * kd + vd, vd, nv, nv])?;
        let parts = m.split_cols(&fused, &widths)?;
        let (qkv, z, b, a) = (&parts[0], &parts[1], &parts[2], &parts[3]);
        trace(format!("{p}.in_proj_qkv"), &|| {
            gather_segments(m, qkv, &[kd, kd, vd])
        });
        trace(format!("{p}.in_proj_z"), &|| m.gather(z, GatherAxis::Cols));
        trace(format!("{p}.in_proj_b"), &|| m.gather(b, GatherAxis::Cols));
        trace(format!("{p}.in_proj_a"), &|| m.gather(a, GatherAxis::Cols));
        let (g, beta) = m.delta_gates(a, b, a_log, dt_bias)?;
        // Per request: the conv from its carry, the delta rule from its state, on its rows.
        let (cores, states) = self.per_request(carried, ranges, |carried, r| {
            let [qkv, g, beta] = self.segment_rows([qkv, &g, &beta], r, ranges.len())?;
            let (conv_out, conv_carry) =
                m.causal_conv1d_silu(&qkv, conv, carried.map(|c| c.0), spec.conv_kernel)?;
            let (key_heads, value_heads) = (spec.key_heads, spec.value_heads);
            let (key_dim, value_dim) = (spec.key_dim, spec.value_dim);
            let prior = carried.map(|c| c.1);
            let (core, recurrent) = m.gated_delta_rule(
                &conv_out,
                &g,
                &beta,
                prior,
                key_heads,
                value_heads,
                key_dim,
                value_dim,
            )?;
            let state = LayerState::DeltaNet {
                conv: conv_carry,
                recurrent,
            };
            Ok((core, state))
        })?;
        let core = self.join_rows(cores)?;
        let dv = spec.value_dim;
        trace(format!("{p}.norm.in0"), &|| {
            per_head_rows(m.gather(&core, GatherAxis::Cols)?, dv)
        });
        trace(format!("{p}.norm.in1"), &|| {
            per_head_rows(m.gather(z, GatherAxis::Cols)?, dv)
        });
        let normed = m.gated_rms_norm(&core, z, norm, dv, self.config.rms_norm_eps)?;
        trace(format!("{p}.norm"), &|| {
            per_head_rows(m.gather(&normed, GatherAxis::Cols)?, dv)
        });
        trace(format!("{p}.out_proj.in0"), &|| {
            m.gather(&normed, GatherAxis::Cols)
        });
        let out = self.reduce(i, m.linear(&normed, out_proj)?)?;
        trace(p.to_string(), &|| m.gather(&out, GatherAxis::Cols));
        Ok((out, states))
    }

    /// The per-device attention shape under the plan.
    fn attention_spec(&self) -> AttentionSpec {
        let cfg = &self.config;
        let tp = self.plan.devices;
        AttentionSpec {
            heads: cfg.num_attention_heads / tp,
            kv_heads: cfg.num_key_value_heads / tp,
            head_dim: cfg.head_dim,
        }
    }

    /// The rope of `heads` attention heads.
    fn rope_spec(&self, heads: usize) -> RopeSpec {
        let cfg = &self.config;
        RopeSpec {
            heads,
            head_dim: cfg.head_dim,
            rotary_dim: cfg.rotary_dim(),
            theta: cfg.rope_theta,
            mrope_section: cfg.mrope_section,
        }
    }

    /// The per-device DeltaNet shape under the plan.
    fn delta_spec(&self) -> DeltaNetSpec {
        let cfg = &self.config;
        let tp = self.plan.devices;
        DeltaNetSpec {
            key_heads: cfg.linear_num_key_heads / tp,
            value_heads: cfg.linear_num_value_heads / tp,
            key_dim: cfg.linear_key_head_dim,
            value_dim: cfg.linear_value_head_dim,
            conv_kernel: cfg.linear_conv_kernel_dim,
        }
    }

    /// A layer's state in Hugging Face's layout, devices joined.
    pub fn export_state(&self, state: &LayerState<B::Tensor>) -> Result<HfLayerState, DeviceError> {
        let m = &self.mesh;
        match state {
            LayerState::Attention { keys, values } => {
                let d = self.config.head_dim;
                let to_heads = |t: &B::Tensor| -> Result<Vec<f32>, DeviceError> {
                    let all = m.gather(t, GatherAxis::Cols)?;
                    let heads = all.cols / d;
                    let mut out = Vec::with_capacity(all.data.len());
                    for h in 0..heads {
                        for r in 0..all.rows {
                            out.extend_from_slice(&all.row(r)[h * d..(h + 1) * d]);
                        }
                    }
                    Ok(out)
                };
                Ok(HfLayerState::Attention {
                    keys: to_heads(keys)?,
                    values: to_heads(values)?,
                })
            }
            LayerState::DeltaNet { conv, recurrent } => {
                let spec = self.delta_spec();
                let kd = spec.key_heads * spec.key_dim;
                let vd = spec.value_heads * spec.value_dim;
                let joined = gather_segments(m, conv, &[kd, kd, vd])?;
                // [kernel-1, channels] -> [channels, kernel-1]
                let mut t = Vec::with_capacity(joined.data.len());
                for c in 0..joined.cols {
                    for r in 0..joined.rows {
                        t.push(joined.data[r * joined.cols + c]);
                    }
                }
                Ok(HfLayerState::DeltaNet {
                    conv: t,
                    recurrent: m.gather(recurrent, GatherAxis::Rows)?.data,
                })
            }
        }
    }
}

/// Join a sharded tensor whose device parts are `[seg0 | seg1 | ...]` (per-device widths)
/// into Hugging Face's order `[seg0 of all devices | seg1 of all devices | ...]`.
fn gather_segments<B: MeshOps>(
    m: &B,
    t: &B::Tensor,
    widths: &[usize],
) -> Result<HostTensor, DeviceError> {
    let segs = m.split_cols(t, &list_u32("split_cols", "width", widths.iter().copied())?)?;
    let gathered: Vec<HostTensor> = segs
        .iter()
        .map(|s| m.gather(s, GatherAxis::Cols))
        .collect::<Result<_, _>>()?;
    let rows = gathered[0].rows;
    let cols: usize = gathered.iter().map(|g| g.cols).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for g in &gathered {
            data.extend_from_slice(g.row(r));
        }
    }
    Ok(HostTensor::new(rows, cols, data))
}

/// `[T, heads*d]` viewed as `[T*heads, d]` (token-major, then head).
fn per_head_rows(t: HostTensor, d: usize) -> Result<HostTensor, DeviceError> {
    Ok(HostTensor::new(t.rows * t.cols / d, d, t.data))
}
