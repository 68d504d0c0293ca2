//! The projection shapes of a 0.8B prefill and of the Clef-27B head's memory projection, each
//! timed through `matmul::linear_with` and set against the machine's f32 FMA peak measured
//! right before and after it (the higher of the two; this VM's clock drifts). Best of `REPEAT`
//! runs. Three operand kinds per shape: f32 weights, bf16 weights with f32 activations (the f32
//! FMA kernels, widening), and bf16 weights with bf16 activations as the `bf16` profile runs
//! them (the bf16 dot-product kernel where the CPU has AVX512-BF16); the kernel is named.
//!
//!     cargo bench -p clef-device --bench projections [-- FILTER]
//!
//! FILTER keeps the shapes whose name contains it (`head`, `mlp`, ...); `CLEF_BENCH_REPEAT`
//! sets the runs per row (best of them is reported; more runs filter out a busy machine).

use clef_device::cpu::{fma_peak_gflops, isa, matmul};
use clef_device::Numerics;
use clef_device::{HostWeight, WeightFormat};
use std::time::Instant;

mod common;
use common::values;

/// Runs per row unless `CLEF_BENCH_REPEAT` says otherwise.
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
    let repeat = std::env::var("CLEF_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPEAT);
    println!(
        "kernels: {}, threads: {}",
        isa::isa().name(),
        rayon::current_num_threads()
    );
    println!("| shape | tokens x in x out | weights x activations | kernel | ms | GFLOP/s | FMA peak | of peak |");
    println!("|---|---|---|---|---|---|---|---|");
    let f32_activations = Numerics::default();
    let bf16_activations = Numerics {
        bf16_activations: true,
        ..Numerics::default()
    };
    let kinds = [
        ("f32 x f32", WeightFormat::F32, &f32_activations),
        ("bf16 x f32", WeightFormat::Bf16, &f32_activations),
        ("bf16 x bf16", WeightFormat::Bf16, &bf16_activations),
    ];
    for (name, t, k, n) in SHAPES {
        if !name.contains(&filter) {
            continue;
        }
        let x = values(t * k, 1);
        let w = HostWeight::f32(n, k, values(n * k, 2));
        for (kind, format, numerics) in kinds {
            let packed = matmul::PackedWeight::pack(&w, format);
            let kernel = matmul::kernel_name(&packed, numerics);
            std::hint::black_box(matmul::linear_with(&x, t, &packed, numerics));
            let before = fma_peak_gflops().unwrap_or(f64::NAN);
            let mut best = f64::INFINITY;
            for _ in 0..repeat.max(1) {
                let started = Instant::now();
                std::hint::black_box(matmul::linear_with(&x, t, &packed, numerics));
                best = best.min(started.elapsed().as_secs_f64());
            }
            let peak = before.max(fma_peak_gflops().unwrap_or(f64::NAN));
            let gflops = 2.0 * (t * k * n) as f64 / best / 1e9;
            println!(
                "| {name} | {t} x {k} x {n} | {kind} | {kernel} | {:.1} | {gflops:.0} | {peak:.0} | {:.0}% |",
                best * 1e3,
                100.0 * gflops / peak
            );
        }
    }
}
