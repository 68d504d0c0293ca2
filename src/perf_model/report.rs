//! The text `clef-tt plan` prints: weights per device, the slot and cache state, the ops of one
//! chunk with their predicted times, and the vision tower's, as markdown tables.

use super::{
    bytes_by_class, chunk_ops, text_matrices, text_vector_values, vision_matrices, vision_ops,
    Ceilings, OpCost,
};
use crate::backbone::TpPlan;
use crate::checkpoint::{LayerKind, TextConfig};
use crate::precision::Precision;
use clef_vision::tower::plan::VisionPlan;
use clef_vision::VisionShape;
use std::fmt::Write;

/// The port's measured prefill of one 1,024-token chunk on P150x2, traced (spec §6).
pub const PORT_CHUNK_MS: f64 = 338.0;
/// Free DRAM per chip the port reports after its text weights, of 32 GB.
pub const PORT_FREE_GIB: f64 = 13.8;

const GIB: f64 = (1u64 << 30) as f64;

/// What to model.
pub struct PlanQuestion<'a> {
    pub name: &'a str,
    pub text: &'a TextConfig,
    pub vision: Option<VisionShape>,
    pub devices: usize,
    pub precision: &'a Precision,
    /// Tokens of the chunk and where it starts.
    pub tokens: usize,
    pub start: usize,
    pub patches: usize,
}

/// Predicted milliseconds of `ops` at the measured matmul rate and at the peak.
pub fn totals(ops: &[OpCost], c: &Ceilings) -> (f64, f64) {
    let sum = |rate: f64| ops.iter().map(|o| o.seconds(c, rate)).sum::<f64>() * 1e3;
    (sum(c.matmul_measured_tflops), sum(c.matmul_peak_tflops))
}

fn ops_table(out: &mut String, ops: &[OpCost], c: &Ceilings) {
    let _ = writeln!(
        out,
        "| op | runs | GFLOP | DRAM MB | link MB | ms at {:.0} TFLOP/s | ms at {:.0} TFLOP/s |\n|---|---|---|---|---|---|---|",
        c.matmul_measured_tflops, c.matmul_peak_tflops
    );
    for o in ops {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            o.name,
            o.count,
            o.flops / 1e9,
            o.dram_bytes / 1e6,
            o.link_bytes / 1e6,
            o.seconds(c, c.matmul_measured_tflops) * 1e3,
            o.seconds(c, c.matmul_peak_tflops) * 1e3
        );
    }
    let (measured, peak) = totals(ops, c);
    let flops: f64 = ops.iter().map(|o| o.flops).sum();
    let _ = writeln!(
        out,
        "| **total** | | {:.1} | {:.1} | {:.1} | **{measured:.1}** | **{peak:.1}** |",
        flops / 1e9,
        ops.iter().map(|o| o.dram_bytes).sum::<f64>() / 1e6,
        ops.iter().map(|o| o.link_bytes).sum::<f64>() / 1e6,
    );
}

/// The whole report.
pub fn render(q: &PlanQuestion) -> anyhow::Result<String> {
    let cfg = q.text;
    let plan = TpPlan::new(cfg, q.devices)?;
    let formats = q.precision.weight_formats();
    let c = Ceilings::p150(q.precision.fidelity);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Device model: {} on a 1x{} p150 mesh, profile {} ({})\n",
        q.name,
        q.devices,
        q.precision.name,
        q.precision.fidelity.name()
    );
    let _ = writeln!(
        out,
        "Ceilings per chip: matmul {:.0} TFLOP/s measured, {:.0} TFLOP/s peak at this fidelity; DRAM {:.0} GB/s; collectives {:.0} µs + {:.0} GB/s over the links; PCIe {:.0} GB/s.\n",
        c.matmul_measured_tflops, c.matmul_peak_tflops, c.dram_gb_s, c.collective_us, c.link_gb_s, c.pcie_gb_s
    );
    let matrices = text_matrices(cfg, &plan, &formats);
    let _ = writeln!(
        out,
        "## Weights per device\n\n| class | format | parameters | GiB |\n|---|---|---|---|"
    );
    let mut total = 0usize;
    for (class, format, params, bytes) in bytes_by_class(&matrices) {
        total += bytes;
        let _ = writeln!(
            out,
            "| {class} | {} | {params} | {:.3} |",
            format.name(),
            bytes as f64 / GIB
        );
    }
    let vectors = text_vector_values(cfg, &plan);
    total += vectors * 4;
    let _ = writeln!(
        out,
        "| norms, gates, conv taps | f32 | {vectors} | {:.3} |",
        (vectors * 4) as f64 / GIB
    );
    if let Some(v) = &q.vision {
        let vplan = VisionPlan::new(v, q.devices)?;
        let vm = vision_matrices(v, &vplan, formats.vision);
        let (params, bytes): (usize, usize) = vm
            .iter()
            .fold((0, 0), |(p, b), m| (p + m.params(), b + m.bytes()));
        total += bytes;
        let _ = writeln!(
            out,
            "| vision tower matrices | {} | {params} | {:.3} |",
            formats.vision.name(),
            bytes as f64 / GIB
        );
    }
    let _ = writeln!(out, "| **total** | | | **{:.3}** |\n", total as f64 / GIB);
    let embedding = cfg.vocab_size * cfg.hidden_size / q.devices * 2;
    let _ = writeln!(
        out,
        "Not on the device: the embedding table ({:.2} GiB per device as the port holds it, hidden-sharded bf16) and the LM head — clef-tt reads their rows on the host. The port reports {PORT_FREE_GIB} GiB free of 32 GB per chip after its text weights (≈16.9 GB with its embedding table).\n",
        embedding as f64 / GIB
    );
    // A prefix slot / the KV cache of the longest prompt, per device.
    let n = q.devices;
    let slot = |p: usize| {
        let kv = 2 * p * (cfg.num_key_value_heads / n) * cfg.head_dim * 2;
        let state = (cfg.linear_num_value_heads / n)
            * cfg.linear_key_head_dim
            * cfg.linear_value_head_dim
            * 4
            + (cfg.linear_conv_kernel_dim - 1) * cfg.conv_dim() / n * 2;
        cfg.count(LayerKind::Attention) * kv + cfg.count(LayerKind::DeltaNet) * state
    };
    let _ = writeln!(
        out,
        "State per device (bf16 KV, f32 DeltaNet state, bf16 conv carry): {:.3} GiB for a 16,384-token prefix slot, {:.3} GiB for a 20,480-token prompt.\n",
        slot(16384) as f64 / GIB,
        slot(20480) as f64 / GIB
    );
    let ops = chunk_ops(cfg, &plan, &formats, q.tokens, q.start);
    let _ = writeln!(
        out,
        "## One prefill chunk: {} tokens from position {}, per device\n",
        q.tokens, q.start
    );
    ops_table(&mut out, &ops, &c);
    let (measured, peak) = totals(&ops, &c);
    let _ = writeln!(
        out,
        "\nPredicted: {measured:.1} ms per chunk at the measured matmul rate, {peak:.1} ms at the peak; the port measured {PORT_CHUNK_MS} ms (traced) for a 1,024-token chunk, {:.1}x the first.\n",
        PORT_CHUNK_MS / measured
    );
    if let Some(v) = &q.vision {
        let vplan = VisionPlan::new(v, q.devices)?;
        let vops = vision_ops(v, &vplan, formats.vision, q.patches);
        let _ = writeln!(
            out,
            "## Vision tower: one image of {} patches, per device\n",
            q.patches
        );
        ops_table(&mut out, &vops, &c);
    }
    Ok(out)
}
