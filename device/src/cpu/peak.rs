//! The machine's f32 FMA peak, measured (not looked up): every rayon thread runs a loop of 24
//! independent AVX-512 FMA chains at once, so the figure includes the clock the cores really
//! hold under an all-core vector load. `clef-tt bench head` reports kernels as a share of it.

use rayon::prelude::*;
use std::time::Instant;

/// FMA iterations per thread (24 × 16 lanes × 2 flops each), ~0.1–0.2 s on a current core.
const ITERATIONS: usize = 10_000_000;

/// GFLOP/s of all rayon threads together, or `None` without AVX-512.
pub fn fma_peak_gflops() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let threads = rayon::current_num_threads();
        let started = Instant::now();
        let sink: f32 = (0..threads)
            .into_par_iter()
            // SAFETY: AVX-512F was detected above.
            .map(|_| unsafe { fma_chains(ITERATIONS) })
            .sum();
        let seconds = started.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        let flops = (threads * ITERATIONS * CHAINS * 16 * 2) as f64;
        return Some(flops / seconds / 1e9);
    }
    None
}

const CHAINS: usize = 24;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
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
