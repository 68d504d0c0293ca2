//! The CPU matmul seam: `y = x · Wᵀ` with f32 activations and f32 or bf16 weights.
//!
//! One function decides how every projection of the prefill runs on the CPU, so another kernel
//! can be swapped in and measured here alone. The weight is cut into blocks of output channels;
//! each block (widened to f32 when the weight is bf16, so the full weight is never copied) is
//! multiplied by `gemm`'s packed f32 kernel on its own rayon task.

use crate::{HostWeight, WeightData};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Output channels per block: small enough to spread over both cores and stay in L2 when
/// widened, large enough that re-packing `x` per block costs little.
const BLOCK_OUT: usize = 128;

/// `y[rows, w.rows] = x[rows, w.cols] · wᵀ`. The caller checks the shapes.
pub fn linear(x: &[f32], rows: usize, w: &HostWeight) -> Vec<f32> {
    let (n, k) = (w.rows, w.cols);
    let mut y = vec![0.0f32; rows * n];
    if rows == 0 || n == 0 {
        return y;
    }
    let blocks: Vec<(usize, usize)> = (0..n)
        .step_by(BLOCK_OUT)
        .map(|s| (s, (s + BLOCK_OUT).min(n)))
        .collect();
    let y_ptr = SendPtr(y.as_mut_ptr());
    blocks.par_iter().for_each_init(Vec::new, |scratch: &mut Vec<f32>, &(n0, n1)| {
        let w_block: &[f32] = match &w.data {
            WeightData::F32(v) => &v[n0 * k..n1 * k],
            WeightData::Bf16(v) => {
                scratch.clear();
                scratch.extend(v[n0 * k..n1 * k].iter().map(|b| b.to_f32()));
                scratch
            }
        };
        // SAFETY: blocks write disjoint column ranges [n0, n1) of `y`; every pointer and
        // stride below stays inside `x` ([rows, k]), `w_block` ([n1-n0, k]) and `y` ([rows, n]).
        unsafe {
            let y_ptr = y_ptr;
            gemm(
                rows,
                n1 - n0,
                k,
                y_ptr.0.add(n0),
                1,
                n as isize,
                false,
                x.as_ptr(),
                1,
                k as isize,
                w_block.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    });
    y
}

/// `c[m, n] = a[m, k] · b[k, n]` for small dense row-major operands (strides given), summed
/// into `c` when `accumulate`. Single-threaded: callers parallelise over heads.
#[allow(clippy::too_many_arguments)]
pub fn small_matmul(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    accumulate: bool,
    a: &[f32],
    a_row_stride: usize,
    a_col_stride: usize,
    b: &[f32],
    b_row_stride: usize,
    b_col_stride: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    debug_assert!(c.len() >= m * n);
    debug_assert!(a.len() > (m - 1) * a_row_stride + (k - 1) * a_col_stride);
    debug_assert!(b.len() > (k - 1) * b_row_stride + (n - 1) * b_col_stride);
    // SAFETY: the debug assertions above state the bounds every caller guarantees.
    unsafe {
        gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_col_stride as isize,
            a_row_stride as isize,
            b.as_ptr(),
            b_col_stride as isize,
            b_row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint output blocks to rayon tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn naive(x: &[f32], rows: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * n];
        for r in 0..rows {
            for j in 0..n {
                y[r * n + j] = (0..k).map(|i| x[r * k + i] * w[j * k + i]).sum();
            }
        }
        y
    }

    #[test]
    fn blocked_linear_equals_the_naive_product_for_f32_and_bf16_weights() {
        let (rows, n, k) = (7, 300, 37);
        let x: Vec<f32> = (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0).collect();
        let want = naive(&x, rows, &w, n, k);
        let got = linear(&x, rows, &HostWeight::f32(n, k, w.clone()));
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        // These weights are exactly representable in bf16, so the bf16 path must agree too.
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let got = linear(&x, rows, &HostWeight::bf16(n, k, wb));
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
