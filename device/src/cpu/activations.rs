//! Scalar activations of the CPU backend, as PyTorch computes them in f32.

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// PyTorch's softplus (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`).
pub fn gelu_tanh(x: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

/// Exact GELU, `x/2 · (1 + erf(x/√2))`.
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// erf in f64 (the Maclaurin series below 2.5, the erfc continued fraction above; accurate to
/// ~1e-15), returned as f32.
pub fn erf(x: f32) -> f32 {
    let x = f64::from(x);
    let t = x.abs();
    let v = if t < 2.5 {
        let mut sum = t;
        let mut term = t;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -t * t / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = f64::from(k) / 2.0 / (t + f);
        }
        1.0 - (-t * t).exp() / std::f64::consts::PI.sqrt() / (t + f)
    };
    (if x < 0.0 { -v } else { v }) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (3.0, 0.999_977_909_503_001_4),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((f64::from(erf(x)) - want).abs() < 1e-7, "{x}");
        }
        assert_eq!(erf(f32::INFINITY), 1.0);
    }

    #[test]
    fn the_two_gelus_agree_closely_and_fix_zero() {
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
        for x in [-3.0f32, -1.0, 0.5, 2.0] {
            assert!((gelu_erf(x) - gelu_tanh(x)).abs() < 2e-3, "{x}");
        }
        // gelu(1) = Φ(1) = 0.841344746...
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
    }
}
