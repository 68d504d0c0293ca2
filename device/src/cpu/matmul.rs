//! The CPU matmul seam: `y = x · Wᵀ` with f32 activations and f32 or bf16 weights.
//!
//! Weights are packed once, at upload, into panels of [`PANEL`] output channels laid out
//! `[in, PANEL]` (the `[K, N]` orientation the Tenstorrent port packs too), kept in their own
//! format: a bf16 weight is never widened in memory, each panel row is widened in registers.
//! On CPUs with AVX-512 a register-blocked kernel (12 tokens x 32 outputs, 24 accumulators)
//! runs over blocks of [`KC`] input channels; elsewhere `gemm` multiplies panel by panel.
//! Work is split over rayon tasks by groups of panels, so both cores share every projection.

use crate::{HostWeight, WeightData, WeightFormat};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Output channels per panel (two AVX-512 vectors of f32).
pub const PANEL: usize = 32;
/// Tokens per register tile.
const MR: usize = 12;
/// Input channels per cache block.
const KC: usize = 512;
/// Panels per rayon task (when tasks split the output columns).
const PANELS_PER_TASK: usize = 2;
/// Rows per rayon task (when tasks split the tokens), a multiple of `MR`.
const MC: usize = 8 * MR;
/// Above this size of `x`, tasks split the tokens instead of the output columns.
const ROW_SPLIT_BYTES: usize = 64 << 20;

/// Panel storage.
#[derive(Clone, Debug, PartialEq)]
enum PanelData {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
}

/// `[n, k]` row-major values laid out as `ceil(n/PANEL)` panels of `[k, PANEL]`, zero-padded.
fn into_panels<T: Copy + Default>(src: &[T], n: usize, k: usize) -> Vec<T> {
    let mut out = vec![T::default(); n.div_ceil(PANEL) * k * PANEL];
    for (row, values) in src.chunks(k).enumerate().take(n) {
        let (p, j) = (row / PANEL, row % PANEL);
        for (kk, v) in values.iter().enumerate() {
            out[(p * k + kk) * PANEL + j] = *v;
        }
    }
    out
}

/// A weight `[n, k]` packed as `ceil(n/PANEL)` panels of `[k, PANEL]` (zero-padded columns).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    pub n: usize,
    pub k: usize,
    data: PanelData,
}

impl PackedWeight {
    /// Pack a `[out, in]` weight, converting to `format` (f32 → bf16 rounds to nearest even).
    pub fn pack(w: &HostWeight, format: WeightFormat) -> Self {
        let (n, k) = (w.rows, w.cols);
        let data = match format {
            WeightFormat::F32 => PanelData::F32(into_panels(&w.to_f32(), n, k)),
            WeightFormat::Bf16 => {
                let bits: Vec<u16> = match &w.data {
                    WeightData::Bf16(v) => v.iter().map(|b| b.to_bits()).collect(),
                    WeightData::F32(v) => v
                        .iter()
                        .map(|&f| half::bf16::from_f32(f).to_bits())
                        .collect(),
                };
                PanelData::Bf16(into_panels(&bits, n, k))
            }
        };
        PackedWeight { n, k, data }
    }

    /// Pack f32 rows `[n, k]` (one row per output, as [`PackedWeight::pack`]) given by
    /// `row(i)`, without an intermediate weight: for operands built at run time, such as the
    /// head's memory rows (which may sit in several pieces).
    pub fn from_f32_rows<'a>(row: impl Fn(usize) -> &'a [f32] + Sync, n: usize, k: usize) -> Self {
        let mut out = vec![0.0f32; n.div_ceil(PANEL) * k * PANEL];
        out.par_chunks_mut(k * PANEL)
            .enumerate()
            .for_each(|(p, panel)| {
                for j in 0..PANEL.min(n - p * PANEL) {
                    for (kk, v) in row(p * PANEL + j)[..k].iter().enumerate() {
                        panel[kk * PANEL + j] = *v;
                    }
                }
            });
        PackedWeight {
            n,
            k,
            data: PanelData::F32(out),
        }
    }

    /// Pack f32 values laid out `[k, n]` (one row per input channel, given by `row(i)`): the
    /// same panels as [`PackedWeight::from_f32_rows`] of the transpose, built by contiguous
    /// copies.
    pub fn from_f32_cols<'a>(row: impl Fn(usize) -> &'a [f32] + Sync, k: usize, n: usize) -> Self {
        let mut out = vec![0.0f32; n.div_ceil(PANEL) * k * PANEL];
        out.par_chunks_mut(k * PANEL)
            .enumerate()
            .for_each(|(p, panel)| {
                let (c0, cols) = (p * PANEL, PANEL.min(n - p * PANEL));
                for (kk, dst) in panel.chunks_mut(PANEL).enumerate() {
                    dst[..cols].copy_from_slice(&row(kk)[c0..c0 + cols]);
                }
            });
        PackedWeight {
            n,
            k,
            data: PanelData::F32(out),
        }
    }

    /// Bytes held (padding included).
    pub fn bytes(&self) -> usize {
        match &self.data {
            PanelData::F32(v) => v.len() * 4,
            PanelData::Bf16(v) => v.len() * 2,
        }
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
}

/// `y[rows, w.n] = x[rows, w.k] · wᵀ`. The caller checks the shapes.
pub fn linear(x: &[f32], rows: usize, w: &PackedWeight) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * w.n];
    if rows == 0 || w.n == 0 {
        return y;
    }
    let out = SendPtr(y.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // Token blocks of MR rows, interleaved [block][k][MR], so a tile's broadcasts walk one
        // contiguous stream; shared by every task.
        let packed_x = pack_token_blocks(x, rows, w.k);
        if rows * w.k * 4 > ROW_SPLIT_BYTES {
            // x does not stay in cache: each task takes a block of rows and every panel, so x is
            // read once and the (smaller, cache-resident) weight blocks are reused.
            let blocks: Vec<usize> = (0..rows).step_by(MC).collect();
            blocks.par_iter().for_each(|&r0| {
                let r1 = (r0 + MC).min(rows);
                // SAFETY: each task writes only rows [r0, r1) of `y`; shapes checked by the caller.
                unsafe { avx512::panels(&packed_x, r0..r1, w, 0..w.panels(), out.ptr()) };
            });
        } else {
            let groups: Vec<usize> = (0..w.panels()).step_by(PANELS_PER_TASK).collect();
            groups.par_iter().for_each(|&first| {
                let last = (first + PANELS_PER_TASK).min(w.panels());
                // SAFETY: each task writes only the columns of its own panels.
                unsafe { avx512::panels(&packed_x, 0..rows, w, first..last, out.ptr()) };
            });
        }
        return y;
    }
    let groups: Vec<usize> = (0..w.panels()).step_by(PANELS_PER_TASK).collect();
    groups.par_iter().for_each(|&first| {
        let last = (first + PANELS_PER_TASK).min(w.panels());
        // SAFETY: each task writes only the columns of its own panels; `x` is `[rows, k]` and
        // `y` is `[rows, n]` (checked by the caller).
        unsafe { portable_panels(x, rows, w, first, last, out.ptr()) };
    });
    y
}

/// `x[rows, k]` as `[ceil(rows/MR)][k][MR]`, zero-padded.
fn pack_token_blocks(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    let blocks = rows.div_ceil(MR);
    let mut out = vec![0.0f32; blocks * k * MR];
    out.par_chunks_mut(k * MR)
        .enumerate()
        .for_each(|(b, block)| {
            for r in 0..MR.min(rows - b * MR) {
                let src = &x[(b * MR + r) * k..(b * MR + r + 1) * k];
                for (kk, v) in src.iter().enumerate() {
                    block[kk * MR + r] = *v;
                }
            }
        });
    out
}

/// Panels `[first, last)` with `gemm` (any CPU).
unsafe fn portable_panels(
    x: &[f32],
    rows: usize,
    w: &PackedWeight,
    first: usize,
    last: usize,
    y: *mut f32,
) {
    let (n, k) = (w.n, w.k);
    let mut scratch = vec![0.0f32; k * PANEL];
    for p in first..last {
        let panel: &[f32] = match &w.data {
            PanelData::F32(d) => &d[p * k * PANEL..(p + 1) * k * PANEL],
            PanelData::Bf16(d) => {
                for (s, b) in scratch
                    .iter_mut()
                    .zip(&d[p * k * PANEL..(p + 1) * k * PANEL])
                {
                    *s = f32::from_bits((*b as u32) << 16);
                }
                &scratch
            }
        };
        let cols = PANEL.min(n - p * PANEL);
        gemm(
            rows,
            cols,
            k,
            y.add(p * PANEL),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            panel.as_ptr(),
            1,
            PANEL as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{PackedWeight, PanelData, KC, MR, PANEL};
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
    ) {
        let (n, k) = (w.n, w.k);
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            for p in panels.clone() {
                let cols = PANEL.min(n - p * PANEL);
                let mut r0 = rows.start;
                while r0 < rows.end {
                    let m = MR.min(rows.end - r0);
                    // Token block r0/MR, input channel k0 of the packed x.
                    let a = xp.as_ptr().add(r0 * k + k0 * MR);
                    let c = y.add(r0 * n + p * PANEL);
                    let acc = k0 > 0;
                    let t = Tile {
                        a,
                        a_rs: 1,
                        a_cs: MR,
                        ldb: PANEL,
                        kc,
                        c,
                        ldc: n,
                        cols,
                        accumulate: acc,
                    };
                    match &w.data {
                        PanelData::F32(d) => dispatch::<false, true>(
                            m,
                            &t,
                            d.as_ptr().add((p * k + k0) * PANEL) as *const u8,
                        ),
                        PanelData::Bf16(d) => dispatch::<true, true>(
                            m,
                            &t,
                            d.as_ptr().add((p * k + k0) * PANEL) as *const u8,
                        ),
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
        let mut j0 = 0;
        while j0 < n {
            let cols = PANEL.min(n - j0);
            let mut k0 = 0;
            while k0 < k {
                let kc = KC.min(k - k0);
                let mut r0 = 0;
                while r0 < m {
                    let rows = MR.min(m - r0);
                    let t = Tile {
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
                    dispatch::<false, false>(rows, &t, b.add(k0 * ldb + j0) as *const u8);
                    r0 += rows;
                }
                k0 += kc;
            }
            j0 += cols;
        }
    }

    /// One register tile's operands.
    struct Tile {
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
    unsafe fn dispatch<const BF16: bool, const PACKED_A: bool>(m: usize, t: &Tile, b: *const u8) {
        macro_rules! go {
            ($($m:literal)*) => {
                match m {
                    $($m => tile::<$m, BF16, PACKED_A>(t, b),)*
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

    /// One `M x 32` tile over `kc` input channels: `c (+)= a[M, kc] · b[kc, 32]`. With
    /// `PACKED_A`, `a` is a token block `[kc][MR]` and its offsets are constants.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile<const M: usize, const BF16: bool, const PACKED_A: bool>(t: &Tile, b: *const u8) {
        let (a_rs, a_cs) = if PACKED_A { (1, MR) } else { (t.a_rs, t.a_cs) };
        let mut lo = [_mm512_setzero_ps(); M];
        let mut hi = [_mm512_setzero_ps(); M];
        let (mask_lo, mask_hi) = masks(t.cols);
        for kk in 0..t.kc {
            let (b0, b1) = if BF16 {
                // bf16 panels are padded to 32 columns: whole loads are in bounds.
                let raw = _mm512_loadu_si512(b.add(kk * t.ldb * 2) as *const __m512i);
                let l = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw));
                let h = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(raw));
                (
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(l)),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)),
                )
            } else {
                let p = b.add(kk * t.ldb * 4) as *const f32;
                (
                    _mm512_maskz_loadu_ps(mask_lo, p),
                    _mm512_maskz_loadu_ps(mask_hi, p.add(16)),
                )
            };
            let a = t.a.add(kk * a_cs);
            for r in 0..M {
                let av = _mm512_set1_ps(*a.add(r * a_rs));
                lo[r] = _mm512_fmadd_ps(av, b0, lo[r]);
                hi[r] = _mm512_fmadd_ps(av, b1, hi[r]);
            }
        }
        for r in 0..M {
            let row = t.c.add(r * t.ldc);
            let (mut vl, mut vh) = (lo[r], hi[r]);
            if t.accumulate {
                vl = _mm512_add_ps(vl, _mm512_maskz_loadu_ps(mask_lo, row));
                vh = _mm512_add_ps(vh, _mm512_maskz_loadu_ps(mask_hi, row.add(16)));
            }
            _mm512_mask_storeu_ps(row, mask_lo, vl);
            _mm512_mask_storeu_ps(row.add(16), mask_hi, vh);
        }
    }
}

/// `c[m, n] = a[m, k] · b[k, n]` for small dense row-major operands (strides given), summed
/// into `c` when `accumulate`. Single-threaded: callers parallelise over heads.
#[allow(clippy::too_many_arguments)]
pub fn small_matmul(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    accumulate: bool,
    a: &[f32],
    a_row_stride: usize,
    a_col_stride: usize,
    b: &[f32],
    b_row_stride: usize,
    b_col_stride: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    assert!(c.len() >= m * n, "small_matmul: output too small");
    assert!(
        a.len() > (m - 1) * a_row_stride + (k - 1) * a_col_stride,
        "small_matmul: a too small"
    );
    assert!(
        b.len() > (k - 1) * b_row_stride + (n - 1) * b_col_stride,
        "small_matmul: b too small"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // The tile kernel wants unit column stride in `b`: transpose it once if needed.
        let transposed;
        let (b_ptr, ldb) = if b_col_stride == 1 {
            (b.as_ptr(), b_row_stride)
        } else {
            let mut t = vec![0.0f32; k * n];
            for kk in 0..k {
                for j in 0..n {
                    t[kk * n + j] = b[kk * b_row_stride + j * b_col_stride];
                }
            }
            transposed = t;
            (transposed.as_ptr(), n)
        };
        // SAFETY: the assertions above bound every access to `a` and `c`; `b_ptr` is either
        // `b` with unit column stride (bounded likewise) or the dense `[k, n]` transposition.
        unsafe {
            avx512::small(
                m,
                n,
                k,
                c.as_mut_ptr(),
                accumulate,
                a.as_ptr(),
                a_row_stride,
                a_col_stride,
                b_ptr,
                ldb,
            )
        };
        return;
    }
    // SAFETY: the assertions above bound every access gemm makes.
    unsafe {
        gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_col_stride as isize,
            a_row_stride as isize,
            b.as_ptr(),
            b_col_stride as isize,
            b_row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    /// Through a method, so closures capture the whole `Send` wrapper, not its raw field.
    fn ptr(&self) -> *mut f32 {
        self.0
    }
}
// SAFETY: used only to hand disjoint output columns to rayon tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn naive(x: &[f32], rows: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * n];
        for r in 0..rows {
            for j in 0..n {
                y[r * n + j] = (0..k).map(|i| x[r * k + i] * w[j * k + i]).sum();
            }
        }
        y
    }

    fn check(rows: usize, n: usize, k: usize) {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0)
            .collect();
        let want = naive(&x, rows, &w, n, k);
        let tol = 1e-5 * k as f32;
        for format in [WeightFormat::F32, WeightFormat::Bf16] {
            // These weights are exactly representable in bf16, so both formats must agree.
            let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
            let got = linear(&x, rows, &packed);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < tol, "{rows}x{n}x{k} {format:?}: {a} vs {b}");
            }
            let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let packed = PackedWeight::pack(&HostWeight::bf16(n, k, wb), format);
            assert_eq!(linear(&x, rows, &packed), got);
        }
    }

    #[test]
    fn packed_linear_equals_the_naive_product_on_ragged_shapes() {
        check(7, 300, 37); // partial tiles, partial panel
        check(25, 64, 1100); // several K blocks
        check(1, 5, 3);
        check(12, 32, 512);
        check(4100, 8, 4100); // x over 64 MiB: tasks split the tokens
    }

    #[test]
    fn run_time_packers_equal_the_weight_packer() {
        let (n, k) = (70, 9);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let want = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), WeightFormat::F32);
        assert_eq!(
            PackedWeight::from_f32_rows(|r| &w[r * k..(r + 1) * k], n, k),
            want
        );
        let mut transposed = vec![0.0f32; k * n];
        for j in 0..n {
            for kk in 0..k {
                transposed[kk * n + j] = w[j * k + kk];
            }
        }
        assert_eq!(
            PackedWeight::from_f32_cols(|r| &transposed[r * n..(r + 1) * n], k, n),
            want
        );
    }

    #[test]
    fn small_matmul_handles_every_stride_pattern() {
        let (m, n, k) = (13, 37, 70);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 11) as f32 / 4.0 - 1.2).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 / 3.0 - 0.9).collect();
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
            }
        }
        // a row-major and b row-major.
        let mut c = vec![1.0f32; m * n];
        small_matmul(m, n, k, &mut c, false, &a, k, 1, &b, n, 1);
        assert!(c.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-3));
        // a transposed, b transposed, accumulating onto c.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        small_matmul(m, n, k, &mut c, true, &at, 1, m, &bt, 1, k);
        assert!(c.iter().zip(&want).all(|(x, y)| (x - 2.0 * y).abs() < 2e-3));
    }

    #[test]
    fn the_portable_path_equals_the_dispatched_one() {
        let (rows, n, k) = (13, 70, 600);
        let x: Vec<f32> = (0..rows * k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 23) as f32 / 16.0 - 0.7).collect();
        let packed = PackedWeight::pack(&HostWeight::f32(n, k, w), WeightFormat::Bf16);
        let fast = linear(&x, rows, &packed);
        let mut slow = vec![0.0f32; rows * n];
        // SAFETY: shapes as `linear` would check them.
        unsafe { portable_panels(&x, rows, &packed, 0, packed.panels(), slow.as_mut_ptr()) };
        for (a, b) in fast.iter().zip(&slow) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
    }
}
