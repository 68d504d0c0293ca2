//! The matmul's AVX-512 kernels: register tiles of up to 12 tokens x 32 outputs (24 zmm
//! accumulators) over blocks of `KC` input channels, f32 / bf16 panels read directly, bfp
//! panels decoded once per block, the fidelity and accumulation imitation in registers.

use super::{BlockFormat, Engine, PackedWeight, PanelData, KC, MR, PANEL};
use std::arch::x86_64::*;

/// Rows `rows` (starting on a token block) of panels `panels`: for each block of `KC`
/// input channels, every panel, every tile of `MR` tokens.
#[target_feature(enable = "avx512f")]
pub unsafe fn panels(
    xp: &[f32],
    rows: std::ops::Range<usize>,
    w: &PackedWeight,
    panels: std::ops::Range<usize>,
    y: *mut f32,
    engine: Engine,
) {
    let (n, k) = (w.n, w.k);
    // Block-format panels are decoded once per block of input channels into this buffer
    // and then shared by every token tile, instead of being decoded per tile.
    let mut decoded = match &w.data {
        PanelData::Blocks { .. } => vec![0.0f32; KC * PANEL],
        _ => Vec::new(),
    };
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        for p in panels.clone() {
            let cols = PANEL.min(n - p * PANEL);
            let (src, b): (u8, *const u8) = match &w.data {
                PanelData::F32(d) => (SRC_F32, d.as_ptr().add((p * k + k0) * PANEL) as *const u8),
                PanelData::Bf16(d) => (SRC_BF16, d.as_ptr().add((p * k + k0) * PANEL) as *const u8),
                PanelData::Blocks {
                    format,
                    tiles,
                    tiles_per_row,
                } => {
                    // k0 is a multiple of KC, so of the tile height: start at the tile of
                    // row k0 in column p; `ldb` is the bytes of a tile row.
                    let tb = format.tile_bytes();
                    let tiles_at = Tile {
                        engine,
                        a: std::ptr::null(),
                        a_rs: 0,
                        a_cs: 0,
                        ldb: tiles_per_row * tb,
                        kc,
                        c: std::ptr::null_mut(),
                        ldc: 0,
                        cols,
                        accumulate: false,
                    };
                    let first = tiles.as_ptr().add(((k0 / 32) * tiles_per_row + p) * tb);
                    let all = masks(PANEL);
                    for kk in 0..kc {
                        let (b0, b1) = match format {
                            BlockFormat::Bfp8 => load_b::<SRC_BFP8>(&tiles_at, first, kk, all),
                            BlockFormat::Bfp4 => load_b::<SRC_BFP4>(&tiles_at, first, kk, all),
                        };
                        let row = decoded.as_mut_ptr().add(kk * PANEL);
                        _mm512_storeu_ps(row, b0);
                        _mm512_storeu_ps(row.add(16), b1);
                    }
                    (SRC_F32, decoded.as_ptr() as *const u8)
                }
            };
            let mut r0 = rows.start;
            while r0 < rows.end {
                let m = MR.min(rows.end - r0);
                // Token block r0/MR, input channel k0 of the packed x.
                let t = Tile {
                    engine,
                    a: xp.as_ptr().add(r0 * k + k0 * MR),
                    a_rs: 1,
                    a_cs: MR,
                    ldb: PANEL,
                    kc,
                    c: y.add(r0 * n + p * PANEL),
                    ldc: n,
                    cols,
                    accumulate: k0 > 0,
                };
                if src == SRC_BF16 {
                    dispatch::<SRC_BF16, true>(m, &t, b);
                } else {
                    dispatch::<SRC_F32, true>(m, &t, b);
                }
                r0 += m;
            }
        }
        k0 += kc;
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
    cols: usize,
    accumulate: bool,
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

fn masks(cols: usize) -> (__mmask16, __mmask16) {
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
unsafe fn round_bf16(v: __m512) -> __m512 {
    let bits = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let up = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
    _mm512_castsi512_ps(_mm512_and_si512(
        up,
        _mm512_set1_epi32(0xFFFF_0000u32 as i32),
    ))
}

/// Where the 32 weights of one input channel come from.
const SRC_F32: u8 = 0;
/// bf16 panels, widened in registers.
const SRC_BF16: u8 = 1;
/// bfp8_b / bfp4_b tiles: two blocks decoded per input channel.
const SRC_BFP8: u8 = 2;
const SRC_BFP4: u8 = 3;

/// One block of 16 codes decoded to f32: `±m · scale`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn decode_block<const SRC: u8>(tile: *const u8, block: usize) -> __m512 {
    let (format, sign_bit) = if SRC == SRC_BFP8 {
        (BlockFormat::Bfp8, 7)
    } else {
        (BlockFormat::Bfp4, 3)
    };
    let scale = _mm512_set1_ps(format.scale(*tile.add(block)));
    let codes = tile.add(super::formats::BLOCKS_PER_TILE + block * format.code_bytes());
    let v = if SRC == SRC_BFP8 {
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

/// The 32 weights of input channel `kk` of the block: two vectors of 16.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_b<const SRC: u8>(
    t: &Tile,
    b: *const u8,
    kk: usize,
    (mask_lo, mask_hi): (__mmask16, __mmask16),
) -> (__m512, __m512) {
    match SRC {
        SRC_F32 => {
            let p = b.add(kk * t.ldb * 4) as *const f32;
            (
                _mm512_maskz_loadu_ps(mask_lo, p),
                _mm512_maskz_loadu_ps(mask_hi, p.add(16)),
            )
        }
        SRC_BF16 => {
            // bf16 panels are padded to 32 columns: whole loads are in bounds.
            let raw = _mm512_loadu_si512(b.add(kk * t.ldb * 2) as *const __m512i);
            let l = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw));
            let h = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(raw));
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(l)),
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)),
            )
        }
        _ => {
            // Tiles are zero-padded: whole blocks are in bounds. Row r of a tile is face
            // row r % 16 of faces 2(r/16) (outputs 0..16) and 2(r/16)+1 (outputs 16..32).
            let tile = b.add((kk / 32) * t.ldb);
            let r = kk % 32;
            let block = (r / 16) * 32 + r % 16;
            (
                decode_block::<SRC>(tile, block),
                decode_block::<SRC>(tile, block + 16),
            )
        }
    }
}

/// One `M x 32` tile over `kc` input channels: `c (+)= a[M, kc] · b[kc, 32]`. With
/// `PACKED_A`, `a` is a token block `[kc][MR]` and its offsets are constants.
#[target_feature(enable = "avx512f")]
#[inline]
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
            let (b0, b1) = load_b::<SRC>(t, b, kk, masks);
            channel!(kk, b0, b1);
        }
    } else {
        for kk in 0..t.kc {
            let (mut b0, mut b1) = load_b::<SRC>(t, b, kk, masks);
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
    let (mask_lo, mask_hi) = masks;
    for r in 0..M {
        let row = t.c.add(r * t.ldc);
        let (mut vl, mut vh) = (lo[r], hi[r]);
        if t.accumulate && !carry_in {
            vl = _mm512_add_ps(vl, _mm512_maskz_loadu_ps(mask_lo, row));
            vh = _mm512_add_ps(vh, _mm512_maskz_loadu_ps(mask_hi, row.add(16)));
        }
        if t.engine.round_accumulators {
            vl = round_bf16(vl);
            vh = round_bf16(vh);
        }
        _mm512_mask_storeu_ps(row, mask_lo, vl);
        _mm512_mask_storeu_ps(row.add(16), mask_hi, vh);
    }
}
