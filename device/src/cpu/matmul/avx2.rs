//! The matmul's AVX2 + FMA kernels (CPUs without AVX-512): register tiles of up to 6 tokens x
//! 16 outputs (12 ymm accumulators, 2 weight vectors, 1 broadcast), each
//! 32-output panel taken in two halves, over blocks of `KC` input channels. They read the same
//! packed operands as the AVX-512 kernels (token blocks of `MR` = 2 tiles here; f32 and bf16
//! panels directly; bfp panels decoded once per block into an f32 panel shared by every tile)
//! and apply the same fidelity truncation and bf16 accumulation, lane for lane.

use super::{decode_block_rows, Engine, PackedWeight, PanelData, KC, MC, MR, PANEL};
use std::arch::x86_64::*;

/// Outputs of one tile: two vectors of 8.
const HALF: usize = 16;
/// Tokens of one tile (a token block of `MR` holds two): 12 accumulators, 2 weight vectors
/// and a broadcast fill the 16 registers, so nothing else may stay live in the loop (an
/// output mask kept there spilled an accumulator: 1.6x slower).
const ROWS: usize = MR / 2;

/// Tokens per cache block (a multiple of `MR`; `MC`, the rows of a row-split task): their `KC`
/// channels (192 KiB) stay in L2 while every panel of the task passes over them (48 rows made
/// the head's 16,384-row projection stream its weights from L3 twice as often: 103 vs 127
/// GFLOP/s).
const BLOCK_ROWS: usize = MC;

/// Where the 16 weights of one input channel come from.
const SRC_F32: u8 = 0;
const SRC_BF16: u8 = 1;

/// One register tile's operands.
struct Tile {
    engine: Engine,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    /// Row stride of `b` in elements.
    ldb: usize,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    /// Valid outputs of the tile (1..=16).
    cols: usize,
    accumulate: bool,
}

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
    if SRC == SRC_BF16 {
        // bf16 panels are padded to 32 columns: the 16 of a half are in bounds.
        let raw = _mm256_loadu_si256(b.add(kk * t.ldb * 2) as *const __m256i);
        let l = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw));
        let h = _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(raw));
        return (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(l)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h)),
        );
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
/// a packed token block `[kc][MR]`, whose offsets are then constants; otherwise any strides.
/// `WHOLE`: `b` has 16 readable values a row (a padded panel, or a full tile of a dense
/// matrix), loaded without masks; otherwise `cols`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const M: usize, const SRC: u8, const PACKED: bool, const WHOLE: bool>(
    t: &Tile,
    b: *const u8,
) {
    let (a_rs, a_cs) = if PACKED { (1, MR) } else { (t.a_rs, t.a_cs) };
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

/// Rows `rows` (starting on a token block) of panels `panels`, as `avx512::panels`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn panels(
    xp: &[f32],
    rows: std::ops::Range<usize>,
    w: &PackedWeight,
    panels: std::ops::Range<usize>,
    y: *mut f32,
    engine: Engine,
) {
    let (n, k) = (w.n, w.k);
    let mut decoded = match &w.data {
        PanelData::Blocks { .. } => vec![0.0f32; panels.len() * KC * PANEL],
        _ => Vec::new(),
    };
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        let mut b0 = rows.start;
        while b0 < rows.end {
            let b1 = (b0 + BLOCK_ROWS).min(rows.end);
            for p in panels.clone() {
                let cols = PANEL.min(n - p * PANEL);
                let (src, b, elem): (u8, *const u8, usize) = match &w.data {
                    PanelData::F32(d) => (
                        SRC_F32,
                        d.as_ptr().add((p * k + k0) * PANEL) as *const u8,
                        4,
                    ),
                    PanelData::Bf16(d) => (
                        SRC_BF16,
                        d.as_ptr().add((p * k + k0) * PANEL) as *const u8,
                        2,
                    ),
                    PanelData::Blocks {
                        format,
                        tiles,
                        tiles_per_row,
                    } => {
                        if b0 == rows.start {
                            let at = (p - panels.start) * KC * PANEL;
                            decode_block_rows(
                                *format,
                                tiles,
                                *tiles_per_row,
                                p,
                                k0,
                                kc,
                                &mut decoded[at..],
                            );
                        }
                        (
                            SRC_F32,
                            decoded.as_ptr().add((p - panels.start) * KC * PANEL) as *const u8,
                            4,
                        )
                    }
                };
                for c0 in (0..cols).step_by(HALF) {
                    let half_b = b.add(c0 * elem);
                    let mut r0 = b0;
                    while r0 < b1 {
                        // Token block r0/MR of the packed x: two tiles of ROWS tokens.
                        for sub in 0..MR / ROWS {
                            let first = r0 + sub * ROWS;
                            if first >= b1 {
                                break;
                            }
                            let m = ROWS.min(b1 - first);
                            let t = Tile {
                                engine,
                                a: xp.as_ptr().add(r0 * k + k0 * MR + sub * ROWS),
                                a_rs: 1,
                                a_cs: MR,
                                ldb: PANEL,
                                kc,
                                c: y.add(first * n + p * PANEL + c0),
                                ldc: n,
                                cols: HALF.min(cols - c0),
                                accumulate: k0 > 0,
                            };
                            if src == SRC_BF16 {
                                dispatch::<SRC_BF16, true, true>(m, &t, half_b);
                            } else {
                                dispatch::<SRC_F32, true, true>(m, &t, half_b);
                            }
                        }
                        r0 += MR;
                    }
                }
            }
            b0 = b1;
        }
        k0 += kc;
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
