//! Small dense building blocks of the joint head, in f32 on the host: linear layers (the packed
//! CPU matmul of `clef-device`), LayerNorm, exact GELU, softmax and span means.

use clef_device::cpu::matmul::{self, PackedWeight};
use clef_device::{HostWeight, WeightFormat};
use rayon::prelude::*;

/// `y = x Wᵀ (+ b)` with `W` `[out, in]`.
pub struct Linear {
    w: PackedWeight,
    b: Option<Vec<f32>>,
}

impl Linear {
    pub fn new(w: Vec<f32>, out: usize, inp: usize, b: Option<Vec<f32>>) -> Self {
        Linear {
            w: PackedWeight::pack(&HostWeight::f32(out, inp, w), WeightFormat::F32),
            b,
        }
    }

    /// `rows` rows of `x` (each `in_dim` wide) → `rows` rows of `out_dim`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = matmul::linear(x, rows, &self.w);
        if let Some(b) = &self.b {
            for row in y.chunks_mut(self.w.n) {
                row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
            }
        }
        y
    }
}

/// PyTorch `LayerNorm(n)`: eps 1e-5, biased variance, affine.
pub struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

pub const LN_EPS: f32 = 1e-5;

impl LayerNorm {
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = self.weight.len();
        let mut out = x.to_vec();
        out.par_chunks_mut(n).for_each(|row| {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + LN_EPS).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * inv * w + b;
            }
        });
        out
    }
}

/// Exact GELU: `0.5 x (1 + erf(x / √2))`.
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// erf in f64 (Abramowitz–Stegun 7.1.26 is too coarse; this is W. J. Cody's rational
/// approximation as used by most libms, accurate to f32 rounding).
fn erf(x: f32) -> f32 {
    libm_erf(x as f64) as f32
}

/// erf via the complementary error function's continued fraction for large |x| and the
/// Maclaurin series for small |x|; both converge to double precision in the used ranges.
fn libm_erf(x: f64) -> f64 {
    let ax = x.abs();
    if ax < 2.5 {
        // Maclaurin series: erf x = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let x2 = x * x;
        let mut term = x;
        let mut sum = x;
        // |x| < 2.5: the terms fall below 1e-17 of the sum well within 80 steps.
        for n in 1..80 {
            let n = n as f64;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc x = exp(-x²)/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + 2/(x + ...))))).
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f);
        (1.0 - erfc).copysign(x)
    }
}

/// Softmax in place.
pub fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    v.iter_mut().for_each(|x| *x /= sum);
}

/// Mean of rows `[start, end)` of a `[rows, n]` matrix.
pub fn span_mean(x: &[f32], n: usize, start: usize, end: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    for r in start..end {
        out.iter_mut()
            .zip(&x[r * n..(r + 1) * n])
            .for_each(|(o, v)| *o += v);
    }
    let count = (end - start) as f32;
    out.iter_mut().for_each(|o| *o /= count);
    out
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub fn norm2(a: &[f32]) -> f32 {
    dot(a, a).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        // Values of erf from standard tables.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (-1.5, -0.966_105_146_475_310_7),
        ] {
            assert!(
                (libm_erf(x) - want).abs() < 1e-15,
                "erf({x}) = {} vs {want}",
                libm_erf(x)
            );
        }
    }
}
