//! Whole passes: one request's chunk through the backbone in a single mesh call
//! ([`MeshOps::prefill_pass`]), for a mesh that runs them (the ttnn backend, which replays each
//! bucket of rows from a captured trace), and their warm-up. Elsewhere, and for a pass the mesh
//! does not take, [`Backbone::prefill_chunk`] runs the layers one by one, which stay the
//! definition.

use super::weights::MixerWeights;
use super::{Backbone, LayerState, PrefillError, PrefillState};
use clef_device::{HostTensor, MeshOps, PassLayer, PassMixer, PassStats, PrefillPass, RowBatch};
use std::time::{Duration, Instant};

/// A chunk's final rows and the state it leaves.
type Chunk<T> = (HostTensor, PrefillState<T>);
/// A batched pass's final rows and each kept prefix's layer states.
type BatchedRows<T> = (HostTensor, Vec<Vec<LayerState<T>>>);

/// What warming a mesh's passes did.
pub struct PassWarmup {
    pub took: Duration,
    /// The passes' facts after it (traces captured, trace region and reserved bytes).
    pub stats: PassStats,
}

impl<B: MeshOps> Backbone<B> {
    /// One chunk of a prompt: `embedded` rows at `positions`, continuing `state` (none: the
    /// prompt's start). `consume`: the caller drops `state` once this returns (its own previous
    /// chunk's), so a mesh may overwrite it in place. A whole pass where the mesh runs one,
    /// the layers one by one otherwise.
    pub fn prefill_chunk(
        &self,
        embedded: &HostTensor,
        positions: &[[u32; 3]],
        state: Option<&PrefillState<B::Tensor>>,
        consume: bool,
    ) -> Result<Chunk<B::Tensor>, PrefillError> {
        if let Some(done) = self.whole_pass(embedded, positions, state, consume) {
            return done;
        }
        self.prefill_embedded(embedded, positions, state, None)
    }

    /// The chunk as one [`MeshOps::prefill_pass`]; `None` when the mesh does not run it.
    fn whole_pass(
        &self,
        embedded: &HostTensor,
        positions: &[[u32; 3]],
        state: Option<&PrefillState<B::Tensor>>,
        consume: bool,
    ) -> Option<Result<Chunk<B::Tensor>, PrefillError>> {
        if positions.len() != embedded.rows || embedded.rows == 0 {
            return None;
        }
        let start = state.map_or(0, |s| s.position);
        let pass = PrefillPass {
            rows: embedded,
            positions,
            start,
            layers: self.pass_layers(state)?,
            final_norm: &self.final_norm,
            eps: self.config.rms_norm_eps,
            consume,
            batch: None,
        };
        let out = match self.mesh.prefill_pass(&pass)? {
            Ok(out) => out,
            Err(e) => return Some(Err(e.into())),
        };
        let mut states = self.kept_states(out.states, 1).into_iter();
        Some(match states.next() {
            Some(layers) => Ok((
                out.hidden,
                PrefillState {
                    position: start + embedded.rows,
                    layers,
                },
            )),
            None => Err(PrefillError::State("a pass without a state".into())),
        })
    }

    /// A batched pass as one [`MeshOps::prefill_pass`] (`rows`: every block's, `positions`:
    /// one block's or every block's, `start`: the state every block continues): its final
    /// rows and the layer states of each kept prefix, in order; `None` when the mesh does not
    /// run it.
    pub(super) fn batched_pass(
        &self,
        rows: &HostTensor,
        positions: &[[u32; 3]],
        batch: &RowBatch,
        start: Option<&PrefillState<B::Tensor>>,
    ) -> Option<Result<BatchedRows<B::Tensor>, PrefillError>> {
        let pass = PrefillPass {
            rows,
            positions,
            start: start.map_or(0, |s| s.position),
            layers: self.pass_layers(start)?,
            final_norm: &self.final_norm,
            eps: self.config.rms_norm_eps,
            consume: false,
            batch: Some(batch),
        };
        let out = match self.mesh.prefill_pass(&pass)? {
            Ok(out) => out,
            Err(e) => return Some(Err(e.into())),
        };
        let kept = batch.kept().count();
        Some(Ok((out.hidden, self.kept_states(out.states, kept))))
    }

    /// Every layer of the backbone as a pass takes it, continuing `state`; `None` when the
    /// state does not fit the model.
    fn pass_layers<'a>(
        &'a self,
        state: Option<&'a PrefillState<B::Tensor>>,
    ) -> Option<Vec<PassLayer<'a, B::Tensor, B::Weight>>> {
        if state.is_some_and(|s| s.layers.len() != self.layers.len()) {
            return None;
        }
        let attention = self.attention_spec();
        let delta = self.delta_spec();
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, lw) in self.layers.iter().enumerate() {
            let prev = state.map(|s| &s.layers[i]);
            let all_reduce = self.all_reduces(i);
            let mixer = match (lw.mixer.attention(), lw.mixer.delta_net(), prev) {
                (
                    Some((qkv, q_norm, k_norm, o_proj)),
                    _,
                    None | Some(LayerState::Attention { .. }),
                ) => PassMixer::Attention {
                    norm: &lw.input_norm,
                    qkv,
                    q_norm,
                    k_norm,
                    o_proj,
                    cache: match prev {
                        Some(LayerState::Attention { keys, values }) => Some((keys, values)),
                        _ => None,
                    },
                    spec: attention,
                    rope: self.rope_spec(attention.heads),
                    all_reduce,
                },
                (
                    _,
                    Some((in_proj, conv, a_log, dt_bias, gated_norm, out_proj)),
                    None | Some(LayerState::DeltaNet { .. }),
                ) => PassMixer::DeltaNet {
                    norm: &lw.input_norm,
                    in_proj,
                    conv,
                    a_log,
                    dt_bias,
                    gated_norm,
                    out_proj,
                    carried: match prev {
                        Some(LayerState::DeltaNet { conv, recurrent }) => Some((conv, recurrent)),
                        _ => None,
                    },
                    spec: delta,
                    all_reduce,
                },
                _ => return None,
            };
            layers.push(PassLayer {
                mixer,
                post_norm: &lw.post_norm,
                gate_up: &lw.gate_up,
                down: &lw.down,
                mlp_all_reduce: all_reduce,
            });
        }
        Some(layers)
    }

    /// A pass's states (layer-major: each layer's pair for each of `requests` kept states) as
    /// each request's layer states.
    fn kept_states(
        &self,
        states: Vec<[B::Tensor; 2]>,
        requests: usize,
    ) -> Vec<Vec<LayerState<B::Tensor>>> {
        let mut out: Vec<Vec<LayerState<B::Tensor>>> = (0..requests)
            .map(|_| Vec::with_capacity(self.layers.len()))
            .collect();
        for (k, [a, b]) in states.into_iter().enumerate() {
            let layer = &self.layers[k / requests.max(1)];
            out[k % requests.max(1)].push(match layer.mixer {
                MixerWeights::Attention { .. } => LayerState::Attention { keys: a, values: b },
                MixerWeights::DeltaNet { .. } => LayerState::DeltaNet {
                    conv: a,
                    recurrent: b,
                },
            });
        }
        out
    }

    /// Warm the mesh's whole passes: room for `kv_tokens` tokens of KV, then every bucket from
    /// a prompt's start and continuing one, twice (the first run compiles and caches the
    /// programs, the second is captured and replayed). `None` when the mesh runs no passes.
    pub fn warm_passes(&self, kv_tokens: usize) -> Result<Option<PassWarmup>, PrefillError> {
        let m = &self.mesh;
        let Some(before) = m.pass_stats() else {
            return Ok(None);
        };
        m.configure_passes(kv_tokens)?;
        let t0 = Instant::now();
        let hidden = self.config.hidden_size;
        for &rows in &before.buckets {
            let zeros = HostTensor::new(rows, hidden, vec![0.0; rows * hidden]);
            for _ in 0..2 {
                let first = Self::text_positions(0, rows);
                let (_, state) = self.prefill_chunk(&zeros, &first, None, false)?;
                let next = Self::text_positions(rows, rows);
                self.prefill_chunk(&zeros, &next, Some(&state), true)?;
            }
        }
        Ok(m.pass_stats().map(|stats| PassWarmup {
            took: t0.elapsed(),
            stats,
        }))
    }
}
