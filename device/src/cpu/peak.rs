//! The machine's f32 FMA peak, measured (not looked up): every rayon thread runs a loop of
//! independent FMA chains at once (24 zmm chains with AVX-512, 12 ymm chains with AVX2 + FMA:
//! enough to cover the FMA latency on two pipes), so the figure includes the clock the cores
//! really hold under an all-core vector load. `clef-tt bench head` and `bench prefill` report
//! kernels as a share of it.

use super::isa::{isa, Isa};
use rayon::prelude::*;
use std::time::Instant;

/// FMA iterations per thread (~0.1–0.3 s on a current core).
const ITERATIONS: usize = 10_000_000;

/// GFLOP/s of all rayon threads together, or `None` without a vector FMA (portable code).
pub fn fma_peak_gflops() -> Option<f64> {
    let (lanes, chains): (usize, usize) = match isa() {
        Isa::Avx512 | Isa::Avx512Bf16 => (16, 24),
        Isa::Avx2Fma => (8, 12),
        Isa::Portable => return None,
    };
    let threads = rayon::current_num_threads();
    let started = Instant::now();
    let sink: f32 = (0..threads)
        .into_par_iter()
        .map(|_| chains_of(ITERATIONS))
        .sum();
    let seconds = started.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    let flops = (threads * ITERATIONS * chains * lanes * 2) as f64;
    Some(flops / seconds / 1e9)
}

/// One thread's chains on the process's ISA.
fn chains_of(iterations: usize) -> f32 {
    match isa() {
        // SAFETY (both): the ISA was detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Bf16 => unsafe { fma_chains_avx512(iterations) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { fma_chains_avx2(iterations) },
        _ => 0.0,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); 24];
    let scale = _mm512_set1_ps(0.999_99);
    let step = _mm512_set1_ps(1e-7);
    for _ in 0..iterations {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, scale, step);
        }
    }
    let mut total = _mm512_setzero_ps();
    for a in acc {
        total = _mm512_add_ps(total, a);
    }
    _mm512_reduce_add_ps(total)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); 12];
    let scale = _mm256_set1_ps(0.999_99);
    let step = _mm256_set1_ps(1e-7);
    for _ in 0..iterations {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, scale, step);
        }
    }
    let mut total = _mm256_setzero_ps();
    for a in acc {
        total = _mm256_add_ps(total, a);
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), total);
    lanes.iter().sum()
}
