//! Activations of the CPU backend, as PyTorch computes them in f32.

use super::exp::exp_in_place;

/// The scalar definitions, which the vectorised forms are tested against.
#[cfg(test)]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[cfg(test)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x = finish(x, exp(-x))` for every element, the `exp` vectorised in stack-sized chunks.
fn with_exp_of_negative(xs: &mut [f32], finish: impl Fn(f32, f32) -> f32) {
    let mut e = [0.0f32; 256];
    for chunk in xs.chunks_mut(e.len()) {
        let e = &mut e[..chunk.len()];
        e.iter_mut().zip(chunk.iter()).for_each(|(e, x)| *e = -x);
        exp_in_place(e);
        chunk
            .iter_mut()
            .zip(e.iter())
            .for_each(|(x, e)| *x = finish(*x, *e));
    }
}

/// [`silu`] in place with the vectorised `exp` (within 2 ulp of libm's): the scalar call was
/// most of the conv, SwiGLU and gated-norm time.
pub fn silu_in_place(xs: &mut [f32]) {
    with_exp_of_negative(xs, |x, e| x / (1.0 + e));
}

/// [`sigmoid`] in place with the vectorised `exp`.
pub fn sigmoid_in_place(xs: &mut [f32]) {
    with_exp_of_negative(xs, |_, e| 1.0 / (1.0 + e));
}

/// PyTorch's softplus (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), `x/2 · (1 + tanh(u))`, in place,
/// computed as the identical `x · sigmoid(2u)` with the vectorised `exp` (the scalar `tanh` was
/// most of the op's time).
pub fn gelu_tanh_in_place(xs: &mut [f32]) {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    let mut t: Vec<f32> = xs
        .iter()
        .map(|&x| -2.0 * c * (x + 0.044_715 * x * x * x))
        .collect();
    exp_in_place(&mut t);
    xs.iter_mut().zip(&t).for_each(|(x, e)| *x /= 1.0 + e);
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
    fn the_vectorised_silu_and_sigmoid_follow_the_scalar_ones() {
        let xs: Vec<f32> = (0..1_001).map(|i| -100.0 + 0.2 * i as f32).collect();
        let (mut s, mut g) = (xs.clone(), xs.clone());
        silu_in_place(&mut s);
        sigmoid_in_place(&mut g);
        for ((x, s), g) in xs.iter().zip(&s).zip(&g) {
            assert!(
                (s - silu(*x)).abs() <= 1e-6 * x.abs().max(1e-30) + 1e-37,
                "silu({x}) = {s}"
            );
            assert!(
                (g - sigmoid(*x)).abs() <= 1e-6 * sigmoid(*x) + 1e-37,
                "sigmoid({x}) = {g}"
            );
        }
    }

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
        let xs = [-3.0f32, -1.0, 0.0, 0.5, 2.0];
        let mut tanh = xs;
        gelu_tanh_in_place(&mut tanh);
        for (x, t) in xs.iter().zip(&tanh) {
            assert!((gelu_erf(*x) - t).abs() < 2e-3, "{x}");
        }
        assert_eq!((gelu_erf(0.0), tanh[2]), (0.0, 0.0));
        // gelu(1) = Φ(1) = 0.841344746...
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        // The sigmoid form equals the tanh form; large inputs saturate without NaN.
        let xs = [-1e4f32, -40.0, -5.0, -0.3, 0.0, 1e-4, 0.7, 3.0, 40.0, 1e4];
        let mut got = xs;
        gelu_tanh_in_place(&mut got);
        for (x, g) in xs.iter().zip(&got) {
            let u = (2.0f32 / std::f32::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
            let tanh_form = 0.5 * x * (1.0 + u.tanh());
            assert!((g - tanh_form).abs() <= 1e-6 * x.abs().max(1.0), "{x}: {g}");
        }
    }
}
