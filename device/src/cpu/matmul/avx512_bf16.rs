//! The matmul's AVX512-BF16 kernel: register tiles of up to 12 tokens x 32 outputs, each
//! `vdpbf16ps` multiplying two input channels of 16 outputs at once (24 zmm accumulators, two
//! weight vectors of channel pairs, the token's pair broadcast from memory). For bf16 and bfp
//! weights (bfp panels decoded to bf16 pairs once per block: their values are bf16-exact)
//! when the activations are bf16. `bf16_dot.rs` holds its arithmetic in portable code.

use super::avx512::{decode_channel, masks, round_bf16, store, Out};
use super::bf16_dot::{KC, MR};
use super::panels::pairs;
use super::{BlockPanel, Decoder, Kernel, Packing, TileJob, Weights, PANEL};
use std::arch::x86_64::*;

/// The kernel of CPUs with AVX512-BF16 (chosen per product by `kernel_for`).
pub(super) const KERNEL: Kernel = Kernel {
    name: "avx512-bf16 12x32 vdpbf16ps",
    mr: MR,
    packing: Packing::Bf16Pairs,
    kc: KC,
    tile: tile_job,
    decoder: Decoder::Pairs(decode_pairs),
};

/// One tile of the blocked product.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_job(job: &TileJob) {
    let Weights::Pairs(b) = job.b else {
        return;
    };
    macro_rules! go {
        ($($m:literal)*) => {
            match job.rows {
                $($m => tile::<$m>(job, b),)*
                _ => {}
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// One `M x 32` tile over the job's channel pairs (a function of its own per `M`: inlined
/// into one dispatcher, the twelve tiles' accumulators were spilled to the stack).
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline(never)]
unsafe fn tile<const M: usize>(job: &TileJob, b: *const u32) {
    let mut lo = [_mm512_setzero_ps(); M];
    let mut hi = [_mm512_setzero_ps(); M];
    let (mask_lo, mask_hi) = masks(job.cols);
    // A bf16 destination rounds the running sum, so it starts from the earlier blocks'.
    let carry_in = job.accumulate && job.engine.round_accumulators;
    if carry_in {
        for r in 0..M {
            let row = job.c.add(r * job.ldc);
            lo[r] = _mm512_maskz_loadu_ps(mask_lo, row);
            hi[r] = _mm512_maskz_loadu_ps(mask_hi, row.add(16));
        }
    }
    let a = job.a as *const u32;
    let n_pairs = pairs(job.kc);
    // One pair of input channels: 2 weight vectors, M broadcasts, 2M dot products.
    macro_rules! pair {
        ($i:expr, $w0:expr, $w1:expr) => {{
            let ar = a.add($i * MR);
            for r in 0..M {
                let av = bh(_mm512_set1_epi32(*ar.add(r) as i32));
                lo[r] = _mm512_dpbf16_ps(lo[r], av, $w0);
                hi[r] = _mm512_dpbf16_ps(hi[r], av, $w1);
            }
        }};
    }
    if job.engine.weight_mask == u32::MAX && !job.engine.round_accumulators {
        for i in 0..n_pairs {
            let p = b.add(i * PANEL) as *const __m512i;
            let w0 = bh(_mm512_loadu_si512(p));
            let w1 = bh(_mm512_loadu_si512(p.add(1)));
            pair!(i, w0, w1);
        }
    } else {
        // The fidelity's weight mask on both bf16 of every pair.
        let m = _mm512_set1_epi32(((job.engine.weight_mask >> 16) * 0x0001_0001) as i32);
        for i in 0..n_pairs {
            let p = b.add(i * PANEL) as *const __m512i;
            let w0 = bh(_mm512_and_si512(_mm512_loadu_si512(p), m));
            let w1 = bh(_mm512_and_si512(_mm512_loadu_si512(p.add(1)), m));
            pair!(i, w0, w1);
            if job.engine.round_accumulators && i % 16 == 15 {
                for r in 0..M {
                    lo[r] = round_bf16(lo[r]);
                    hi[r] = round_bf16(hi[r]);
                }
            }
        }
    }
    let out = Out {
        c: job.c,
        ldc: job.ldc,
        masks: (mask_lo, mask_hi),
        add: job.accumulate && !carry_in,
        round: job.engine.round_accumulators,
    };
    store(lo, hi, &out);
}

/// 32 bf16 (16 pairs) as the instruction's operand type.
#[inline(always)]
unsafe fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain data; every bit pattern is a valid value of each.
    std::mem::transmute(v)
}

/// Channels `k0..k0 + kc` of a block panel as bf16 pairs `[ceil(kc/2), PANEL]`: decoded
/// values are bf16-exact, so a pair is the high halves of two decoded channels.
#[target_feature(enable = "avx512f")]
unsafe fn decode_pairs(panel: &BlockPanel, k0: usize, kc: usize, out: &mut [u32]) {
    assert!(
        out.len() >= pairs(kc) * PANEL,
        "decode_pairs: output too small"
    );
    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    for i in 0..pairs(kc) {
        let (e0, e1) = decode_channel(panel, k0 + 2 * i);
        let (o0, o1) = if 2 * i + 1 < kc {
            decode_channel(panel, k0 + 2 * i + 1)
        } else {
            (_mm512_setzero_ps(), _mm512_setzero_ps())
        };
        let join = |e: __m512, o: __m512| {
            _mm512_or_si512(
                _mm512_srli_epi32::<16>(_mm512_castps_si512(e)),
                _mm512_and_si512(_mm512_castps_si512(o), high),
            )
        };
        let row = out.as_mut_ptr().add(i * PANEL) as *mut __m512i;
        _mm512_storeu_si512(row, join(e0, o0));
        _mm512_storeu_si512(row.add(1), join(e1, o1));
    }
}
