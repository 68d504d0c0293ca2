//! The ops of one prefill chunk on one device, with their FLOPs, DRAM bytes and link bytes
//! (activations in bf16, partial sums and DeltaNet states in f32), grouped by op over layers.
//!
//! Every device op the ttnn backend runs for the chunk is priced here: each entry says how many
//! device programs one run of it is (`programs`) and, for an op that only moves data, which kind
//! (`movement`, named as ttnn's graph capture is classified by ffi/shim/ttnn/clef_tt_ttnn/
//! graph.py). The sequence is the layer ops' (clef_tt_ttnn/layers.py): `clef-tt bench prefill
//! --shape` checks that the plan and ttnn's graph capture agree, in total and per data-movement
//! kind, for every chunk it measures.

use super::{text_matrices, Ceilings, PlacedMatrix};
use crate::backbone::{TpPlan, WeightFormats};
use crate::checkpoint::{LayerKind, TextConfig};

/// What bounds an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Matrix-engine work: the slower of FLOPs at the matmul rate and bytes at DRAM speed.
    Compute,
    /// Elementwise or data movement: DRAM bytes.
    Memory,
    /// A reduce-scatter + all-gather: a fixed cost plus bytes over the links.
    Collective,
    /// Rows between the host and the device over PCIe.
    Host,
}

/// One op of a chunk, summed over the layers that run it (per device).
#[derive(Clone, Debug, PartialEq)]
pub struct OpCost {
    pub name: String,
    pub kind: OpKind,
    /// Times it runs per chunk.
    pub count: usize,
    pub flops: f64,
    pub dram_bytes: f64,
    pub link_bytes: f64,
    /// Device programs one run takes (a reduce-scatter + all-gather is 2).
    pub programs: usize,
    /// The data-movement kind of an op that only moves or re-lays data (`slice`, `concat`,
    /// `heads`, `tilize`, `typecast`), as graph capture names it.
    pub movement: Option<&'static str>,
}

impl OpCost {
    /// Predicted seconds with matmuls at `tflops`.
    pub fn seconds(&self, c: &Ceilings, tflops: f64) -> f64 {
        let dram = self.dram_bytes / (c.dram_gb_s * 1e9);
        match self.kind {
            OpKind::Compute => (self.flops / (tflops * 1e12)).max(dram),
            OpKind::Memory => dram,
            OpKind::Host => self.dram_bytes / (c.pcie_gb_s * 1e9),
            OpKind::Collective => {
                self.count as f64 * c.collective_us * 1e-6 + self.link_bytes / (c.link_gb_s * 1e9)
            }
        }
    }
}

/// Accumulates ops by name.
#[derive(Default)]
struct Ops(Vec<OpCost>);

impl Ops {
    /// One run of a one-program op.
    fn add(&mut self, name: &str, kind: OpKind, flops: f64, dram: f64, link: f64) {
        self.add_programs(name, kind, 1, None, flops, dram, link);
    }

    /// One run of an op of `programs` device programs.
    #[allow(clippy::too_many_arguments)]
    fn add_programs(
        &mut self,
        name: &str,
        kind: OpKind,
        programs: usize,
        movement: Option<&'static str>,
        flops: f64,
        dram: f64,
        link: f64,
    ) {
        match self.0.iter_mut().find(|o| o.name == name) {
            Some(o) => {
                o.count += 1;
                o.flops += flops;
                o.dram_bytes += dram;
                o.link_bytes += link;
            }
            None => self.0.push(OpCost {
                name: name.to_string(),
                kind,
                count: 1,
                flops,
                dram_bytes: dram,
                link_bytes: link,
                programs,
                movement,
            }),
        }
    }

    /// `programs` data-movement programs of `kind` reading and writing `values` bf16 values
    /// in all.
    fn moves(&mut self, name: &str, kind: &'static str, programs: usize, values: f64) {
        self.add_programs(
            name,
            OpKind::Memory,
            programs,
            Some(kind),
            0.0,
            4.0 * values,
            0.0,
        );
    }

    /// An elementwise op reading `inputs` and writing `outputs` bf16 values.
    fn elementwise(&mut self, name: &str, inputs: f64, outputs: f64, flops_per_value: f64) {
        let dram = 2.0 * (inputs + outputs);
        self.add(name, OpKind::Memory, flops_per_value * outputs, dram, 0.0);
    }

    /// `x · W` over `t` rows: the weight streamed once, bf16 rows in, bf16 (f32 when a
    /// partial sum) rows out.
    fn matmul(&mut self, name: &str, m: &PlacedMatrix, t: f64) {
        let out_bytes = if m.row_parallel { 4.0 } else { 2.0 };
        let dram = m.bytes() as f64 + t * (m.inputs as f64 * 2.0 + m.outputs as f64 * out_bytes);
        let flops = 2.0 * t * m.params() as f64;
        self.add(name, OpKind::Compute, flops, dram, 0.0);
    }

    /// The all-reduce of a `[t, width]` partial sum over `devices` devices: a reduce-scatter
    /// and an all-gather (2 programs), in bf16 as the backend runs them.
    fn all_reduce(&mut self, name: &str, t: f64, width: f64, devices: usize) {
        if devices < 2 {
            return;
        }
        let n = devices as f64;
        let phase = (n - 1.0) / n * t * width * 2.0;
        self.add_programs(
            name,
            OpKind::Collective,
            2,
            None,
            t * width,
            2.0 * t * width * 2.0,
            2.0 * phase,
        );
    }
}

/// Chunk length of the chunked delta rule.
const DELTA_CHUNK: f64 = 64.0;

/// The ops of one chunk of `t` tokens that starts at position `start`, per device.
pub fn chunk_ops(
    cfg: &TextConfig,
    plan: &TpPlan,
    formats: &WeightFormats,
    t: usize,
    start: usize,
) -> Vec<OpCost> {
    let n = plan.devices;
    let matrices = text_matrices(cfg, plan, formats);
    let mut matrix = matrices.iter();
    let mut next = || matrix.next();
    let (tf, h) = (t as f64, cfg.hidden_size as f64);
    let mut ops = Ops::default();
    ops.add_programs(
        "embedding rows up (host → device)",
        OpKind::Host,
        0,
        None,
        0.0,
        tf * h * 4.0,
        0.0,
    );
    // The f32 rows are tiled and cast to bf16 on the device.
    ops.moves("embedding rows: tilize", "tilize", 1, 2.0 * tf * h);
    ops.moves("embedding rows: to bf16", "typecast", 1, 2.0 * tf * h);
    for kind in &cfg.layers {
        ops.elementwise("rms_norm (input)", tf * h, tf * h, 4.0);
        match kind {
            LayerKind::Attention => {
                let (heads, kv, d) = (
                    (cfg.num_attention_heads / n) as f64,
                    (cfg.num_key_value_heads / n) as f64,
                    cfg.head_dim as f64,
                );
                let r = cfg.rotary_dim() as f64;
                if let Some(m) = next() {
                    ops.matmul("attention qkv|gate matmul", m, tf);
                }
                let qk = tf * (heads + kv) * d;
                ops.moves(
                    "q|gate, k, v heads (nlp_create_qkv_heads)",
                    "heads",
                    1,
                    2.0 * tf * (2.0 * heads + 2.0 * kv) * d,
                );
                ops.moves(
                    "q, gate out of the q|gate heads",
                    "slice",
                    2,
                    4.0 * tf * heads * d,
                );
                ops.add_programs(
                    "q/k rms_norm (heads)",
                    OpKind::Memory,
                    2,
                    None,
                    4.0 * qk,
                    4.0 * qk,
                    0.0,
                );
                ops.moves("rope: rotated and passed channels", "slice", 4, 2.0 * qk);
                let rotated = tf * (heads + kv) * r;
                ops.add_programs(
                    "rope: rotary_embedding_hf",
                    OpKind::Memory,
                    2,
                    None,
                    3.0 * rotated,
                    2.0 * (3.0 * rotated + rotated),
                    0.0,
                );
                ops.moves("rope: heads joined", "concat", 2, 2.0 * qk);
                ops.add_programs(
                    "paged_fill_cache (K, V)",
                    OpKind::Memory,
                    2,
                    None,
                    0.0,
                    2.0 * 4.0 * tf * kv * d,
                    0.0,
                );
                // Causal: query i of the chunk sees start + i + 1 keys.
                let seen = tf * start as f64 + tf * (tf + 1.0) / 2.0;
                let flops = 4.0 * d * heads * seen;
                let kv_rows = (start + t) as f64;
                let dram = 2.0 * (2.0 * tf * heads * d + 2.0 * kv_rows * kv * d);
                ops.add(
                    "chunked SDPA (causal, GQA)",
                    OpKind::Compute,
                    flops,
                    dram,
                    0.0,
                );
                ops.elementwise(
                    "output gate (x · sigmoid(g))",
                    2.0 * tf * heads * d,
                    tf * heads * d,
                    5.0,
                );
                ops.moves(
                    "heads joined (nlp_concat_heads)",
                    "heads",
                    1,
                    2.0 * tf * heads * d,
                );
                if let Some(m) = next() {
                    ops.matmul("attention o_proj matmul", m, tf);
                }
                ops.all_reduce("all_reduce (o_proj, out_proj)", tf, h, n);
            }
            LayerKind::DeltaNet => {
                let (nk, nv, dk, dv) = (
                    (cfg.linear_num_key_heads / n) as f64,
                    (cfg.linear_num_value_heads / n) as f64,
                    cfg.linear_key_head_dim as f64,
                    cfg.linear_value_head_dim as f64,
                );
                if let Some(m) = next() {
                    ops.matmul("deltanet in_proj matmul", m, tf);
                }
                let ch = 2.0 * nk * dk + nv * dv;
                let k = cfg.linear_conv_kernel_dim as f64;
                // Reads q|k|v in place from the projection, writes q, k, v and the carry.
                ops.elementwise(
                    "causal conv1d + SiLU (carry)",
                    tf * ch,
                    tf * ch,
                    2.0 * k + 4.0,
                );
                ops.moves("b|a columns", "slice", 1, 2.0 * tf * 2.0 * nv);
                // Two selection matmuls (sigmoid; softplus with dt_bias) and the decay.
                ops.add_programs(
                    "delta gates (f32)",
                    OpKind::Memory,
                    3,
                    None,
                    8.0 * tf * nv,
                    2.0 * (2.0 * tf * 2.0 * nv) + 3.0 * 4.0 * tf * nv,
                    0.0,
                );
                // Chunked form per value head and token: the state read by q and k and its
                // update (3 products of dk x dv), and the within-chunk scores and their
                // application (2 C (dk + dv)).
                let flops = tf * nv * (6.0 * dk * dv + 2.0 * DELTA_CHUNK * (dk + dv));
                let state = nv * dk * dv * 4.0;
                let dram = 2.0 * tf * (ch + 2.0 * nv) + 4.0 * tf * nv * dv + 2.0 * state;
                ops.add(
                    "chunk_gated_delta_rule (f32 state)",
                    OpKind::Compute,
                    flops,
                    dram,
                    0.0,
                );
                let core = tf * nv * dv;
                ops.add(
                    "rms_norm per value head (f32)",
                    OpKind::Memory,
                    4.0 * core,
                    8.0 * core,
                    0.0,
                );
                ops.moves(
                    "heads joined (nlp_concat_heads, f32)",
                    "heads",
                    1,
                    4.0 * core,
                );
                ops.moves("z columns", "slice", 1, 2.0 * core);
                ops.elementwise("gate · SiLU(z)", 3.0 * core, core, 5.0);
                if let Some(m) = next() {
                    ops.matmul("deltanet out_proj matmul", m, tf);
                }
                ops.all_reduce("all_reduce (o_proj, out_proj)", tf, h, n);
            }
        }
        ops.elementwise("residual add", 2.0 * tf * h, tf * h, 1.0);
        ops.elementwise("rms_norm (post)", tf * h, tf * h, 4.0);
        let inter = (cfg.intermediate_size / n) as f64;
        if let Some(m) = next() {
            ops.matmul("mlp gate|up matmul", m, tf);
        }
        ops.elementwise("SwiGLU", 2.0 * tf * inter, tf * inter, 6.0);
        if let Some(m) = next() {
            ops.matmul("mlp down matmul", m, tf);
        }
        ops.all_reduce("all_reduce (down_proj)", tf, h, n);
        ops.elementwise("residual add", 2.0 * tf * h, tf * h, 1.0);
    }
    ops.elementwise("final rms_norm", tf * h, tf * h, 4.0);
    // Untilized on the device, so the host reads the bf16 rows as they are and widens them while
    // copying them out (no tile conversion on the host).
    ops.moves("final rows: untilize", "untilize", 1, 2.0 * tf * h);
    ops.add_programs(
        "final rows down (device → host)",
        OpKind::Host,
        0,
        None,
        0.0,
        tf * h * 2.0,
        0.0,
    );
    ops.0
}

/// Device programs of a chunk's ops: in all, and per data-movement kind.
pub fn device_programs(ops: &[OpCost]) -> (usize, Vec<(&'static str, usize)>) {
    let mut kinds: Vec<(&'static str, usize)> = Vec::new();
    for o in ops {
        if let Some(k) = o.movement {
            match kinds.iter_mut().find(|e| e.0 == k) {
                Some(e) => e.1 += o.count * o.programs,
                None => kinds.push((k, o.count * o.programs)),
            }
        }
    }
    (ops.iter().map(|o| o.count * o.programs).sum(), kinds)
}
