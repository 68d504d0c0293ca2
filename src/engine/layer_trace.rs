//! A request's every layer read back, for `clef-tt compare-layers` (`crate::compare`): the
//! vision tower's block outputs and merger rows, and after every decoder layer the residual
//! stream's rows and the state the layer leaves (keys and values, or conv carry and recurrent
//! state, in Hugging Face's layout), named so that a device's trace and the reference's line up.
//!
//! The reference side (the CPU) runs the request alone from position 0 (`alone.*`) and its
//! prefix alone, and writes from those what every device run must give. The device side runs:
//! - `alone`: the request alone, the layers one by one (the layer ops), from position 0;
//! - `continued`: its prefix, then the tail continuing the prefix's state (a prefix-cache
//!   hit), the tail's layers one by one; the tail's rows against the alone run's;
//! - `served`: the request as served, through [`Backbone::prefill_chunk`] (on ttnn a whole
//!   pass replayed from its trace: its final rows and every layer's state), after two passes of
//!   other rows of the same shape, so the compared pass is a replay that must read its new
//!   input;
//! - `packed`: a batched pass (packing) of the request, keeping its prefix's state (a
//!   prefix-cache miss), beside its prefix as a request of its own; each request's rows
//!   against its alone run, the kept state against the prefix alone. Meshes that run no
//!   batched pass run the two as packed row segments (no kept state).
//!
//! Both sides read the same tokens, positions and text-model input: the device side's text
//! model takes the reference's vision rows, so each part's differences are its own.

use super::{Pipeline, TowerRun, VisionInput, PREFILL_CHUNK};
use crate::backbone::{Batched, HfLayerState, LayerState, PrefillState, Segment};
use crate::encode::LengthRule;
use crate::request::{RequestError, SystemOneRequest};
use clef_device::{DeviceError, GatherAxis, HostTensor, MeshOps};
use clef_vision::{Grid, VisionTower};
use std::collections::BTreeMap;

/// One named quantity read back (rows of the residual stream, a state in Hugging Face's
/// layout, a vision block's rows).
pub struct Quantity {
    pub name: String,
    pub values: Vec<f32>,
}

/// What a layer trace read for one request.
pub struct LayerTrace {
    /// In the order they were computed.
    pub quantities: Vec<Quantity>,
    /// The rows the vision tower gave the text model (none without media).
    pub vision_rows: Option<Vec<f32>>,
    /// The prompt's tokens, and the prefix the continued and packed runs keep (0: the
    /// prompt is too short for them).
    pub tokens: usize,
    pub prefix: usize,
    /// Runs that were not made, and why.
    pub notes: Vec<String>,
}

/// Which side of the comparison a trace is.
pub enum Side<'a> {
    /// The CPU: the request alone and its prefix alone, and from them what each device run
    /// must give.
    Reference,
    /// The device under test; its text model reads these vision rows (the reference's).
    Device { vision_rows: Option<&'a [f32]> },
}

/// The smallest prompt the continued and packed runs take (a kept prefix is a multiple of 32
/// rows, and the tail needs rows of its own).
const SPLIT_BLOCK: usize = 32;

/// The tower's output through its blocks (each to `probe` as `block.J`) and merger (`merger`).
pub(super) fn probed_tower<B: MeshOps>(
    tower: &VisionTower<B>,
    mesh: &B,
    pixels: &[f32],
    grids: &[Grid],
    probe: &mut dyn FnMut(&str, HostTensor) -> Result<(), DeviceError>,
) -> Result<Vec<f32>, DeviceError> {
    let hidden = tower.hidden_probed(mesh, pixels, grids, &mut |j, x| {
        probe(&format!("block.{j}"), mesh.gather(x, GatherAxis::Cols)?)
    })?;
    let rows = tower.merge(mesh, &hidden)?;
    probe("merger", HostTensor::new(1, rows.len(), rows.clone()))?;
    Ok(rows)
}

/// Per layer, the residual rows (concatenated over the chunks or requests that gave them) and
/// the last state seen.
#[derive(Default)]
struct Layers {
    residual: BTreeMap<usize, Vec<f32>>,
    states: BTreeMap<usize, HfLayerState>,
}

impl Layers {
    /// Named quantities under `run`: `run.layer.I.residual` (when `residual`) and the state's
    /// parts (when `states`).
    fn named(&self, run: &str, residual: bool, states: bool) -> Vec<Quantity> {
        let mut out = Vec::new();
        let layers = self
            .residual
            .keys()
            .chain(self.states.keys())
            .max()
            .map_or(0, |m| m + 1);
        for i in 0..layers {
            if let Some(r) = self.residual.get(&i).filter(|_| residual) {
                out.push(quantity(format!("{run}.layer.{i}.residual"), r.clone()));
            }
            if let Some(s) = self.states.get(&i).filter(|_| states) {
                out.extend(state_quantities(&format!("{run}.layer.{i}"), s));
            }
        }
        out
    }
}

fn quantity(name: String, values: Vec<f32>) -> Quantity {
    Quantity { name, values }
}

fn state_quantities(at: &str, s: &HfLayerState) -> Vec<Quantity> {
    let (a, b, x, y) = match s {
        HfLayerState::Attention { keys, values } => ("keys", "values", keys, values),
        HfLayerState::DeltaNet { conv, recurrent } => ("conv", "recurrent", conv, recurrent),
    };
    vec![
        quantity(format!("{at}.{a}"), x.clone()),
        quantity(format!("{at}.{b}"), y.clone()),
    ]
}

/// Rows `range` of row-major values of `width` columns.
fn rows_of(values: &[f32], width: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    values[range.start * width..range.end * width].to_vec()
}

fn failed(what: &str) -> impl Fn(crate::backbone::PrefillError) -> RequestError + '_ {
    move |e| RequestError::internal(format!("layer trace, {what}: {e}"))
}

impl<B: MeshOps> Pipeline<B> {
    /// The layer trace of one request under `rule` (see the module header).
    pub fn layer_trace(
        &self,
        req: &SystemOneRequest,
        rule: LengthRule,
        side: Side<'_>,
    ) -> Result<LayerTrace, RequestError> {
        let mut quantities = Vec::new();
        let given = match side {
            Side::Reference => None,
            Side::Device { vision_rows } => vision_rows,
        };
        let prepared = {
            let mut probe = |name: &str, t: HostTensor| -> Result<(), DeviceError> {
                quantities.push(quantity(name.to_string(), t.data));
                Ok(())
            };
            let mut run = TowerRun::Probed(&mut probe, given);
            self.prepare_with(req, rule, &mut run)?
        };
        let ids = &prepared.record.input_ids;
        let vision = prepared.vision.as_ref();
        let t = ids.len();
        let prefix = if t >= 2 * SPLIT_BLOCK {
            t / 2 / SPLIT_BLOCK * SPLIT_BLOCK
        } else {
            0
        };
        let h = self.hidden;
        let mut notes = Vec::new();
        if prefix == 0 {
            notes.push(format!(
                "continued and packed: not run (a prompt of {t} tokens, under {})",
                2 * SPLIT_BLOCK
            ));
        }
        let (alone, alone_final) = self.traced_alone(ids, vision, 0..t)?;
        quantities.extend(alone.named("alone", true, true));
        quantities.push(quantity("alone.final".into(), alone_final.clone()));
        match side {
            Side::Reference => {
                quantities.extend(alone.named("served", false, true));
                quantities.push(quantity("served.final".into(), alone_final.clone()));
                if prefix > 0 {
                    let (kept, _) = self.traced_alone(ids, vision, 0..prefix)?;
                    let tail = |r: &Vec<f32>| rows_of(r, h, prefix..t);
                    let with_prefix = |r: &Vec<f32>| [&r[..], &r[..prefix * h]].concat();
                    let mut continued = Layers::default();
                    let mut packed = Layers::default();
                    for (&i, r) in &alone.residual {
                        continued.residual.insert(i, tail(r));
                        packed.residual.insert(i, with_prefix(r));
                    }
                    continued.states = alone.states.clone();
                    quantities.extend(continued.named("continued", true, true));
                    quantities.push(quantity("continued.final".into(), tail(&alone_final)));
                    quantities.extend(packed.named("packed", true, false));
                    quantities.extend(kept.named("packed.kept", false, true));
                    quantities.push(quantity("packed.final".into(), with_prefix(&alone_final)));
                }
            }
            Side::Device { .. } => {
                if prefix > 0 {
                    quantities.extend(self.traced_continued(ids, vision, prefix)?);
                }
                quantities.extend(self.traced_served(ids, vision)?);
                if prefix > 0 {
                    match self.traced_packed(ids, vision, prefix)? {
                        Some(packed) => quantities.extend(packed),
                        None => notes.push(
                            "packed: not run (the mesh runs no batched pass of this model's \
                             shapes, nor packed row segments: packs run one by one)"
                                .into(),
                        ),
                    }
                }
            }
        }
        Ok(LayerTrace {
            quantities,
            vision_rows: vision.map(|v| v.rows.clone()),
            tokens: t,
            prefix,
            notes,
        })
    }

    /// Positions `range` alone (from position 0 when it starts there, continuing nothing
    /// otherwise is not asked), the layers one by one in chunks: every layer's residual rows
    /// and its state after the last chunk, and the final rows.
    fn traced_alone(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        range: std::ops::Range<usize>,
    ) -> Result<(Layers, Vec<f32>), RequestError> {
        let mut layers = Layers::default();
        let mut finals = Vec::new();
        let mut state: Option<PrefillState<B::Tensor>> = None;
        let mut from = range.start;
        while from < range.end {
            let to = (from + PREFILL_CHUNK).min(range.end);
            let (hidden, next) =
                self.traced_pass(ids, vision, from..to, state.as_ref(), &mut layers)?;
            finals.extend_from_slice(&hidden.data);
            state = Some(next);
            from = to;
        }
        Ok((layers, finals))
    }

    /// One pass of positions `range` continuing `start`, the layers one by one, each layer's
    /// residual rows appended to `layers` and its state kept there.
    fn traced_pass(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        range: std::ops::Range<usize>,
        start: Option<&PrefillState<B::Tensor>>,
        layers: &mut Layers,
    ) -> Result<(HostTensor, PrefillState<B::Tensor>), RequestError> {
        let (embedded, positions) = self
            .piece_input(ids, vision, range.clone())
            .map_err(failed("input rows"))?;
        let one = Segment {
            rows: range.len(),
            start,
        };
        let bb = &self.backbone;
        let mut probe = |i: usize, rows: HostTensor, states: &[&LayerState<B::Tensor>]| {
            layers.residual.entry(i).or_default().extend(rows.data);
            if let Some(s) = states.first() {
                layers.states.insert(i, bb.export_state(s)?);
            }
            Ok(())
        };
        let (hidden, mut states) = bb
            .prefill_segments(&embedded, &positions, &[one], None, Some(&mut probe))
            .map_err(failed("a pass"))?;
        let state = states
            .pop()
            .ok_or_else(|| RequestError::internal("layer trace: a pass without a state"))?;
        Ok((hidden, state))
    }

    /// The prefix `[0, prefix)` (layers one by one), then the tail continuing its state,
    /// traced: `continued.*`.
    fn traced_continued(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        prefix: usize,
    ) -> Result<Vec<Quantity>, RequestError> {
        let mut ignored = Layers::default();
        let (_, state) = self.traced_pass(ids, vision, 0..prefix, None, &mut ignored)?;
        let mut tail = Layers::default();
        let (hidden, _) =
            self.traced_pass(ids, vision, prefix..ids.len(), Some(&state), &mut tail)?;
        let mut out = tail.named("continued", true, true);
        out.push(quantity("continued.final".into(), hidden.data));
        Ok(out)
    }

    /// The request as served ([`crate::backbone::Backbone::prefill_chunk`] in chunks), after
    /// two passes of its first chunk's rows in reverse order: `served.*`.
    fn traced_served(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
    ) -> Result<Vec<Quantity>, RequestError> {
        let bb = &self.backbone;
        let first = ids.len().min(PREFILL_CHUNK);
        let (embedded, positions) = self
            .piece_input(ids, vision, 0..first)
            .map_err(failed("input rows"))?;
        let w = embedded.cols;
        let reversed: Vec<f32> = embedded
            .data
            .chunks_exact(w)
            .rev()
            .flatten()
            .copied()
            .collect();
        let decoy = HostTensor::new(embedded.rows, w, reversed);
        for _ in 0..2 {
            bb.prefill_chunk(&decoy, &positions, None, false)
                .map_err(failed("a served pass"))?;
        }
        // As served: chunks of PREFILL_CHUNK through `prefill_chunk`.
        let (finals, state) =
            self.chunked_prefill(ids, vision, false, 0..ids.len(), None, &|| false)?;
        let mut out = Vec::new();
        for (i, s) in state.layers.iter().enumerate() {
            let s = bb
                .export_state(s)
                .map_err(|e| failed("a state")(e.into()))?;
            out.extend(state_quantities(&format!("served.layer.{i}"), &s));
        }
        out.push(quantity("served.final".into(), finals));
        Ok(out)
    }

    /// The request keeping its prefix's state, beside its prefix as a request of its own, in
    /// one batched pass (layers one by one): `packed.*`. A mesh that runs no batched pass runs
    /// them as packed row segments (no kept state); one that does neither, none.
    fn traced_packed(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        prefix: usize,
    ) -> Result<Option<Vec<Quantity>>, RequestError> {
        let bb = &self.backbone;
        let whole = self
            .piece_input(ids, vision, 0..ids.len())
            .map_err(failed("input rows"))?;
        let head = self
            .piece_input(ids, vision, 0..prefix)
            .map_err(failed("input rows"))?;
        let mut packed = Layers::default();
        let mut kept = Layers::default();
        // A batched pass's states are its kept prefixes'; packed segments' are their ends'.
        let batched = bb.batch_limit() >= 2;
        let mut probe = |i: usize, rows: HostTensor, states: &[&LayerState<B::Tensor>]| {
            packed.residual.insert(i, rows.data);
            if let Some(s) = states.first().filter(|_| batched) {
                kept.states.insert(i, bb.export_state(s)?);
            }
            Ok(())
        };
        let finals = if batched {
            let requests = [(&whole.0, &whole.1[..]), (&head.0, &head.1[..])];
            match bb
                .prefill_batched_probed(&requests, &[prefix, 0], None, Some(&mut probe))
                .map_err(failed("a batched pass"))?
            {
                Batched::Rows(rows, _) => rows.data,
                Batched::Refused => return Ok(None),
            }
        } else if bb.mesh().packs_rows() {
            let rows = [&whole.0.data[..], &head.0.data[..]].concat();
            let embedded = HostTensor::new(ids.len() + prefix, whole.0.cols, rows);
            let positions = [&whole.1[..], &head.1[..]].concat();
            let segments = [
                Segment {
                    rows: ids.len(),
                    start: None,
                },
                Segment {
                    rows: prefix,
                    start: None,
                },
            ];
            let (hidden, _) = bb
                .prefill_segments(&embedded, &positions, &segments, None, Some(&mut probe))
                .map_err(failed("a packed pass"))?;
            hidden.data
        } else {
            return Ok(None);
        };
        let mut out = packed.named("packed", true, false);
        out.extend(kept.named("packed.kept", false, true));
        out.push(quantity("packed.final".into(), finals));
        Ok(Some(out))
    }
}
