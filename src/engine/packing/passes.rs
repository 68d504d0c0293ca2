//! One packed pass (`Pipeline::pack_pass`): the pieces' rows built, the backbone run over them
//! as one pass of row segments (the CPU) or one batched pass (ttnn: fresh whole prompts, some
//! keeping their prefixes' state, or tails continuing one slot's state), falling back to each
//! piece alone where the mesh refuses the batch for the model's shapes; each piece's rows and
//! state handed back, and a failure answered for every request of the pass.

use super::{Member, Piece, PieceRows, PiecesRows};
use crate::backbone::{Batched, PrefillError, PrefillState, Segment};
use crate::engine::{cancelled_error, fail, injected_device_fault, Decision, Pipeline};
use crate::request::RequestError;
use clef_device::{HostTensor, MeshOps};
use std::sync::atomic::Ordering;

impl<B: MeshOps> Pipeline<B> {
    /// One pass over `pieces`: requests whose client left, or whose rows cannot be built, are
    /// answered and dropped first; a failed pass answers every request in it. Returns each
    /// piece's member, final rows and state (from a batched pass, a kept prefix's only).
    pub(super) fn pack_pass(
        &self,
        live: &mut [Option<Member<B>>],
        pieces: Vec<Piece<B>>,
        cancelled: &dyn Fn(usize) -> bool,
        done: &mut dyn FnMut(usize, Result<Decision, RequestError>),
    ) -> Vec<PieceRows<B>> {
        let mut inputs: Vec<(HostTensor, Vec<[u32; 3]>)> = Vec::new();
        let mut starts: Vec<Option<&PrefillState<B::Tensor>>> = Vec::new();
        let mut keeps: Vec<Option<usize>> = Vec::new();
        let mut members: Vec<(usize, usize)> = Vec::new();
        let mut dropped: Vec<(usize, RequestError)> = Vec::new();
        for piece in &pieces {
            let Some(m) = live[piece.member].as_ref() else {
                continue;
            };
            if cancelled(m.job) {
                dropped.push((piece.member, cancelled_error()));
                continue;
            }
            let ids = &m.prepared.record.input_ids;
            match self.piece_input(ids, m.prepared.vision.as_ref(), piece.range.clone()) {
                Ok(input) => {
                    inputs.push(input);
                    starts.push(piece.start.as_ref().map(|s| &s.state));
                    keeps.push(piece.keep);
                    members.push((piece.member, piece.range.len()));
                }
                Err(e) => dropped.push((piece.member, fail(e))),
            }
        }
        for (k, e) in dropped {
            if let Some(m) = live[k].take() {
                done(m.job, Err(e));
            }
        }
        if inputs.is_empty() {
            return Vec::new();
        }
        let n = inputs.len();
        let faulty = members
            .iter()
            .any(|&(k, _)| live[k].as_ref().is_some_and(|m| m.prepared.device_fault));
        let result = match faulty {
            true => Err(injected_device_fault()),
            false => self.prefill_pieces(&inputs, &starts, &keeps),
        };
        drop(starts);
        let (hidden, states, shared) = match result {
            Ok(r) => r,
            Err(e) => {
                let e = fail(e);
                for &(k, _) in &members {
                    if let Some(m) = live[k].take() {
                        done(m.job, Err(e.clone()));
                    }
                }
                return Vec::new();
            }
        };
        let h = self.hidden;
        let mut out = Vec::with_capacity(n);
        let mut from = 0;
        for ((k, len), state) in members.into_iter().zip(states) {
            if let Some(m) = live[k].as_mut() {
                m.pass_requests = m.pass_requests.max(if shared { n } else { 1 });
            }
            out.push((k, hidden.data[from * h..(from + len) * h].to_vec(), state));
            from += len;
        }
        out
    }

    /// The pieces' final rows (in order) and states: one pass of row segments, or one batched
    /// pass (the states of the prefixes kept); where the mesh refuses the batch for this
    /// model's shapes, each piece alone, and no batch again.
    fn prefill_pieces(
        &self,
        inputs: &[(HostTensor, Vec<[u32; 3]>)],
        starts: &[Option<&PrefillState<B::Tensor>>],
        keeps: &[Option<usize>],
    ) -> Result<PiecesRows<B>, PrefillError> {
        let keeping = keeps.iter().any(Option::is_some);
        if keeping && starts.iter().any(Option::is_some) {
            return Err(PrefillError::State(
                "a pass keeping prefixes of pieces that continue a state".into(),
            ));
        }
        if self.backbone.mesh().packs_rows() {
            if keeping {
                return Err(PrefillError::State(
                    "a pass of row segments keeping prefixes".into(),
                ));
            }
            let mut rows = Vec::new();
            let mut positions = Vec::new();
            for (e, p) in inputs {
                rows.extend_from_slice(&e.data);
                positions.extend_from_slice(p);
            }
            let segments: Vec<Segment<B::Tensor>> = inputs
                .iter()
                .zip(starts)
                .map(|((e, _), &start)| Segment {
                    rows: e.rows,
                    start,
                })
                .collect();
            let embedded = HostTensor::new(positions.len(), self.hidden, rows);
            let (hidden, states) = self
                .backbone
                .prefill_segments(&embedded, &positions, &segments, None, None)?;
            return Ok((hidden, states.into_iter().map(Some).collect(), true));
        }
        // A batch holds fresh whole prompts, or tails that all continue one state (hits of
        // one slot); other mixes run one by one.
        let first = starts.first().copied().flatten();
        let one_start = starts.iter().all(|s| match (s, first) {
            (Some(s), Some(first)) => std::ptr::eq(*s, first),
            (s, _) => s.is_none(),
        });
        if one_start && (first.is_none() || inputs.len() > 1) {
            let batch: Vec<(&HostTensor, &[[u32; 3]])> =
                inputs.iter().map(|(e, p)| (e, p.as_slice())).collect();
            let keep: Vec<usize> = keeps.iter().map(|k| k.unwrap_or(0)).collect();
            match self.backbone.prefill_batched(&batch, &keep, first)? {
                Batched::Rows(hidden, states) => return Ok((hidden, states, true)),
                Batched::Refused => {
                    if !self.batch_refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "the device refused a batched pass for this model's shapes: \
                             packed requests run one by one from now on"
                        );
                    }
                }
            }
        }
        let mut rows = Vec::new();
        let mut states = Vec::with_capacity(inputs.len());
        for (((embedded, positions), &start), &keep) in inputs.iter().zip(starts).zip(keeps) {
            // A kept prefix runs as alone: the prefix, then the rest from its state.
            let cut = keep.unwrap_or(0);
            let (head, rest) = embedded.data.split_at(cut * self.hidden);
            let mut kept = None;
            if cut > 0 {
                let head = HostTensor::new(cut, self.hidden, head.to_vec());
                let (hidden, state) =
                    self.backbone
                        .prefill_chunk(&head, &positions[..cut], None, false)?;
                rows.extend_from_slice(&hidden.data);
                kept = Some(state);
            }
            let rest = HostTensor::new(embedded.rows - cut, self.hidden, rest.to_vec());
            let (hidden, state) = self.backbone.prefill_chunk(
                &rest,
                &positions[cut..],
                kept.as_ref().or(start),
                false,
            )?;
            rows.extend_from_slice(&hidden.data);
            states.push(Some(kept.unwrap_or(state)));
        }
        Ok((
            HostTensor::new(rows.len() / self.hidden, self.hidden, rows),
            states,
            false,
        ))
    }
}
