//! `exp` over slices, vectorised: the softmax of attention takes one `exp` per score (billions
//! for a large image), and the scalar libm call was the largest part of the vision tower's
//! attention. Cephes' `expf` scheme (range reduction by ln 2 in two parts, a degree-6
//! polynomial, the power of two put in the exponent bits), branch-free so the compiler
//! vectorises the loop; built for AVX-512 or AVX2 when the CPU has it. Within 2 ulp of `f32::exp` on
//! `[-87.3, 88]`; below that the result is the smallest normal (callers flush it), above it
//! saturates at `exp(88)`.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5 · 2^23 rounds to the nearest integer.
const ROUND: f32 = 12_582_912.0;
const LOWEST: f32 = -87.336_54;
const HIGHEST: f32 = 88.0;

#[inline(always)]
fn exp_one(x: f32) -> f32 {
    let x = x.clamp(LOWEST, HIGHEST);
    // `shifted` is 1.5 · 2^23 + n exactly (its ulp is 1), so n is also in its low bits.
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n from those bits, not from `n as i32`: Rust's saturating float-to-int conversion is
    // compiled one lane at a time (with NaN checks), which made this loop mostly scalar. `n` is
    // in [-126, 127] after the clamp; wrapping ops keep overflow checks (debug and test builds)
    // out of the loop.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

#[inline(always)]
fn exp_slice_portable(xs: &mut [f32]) {
    for x in xs.iter_mut() {
        *x = exp_one(*x);
    }
}

/// The same loop compiled for AVX-512 (16 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_slice_avx512(xs: &mut [f32]) {
    exp_slice_portable(xs)
}

/// The same loop compiled for AVX2 (8 lanes; no contraction into FMAs, so the same roundings).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_slice_avx2(xs: &mut [f32]) {
    exp_slice_portable(xs)
}

/// `x = exp(x)` for every element, with the process's ISA ([`super::isa`]).
pub fn exp_in_place(xs: &mut [f32]) {
    use super::isa::{isa, Isa};
    match isa() {
        // SAFETY (both): the ISA was detected; the body is plain safe Rust.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Bf16 => unsafe { exp_slice_avx512(xs) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { exp_slice_avx2(xs) },
        _ => exp_slice_portable(xs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_two_ulp_of_libm_over_the_softmax_range() {
        let mut xs: Vec<f32> = (0..200_001)
            .map(|i| -87.0 + 175.0 * i as f32 / 200_000.0)
            .collect();
        xs.extend([0.0, -0.0, 1e-8, -1e-8, 1.0, -1.0, 88.0]);
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (x, g) in xs.iter().zip(&got) {
            let want = f64::from(*x).exp();
            let ulp = f64::from(f32::from_bits((want as f32).to_bits() + 1) - want as f32);
            assert!(
                (f64::from(*g) - want).abs() <= 2.0 * ulp,
                "exp({x}) = {g}, want {want}"
            );
        }
    }

    /// The exponent taken from the shifted sum's bits is the rounded `n` itself, for every `n`
    /// the clamp allows.
    #[test]
    fn the_shifted_bits_hold_the_rounded_exponent() {
        for i in -2_000_000..=2_000_000 {
            let x = (i as f32 * 4.4e-5).clamp(LOWEST, HIGHEST);
            let shifted = x * LOG2E + ROUND;
            let n = shifted - ROUND;
            assert_eq!(
                shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32,
                n as i32,
                "x = {x}"
            );
        }
    }

    /// Every ISA's build of the loop gives the portable loop's bits.
    #[test]
    fn every_isa_build_equals_the_portable_loop() {
        let xs: Vec<f32> = (0..10_007).map(|i| -90.0 + 0.0179 * i as f32).collect();
        let mut want = xs.clone();
        exp_slice_portable(&mut want);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::isa::Isa;
            let have = Isa::detected();
            if have >= Isa::Avx2Fma {
                let mut got = xs.clone();
                // SAFETY: AVX2 + FMA detected.
                unsafe { exp_slice_avx2(&mut got) };
                assert_eq!(got, want);
            }
            if have >= Isa::Avx512 {
                let mut got = xs.clone();
                // SAFETY: AVX-512F detected.
                unsafe { exp_slice_avx512(&mut got) };
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn extremes_neither_overflow_nor_produce_nan() {
        let mut xs = vec![-1e30, -200.0, -88.0, 89.0, 1e30];
        exp_in_place(&mut xs);
        assert!(xs.iter().all(|v| v.is_finite() && *v >= 0.0), "{xs:?}");
        assert!(xs[0] < 1.2e-38 && xs[4] > 1e38);
    }
}
