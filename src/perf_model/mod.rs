//! The device performance model of `clef-tt plan`, computed from the code's own tensor-parallel
//! plans (`backbone::TpPlan`, `clef_vision::VisionPlan`) and the precision profile's formats:
//! per device, the bytes of every placed weight class; for one prefill chunk, the FLOPs, DRAM
//! bytes and collective bytes of every op; and a predicted time per op at the p150 ceilings of
//! Tenstorrent's documentation — matmuls at the measured 190 TFLOP/s per chip and at the peak of the
//! profile's fidelity, everything else at the 512 GB/s of DRAM, a fixed cost plus link time per
//! collective. It is arithmetic, not a simulation: it knows nothing of dispatch, relayouts or
//! kernel efficiency, which is why the port's measured 338 ms per 1,024-token chunk is set
//! beside it.

mod ops;
pub mod placement;
pub mod report;
mod vision;

pub use ops::{chunk_ops, device_programs, OpCost};
pub use vision::{vision_matrices, vision_ops};

use crate::backbone::{Split, TpPlan, WeightFormats};
use crate::checkpoint::TextConfig;
use clef_device::formats::{packed_bytes, TileFormat};
use clef_device::plan::WeightPlan;
use clef_device::{Fidelity, WeightFormat};

/// The hardware numbers the model divides by (Tenstorrent's documentation, per chip).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceilings {
    /// The best matmul rate measured on a p150 (`qwen36/PERF_ROOFLINE.md`).
    pub matmul_measured_tflops: f64,
    /// 110 compute cores × 4096 FLOP/cycle at LoFi × 1.35 GHz, divided by the fidelity's phases.
    pub matmul_peak_tflops: f64,
    pub dram_gb_s: f64,
    /// Fixed cost of one collective (about 120 µs each on the 8-chip Galaxy).
    pub collective_us: f64,
    /// Ethernet bandwidth between the two chips of a single-cable P150x2 (2 links × 50 GB/s).
    pub link_gb_s: f64,
    /// Host ↔ device, PCIe 5.0 x16 (about 50 GB/s usable).
    pub pcie_gb_s: f64,
}

impl Ceilings {
    /// The p150's ceilings for matmuls at `fidelity` (exact = HiFi4 on the device).
    pub fn p150(fidelity: Fidelity) -> Self {
        let phases = match fidelity {
            Fidelity::LoFi => 1.0,
            Fidelity::HiFi2 => 2.0,
            Fidelity::HiFi3 => 3.0,
            Fidelity::HiFi4 | Fidelity::Exact => 4.0,
        };
        Ceilings {
            matmul_measured_tflops: 190.0,
            matmul_peak_tflops: 110.0 * 4096.0 * 1.35e9 / 1e12 / phases,
            dram_gb_s: 512.0,
            collective_us: 120.0,
            link_gb_s: 100.0,
            pcie_gb_s: 50.0,
        }
    }
}

/// One matrix of the plan as one device holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedMatrix {
    pub class: &'static str,
    pub name: String,
    /// Input and output channels on one device.
    pub inputs: usize,
    pub outputs: usize,
    pub format: WeightFormat,
    /// A row-parallel projection: its output is a partial sum completed by an all-reduce.
    pub row_parallel: bool,
}

impl PlacedMatrix {
    pub fn params(&self) -> usize {
        self.inputs * self.outputs
    }

    /// Device bytes: `[in, out]` tiles of the format.
    pub fn bytes(&self) -> usize {
        packed_bytes(self.inputs, self.outputs, TileFormat::of(self.format))
    }
}

/// Output rows of a planned weight on one device.
fn device_rows(w: &WeightPlan, devices: usize) -> usize {
    let rows: usize = w.parts.iter().map(|p| p.rows.len()).sum();
    match w.split {
        Split::Columns => rows / devices,
        Split::Rows | Split::Replicated => rows,
    }
}

/// Input channels of a planned weight on one device, given its full input width.
fn device_inputs(w: &WeightPlan, full: usize, devices: usize) -> usize {
    match w.split {
        Split::Rows => full / devices,
        Split::Columns | Split::Replicated => full,
    }
}

/// Every matrix of the text plan as one device holds it, layer by layer.
pub fn text_matrices(
    cfg: &TextConfig,
    plan: &TpPlan,
    formats: &WeightFormats,
) -> Vec<PlacedMatrix> {
    use crate::backbone::plan::MixerPlan;
    let (h, n) = (cfg.hidden_size, plan.devices);
    let mut out = Vec::new();
    let mut add = |class, name: String, w: &WeightPlan, full_in, format| {
        out.push(PlacedMatrix {
            class,
            name,
            inputs: device_inputs(w, full_in, n),
            outputs: device_rows(w, n),
            format,
            row_parallel: w.split == Split::Rows && n > 1,
        })
    };
    for (i, layer) in plan.layers.iter().enumerate() {
        match &layer.mixer {
            MixerPlan::Attention { qkv, o_proj, .. } => {
                let f = formats.attention;
                add("attention", format!("{i}.qkv"), qkv, h, f);
                let q_width = cfg.num_attention_heads * cfg.head_dim;
                add("attention", format!("{i}.o_proj"), o_proj, q_width, f);
            }
            MixerPlan::DeltaNet {
                in_proj, out_proj, ..
            } => {
                let f = formats.deltanet;
                add("deltanet", format!("{i}.in_proj"), in_proj, h, f);
                add(
                    "deltanet",
                    format!("{i}.out_proj"),
                    out_proj,
                    cfg.value_dim(),
                    f,
                );
            }
        }
        add(
            "mlp_gate_up",
            format!("{i}.gate_up"),
            &layer.gate_up,
            h,
            formats.mlp_gate_up,
        );
        let inter = cfg.intermediate_size;
        add(
            "mlp_down",
            format!("{i}.down"),
            &layer.down,
            inter,
            formats.mlp_down,
        );
    }
    out
}

/// Values of the plan's vectors (norms, gates, conv taps) on one device (held in f32).
pub fn text_vector_values(cfg: &TextConfig, plan: &TpPlan) -> usize {
    text_vectors(cfg, plan).iter().sum()
}

/// The values of every vector of the plan on one device, one entry per vector.
pub fn text_vectors(cfg: &TextConfig, plan: &TpPlan) -> Vec<usize> {
    use crate::backbone::plan::MixerPlan;
    let n = plan.devices;
    let vector = |w: &WeightPlan, per_row: usize| device_rows(w, n) * per_row;
    let mut out = vec![vector(&plan.final_norm, 1)];
    for layer in &plan.layers {
        out.push(vector(&layer.input_norm, 1));
        out.push(vector(&layer.post_norm, 1));
        match &layer.mixer {
            MixerPlan::Attention { q_norm, k_norm, .. } => {
                out.extend([vector(q_norm, 1), vector(k_norm, 1)]);
            }
            MixerPlan::DeltaNet {
                conv,
                a_log,
                dt_bias,
                norm,
                ..
            } => out.extend([
                vector(conv, cfg.linear_conv_kernel_dim),
                vector(a_log, 1),
                vector(dt_bias, 1),
                vector(norm, 1),
            ]),
        }
    }
    out
}

/// Bytes one device holds per weight class, in the order the classes first appear.
pub fn bytes_by_class(
    matrices: &[PlacedMatrix],
) -> Vec<(&'static str, WeightFormat, usize, usize)> {
    let mut out: Vec<(&'static str, WeightFormat, usize, usize)> = Vec::new();
    for m in matrices {
        match out.iter_mut().find(|(c, ..)| *c == m.class) {
            Some(row) => {
                row.2 += m.params();
                row.3 += m.bytes();
            }
            None => out.push((m.class, m.format, m.params(), m.bytes())),
        }
    }
    out
}

#[cfg(test)]
mod tests;
