//! The projection shapes of a 0.8B prefill and of the Clef-27B head's memory projection, each
//! timed through `matmul::linear` and set against the machine's f32 FMA peak measured right
//! before and after it (the higher of the two; this VM's clock drifts). Best of `REPEAT` runs.
//!
//!     cargo bench -p clef-device --bench projections [-- FILTER]
//!
//! FILTER keeps the shapes whose name contains it (`head`, `mlp`, ...).

use clef_device::cpu::{fma_peak_gflops, isa, matmul};
use clef_device::{HostWeight, WeightFormat};
use std::time::Instant;

mod common;
use common::values;

const REPEAT: usize = 3;

/// name, tokens, input channels, output channels.
const SHAPES: [(&str, usize, usize, usize); 8] = [
    ("mlp_gate_up_512", 512, 1024, 7168),
    ("mlp_down_512", 512, 3584, 1024),
    ("deltanet_qkvz_512", 512, 1024, 8192),
    ("deltanet_out_512", 512, 2048, 1024),
    ("attention_qkv_512", 512, 1024, 5120),
    ("mlp_gate_up_2048", 2048, 1024, 7168),
    ("mlp_down_2048", 2048, 3584, 1024),
    ("head_memory_16384", 16384, 5120, 1024),
];

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    println!(
        "kernels: {}, threads: {}",
        isa::isa().name(),
        rayon::current_num_threads()
    );
    println!("| shape | tokens x in x out | format | ms | GFLOP/s | FMA peak | of peak |");
    println!("|---|---|---|---|---|---|---|");
    for (name, t, k, n) in SHAPES {
        if !name.contains(&filter) {
            continue;
        }
        let x = values(t * k, 1);
        let w = HostWeight::f32(n, k, values(n * k, 2));
        for format in [WeightFormat::F32, WeightFormat::Bf16] {
            let packed = matmul::PackedWeight::pack(&w, format);
            std::hint::black_box(matmul::linear(&x, t, &packed));
            let before = fma_peak_gflops().unwrap_or(f64::NAN);
            let mut best = f64::INFINITY;
            for _ in 0..REPEAT {
                let started = Instant::now();
                std::hint::black_box(matmul::linear(&x, t, &packed));
                best = best.min(started.elapsed().as_secs_f64());
            }
            let peak = before.max(fma_peak_gflops().unwrap_or(f64::NAN));
            let gflops = 2.0 * (t * k * n) as f64 / best / 1e9;
            println!(
                "| {name} | {t} x {k} x {n} | {format:?} | {:.1} | {gflops:.0} | {peak:.0} | {:.0}% |",
                best * 1e3,
                100.0 * gflops / peak
            );
        }
    }
}
