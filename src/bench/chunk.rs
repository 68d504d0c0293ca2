//! `clef-tt bench prefill --shape clef-27b --device tt`: the device path of one prefill chunk of
//! a model shape, measured on a Tenstorrent mesh (or tt-metal's mock one) through the real
//! Rust backbone, the C ABI and the shim, with synthetic weights that live only on the devices
//! (matrices allocated, never uploaded: Clef 27B's 15 GB never leave the host; the small
//! vectors are uploaded as zeros). Per chunk length and start position it reports:
//! - device ops: ttnn's own count (graph capture through the shim's `graph_capture` mesh
//!   command; a mesh workload counts once), not the backend's;
//! - ttnn calls (every call the shim made to ttnn, deallocations included) and ABI calls (op
//!   and layer-op calls through the C ABI), per chunk;
//! - host ms: wall time of `Backbone::prefill_embedded` for the chunk (the upload of its rows,
//!   every op, the download of the final rows) with cached programs, the median of the
//!   repeats after one warm-up: eager dispatch, layer op by layer op;
//! - traced ms: the same chunk as a whole pass replayed from its trace
//!   (`Backbone::prefill_chunk`; the ttnn backend's passes.py): the rows and the pass's
//!   inputs copied to the devices, the replay, the final rows read back; the median of the
//!   repeats after its two warm-ups (eager, then captured). From a start past 0 each repeat
//!   continues a state made by traced passes, in place (a long prompt's next chunk);
//! - launches: device ops ttnn launched during one traced chunk (graph capture): 0 when every
//!   op of the chunk ran inside the trace;
//! - data movement: the device ops that only move or re-lay data (tilize, untilize, reshape,
//!   slice, concat, typecast, transpose, permute, pad, and the heads ops), with the bytes they
//!   write per device;
//! - plan: the device ops `clef-tt plan` prices for the chunk (`perf_model::chunk_ops`), which
//!   must agree with the graph in total and per data-movement kind (`ChunkRow::disagreements`).
//!
//! A start past 0 is reached by prefilling chunks up to it first (their state is what the
//! measured chunk continues from). On a mock device the values are not computed, so host time
//! and op counts are what it can tell; device time needs chips.

use crate::backbone::{visit_weights, Backbone, LoadError, PrefillState, TpPlan, WeightFormats};
use crate::checkpoint::{expected_text_tensors, CheckpointError, TextConfig};
use crate::perf_model::{chunk_ops, device_programs};
use clef_device::plan::{PlaceError, Split, SplitError, WeightPlan, WeightSource};
use clef_device::tt::TtMesh;
use clef_device::{HostTensor, HostWeight, MeshOps, WeightFormat};
use std::collections::HashMap;
use std::time::Instant;

/// One measured chunk.
pub struct ChunkRow {
    pub tokens: usize,
    pub start: usize,
    pub device_ops: u64,
    /// Device ops `clef-tt plan` prices for the chunk (`perf_model::chunk_ops`).
    pub plan_ops: u64,
    /// Where the plan and the graph disagree (total or a data-movement kind); empty when
    /// they agree op for op.
    pub disagreements: Vec<String>,
    pub ttnn_calls: u64,
    pub abi_calls: u64,
    pub host_ms: f64,
    /// The chunk replayed from a trace: host ms and the device ops launched outside it;
    /// `None` where the mesh did not trace it.
    pub traced: Option<(f64, u64)>,
    /// (kind, ops, bytes written per device), most bytes first.
    pub movement: Vec<(String, u64, u64)>,
}

/// Zero vectors of the shapes a config implies (a vector's values do not change the path).
struct ZeroVectors(HashMap<String, Vec<usize>>);

impl WeightSource for ZeroVectors {
    type Error = CheckpointError;

    fn rows(
        &self,
        tensor: &str,
        rows: std::ops::Range<usize>,
        _matrix: bool,
    ) -> Result<HostWeight, CheckpointError> {
        let cols = self.cols(tensor)?;
        Ok(HostWeight::f32(
            rows.len(),
            cols,
            vec![0.0; rows.len() * cols],
        ))
    }
}

impl ZeroVectors {
    fn cols(&self, tensor: &str) -> Result<usize, CheckpointError> {
        let shape = self.0.get(tensor).ok_or_else(|| {
            CheckpointError::from(SplitError {
                tensor: tensor.to_string(),
                msg: "not a tensor of this shape".into(),
            })
        })?;
        Ok(shape.iter().skip(1).product::<usize>().max(1))
    }
}

/// One planned weight on the mesh: a matrix allocated in `format` (values unset), a vector
/// uploaded as zeros.
fn synthetic_weight(
    mesh: &TtMesh,
    source: &ZeroVectors,
    w: &WeightPlan,
    format: WeightFormat,
) -> Result<<TtMesh as MeshOps>::Weight, LoadError> {
    let devices = mesh.mesh().devices();
    let name = w
        .parts
        .first()
        .map(|p| p.tensor.clone())
        .unwrap_or_default();
    let placed = if w.matrix {
        let rows: usize = w.parts.iter().map(|p| p.rows.len()).sum();
        let cols = source.cols(&name).map_err(PlaceError::Source)?;
        let (outputs, inputs) = match w.split {
            Split::Columns => (rows / devices, cols),
            Split::Rows => (rows, cols / devices),
            Split::Replicated => (rows, cols),
        };
        mesh.allocate_weight(outputs, inputs, format)
            .map_err(|source| PlaceError::Device {
                tensor: name,
                source,
            })
    } else {
        w.place(mesh, source, WeightFormat::F32)
    };
    Ok(placed?)
}

/// A backbone of `config` on `mesh` with synthetic weights in `formats`.
pub fn synthetic_backbone(
    config: &TextConfig,
    mesh: TtMesh,
    formats: &WeightFormats,
) -> super::Result<Backbone<TtMesh>> {
    let plan = TpPlan::new(config, mesh.mesh().devices())?;
    let source = ZeroVectors(expected_text_tensors(config).into_iter().collect());
    let placed = visit_weights(&plan, formats, |w, format| {
        synthetic_weight(&mesh, &source, w, format)
    })?;
    Ok(Backbone::synthetic(config.clone(), mesh, plan, placed))
}

/// Measures every chunk length from every start (see the module header).
pub fn measure(
    bb: &Backbone<TtMesh>,
    formats: &WeightFormats,
    tokens: &[usize],
    starts: &[usize],
    repeats: usize,
) -> super::Result<Vec<ChunkRow>> {
    let m = bb.mesh();
    let hidden = bb.config().hidden_size;
    let rows_of = |n: usize| HostTensor::new(n, hidden, vec![0.0; n * hidden]);
    let step = tokens.iter().copied().max().unwrap_or(1024).max(1);
    let mut out = Vec::new();
    for &start in starts {
        // The state at `start`: chunks of the longest length prefilled up to it.
        let mut state: Option<PrefillState<_>> = None;
        let mut at = 0;
        while at < start {
            let n = step.min(start - at);
            let positions = Backbone::<TtMesh>::text_positions(at, n);
            state = Some(
                bb.prefill_embedded(&rows_of(n), &positions, state.as_ref(), None)?
                    .1,
            );
            at += n;
        }
        for &n in tokens {
            let x = rows_of(n);
            let positions = Backbone::<TtMesh>::text_positions(start, n);
            let run = || bb.prefill_embedded(&x, &positions, state.as_ref(), None);
            run()?; // programs built and cached
            m.take_op_calls();
            m.take_runtime_calls();
            let mut times = Vec::new();
            for _ in 0..repeats.max(1) {
                let t0 = Instant::now();
                run()?;
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            let runs = repeats.max(1) as u64;
            let abi_calls = m.take_op_calls() / runs;
            let ttnn_calls = m.take_runtime_calls().iter().map(|c| c.calls).sum::<u64>() / runs;
            m.command(r#"{"graph_capture": "begin"}"#)?;
            let captured = run();
            let summary: serde_json::Value =
                serde_json::from_str(&m.command(r#"{"graph_capture": "end"}"#)?)?;
            captured?;
            let mut movement: Vec<(String, u64, u64)> = summary["data_movement"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                v[0].as_u64().unwrap_or(0),
                                v[1].as_u64().unwrap_or(0),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            movement.sort_by_key(|m| std::cmp::Reverse(m.2));
            let device_ops = summary["device_ops"].as_u64().unwrap_or(0);
            let planned = chunk_ops(bb.config(), bb.plan(), formats, n, start);
            let (plan_ops, plan_kinds) = device_programs(&planned);
            let mut disagreements = Vec::new();
            if plan_ops as u64 != device_ops {
                disagreements.push(format!("{plan_ops} device ops planned, {device_ops} run"));
            }
            let ran = |kind: &str| movement.iter().find(|m| m.0 == kind).map_or(0, |m| m.1);
            let mut kinds: Vec<&str> = plan_kinds.iter().map(|k| k.0).collect();
            kinds.extend(movement.iter().map(|m| m.0.as_str()));
            kinds.sort_unstable();
            kinds.dedup();
            for kind in kinds {
                let planned = plan_kinds.iter().find(|k| k.0 == kind).map_or(0, |k| k.1) as u64;
                if planned != ran(kind) {
                    disagreements.push(format!("{kind}: {planned} planned, {} run", ran(kind)));
                }
            }
            let traced = traced(bb, &x, start, step, repeats)?;
            out.push(ChunkRow {
                tokens: n,
                start,
                device_ops,
                plan_ops: plan_ops as u64,
                disagreements,
                ttnn_calls,
                abi_calls,
                host_ms: super::median(times),
                traced,
                movement,
            });
        }
    }
    Ok(out)
}

/// The state at `start` made by whole passes of `step` rows (replayed once warm), each
/// consuming the last.
fn passes_to(
    bb: &Backbone<TtMesh>,
    start: usize,
    step: usize,
) -> super::Result<Option<PrefillState<clef_device::tt::TtTensor>>> {
    let hidden = bb.config().hidden_size;
    let mut state: Option<PrefillState<_>> = None;
    let mut at = 0;
    while at < start {
        let n = step.min(start - at);
        let rows = HostTensor::new(n, hidden, vec![0.0; n * hidden]);
        let positions = Backbone::<TtMesh>::text_positions(at, n);
        let consume = state.is_some();
        state = Some(
            bb.prefill_chunk(&rows, &positions, state.as_ref(), consume)?
                .1,
        );
        at += n;
    }
    Ok(state)
}

/// Rows `x` at `start` as a whole pass replayed from its trace (see the module header): host
/// ms (median of `repeats`) and the device ops launched during one; `None` when the mesh does
/// not trace it.
fn traced(
    bb: &Backbone<TtMesh>,
    x: &HostTensor,
    start: usize,
    step: usize,
    repeats: usize,
) -> super::Result<Option<(f64, u64)>> {
    let m = bb.mesh();
    let positions = Backbone::<TtMesh>::text_positions(start, x.rows);
    let replays = || m.pass_stats().map_or(0, |s| s.traced);
    let run = |graph: bool| -> super::Result<(f64, bool, u64)> {
        let state = passes_to(bb, start, step)?;
        let before = replays();
        if graph {
            m.command(r#"{"graph_capture": "begin"}"#)?;
        }
        let t0 = Instant::now();
        let done = bb.prefill_chunk(x, &positions, state.as_ref(), true);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let launched = if graph {
            let summary: serde_json::Value =
                serde_json::from_str(&m.command(r#"{"graph_capture": "end"}"#)?)?;
            summary["device_ops"].as_u64().unwrap_or(0)
        } else {
            0
        };
        done?;
        Ok((ms, replays() > before, launched))
    };
    // The first pass of its form runs eagerly (programs cached), the second is captured.
    for _ in 0..2 {
        run(false)?;
    }
    let mut times = Vec::new();
    for _ in 0..repeats.max(1) {
        let (ms, replayed, _) = run(false)?;
        if !replayed {
            return Ok(None);
        }
        times.push(ms);
    }
    let (_, _, launched) = run(true)?;
    Ok(Some((super::median(times), launched)))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The rows as a Markdown table.
pub fn table(rows: &[ChunkRow]) -> String {
    let mut s = String::from(
        "| tokens | start | device ops | plan | ttnn calls | ABI calls | host ms | traced ms | traced / eager | launches in a replay | data movement (ops, bytes per device) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let moved: Vec<String> = r
            .movement
            .iter()
            .map(|(k, n, b)| format!("{k} {n} ({})", mib(*b)))
            .collect();
        let (traced, ratio, launches) = match r.traced {
            Some((ms, n)) => (
                format!("{ms:.2}"),
                format!("{:.3}", ms / r.host_ms),
                n.to_string(),
            ),
            None => ("not traced".into(), "-".into(), "-".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {traced} | {ratio} | {launches} | {} |\n",
            r.tokens,
            r.start,
            r.device_ops,
            r.plan_ops,
            r.ttnn_calls,
            r.abi_calls,
            r.host_ms,
            if moved.is_empty() {
                "none".to_string()
            } else {
                moved.join(", ")
            }
        ));
    }
    s
}

/// Fails when the plan and ttnn's graph capture disagree on a chunk, a chunk takes more
/// device ops than `max` (CI's budget), a replayed chunk launched a device op outside its
/// trace, or (`untraced`: tracing is on, with what the backend says of the forms it could not
/// trace) a chunk was not replayed; says so on stdout when they hold.
pub fn check(rows: &[ChunkRow], max: Option<u64>, untraced: Option<&str>) -> super::Result<()> {
    let disagree: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.disagreements
                .iter()
                .map(move |d| format!("{} tokens from {}: {d}", r.tokens, r.start))
        })
        .collect();
    if !disagree.is_empty() {
        refuse!(
            "the plan and ttnn's graph capture disagree: {}",
            disagree.join("; ")
        );
    }
    println!(
        "\nthe plan prices every device op the graph shows (in total and per data-movement kind)"
    );
    let launching: Vec<String> = rows
        .iter()
        .filter_map(|r| match r.traced {
            Some((_, n)) if n > 0 => Some(format!("{n} at {} tokens from {}", r.tokens, r.start)),
            _ => None,
        })
        .collect();
    if !launching.is_empty() {
        refuse!(
            "a replayed chunk launched device ops outside its trace: {}",
            launching.join(", ")
        );
    }
    if rows.iter().any(|r| r.traced.is_some()) {
        println!("\nevery traced chunk ran all its device ops inside its trace (0 launches)");
    }
    if let Some(why) = untraced {
        let missing: Vec<String> = rows
            .iter()
            .filter(|r| r.traced.is_none())
            .map(|r| format!("{} tokens from {}", r.tokens, r.start))
            .collect();
        if !missing.is_empty() {
            refuse!(
                "tracing is on, but these chunks were not replayed from a trace: {} ({why})",
                missing.join(", ")
            );
        }
    }
    if let Some(max) = max {
        let over: Vec<String> = rows
            .iter()
            .filter(|r| r.device_ops > max)
            .map(|r| format!("{} at {} tokens from {}", r.device_ops, r.tokens, r.start))
            .collect();
        if !over.is_empty() {
            refuse!(
                "device ops per chunk over the budget of {max}: {}",
                over.join(", ")
            );
        }
        println!("\ndevice ops per chunk within the budget of {max}");
    }
    Ok(())
}

/// What `bench prefill --shape` measures: each profile on each mesh, chunks of `tokens` from
/// each of `start`.
pub struct ShapeBench<'a> {
    pub shape: crate::checkpoint::shapes::Shape,
    pub profiles: &'a [crate::precision::Precision],
    pub meshes: &'a [clef_device::MeshShape],
    pub tokens: &'a [usize],
    pub start: &'a [usize],
    pub repeats: usize,
    /// Device ops per chunk above which the run fails (CI's budget).
    pub max_device_ops: Option<u64>,
}

/// Runs `b` on meshes of the ttnn shim `shim` (chips or the mock kit), a table per profile
/// and mesh written to `out` as each is measured.
pub fn run(
    shim: &std::sync::Arc<clef_device::tt::Shim>,
    b: &ShapeBench,
    out: &mut dyn std::io::Write,
) -> super::Result<()> {
    if shim.backend() != "ttnn" {
        // The host shim would hold the synthetic weights in host memory (~30 GB for Clef 27B)
        // and has no graph capture.
        refuse!(
            "--shape needs the ttnn shim (chips or the mock kit), not the {} shim",
            shim.backend()
        );
    }
    let (config, _) = crate::checkpoint::shapes::shape_configs(b.shape);
    let hardware = clef_device::select::hardware(shim);
    for p in b.profiles {
        let formats = p.weight_formats();
        for &mesh in b.meshes {
            let tt =
                clef_device::select::MeshLayout::single(mesh).open_tt(shim, 0, p.numerics())?;
            let bb = synthetic_backbone(&config, tt, &formats)?;
            let rows = measure(&bb, &formats, b.tokens, b.start, b.repeats)?;
            let shape = b.shape;
            writeln!(
                out,
                "{shape:?} on a {mesh} {hardware} mesh, profile {}:\n",
                p.name
            )?;
            write!(out, "{}", table(&rows))?;
            let stats = bb.mesh().pass_stats();
            if let Some(s) = &stats {
                writeln!(
                    out,
                    "\ntraces held: {}, their intermediates' placeholders {:.1} MiB per device",
                    s.traces,
                    s.reserved_bytes as f64 / (1u64 << 20) as f64
                )?;
            }
            let untraced = stats.filter(|s| s.tracing).map(|_| {
                bb.mesh()
                    .command(r#"{"trace":"facts"}"#)
                    .ok()
                    .and_then(|f| serde_json::from_str::<serde_json::Value>(&f).ok())
                    .map(|f| f["untraced"].to_string())
                    .unwrap_or_default()
            });
            check(&rows, b.max_device_ops, untraced.as_deref())?;
        }
    }
    Ok(())
}
