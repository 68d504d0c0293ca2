//! AVX512-BF16's `vdpbf16ps` in portable code, bit for bit, and a tile kernel built on it that
//! reads the same packed operands and runs the same blocking as the real one
//! (`avx512_bf16.rs`): the tests check the real kernel against this one exactly where the CPU
//! has the instruction, and this one against the f32 product on every CPU.
//!
//! The instruction, per f32 lane j (Intel SDM, VDPBF16PS; checked on AMD Zen 5 for 3.2 M
//! random lanes, exponents over the whole range): two FMAs in sequence, the odd pair first,
//! `acc += a[2j+1]·b[2j+1]; acc += a[2j]·b[2j]`, each rounding to nearest even, with inputs
//! that are subnormal read as zero (DAZ: the accumulator and the bf16 operands) and subnormal
//! results flushed to zero (FTZ); MXCSR is neither read nor written. A bf16 product is exact
//! in f32, so each step rounds once.

use super::panels::{pairs, rows_to_pairs};
use super::{BlockPanel, TileJob, Weights, PANEL};
#[cfg(test)]
use super::{Decoder, Kernel, Packing};
use crate::formats;

/// Tokens per tile of the bf16 dot kernels: 12 rows x 2 vectors = 24 accumulators cover the
/// instruction's latency at two per cycle (fewer chains measured slower on Zen 5).
pub(super) const MR: usize = 12;
/// Input channels per cache block: a panel's 256 pairs (32 KiB) stay in L1.
pub(super) const KC: usize = 2048;

/// ±0 for a subnormal value, the value otherwise.
fn flush(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// The bf16 in the low (`HIGH = false`) or high half of a pair, read with DAZ.
fn half<const HIGH: bool>(pair: u32) -> f32 {
    let bits = if HIGH { pair >> 16 } else { pair & 0xFFFF };
    flush(formats::bf16::to_f32(bits as u16))
}

/// One lane of `vdpbf16ps`: `acc` plus the dot product of the bf16 pairs `a` and `b`.
pub(super) fn dot_pair(acc: f32, a: u32, b: u32) -> f32 {
    let odd = flush(half::<true>(a).mul_add(half::<true>(b), flush(acc)));
    flush(half::<false>(a).mul_add(half::<false>(b), odd))
}

/// The emulated kernel (tests only: scalar code).
#[cfg(test)]
pub(super) const EMULATED: Kernel = Kernel {
    name: "bf16 dot, emulated",
    mr: MR,
    packing: Packing::Bf16Pairs,
    kc: KC,
    tile: tile_job,
    decoder: Decoder::Pairs(decode_pairs),
};

/// Lane j of the real kernel's tile, in scalar code: the same pairs in the same order, the
/// accumulator rounded to bf16 after every 16 pairs with a bf16 destination, the earlier
/// blocks' sum added at the end (or carried in with a bf16 destination).
#[cfg_attr(not(test), allow(dead_code))]
unsafe fn tile_job(job: &TileJob) {
    let Weights::Pairs(b) = job.b else {
        return;
    };
    let a = job.a as *const u32;
    let pair_mask = (job.engine.weight_mask >> 16) * 0x0001_0001;
    let carry_in = job.accumulate && job.engine.round_accumulators;
    let round = |v: f32| formats::bf16::to_f32(formats::bf16::from_f32(v));
    for r in 0..job.rows {
        for j in 0..job.cols {
            let c = job.c.add(r * job.ldc + j);
            let mut acc = if carry_in { *c } else { 0.0 };
            for i in 0..pairs(job.kc) {
                acc = dot_pair(acc, *a.add(i * MR + r), *b.add(i * PANEL + j) & pair_mask);
                if job.engine.round_accumulators && i % 16 == 15 {
                    acc = round(acc);
                }
            }
            if job.accumulate && !carry_in {
                acc += *c;
            }
            if job.engine.round_accumulators {
                acc = round(acc);
            }
            *c = acc;
        }
    }
}

/// Channels `k0..k0 + kc` of a block panel as bf16 pairs (any CPU).
#[cfg_attr(not(test), allow(dead_code))]
unsafe fn decode_pairs(panel: &BlockPanel, k0: usize, kc: usize, out: &mut [u32]) {
    let mut rows = vec![0.0f32; kc * PANEL];
    panel.decode_rows(k0, kc, &mut rows);
    rows_to_pairs(&rows, kc, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(v: f32) -> u32 {
        u32::from(formats::bf16::from_f32(v))
    }

    #[test]
    fn the_odd_pair_is_added_first_and_each_step_rounds() {
        let big = 16_777_216.0f32; // 2^24: the next f32 above it is 2^24 + 2
        let a = bf(1.0) | (bf(big) << 16);
        let b = bf(1.0) | (bf(1.0) << 16);
        // Odd pair first: 1 + 2^24 is a tie and rounds to even (2^24), then + 1 again. Even
        // pair first (1 + 1 = 2, + 2^24) or one rounding of the whole sum would give 2^24 + 2.
        assert_eq!(dot_pair(1.0, a, b), big);
        assert_eq!(
            dot_pair(0.5, bf(3.0) | (bf(-2.0) << 16), bf(2.0) | (bf(4.0) << 16)),
            -1.5
        );
    }

    #[test]
    fn subnormal_inputs_read_as_zero_and_results_flush() {
        let tiny = f32::from_bits(0x0040_0000); // subnormal, a bf16 value (0x0040)
        let one = bf(1.0);
        assert_eq!(dot_pair(0.0, bf(tiny), one), 0.0);
        assert_eq!(dot_pair(tiny, bf(1.0), one), 1.0);
        // A normal product whose sum is subnormal flushes: 2^-120 · 2^-10 = 2^-130.
        let p = dot_pair(0.0, bf(2f32.powi(-120)), bf(2f32.powi(-10)));
        assert_eq!(p.to_bits(), 0);
    }
}
