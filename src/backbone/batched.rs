//! Batched passes: several requests (text or media) through the backbone as one batch,
//! for a mesh whose layer ops run a batch ([`MeshOps::batch_limit`]: the ttnn backend) rather
//! than packed row segments ([`MeshOps::packs_rows`]: the CPU).
//!
//! Each request's rows go to the front of its own block of `each` rows (the longest request
//! plus the conv's history, to a tile), zero rows after them. Every row-wise op runs once over
//! all blocks; the mixers run over the batch (causal attention per block, the delta rule per
//! block from a zero state, the conv from a zero history), so each request's rows come out as
//! its own pass computes them. On ttnn a packed pass of row segments would add a slice, a
//! concat and a mixer call per request and layer; the batch adds one op per DeltaNet layer
//! (docs/packing.md has the counts).
//!
//! A batch is of whole prompts, or of tails that all continue one state (hits of one
//! prefix-cache slot: every block's conv from the slot's carry, its delta rule from the
//! slot's state, its attention over the slot's keys and its own). A whole prompt may keep the
//! state of a prefix (a prefix-cache miss: `keep`, a multiple of 32 rows): each layer reads
//! that prefix's keys, values and conv carry out of its block, and the recurrent state at the
//! prefix's end from a second delta-rule call with both gates 0 after it, so the state is
//! what a pass of the prefix alone leaves. Text shares one block's rope tables (positions
//! from 0, or from the continued state's end, in all three sections); a batch with media
//! (M-RoPE positions of its own) passes every block's tables, and the mesh ropes the heads of
//! all rows before it splits them into blocks.

use super::weights::MixerWeights;
use super::{Backbone, LayerProbe, LayerState, PrefillError, PrefillState};
use clef_device::{GatherAxis, HostTensor, MeshOps, RowBatch};

/// What a batched pass gave.
pub enum Batched<T> {
    /// The final rows of every request, in order (without pad rows), and the state of each
    /// request's kept prefix (`None` where it keeps none).
    Rows(HostTensor, Vec<Option<PrefillState<T>>>),
    /// The mesh does not run a layer op of this model as a batch (its shapes): nothing of the
    /// pass is kept, and the requests must run one by one.
    Refused,
}

impl<B: MeshOps> Backbone<B> {
    /// The rope positions of a batched pass: one block's text positions (0, 1, ...) shared by
    /// every block when every request has them; else every block's own (a request's M-RoPE
    /// positions, then text positions after them on its pad rows, which no query of the
    /// request sees).
    fn batch_positions(requests: &[(&HostTensor, &[[u32; 3]])], each: usize) -> Vec<[u32; 3]> {
        // Text from one first position (0, or a continued state's end) for every request.
        let first = requests
            .first()
            .and_then(|(_, p)| p.first())
            .map_or(0, |q| q[0]);
        let text = requests.iter().all(|(_, p)| {
            p.iter()
                .enumerate()
                .all(|(i, &q)| q == [first + i as u32; 3])
        });
        if text {
            return Self::text_positions(first as usize, each);
        }
        let mut all = Vec::with_capacity(requests.len() * each);
        for (_, p) in requests {
            all.extend_from_slice(p);
            let next = p
                .iter()
                .flatten()
                .copied()
                .max()
                .map_or(0, |m| m as usize + 1);
            all.extend(Self::text_positions(next, each - p.len()));
        }
        all
    }

    /// Requests a batched pass may hold on this mesh (0 or 1: the mesh runs none).
    pub fn batch_limit(&self) -> usize {
        self.mesh.batch_limit(&self.delta_spec())
    }

    /// Rows of a batched pass over prompts of these lengths (their blocks, pad rows included).
    pub fn batch_rows(&self, lengths: &[usize]) -> usize {
        RowBatch::of(lengths, self.delta_spec().conv_kernel).rows()
    }

    /// One batched pass, at most [`Backbone::batch_limit`] requests, each given as its
    /// embedded rows (vision rows in place) and their positions: fresh whole prompts (`start`
    /// `None`), request `i` keeping the state of its first `keep[i]` rows (0: none; else a
    /// multiple of 32 up to its length); or the tails of prompts that all continue `start`
    /// (hits of one prefix-cache slot), keeping nothing.
    pub fn prefill_batched(
        &self,
        requests: &[(&HostTensor, &[[u32; 3]])],
        keep: &[usize],
        start: Option<&PrefillState<B::Tensor>>,
    ) -> Result<Batched<B::Tensor>, PrefillError> {
        self.prefill_batched_probed(requests, keep, start, None)
    }

    /// [`Backbone::prefill_batched`], the layers one by one when `probe` is given (it sees every
    /// layer's residual rows, each request's in order, and the kept prefixes' states).
    pub fn prefill_batched_probed(
        &self,
        requests: &[(&HostTensor, &[[u32; 3]])],
        keep: &[usize],
        start: Option<&PrefillState<B::Tensor>>,
        mut probe: Option<LayerProbe<'_, B::Tensor>>,
    ) -> Result<Batched<B::Tensor>, PrefillError> {
        let hidden = self.config.hidden_size;
        let lengths: Vec<usize> = requests.iter().map(|(e, _)| e.rows).collect();
        let limit = self.batch_limit();
        if requests.is_empty() || requests.len() > limit {
            return Err(PrefillError::State(format!(
                "a batched pass of {} requests on a mesh that batches {limit}",
                requests.len()
            )));
        }
        for (embedded, positions) in requests {
            if embedded.cols != hidden || embedded.rows == 0 || positions.len() != embedded.rows {
                return Err(PrefillError::State(format!(
                    "a batched request of {} x {} rows with {} positions",
                    embedded.rows,
                    embedded.cols,
                    positions.len()
                )));
            }
        }
        if keep.len() != requests.len()
            || keep
                .iter()
                .zip(&lengths)
                .any(|(&k, &n)| k > n || k % 32 != 0)
        {
            return Err(PrefillError::State(format!(
                "a batched pass keeping prefixes of {keep:?} rows of requests of {lengths:?}"
            )));
        }
        if let Some(s) = start {
            if keep.iter().any(|&k| k > 0) || s.layers.len() != self.layers.len() {
                return Err(PrefillError::State(format!(
                    "a batched pass continuing a state of {} layers (this model: {}) and \
                     keeping prefixes of {keep:?} rows",
                    s.layers.len(),
                    self.layers.len()
                )));
            }
        }
        let batch = RowBatch {
            keep: keep.to_vec(),
            ..RowBatch::of(&lengths, self.delta_spec().conv_kernel)
        };
        let mut padded = vec![0.0f32; batch.rows() * hidden];
        for (i, (embedded, _)) in requests.iter().enumerate() {
            let at = i * batch.each * hidden;
            padded[at..at + embedded.data.len()].copy_from_slice(&embedded.data);
        }
        let positions = Self::batch_positions(requests, batch.each);
        let m = &self.mesh;
        let eps = self.config.rms_norm_eps;
        let rows_in = HostTensor::new(batch.rows(), hidden, padded);
        // The whole pass in one call where the mesh runs it (traced on ttnn), unless probed.
        let whole = match probe {
            None => self.batched_pass(&rows_in, &positions, &batch, start),
            Some(_) => None,
        };
        if let Some(done) = whole {
            let (all, kept) = done?;
            return Ok(Self::batched_rows(
                all, &lengths, &batch, keep, hidden, kept,
            ));
        }
        let mut h = m.replicate(&rows_in)?;
        let mut untraced = |_: String, _: &dyn Fn() -> Result<HostTensor, _>| {};
        // Each kept prefix's layer states, in request order.
        let kept = batch.kept().count();
        let mut states: Vec<Vec<LayerState<B::Tensor>>> = (0..kept).map(|_| Vec::new()).collect();
        for (i, lw) in self.layers.iter().enumerate() {
            let (cache, carried) = match start.map(|s| &s.layers[i]) {
                None => (None, None),
                Some(LayerState::Attention { keys, values }) => (Some((keys, values)), None),
                Some(LayerState::DeltaNet { conv, recurrent }) => (None, Some((conv, recurrent))),
            };
            let mixed = match &lw.mixer {
                MixerWeights::Attention { .. } => self
                    .attention_op(i, &h, lw, cache, &positions)
                    .and_then(|layer| m.attention_layer_batched(&layer, &batch)),
                MixerWeights::DeltaNet { .. } => self
                    .delta_net_op(i, &h, lw, carried)
                    .and_then(|layer| m.delta_net_layer_batched(&layer, &batch)),
            };
            let Some(mixed) = mixed else {
                return Ok(Batched::Refused);
            };
            let (mixed, pairs) = mixed?;
            if pairs.len() != kept {
                return Err(PrefillError::State(format!(
                    "layer {i} of a batched pass kept {} prefixes of {kept}",
                    pairs.len()
                )));
            }
            for (state, [a, b]) in states.iter_mut().zip(pairs) {
                state.push(match &lw.mixer {
                    MixerWeights::Attention { .. } => LayerState::Attention { keys: a, values: b },
                    MixerWeights::DeltaNet { .. } => LayerState::DeltaNet {
                        conv: a,
                        recurrent: b,
                    },
                });
            }
            h = self.mlp(i, &mixed, lw, true, &mut untraced)?;
            if let Some(probe) = probe.as_mut() {
                let all = m.gather(&h, GatherAxis::Cols)?;
                let rows = Self::request_rows(&all, &lengths, batch.each, hidden);
                let layer: Vec<_> = states.iter().filter_map(|s| s.last()).collect();
                probe(i, rows, &layer)?;
            }
        }
        let y = m.rms_norm(&h, &self.final_norm, hidden, eps, true)?;
        let all = m.gather(&y, GatherAxis::Cols)?;
        Ok(Self::batched_rows(
            all, &lengths, &batch, keep, hidden, states,
        ))
    }

    /// Each request's final rows out of its block, in order, and each kept prefix's state.
    fn batched_rows(
        all: HostTensor,
        lengths: &[usize],
        batch: &RowBatch,
        keep: &[usize],
        hidden: usize,
        states: Vec<Vec<LayerState<B::Tensor>>>,
    ) -> Batched<B::Tensor> {
        let rows = Self::request_rows(&all, lengths, batch.each, hidden);
        let mut states = states.into_iter();
        let kept = keep
            .iter()
            .map(|&position| {
                (position > 0).then(|| PrefillState {
                    position,
                    layers: states.next().unwrap_or_default(),
                })
            })
            .collect();
        Batched::Rows(rows, kept)
    }

    /// Each request's rows (`lengths`) out of its block of `each` rows of `all`, in order.
    fn request_rows(all: &HostTensor, lengths: &[usize], each: usize, hidden: usize) -> HostTensor {
        let mut rows = Vec::with_capacity(lengths.iter().sum::<usize>() * hidden);
        for (i, n) in lengths.iter().enumerate() {
            let at = i * each * hidden;
            rows.extend_from_slice(&all.data[at..at + n * hidden]);
        }
        HostTensor::new(rows.len() / hidden, hidden, rows)
    }
}
