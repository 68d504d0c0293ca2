//! `clef-tt plan --on-device`: the plan placed on a device mesh through its shim without host
//! data — every weight with the tensor spec the backend uses (matrices as `[in, out]` tiles of
//! the profile's formats, vectors f32), the prefix cache's slots (KV rows, DeltaNet states,
//! conv carries) and one chunk's working set — class by class, with the bytes the device's
//! allocator holds for each next to the plan's prediction and what is left of each chip's
//! DRAM. A class that does not fit ends the placement with an error naming it.

use super::report::PlanQuestion;
use super::{text_matrices, text_vectors, vision_matrices, PlacedMatrix};
use crate::backbone::TpPlan;
use crate::checkpoint::LayerKind;
use clef_device::tt::{Allocation, TtMesh, TtTensor};
use clef_device::DeviceError;
use clef_vision::tower::plan::VisionPlan;
use std::fmt::Write;

const GIB: f64 = (1u64 << 30) as f64;

/// One class of tensors placed.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassRow {
    pub class: String,
    pub tensors: usize,
    /// The plan's bytes per device (whole tiles; f32 vectors; activations in their dtype).
    pub predicted: u64,
    /// What the device's allocator holds for them, per device.
    pub held: u64,
}

/// A finished placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub rows: Vec<ClassRow>,
    /// DRAM of one device.
    pub dram: u64,
    /// The allocator's own count of what is allocated per device at the end (ttnn's own
    /// buffers included), when the backend reports it.
    pub allocated: Option<u64>,
    /// The trace region reserved at the mesh's open (outside `dram`), per device.
    pub trace_region: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "{class} does not fit: it needs {need:.2} GiB per device and {free:.2} GiB of the {dram:.2} GiB are left after {placed}; the device said: {message}"
    )]
    DoesNotFit {
        class: String,
        need: f64,
        free: f64,
        dram: f64,
        placed: String,
        message: String,
    },
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("the plan: {0}")]
    Plan(String),
}

/// What one class consists of.
struct Class {
    name: String,
    tensors: Vec<(Allocation, u64)>,
}

/// Bytes a device holds for an activation of `rows x cols` elements of `bytes` each.
fn activation(rows: usize, cols: usize, f32: bool, act_bytes: u64) -> (Allocation, u64) {
    let bytes = if f32 { 4 } else { act_bytes };
    let tiles = (rows.div_ceil(32) * cols.div_ceil(32)) as u64;
    (
        Allocation::Activation { rows, cols, f32 },
        tiles * 1024 * bytes,
    )
}

fn matrix(m: &PlacedMatrix) -> (Allocation, u64) {
    (
        Allocation::Matrix {
            inputs: m.inputs,
            outputs: m.outputs,
            format: m.format,
        },
        m.bytes() as u64,
    )
}

/// Every class of `q`'s plan in placement order: the weight classes (in the order they first
/// appear), the vectors, the vision tower, `slots` prefix-cache slots of `slot_tokens`, one
/// chunk of `q.tokens`.
fn classes(
    q: &PlanQuestion,
    slots: usize,
    slot_tokens: usize,
) -> Result<Vec<Class>, PlacementError> {
    let cfg = q.text;
    let plan = TpPlan::new(cfg, q.devices).map_err(|e| PlacementError::Plan(e.to_string()))?;
    let formats = q.precision.weight_formats();
    let matrices = text_matrices(cfg, &plan, &formats);
    let mut out: Vec<Class> = Vec::new();
    for m in &matrices {
        match out.iter_mut().find(|c| c.name == m.class) {
            Some(c) => c.tensors.push(matrix(m)),
            None => out.push(Class {
                name: m.class.to_string(),
                tensors: vec![matrix(m)],
            }),
        }
    }
    out.push(Class {
        name: "norms, gates, conv taps".into(),
        tensors: text_vectors(cfg, &plan)
            .into_iter()
            .map(|values| (Allocation::Vector { values }, values as u64 * 4))
            .collect(),
    });
    if let Some(v) = &q.vision {
        let vplan =
            VisionPlan::new(v, q.devices).map_err(|e| PlacementError::Plan(e.to_string()))?;
        out.push(Class {
            name: "vision".into(),
            tensors: vision_matrices(v, &vplan, formats.vision)
                .iter()
                .map(matrix)
                .collect(),
        });
    }
    let n = q.devices;
    let act = if q.precision.bf16_activations { 2 } else { 4 };
    let mut slot = Vec::new();
    for _ in 0..slots {
        for _ in 0..cfg.count(LayerKind::Attention) {
            let kv = cfg.num_key_value_heads / n * cfg.head_dim;
            slot.push(activation(slot_tokens, kv, false, act));
            slot.push(activation(slot_tokens, kv, false, act));
        }
        for _ in 0..cfg.count(LayerKind::DeltaNet) {
            let heads = cfg.linear_num_value_heads / n;
            slot.push(activation(
                heads * cfg.linear_key_head_dim,
                cfg.linear_value_head_dim,
                true,
                act,
            ));
            slot.push(activation(
                cfg.linear_conv_kernel_dim - 1,
                cfg.conv_dim() / n,
                false,
                act,
            ));
        }
    }
    out.push(Class {
        name: format!("prefix cache: {slots} slots x {slot_tokens} tokens"),
        tensors: slot,
    });
    out.extend(traced_passes(q, slot_tokens, act));
    let t = q.tokens;
    out.push(Class {
        name: format!("one {t}-token chunk"),
        tensors: chunk_working_set(q, t, act),
    });
    Ok(out)
}

/// One chunk of `t` rows at its widest: the hidden rows (input, residual, normed), the widest
/// column-parallel output and its activation, and a row-parallel projection's partial sums (in
/// the activation dtype, as the port's bf16 collectives) with their reduction.
fn chunk_working_set(q: &PlanQuestion, t: usize, act: u64) -> Vec<(Allocation, u64)> {
    let cfg = q.text;
    let widest = TpPlan::new(cfg, q.devices)
        .map(|plan| {
            text_matrices(cfg, &plan, &q.precision.weight_formats())
                .iter()
                .filter(|m| !m.row_parallel)
                .map(|m| m.outputs)
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    let h = cfg.hidden_size;
    vec![
        activation(t, h, false, act),
        activation(t, h, false, act),
        activation(t, h, false, act),
        activation(t, widest, false, act),
        activation(t, widest / 2, false, act),
        activation(t, h, false, act),
        activation(t, h, false, act),
    ]
}

/// Rows of KV a traced pass's shared pools hold beyond the prefix-cache slots: two prompts
/// in flight, each a slot's state plus the default tail (4,096 tokens).
const TAIL_TOKENS: usize = 4096;
/// The buckets a worker's warm-up captures, each from a prompt's start and continuing one
/// (ffi/shim/ttnn/clef_tt_ttnn/passes.py's default `CLEF_TT_TRACE_BUCKETS`).
const BUCKETS: [usize; 4] = [128, 256, 512, 1024];

/// What traced passes keep on the device besides the slots (docs/tenstorrent.md, "Traced
/// passes"): the shared KV pools' room for the prompts in flight, the live DeltaNet state the
/// passes continue in place, and the arena the traces keep reserved for their intermediates.
fn traced_passes(q: &PlanQuestion, slot_tokens: usize, act: u64) -> Vec<Class> {
    let cfg = q.text;
    let n = q.devices;
    let in_flight = 2 * (slot_tokens + TAIL_TOKENS);
    let kv = cfg.num_key_value_heads / n * cfg.head_dim;
    let pools = (0..2 * cfg.count(LayerKind::Attention))
        .map(|_| activation(in_flight, kv, false, act))
        .collect();
    let mut live = Vec::new();
    for _ in 0..cfg.count(LayerKind::DeltaNet) {
        let heads = cfg.linear_num_value_heads / n;
        live.push(activation(
            heads * cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            true,
            act,
        ));
        live.push(activation(
            cfg.linear_conv_kernel_dim - 1,
            cfg.conv_dim() / n,
            false,
            act,
        ));
    }
    // The arena of every trace's intermediates (ffi/shim/ttnn/clef_tt_ttnn/trace.py): replays
    // run one at a time, so it is the largest bucket's pass; twice that pass's working set
    // (its intermediates as the allocator placed them: measured 187 MiB per device on the
    // mock P150x2 for Clef 27B's 8 warm-up forms, its working set below 101 MiB).
    let largest = BUCKETS.iter().copied().max().unwrap_or(1024);
    let reserved = chunk_working_set(q, largest, act)
        .into_iter()
        .chain(chunk_working_set(q, largest, act))
        .collect();
    vec![
        Class {
            name: format!(
                "traced passes: KV of 2 prompts of {} tokens in flight",
                in_flight / 2
            ),
            tensors: pools,
        },
        Class {
            name: "traced passes: live DeltaNet state".into(),
            tensors: live,
        },
        Class {
            name: format!("traces: their intermediates' arena ({largest}-row pass)"),
            tensors: reserved,
        },
    ]
}

/// Places `q`'s plan on `mesh` class by class, keeping everything allocated until the end.
pub fn place(
    mesh: &TtMesh,
    q: &PlanQuestion,
    slots: usize,
    slot_tokens: usize,
) -> Result<Placement, PlacementError> {
    let facts: serde_json::Value = serde_json::from_str(&mesh.describe()?).unwrap_or_default();
    let dram = facts["dram_bytes_per_device"].as_u64().unwrap_or(0);
    let mut held: Vec<TtTensor> = Vec::new();
    let mut rows: Vec<ClassRow> = Vec::new();
    for class in classes(q, slots, slot_tokens)? {
        let before = mesh
            .status()?
            .bytes_per_device
            .first()
            .copied()
            .unwrap_or(0);
        let predicted: u64 = class.tensors.iter().map(|(_, b)| b).sum();
        for (what, _) in &class.tensors {
            match mesh.allocate(*what) {
                Ok(t) => held.push(t),
                Err(e) if out_of_memory(&e) => {
                    return Err(PlacementError::DoesNotFit {
                        class: class.name,
                        need: predicted as f64 / GIB,
                        free: dram.saturating_sub(before) as f64 / GIB,
                        dram: dram as f64 / GIB,
                        placed: if rows.is_empty() {
                            "nothing".to_string()
                        } else {
                            rows.iter()
                                .map(|r| r.class.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        },
                        message: e.to_string(),
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
        let after = mesh
            .status()?
            .bytes_per_device
            .first()
            .copied()
            .unwrap_or(0);
        rows.push(ClassRow {
            class: class.name,
            tensors: class.tensors.len(),
            predicted,
            held: after.saturating_sub(before),
        });
    }
    let facts: serde_json::Value = serde_json::from_str(&mesh.describe()?).unwrap_or_default();
    let allocated = facts["dram_allocated_per_device"].as_u64();
    let trace_region = facts["trace_region_bytes"].as_u64().unwrap_or(0);
    drop(held);
    Ok(Placement {
        rows,
        dram,
        allocated,
        trace_region,
    })
}

/// Whether a device error is the allocator running out of memory.
fn out_of_memory(e: &DeviceError) -> bool {
    let text = e.to_string();
    text.contains("out of memory") || text.contains("Out of Memory") || text.contains("OOM")
}

/// The placement as markdown: a row per class, then what is left of a chip.
pub fn render(p: &Placement, weights_classes: usize, port_free_gib: f64) -> String {
    let mut out = String::from(
        "| class | tensors | plan GiB per device | device allocator GiB per device |\n|---|---|---|---|\n",
    );
    let (mut predicted, mut held) = (0u64, 0u64);
    let mut weights_held = 0u64;
    for (i, r) in p.rows.iter().enumerate() {
        predicted += r.predicted;
        held += r.held;
        if i < weights_classes {
            weights_held += r.held;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:.3} |",
            r.class,
            r.tensors,
            r.predicted as f64 / GIB,
            r.held as f64 / GIB
        );
    }
    let _ = writeln!(
        out,
        "| **total** | {} | **{:.3}** | **{:.3}** |\n",
        p.rows.iter().map(|r| r.tensors).sum::<usize>(),
        predicted as f64 / GIB,
        held as f64 / GIB
    );
    let dram = p.dram as f64 / GIB;
    let _ = writeln!(
        out,
        "DRAM per device {dram:.2} GiB: {:.2} GiB left after the weights (the port reports {port_free_gib} GiB free of 32 GB after its text weights, its embedding table included), {:.2} GiB left after everything above.{}",
        dram - weights_held as f64 / GIB,
        dram - held as f64 / GIB,
        p.allocated.map_or(String::new(), |a| format!(
            " The allocator counts {:.2} GiB allocated per device (ttnn's own buffers included).",
            a as f64 / GIB
        ))
    );
    if p.trace_region > 0 {
        let _ = writeln!(
            out,
            "\nThe trace region, reserved at open outside the DRAM above: {:.2} GiB per device \
             (the allocator's TRACE view), room for {} traced passes of ~{} device ops at up to \
             {} KiB each: an estimate from tt-metal's dispatch commands (mock mode records \
             none; chips report what the traces take).",
            p.trace_region as f64 / GIB,
            TRACE_ROOM.0,
            TRACE_ROOM.1,
            TRACE_ROOM.2 >> 10
        );
    }
    out
}

/// What the ttnn backend sizes its trace region for (ffi/shim/ttnn/clef_tt_ttnn/trace.py:
/// MAX_TRACES, PASS_OPS, TRACE_BYTES_PER_OP).
const TRACE_ROOM: (usize, usize, usize) = (16, 1800, 16 << 10);

/// `plan --on-device`: the plan `q` placed on a `shape` Tenstorrent mesh through `shim`, with
/// `slots` prefix-cache slots of `slot_tokens`, as the report's section.
pub fn on_device(
    shim: &std::sync::Arc<clef_device::tt::Shim>,
    q: &PlanQuestion,
    shape: clef_device::MeshShape,
    slots: usize,
    slot_tokens: usize,
) -> Result<String, PlacementError> {
    let placement = clef_device::tt::MeshPlacement::direct(shape);
    let mesh = clef_device::tt::TtMesh::open(shim, placement, q.precision.numerics())?;
    let placed = place(&mesh, q, slots, slot_tokens)?;
    let weight_classes = placed
        .rows
        .iter()
        .take_while(|r| !r.class.starts_with("prefix cache"))
        .count();
    Ok(format!(
        "## On the device: {shape} through {} ({} backend)\n\n{}",
        shim.path().display(),
        shim.backend(),
        render(&placed, weight_classes, super::report::PORT_FREE_GIB)
    ))
}
