//! The matmul's AVX-512 f32 kernels: register tiles of up to 12 tokens x 32 outputs (24 zmm
//! accumulators, 2 weight vectors, a broadcast) of f32 FMAs, over f32 panels or bf16 channel
//! pairs widened in registers (a shift or a mask, no shuffle); bfp panels decoded with vector
//! code once per block of input channels; the fidelity and accumulation imitation in registers.
//! Also the small dense products of attention and the delta rule.

use super::{BlockPanel, Decoder, Engine, Kernel, Packing, Tile, TileJob, Weights, PANEL};
use crate::formats::BlockFormat;
use std::arch::x86_64::*;

/// Tokens per tile and per packed token block.
const MR: usize = 12;

/// The kernel of AVX-512 CPUs (for f32 weights, and bf16 / bfp ones when the bf16 dot product
/// is not used).
pub(super) const KERNEL: Kernel = Kernel {
    name: "avx512 12x32 f32 FMA",
    mr: MR,
    packing: Packing::F32,
    // A panel's block of 256 channels (32 KiB) stays in a 48 KiB L1.
    kc: 2048,
    tile: tile_job,
    decoder: Decoder::F32(decode_f32),
};

/// Where the 32 weights of one input channel come from.
const SRC_F32: u8 = 0;
/// bf16 channel pairs, widened in registers.
const SRC_PAIRS: u8 = 1;

/// One tile of the blocked product.
#[target_feature(enable = "avx512f")]
unsafe fn tile_job(job: &TileJob) {
    let t = Tile {
        engine: job.engine,
        a: job.a as *const f32,
        a_rs: 1,
        a_cs: MR,
        ldb: PANEL,
        kc: job.kc,
        c: job.c,
        ldc: job.ldc,
        cols: job.cols,
        accumulate: job.accumulate,
    };
    match job.b {
        Weights::F32(b) => dispatch::<SRC_F32, true>(job.rows, &t, b as *const u8),
        Weights::Pairs(b) => dispatch::<SRC_PAIRS, true>(job.rows, &t, b as *const u8),
    }
}

/// `c[m, n] (+)= a[m, k] · b[k, n]` with any strides for `a` and unit column stride for
/// `b` (row stride `ldb`); `c` is dense `[m, n]`.
#[target_feature(enable = "avx512f")]
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
    super::for_each_small_tile(m, n, k, MR, PANEL, |r0, rows, j0, cols, k0, kc| {
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
        dispatch::<SRC_F32, false>(rows, &t, b.add(k0 * ldb + j0) as *const u8);
    });
}

#[target_feature(enable = "avx512f")]
unsafe fn dispatch<const SRC: u8, const PACKED_A: bool>(m: usize, t: &Tile, b: *const u8) {
    macro_rules! go {
        ($($m:literal)*) => {
            match m {
                $($m => tile::<$m, SRC, PACKED_A>(t, b),)*
                _ => {}
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12);
}

pub(super) fn masks(cols: usize) -> (__mmask16, __mmask16) {
    let lo = if cols >= 16 {
        0xffff
    } else {
        ((1u32 << cols) - 1) as __mmask16
    };
    let hi = if cols >= 32 {
        0xffff
    } else if cols <= 16 {
        0
    } else {
        ((1u32 << (cols - 16)) - 1) as __mmask16
    };
    (lo, hi)
}

/// Each lane rounded to the nearest bf16 (ties to even), kept as f32.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn round_bf16(v: __m512) -> __m512 {
    let bits = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let up = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
    _mm512_castsi512_ps(_mm512_and_si512(
        up,
        _mm512_set1_epi32(0xFFFF_0000u32 as i32),
    ))
}

/// The 32 weights of input channel `kk`: two vectors of 16. `WHOLE`: rows of `b` hold 32
/// readable values (a padded panel), loaded without masks.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_b<const SRC: u8, const WHOLE: bool>(
    t: &Tile,
    b: *const u8,
    kk: usize,
    (mask_lo, mask_hi): (__mmask16, __mmask16),
) -> (__m512, __m512) {
    if SRC == SRC_PAIRS {
        // Pair rows are padded to 32 outputs: whole loads are in bounds. Channel 2i is the
        // low half of each word, 2i + 1 the high half.
        let p = (b as *const u32).add((kk / 2) * PANEL);
        let (l, h) = (
            _mm512_loadu_si512(p as *const __m512i),
            _mm512_loadu_si512(p.add(16) as *const __m512i),
        );
        return if kk.is_multiple_of(2) {
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(l)),
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)),
            )
        } else {
            let m = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
            (
                _mm512_castsi512_ps(_mm512_and_si512(l, m)),
                _mm512_castsi512_ps(_mm512_and_si512(h, m)),
            )
        };
    }
    let p = b.add(kk * t.ldb * 4) as *const f32;
    if WHOLE {
        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
    } else {
        (
            _mm512_maskz_loadu_ps(mask_lo, p),
            _mm512_maskz_loadu_ps(mask_hi, p.add(16)),
        )
    }
}

/// One `M x 32` tile over `kc` input channels: `c (+)= a[M, kc] · b[kc, 32]`. With
/// `PACKED_A`, `a` is a token block `[kc][MR]` and its offsets are constants. A function of
/// its own per instance: inlined into `dispatch`, the accumulators were spilled to the stack.
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn tile<const M: usize, const SRC: u8, const PACKED_A: bool>(t: &Tile, b: *const u8) {
    let (a_rs, a_cs) = if PACKED_A { (1, MR) } else { (t.a_rs, t.a_cs) };
    let mut lo = [_mm512_setzero_ps(); M];
    let mut hi = [_mm512_setzero_ps(); M];
    let masks = masks(t.cols);
    // A bf16 destination rounds the running sum, so it starts from the earlier blocks'.
    let carry_in = t.accumulate && t.engine.round_accumulators;
    if carry_in {
        for r in 0..M {
            let row = t.c.add(r * t.ldc);
            lo[r] = _mm512_maskz_loadu_ps(masks.0, row);
            hi[r] = _mm512_maskz_loadu_ps(masks.1, row.add(16));
        }
    }
    let weight_mask = _mm512_set1_epi32(t.engine.weight_mask as i32);
    let truncate = t.engine.weight_mask != u32::MAX;
    // One input channel: 2 weight vectors, M broadcasts, 2M FMAs.
    macro_rules! channel {
        ($kk:expr, $b0:expr, $b1:expr) => {{
            let a = t.a.add($kk * a_cs);
            for r in 0..M {
                let av = _mm512_set1_ps(*a.add(r * a_rs));
                lo[r] = _mm512_fmadd_ps(av, $b0, lo[r]);
                hi[r] = _mm512_fmadd_ps(av, $b1, hi[r]);
            }
        }};
    }
    if !truncate && !t.engine.round_accumulators {
        // The plain product, without the per-channel checks of the imitation below.
        // (Unrolling by two channels spilled registers: 2x slower, measured.)
        for kk in 0..t.kc {
            let (b0, b1) = load_b::<SRC, PACKED_A>(t, b, kk, masks);
            channel!(kk, b0, b1);
        }
    } else {
        for kk in 0..t.kc {
            let (mut b0, mut b1) = load_b::<SRC, PACKED_A>(t, b, kk, masks);
            if truncate {
                b0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b0), weight_mask));
                b1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b1), weight_mask));
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
    let out = Out {
        c: t.c,
        ldc: t.ldc,
        masks,
        add: t.accumulate && !carry_in,
        round: t.engine.round_accumulators,
    };
    store(lo, hi, &out);
}

/// Where and how a tile's accumulators go.
pub(super) struct Out {
    pub c: *mut f32,
    pub ldc: usize,
    pub masks: (__mmask16, __mmask16),
    /// Add the earlier blocks' sum already in `c`.
    pub add: bool,
    /// Round to bf16 (a bf16 destination).
    pub round: bool,
}

/// The rows of a tile's accumulators (`lo`: outputs 0..16, `hi`: 16..32) into `out.c`.
// Forced inline, by value and without a feature attribute of its own: only ever inlined into
// an AVX-512 tile (taking the accumulators by reference kept them on the stack in the loop).
#[inline(always)]
pub(super) unsafe fn store<const M: usize>(lo: [__m512; M], hi: [__m512; M], out: &Out) {
    let (mask_lo, mask_hi) = out.masks;
    for r in 0..M {
        let row = out.c.add(r * out.ldc);
        let (mut vl, mut vh) = (lo[r], hi[r]);
        if out.add {
            vl = _mm512_add_ps(vl, _mm512_maskz_loadu_ps(mask_lo, row));
            vh = _mm512_add_ps(vh, _mm512_maskz_loadu_ps(mask_hi, row.add(16)));
        }
        if out.round {
            vl = round_bf16(vl);
            vh = round_bf16(vh);
        }
        _mm512_mask_storeu_ps(row, mask_lo, vl);
        _mm512_mask_storeu_ps(row.add(16), mask_hi, vh);
    }
}

/// One block of 16 codes decoded to f32: `±m · scale`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn decode_block<const BFP8: bool>(tile: *const u8, block: usize) -> __m512 {
    let (format, sign_bit) = if BFP8 {
        (BlockFormat::Bfp8, 7)
    } else {
        (BlockFormat::Bfp4, 3)
    };
    let scale = _mm512_set1_ps(format.scale(*tile.add(block)));
    let codes = tile.add(crate::formats::BLOCKS_PER_TILE + block * format.code_bytes());
    let v = if BFP8 {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(codes as *const __m128i))
    } else {
        // Element 2i in the low nibble of byte i.
        let x = _mm_loadl_epi64(codes as *const __m128i);
        let nibble = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(x, nibble);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), nibble);
        _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))
    };
    let m = _mm512_and_si512(v, _mm512_set1_epi32((1 << sign_bit) - 1));
    let sign = _mm512_sllv_epi32(
        _mm512_and_si512(v, _mm512_set1_epi32(1 << sign_bit)),
        _mm512_set1_epi32(31 - sign_bit),
    );
    let magnitude = _mm512_mul_ps(_mm512_cvtepi32_ps(m), scale);
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), sign))
}

/// Input channel `kk` of a block panel: its 32 weights as two vectors of 16. Row r of a tile
/// is face row r % 16 of faces 2(r/16) (outputs 0..16) and 2(r/16)+1 (outputs 16..32).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn decode_channel(panel: &BlockPanel, kk: usize) -> (__m512, __m512) {
    let tb = panel.format.tile_bytes();
    let tile = panel
        .tiles
        .as_ptr()
        .add(((kk / 32) * panel.tiles_per_row + panel.p) * tb);
    let r = kk % 32;
    let block = (r / 16) * 32 + r % 16;
    match panel.format {
        BlockFormat::Bfp8 => (
            decode_block::<true>(tile, block),
            decode_block::<true>(tile, block + 16),
        ),
        BlockFormat::Bfp4 => (
            decode_block::<false>(tile, block),
            decode_block::<false>(tile, block + 16),
        ),
    }
}

/// Channels `k0..k0 + kc` of a block panel as f32 rows `[kc, PANEL]`.
#[target_feature(enable = "avx512f")]
unsafe fn decode_f32(panel: &BlockPanel, k0: usize, kc: usize, out: &mut [f32]) {
    assert!(out.len() >= kc * PANEL, "decode_f32: output too small");
    for i in 0..kc {
        let (b0, b1) = decode_channel(panel, k0 + i);
        let row = out.as_mut_ptr().add(i * PANEL);
        _mm512_storeu_ps(row, b0);
        _mm512_storeu_ps(row.add(16), b1);
    }
}
