//! The matmul's AVX2 + FMA kernels (CPUs without AVX-512): register tiles of up to 6 tokens x
//! 16 outputs (12 ymm accumulators, 2 weight vectors, 1 broadcast), each 32-output panel taken
//! in two halves. They read the operands the driver packs (f32 panels, bf16 channel pairs
//! widened in registers, bfp panels decoded once per block into f32 rows) and apply the same
//! fidelity truncation and bf16 accumulation as the AVX-512 kernels, lane for lane.

use super::{
    decode_rows_portable, Decoder, Engine, Kernel, Packing, Tile, TileJob, Weights, PANEL,
};
use std::arch::x86_64::*;

/// Outputs of one tile: two vectors of 8.
const HALF: usize = 16;
/// Tokens of one tile and of a packed token block: 12 accumulators, 2 weight vectors and a
/// broadcast fill the 16 registers, so nothing else may stay live in the loop (an output mask
/// kept there spilled an accumulator: 1.6x slower).
const ROWS: usize = 6;

/// The kernel of AVX2 + FMA CPUs.
pub(super) const KERNEL: Kernel = Kernel {
    name: "avx2 6x16 f32 FMA",
    mr: ROWS,
    packing: Packing::F32,
    // A half panel's 512 channels (32 KiB) in L1.
    kc: 512,
    tile: tile_job,
    decoder: Decoder::F32(decode_rows_portable),
};

/// Where the 16 weights of one input channel come from.
const SRC_F32: u8 = 0;
/// bf16 channel pairs (rows of `PANEL` words), widened in registers.
const SRC_PAIRS: u8 = 1;

/// Lane masks of the tile's two vectors for `cols` valid outputs.
// Forced inline and no feature attribute of its own (the helpers below too): it is only
// ever inlined into `tile`, whose AVX2 + FMA context its intrinsics then compile in (left
// out of line in test builds, such a call cost a fifth of the golden tests' time).
#[inline(always)]
unsafe fn masks(cols: usize) -> (__m256i, __m256i) {
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols.min(8) as i32), lanes);
    let hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols.saturating_sub(8) as i32), lanes);
    (lo, hi)
}

/// Each lane rounded to the nearest bf16 (ties to even), kept as f32.
// Inlined into `tile`, as `masks`.
#[inline(always)]
unsafe fn round_bf16(v: __m256) -> __m256 {
    let bits = _mm256_castps_si256(v);
    let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let up = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
    _mm256_castsi256_ps(_mm256_and_si256(
        up,
        _mm256_set1_epi32(0xFFFF_0000u32 as i32),
    ))
}

/// The 16 weights of input channel `kk`: two vectors of 8.
// Inlined into `tile`, as `masks`.
#[inline(always)]
unsafe fn load_b<const SRC: u8, const WHOLE: bool>(
    t: &Tile,
    b: *const u8,
    kk: usize,
) -> (__m256, __m256) {
    if SRC == SRC_PAIRS {
        // Pair rows are padded to 32 outputs: the 16 of a half are in bounds. Channel 2i is
        // the low half of each word, 2i + 1 the high half.
        let p = (b as *const u32).add((kk / 2) * PANEL);
        let (l, h) = (
            _mm256_loadu_si256(p as *const __m256i),
            _mm256_loadu_si256(p.add(8) as *const __m256i),
        );
        return if kk.is_multiple_of(2) {
            (
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(l)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h)),
            )
        } else {
            let m = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            (
                _mm256_castsi256_ps(_mm256_and_si256(l, m)),
                _mm256_castsi256_ps(_mm256_and_si256(h, m)),
            )
        };
    }
    let p = b.add(kk * t.ldb * 4) as *const f32;
    if WHOLE {
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    } else {
        let m = masks(t.cols);
        (
            _mm256_maskload_ps(p, m.0),
            _mm256_maskload_ps(p.add(8), m.1),
        )
    }
}

/// One `M x 16` tile over `kc` input channels: `c (+)= a[M, kc] · b[kc, 16]`. `PACKED`: `a` is
/// a packed token block `[kc][ROWS]`, whose offsets are then constants; otherwise any strides.
/// `WHOLE`: `b` has 16 readable values a row (a padded panel, or a full tile of a dense
/// matrix), loaded without masks; otherwise `cols`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const M: usize, const SRC: u8, const PACKED: bool, const WHOLE: bool>(
    t: &Tile,
    b: *const u8,
) {
    let (a_rs, a_cs) = if PACKED { (1, ROWS) } else { (t.a_rs, t.a_cs) };
    let mut lo = [_mm256_setzero_ps(); M];
    let mut hi = [_mm256_setzero_ps(); M];
    // A bf16 destination rounds the running sum, so it starts from the earlier blocks'.
    let carry_in = t.accumulate && t.engine.round_accumulators;
    if carry_in {
        let masks = masks(t.cols);
        for r in 0..M {
            let row = t.c.add(r * t.ldc);
            lo[r] = _mm256_maskload_ps(row, masks.0);
            hi[r] = _mm256_maskload_ps(row.add(8), masks.1);
        }
    }
    let weight_mask = _mm256_set1_epi32(t.engine.weight_mask as i32);
    let truncate = t.engine.weight_mask != u32::MAX;
    macro_rules! channel {
        ($kk:expr, $b0:expr, $b1:expr) => {{
            let a = t.a.add($kk * a_cs);
            for r in 0..M {
                let av = _mm256_broadcast_ss(&*a.add(r * a_rs));
                lo[r] = _mm256_fmadd_ps(av, $b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(av, $b1, hi[r]);
            }
        }};
    }
    if !truncate && !t.engine.round_accumulators {
        for kk in 0..t.kc {
            let (b0, b1) = load_b::<SRC, WHOLE>(t, b, kk);
            channel!(kk, b0, b1);
        }
    } else {
        for kk in 0..t.kc {
            let (mut b0, mut b1) = load_b::<SRC, WHOLE>(t, b, kk);
            if truncate {
                b0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(b0), weight_mask));
                b1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(b1), weight_mask));
            }
            channel!(kk, b0, b1);
            if t.engine.round_accumulators && kk % 32 == 31 {
                for r in 0..M {
                    lo[r] = round_bf16(lo[r]);
                    hi[r] = round_bf16(hi[r]);
                }
            }
        }
    }
    // Whole tiles store without masks (a masked store is microcoded on AMD parts).
    let whole = t.cols == HALF;
    let masks = masks(t.cols);
    for r in 0..M {
        let row = t.c.add(r * t.ldc);
        let (mut vl, mut vh) = (lo[r], hi[r]);
        if t.accumulate && !carry_in {
            let (pl, ph) = if whole {
                (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)))
            } else {
                (
                    _mm256_maskload_ps(row, masks.0),
                    _mm256_maskload_ps(row.add(8), masks.1),
                )
            };
            vl = _mm256_add_ps(vl, pl);
            vh = _mm256_add_ps(vh, ph);
        }
        if t.engine.round_accumulators {
            vl = round_bf16(vl);
            vh = round_bf16(vh);
        }
        if whole {
            _mm256_storeu_ps(row, vl);
            _mm256_storeu_ps(row.add(8), vh);
        } else {
            _mm256_maskstore_ps(row, masks.0, vl);
            _mm256_maskstore_ps(row.add(8), masks.1, vh);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dispatch<const SRC: u8, const PACKED: bool, const WHOLE: bool>(
    m: usize,
    t: &Tile,
    b: *const u8,
) {
    match m {
        1 => tile::<1, SRC, PACKED, WHOLE>(t, b),
        2 => tile::<2, SRC, PACKED, WHOLE>(t, b),
        3 => tile::<3, SRC, PACKED, WHOLE>(t, b),
        4 => tile::<4, SRC, PACKED, WHOLE>(t, b),
        5 => tile::<5, SRC, PACKED, WHOLE>(t, b),
        6 => tile::<6, SRC, PACKED, WHOLE>(t, b),
        _ => {}
    }
}

/// One 32-output tile of the blocked product, as two halves of 16.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_job(job: &TileJob) {
    for c0 in (0..job.cols).step_by(HALF) {
        let t = Tile {
            engine: job.engine,
            a: job.a as *const f32,
            a_rs: 1,
            a_cs: ROWS,
            ldb: PANEL,
            kc: job.kc,
            c: job.c.add(c0),
            ldc: job.ldc,
            cols: HALF.min(job.cols - c0),
            accumulate: job.accumulate,
        };
        match job.b {
            Weights::F32(b) => {
                dispatch::<SRC_F32, true, true>(job.rows, &t, b.add(c0) as *const u8)
            }
            Weights::Pairs(b) => {
                dispatch::<SRC_PAIRS, true, true>(job.rows, &t, b.add(c0) as *const u8)
            }
        }
    }
}

/// `c[m, n] (+)= a[m, k] · b[k, n]` with any strides for `a` and unit column stride for `b`
/// (row stride `ldb`); `c` is dense `[m, n]`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn small(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
) {
    super::for_each_small_tile(m, n, k, ROWS, HALF, |r0, rows, j0, cols, k0, kc| {
        let t = Tile {
            engine: Engine::EXACT,
            a: a.add(r0 * a_rs + k0 * a_cs),
            a_rs,
            a_cs,
            ldb,
            kc,
            c: c.add(r0 * n + j0),
            ldc: n,
            cols,
            accumulate: accumulate || k0 > 0,
        };
        let b = b.add(k0 * ldb + j0) as *const u8;
        if cols == HALF {
            dispatch::<SRC_F32, false, true>(rows, &t, b);
        } else {
            dispatch::<SRC_F32, false, false>(rows, &t, b);
        }
    });
}
