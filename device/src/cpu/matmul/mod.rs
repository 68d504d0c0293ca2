//! The CPU matmul seam: `y = x · Wᵀ` with f32 activations and f32 or bf16 weights.
//!
//! Weights are packed once, at upload, into panels of [`PANEL`] output channels laid out
//! `[in, PANEL]` (the `[K, N]` orientation the Tenstorrent port packs too), kept in their own
//! format: a bf16 weight is never widened in memory, each panel row is widened in registers.
//! Register-blocked kernels run over blocks of [`KC`] input channels, one per ISA
//! ([`super::isa`], chosen once): `avx512` (12 tokens x 32 outputs, 24 zmm accumulators) and
//! `avx2` (6 tokens x 16 outputs, 12 ymm accumulators; AVX2 + FMA); without either, `gemm`
//! multiplies panel by panel (portable).
//! Work is split over rayon tasks by groups of panels, so both cores share every projection.

use crate::formats::{self, BlockFormat, TileFormat};
pub use crate::numerics::{Fidelity, Numerics};
use crate::{HostWeight, SharedBytes, WeightData, WeightFormat};
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

/// Plain little-endian values a panel can hold.
trait Plain: Copy + PartialEq + std::fmt::Debug {
    fn from_le(bytes: &[u8]) -> Self;
}

impl Plain for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Plain for u16 {
    fn from_le(b: &[u8]) -> Self {
        u16::from_le_bytes([b[0], b[1]])
    }
}

impl Plain for u8 {
    fn from_le(b: &[u8]) -> Self {
        b[0]
    }
}

/// Panel values: owned, or read in place from shared bytes (a mapped tensor cache) when they
/// are aligned and the host is little-endian, so a cached weight is never copied.
#[derive(Clone)]
enum Held<T: Plain> {
    Owned(Vec<T>),
    Shared(SharedBytes),
}

impl<T: Plain> Held<T> {
    fn from_bytes(bytes: SharedBytes) -> Self {
        let size = std::mem::size_of::<T>();
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
        if cfg!(target_endian = "little") && aligned && bytes.len().is_multiple_of(size) {
            Held::Shared(bytes)
        } else {
            Held::Owned(bytes.chunks_exact(size).map(T::from_le).collect())
        }
    }
}

impl<T: Plain> std::ops::Deref for Held<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Held::Owned(v) => v,
            // SAFETY: `from_bytes` keeps bytes only when they are aligned for T, a whole number
            // of T, and little-endian like T's in-memory form; T is plain data (f32, u16, u8)
            // for which every bit pattern is valid.
            Held::Shared(b) => unsafe {
                std::slice::from_raw_parts(
                    b.as_ptr() as *const T,
                    b.len() / std::mem::size_of::<T>(),
                )
            },
        }
    }
}

impl<T: Plain> std::fmt::Debug for Held<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} values)", self.len())
    }
}

impl<T: Plain> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

/// Panel storage.
#[derive(Clone, Debug, PartialEq)]
enum PanelData {
    F32(Held<f32>),
    /// bf16 bit patterns.
    Bf16(Held<u16>),
    /// The weight as `[K = in, N = out]` in ttnn's bfp8_b / bfp4_b tiles (the device's bytes):
    /// a panel is a tile column, each panel row two blocks of 16 outputs.
    Blocks {
        format: BlockFormat,
        tiles: Held<u8>,
        /// Tiles per tile row (`ceil(n / 32)`).
        tiles_per_row: usize,
    },
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
            WeightFormat::F32 => PanelData::F32(Held::Owned(into_panels(&w.to_f32(), n, k))),
            WeightFormat::Bfp8 | WeightFormat::Bfp4 => {
                let (block, tile) = match format {
                    WeightFormat::Bfp8 => (BlockFormat::Bfp8, TileFormat::Bfp8),
                    _ => (BlockFormat::Bfp4, TileFormat::Bfp4),
                };
                // Quantised as the device holds it: [in, out], blocks along the outputs.
                let values = w.to_f32();
                let mut kn = vec![0.0f32; k * n];
                for (j, row) in values.chunks(k).enumerate() {
                    for (kk, v) in row.iter().enumerate() {
                        kn[kk * n + j] = *v;
                    }
                }
                PanelData::Blocks {
                    format: block,
                    tiles: Held::Owned(formats::pack(&kn, k, n, tile)),
                    tiles_per_row: formats::tiles_for(n),
                }
            }
            WeightFormat::Bf16 => {
                let bits: Vec<u16> = match &w.data {
                    WeightData::Bf16(v) => v.iter().map(|b| b.to_bits()).collect(),
                    WeightData::F32(v) => v
                        .iter()
                        .map(|&f| half::bf16::from_f32(f).to_bits())
                        .collect(),
                };
                PanelData::Bf16(Held::Owned(into_panels(&bits, n, k)))
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
            data: PanelData::F32(Held::Owned(out)),
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
            data: PanelData::F32(Held::Owned(out)),
        }
    }

    /// The format the weight is held in.
    pub fn format(&self) -> WeightFormat {
        match &self.data {
            PanelData::F32(_) => WeightFormat::F32,
            PanelData::Bf16(_) => WeightFormat::Bf16,
            PanelData::Blocks {
                format: BlockFormat::Bfp8,
                ..
            } => WeightFormat::Bfp8,
            PanelData::Blocks { .. } => WeightFormat::Bfp4,
        }
    }

    /// The held values as little-endian bytes (panels, or device tiles), for a tensor cache.
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.data {
            PanelData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            PanelData::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            PanelData::Blocks { tiles, .. } => tiles.to_vec(),
        }
    }

    /// A weight `[n, k]` in `format` from [`PackedWeight::to_bytes`], read in place when it
    /// can be; `None` when the byte count does not fit the shape.
    pub fn from_bytes(
        n: usize,
        k: usize,
        format: WeightFormat,
        bytes: SharedBytes,
    ) -> Option<Self> {
        let panels = n.div_ceil(PANEL) * k * PANEL;
        let data = match format {
            WeightFormat::F32 => {
                (bytes.len() == panels * 4).then(|| PanelData::F32(Held::from_bytes(bytes)))?
            }
            WeightFormat::Bf16 => {
                (bytes.len() == panels * 2).then(|| PanelData::Bf16(Held::from_bytes(bytes)))?
            }
            WeightFormat::Bfp8 | WeightFormat::Bfp4 => {
                let (block, tile) = match format {
                    WeightFormat::Bfp8 => (BlockFormat::Bfp8, TileFormat::Bfp8),
                    _ => (BlockFormat::Bfp4, TileFormat::Bfp4),
                };
                (bytes.len() == formats::packed_bytes(k, n, tile)).then(|| PanelData::Blocks {
                    format: block,
                    tiles: Held::from_bytes(bytes),
                    tiles_per_row: formats::tiles_for(n),
                })?
            }
        };
        Some(PackedWeight { n, k, data })
    }

    /// The device tile bytes (`[in, out]`, ttnn's layout) of a bfp8_b / bfp4_b weight.
    pub fn block_tiles(&self) -> Option<&[u8]> {
        match &self.data {
            PanelData::Blocks { tiles, .. } => Some(&tiles[..]),
            _ => None,
        }
    }

    /// Bytes held (padding included).
    pub fn bytes(&self) -> usize {
        match &self.data {
            PanelData::F32(v) => v.len() * 4,
            PanelData::Bf16(v) => v.len() * 2,
            PanelData::Blocks { tiles, .. } => tiles.len(),
        }
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
}

/// `y[rows, w.n] = x[rows, w.k] · wᵀ`. The caller checks the shapes.
pub fn linear(x: &[f32], rows: usize, w: &PackedWeight) -> Vec<f32> {
    linear_with(x, rows, w, &Numerics::default())
}

/// [`linear`] with the device's numerics imitated as `numerics` says.
pub fn linear_with(x: &[f32], rows: usize, w: &PackedWeight, numerics: &Numerics) -> Vec<f32> {
    linear_on(panel_kernel(), x, rows, w, numerics)
}

/// [`linear_with`] on `kernel` (`None`: the portable path).
fn linear_on(
    kernel: Option<PanelKernel>,
    x: &[f32],
    rows: usize,
    w: &PackedWeight,
    numerics: &Numerics,
) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * w.n];
    if rows == 0 || w.n == 0 {
        return y;
    }
    let (weight_mask, activation_mask) = numerics.fidelity.masks();
    let rounded;
    let x = if numerics.is_exact() {
        x
    } else {
        let bf16 = numerics.bf16_activations || numerics.fidelity != Fidelity::Exact;
        rounded = x
            .par_iter()
            .map(|&v| {
                let v = if bf16 {
                    formats::bf16::to_f32(formats::bf16::from_f32(v))
                } else {
                    v
                };
                f32::from_bits(v.to_bits() & activation_mask)
            })
            .collect::<Vec<f32>>();
        &rounded
    };
    let engine = Engine {
        weight_mask,
        round_accumulators: numerics.bf16_accumulation,
    };
    let out = SendPtr(y.as_mut_ptr());
    if let Some(kernel) = kernel {
        // x is laid out in token blocks of MR rows, interleaved [block][k][MR], so a tile's
        // broadcasts walk one contiguous stream.
        let k = w.k;
        if rows * k * 4 > ROW_SPLIT_BYTES {
            // x does not stay in cache: each task takes a block of rows, lays out only those
            // (cache-resident, no second copy of a large x) and runs every panel over them, so
            // x is read once and the weight blocks are reused across the block's tiles.
            let blocks: Vec<usize> = (0..rows).step_by(MC).collect();
            blocks.par_iter().for_each(|&r0| {
                let r1 = (r0 + MC).min(rows);
                let local = pack_token_blocks(&x[r0 * k..r1 * k], r1 - r0, k);
                // SAFETY: each task writes only rows [r0, r1) of `y` (the pointer is moved to
                // row r0); shapes checked by the caller; the kernel's ISA was detected.
                unsafe {
                    let y = out.ptr().add(r0 * w.n);
                    kernel(&local, 0..r1 - r0, w, 0..w.panels(), y, engine)
                };
            });
        } else {
            let packed_x = pack_token_blocks(x, rows, k);
            let groups: Vec<usize> = (0..w.panels()).step_by(PANELS_PER_TASK).collect();
            groups.par_iter().for_each(|&first| {
                let last = (first + PANELS_PER_TASK).min(w.panels());
                // SAFETY: each task writes only the columns of its own panels; the kernel's
                // ISA was detected.
                unsafe { kernel(&packed_x, 0..rows, w, first..last, out.ptr(), engine) };
            });
        }
        return y;
    }
    let groups: Vec<usize> = (0..w.panels()).step_by(PANELS_PER_TASK).collect();
    groups.par_iter().for_each(|&first| {
        let last = (first + PANELS_PER_TASK).min(w.panels());
        // SAFETY: each task writes only the columns of its own panels; `x` is `[rows, k]` and
        // `y` is `[rows, n]` (checked by the caller).
        unsafe { portable_panels(x, rows, w, first, last, out.ptr(), engine) };
    });
    y
}

/// A register-tiled kernel over packed token blocks and panels.
type PanelKernel = unsafe fn(
    &[f32],
    std::ops::Range<usize>,
    &PackedWeight,
    std::ops::Range<usize>,
    *mut f32,
    Engine,
);

/// The kernel of the process's ISA ([`super::isa`]), or `None` for the portable `gemm` path.
fn panel_kernel() -> Option<PanelKernel> {
    match super::isa::isa() {
        #[cfg(target_arch = "x86_64")]
        super::isa::Isa::Avx512 | super::isa::Isa::Avx512Bf16 => Some(avx512::panels),
        #[cfg(target_arch = "x86_64")]
        super::isa::Isa::Avx2Fma => Some(avx2::panels),
        _ => None,
    }
}

/// The per-product part of [`Numerics`] the kernels apply.
#[derive(Clone, Copy, Debug)]
struct Engine {
    /// Applied to every weight (math fidelity).
    weight_mask: u32,
    round_accumulators: bool,
}

impl Engine {
    const EXACT: Engine = Engine {
        weight_mask: u32::MAX,
        round_accumulators: false,
    };
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
    engine: Engine,
) {
    let (n, k) = (w.n, w.k);
    let mut scratch = vec![0.0f32; k * PANEL];
    for p in first..last {
        match &w.data {
            PanelData::F32(d) => scratch.copy_from_slice(&d[p * k * PANEL..(p + 1) * k * PANEL]),
            PanelData::Bf16(d) => {
                for (s, b) in scratch
                    .iter_mut()
                    .zip(&d[p * k * PANEL..(p + 1) * k * PANEL])
                {
                    *s = f32::from_bits((*b as u32) << 16);
                }
            }
            PanelData::Blocks {
                format,
                tiles,
                tiles_per_row,
            } => decode_block_panel(*format, tiles, *tiles_per_row, p, k, &mut scratch),
        }
        if engine.weight_mask != u32::MAX {
            for v in scratch.iter_mut() {
                *v = f32::from_bits(v.to_bits() & engine.weight_mask);
            }
        }
        let cols = PANEL.min(n - p * PANEL);
        // With a bf16 destination the sum is rounded after every 32 input channels.
        let step = if engine.round_accumulators { 32 } else { k };
        let mut k0 = 0;
        while k0 < k {
            let kc = step.min(k - k0);
            gemm(
                rows,
                cols,
                kc,
                y.add(p * PANEL),
                1,
                n as isize,
                k0 > 0,
                x.as_ptr().add(k0),
                1,
                k as isize,
                scratch.as_ptr().add(k0 * PANEL),
                1,
                PANEL as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
            if engine.round_accumulators {
                for r in 0..rows {
                    for j in 0..cols {
                        let v = y.add(r * n + p * PANEL + j);
                        *v = formats::bf16::to_f32(formats::bf16::from_f32(*v));
                    }
                }
            }
            k0 += kc;
        }
    }
}

/// Panel `p` (tile column `p`) of a block-format weight decoded to `[k, PANEL]` f32.
fn decode_block_panel(
    format: BlockFormat,
    tiles: &[u8],
    tiles_per_row: usize,
    p: usize,
    k: usize,
    out: &mut [f32],
) {
    decode_block_rows(format, tiles, tiles_per_row, p, 0, k, out)
}

/// Input channels `k0..k0 + kc` of panel `p` of a block-format weight decoded to
/// `[kc, PANEL]` f32.
fn decode_block_rows(
    format: BlockFormat,
    tiles: &[u8],
    tiles_per_row: usize,
    p: usize,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    let tile_bytes = format.tile_bytes();
    for i in 0..kc {
        let kk = k0 + i;
        let tile = &tiles[((kk / 32) * tiles_per_row + p) * tile_bytes..][..tile_bytes];
        let r = kk % 32;
        let block = (r / 16) * 32 + r % 16;
        for (half, b) in [block, block + 16].into_iter().enumerate() {
            let values = format.decode(tile[b], &format.read_codes(tile, b));
            out[i * PANEL + half * 16..i * PANEL + half * 16 + 16].copy_from_slice(&values);
        }
    }
}

/// The block loops of a small product `[m, k] · [k, n]` shared by the ISA kernels: for every
/// strip of `width` output columns, block of `KC` input channels and tile of `height` rows,
/// `tile(first_row, rows, first_col, cols, first_channel, channels)`.
#[cfg(target_arch = "x86_64")]
fn for_each_small_tile(
    m: usize,
    n: usize,
    k: usize,
    height: usize,
    width: usize,
    mut tile: impl FnMut(usize, usize, usize, usize, usize, usize),
) {
    for j0 in (0..n).step_by(width) {
        let cols = width.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for r0 in (0..m).step_by(height) {
                tile(r0, height.min(m - r0), j0, cols, k0, kc);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
    if super::isa::isa() >= super::isa::Isa::Avx2Fma {
        // The tile kernels want unit column stride in `b`: transpose it once if needed.
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
        let kernel = if super::isa::isa() >= super::isa::Isa::Avx512 {
            avx512::small
        } else {
            avx2::small
        };
        // SAFETY: the assertions above bound every access to `a` and `c`; `b_ptr` is either
        // `b` with unit column stride (bounded likewise) or the dense `[k, n]` transposition;
        // the kernel's ISA was detected.
        unsafe {
            kernel(
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

    /// `w [n, k]` as the device holds it in `format`, read back as f32 `[n, k]`.
    fn device_weight(w: &[f32], n: usize, k: usize, format: TileFormat) -> Vec<f32> {
        let mut kn = vec![0.0f32; k * n];
        for j in 0..n {
            for kk in 0..k {
                kn[kk * n + j] = w[j * k + kk];
            }
        }
        let back = formats::unpack(&formats::pack(&kn, k, n, format), k, n, format).unwrap();
        let mut nk = vec![0.0f32; n * k];
        for j in 0..n {
            for kk in 0..k {
                nk[j * k + kk] = back[kk * n + j];
            }
        }
        nk
    }

    fn ragged(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 25.0 * (1.0 + (i % 7) as f32))
            .collect()
    }

    /// The process's kernel and the portable path, for comparison against `want`.
    fn both_kernels(
        x: &[f32],
        rows: usize,
        w: &PackedWeight,
        numerics: &Numerics,
    ) -> [Vec<f32>; 2] {
        [
            linear_with(x, rows, w, numerics),
            linear_on(None, x, rows, w, numerics),
        ]
    }

    #[test]
    fn block_format_weights_multiply_as_their_decoded_values() {
        for (rows, n, k) in [(7, 40, 70), (13, 64, 1100), (3, 32, 32)] {
            let x = ragged(rows * k, 1);
            let w = ragged(n * k, 2);
            for (format, tile) in [
                (WeightFormat::Bfp8, TileFormat::Bfp8),
                (WeightFormat::Bfp4, TileFormat::Bfp4),
            ] {
                let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
                assert_eq!(packed.bytes(), formats::packed_bytes(k, n, tile));
                let want = naive(&x, rows, &device_weight(&w, n, k, tile), n, k);
                for got in both_kernels(&x, rows, &packed, &Numerics::default()) {
                    assert_close(&got, &want, &format!("{format:?} {rows}x{n}x{k}"));
                }
            }
        }
    }

    /// Every value of `got` within 1e-4 (relative to 1 + |want|) of `want`.
    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        for (a, b) in got.iter().zip(want) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{what}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn fidelity_truncates_weights_and_activations() {
        let (rows, n, k) = (5, 48, 96);
        let x = ragged(rows * k, 3);
        let w = ragged(n * k, 4);
        let bf = |v: f32| formats::bf16::to_f32(formats::bf16::from_f32(v));
        let keep = |v: f32, mask: u32| f32::from_bits(v.to_bits() & mask);
        for (fidelity, wm, xm) in [
            (Fidelity::LoFi, 0xFFF8_0000u32, 0xFFFE_0000u32),
            (Fidelity::HiFi2, u32::MAX, 0xFFFE_0000),
            (Fidelity::HiFi4, u32::MAX, u32::MAX),
        ] {
            let numerics = Numerics {
                fidelity,
                ..Default::default()
            };
            let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), WeightFormat::Bf16);
            let xs: Vec<f32> = x.iter().map(|&v| keep(bf(v), xm)).collect();
            let ws: Vec<f32> = w.iter().map(|&v| keep(bf(v), wm)).collect();
            let want = naive(&xs, rows, &ws, n, k);
            for got in both_kernels(&x, rows, &packed, &numerics) {
                assert_close(&got, &want, &format!("{fidelity:?}"));
            }
        }
    }

    #[test]
    fn a_bf16_destination_rounds_the_running_sum_every_32_channels() {
        let (rows, n, k) = (4, 32, 600);
        let x = ragged(rows * k, 5);
        let w = ragged(n * k, 6);
        let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), WeightFormat::F32);
        let numerics = Numerics {
            bf16_accumulation: true,
            ..Default::default()
        };
        let bf = |v: f32| formats::bf16::to_f32(formats::bf16::from_f32(v));
        for got in both_kernels(&x, rows, &packed, &numerics) {
            for r in 0..rows {
                for j in 0..n {
                    let mut acc = 0.0f32;
                    for k0 in (0..k).step_by(32) {
                        let part: f64 = (k0..(k0 + 32).min(k))
                            .map(|kk| x[r * k + kk] as f64 * w[j * k + kk] as f64)
                            .sum();
                        acc = bf((acc as f64 + part) as f32);
                    }
                    let g = got[r * n + j];
                    // Every value is a bf16 and within one bf16 step of the reference.
                    assert_eq!(g, bf(g));
                    assert!((g - acc).abs() <= acc.abs() / 32.0 + 1e-6, "{g} vs {acc}");
                }
            }
        }
    }

    #[test]
    fn packed_weights_round_trip_through_bytes() {
        let (n, k) = (70, 45);
        let w = ragged(n * k, 9);
        for format in [
            WeightFormat::F32,
            WeightFormat::Bf16,
            WeightFormat::Bfp8,
            WeightFormat::Bfp4,
        ] {
            let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
            let bytes = packed.to_bytes();
            assert_eq!(bytes.len(), packed.bytes());
            let shared = SharedBytes::owned(bytes.clone());
            assert_eq!(
                PackedWeight::from_bytes(n, k, format, shared),
                Some(packed.clone())
            );
            // Read in place from a window of a larger owner (as from a mapped cache).
            let mut padded = vec![0u8; 64];
            padded.extend_from_slice(&bytes);
            let window = SharedBytes::window(std::sync::Arc::new(padded), 64, bytes.len());
            assert_eq!(
                PackedWeight::from_bytes(n, k, format, window.unwrap()),
                Some(packed.clone())
            );
            let short = SharedBytes::owned(bytes[1..].to_vec());
            assert_eq!(PackedWeight::from_bytes(n, k, format, short), None);
            assert_eq!(packed.format(), format);
        }
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

    /// The kernels of every ISA this CPU has.
    fn kernels_here() -> Vec<(&'static str, PanelKernel)> {
        let mut out: Vec<(&'static str, PanelKernel)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::isa::Isa;
            let have = Isa::detected();
            if have >= Isa::Avx2Fma {
                out.push(("avx2", avx2::panels));
            }
            if have >= Isa::Avx512 {
                out.push(("avx512", avx512::panels));
            }
        }
        out
    }

    /// Every ISA kernel against the portable path on odd shapes (tails of tokens, outputs and
    /// input channels; several KC blocks; every format): within 1e-6 of the sum of |x·w| for
    /// the plain product and with fidelity truncation, within one bf16 step of the sum with a
    /// bf16 destination (the two add the same products in another order before rounding).
    #[test]
    fn every_isa_kernel_equals_the_portable_path() {
        let shapes = [
            (1, 1, 1),
            (5, 17, 33),
            (13, 70, 600),
            (25, 33, 1030),
            (7, 64, 96),
        ];
        let numerics = [
            Numerics::default(),
            Numerics {
                bf16_activations: true,
                fidelity: Fidelity::LoFi,
                bf16_accumulation: false,
            },
            Numerics {
                bf16_activations: true,
                fidelity: Fidelity::HiFi2,
                bf16_accumulation: true,
            },
        ];
        let mut checked = 0;
        for (name, kernel) in kernels_here() {
            for &(rows, n, k) in &shapes {
                let x = ragged(rows * k, 3);
                let w = ragged(n * k, 5);
                for format in [
                    WeightFormat::F32,
                    WeightFormat::Bf16,
                    WeightFormat::Bfp8,
                    WeightFormat::Bfp4,
                ] {
                    let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
                    for num in &numerics {
                        let fast = linear_on(Some(kernel), &x, rows, &packed, num);
                        let slow = linear_on(None, &x, rows, &packed, num);
                        for r in 0..rows {
                            for j in 0..n {
                                let scale: f32 = (0..k)
                                    .map(|kk| (x[r * k + kk] * w[j * k + kk]).abs())
                                    .sum::<f32>()
                                    .max(1e-30);
                                let (a, b) = (fast[r * n + j], slow[r * n + j]);
                                let bound = if num.bf16_accumulation {
                                    scale / 128.0
                                } else {
                                    1e-6 * scale
                                };
                                assert!(
                                    (a - b).abs() <= bound,
                                    "{name} {format:?} {num:?} [{rows}x{n}x{k}] ({r},{j}): {a} vs {b}"
                                );
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        eprintln!("{checked} kernel/shape/format/numerics cases checked");
    }

    /// The small-matmul kernel of every ISA here against a plain f64 product on odd shapes.
    #[test]
    fn every_isa_small_kernel_equals_a_plain_product() {
        type Small = unsafe fn(
            usize,
            usize,
            usize,
            *mut f32,
            bool,
            *const f32,
            usize,
            usize,
            *const f32,
            usize,
        );
        let mut kernels: Vec<(&str, Small)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::isa::Isa;
            if Isa::detected() >= Isa::Avx2Fma {
                kernels.push(("avx2", avx2::small));
            }
            if Isa::detected() >= Isa::Avx512 {
                kernels.push(("avx512", avx512::small));
            }
        }
        for (name, kernel) in kernels {
            for (m, n, k) in [(1, 1, 1), (7, 9, 33), (13, 40, 600), (3, 72, 1025)] {
                let a = ragged(m * k, 1);
                let b = ragged(k * n, 2);
                let mut c = ragged(m * n, 4);
                let before = c.clone();
                // SAFETY: dense operands of exactly these shapes; the ISA was detected.
                unsafe {
                    kernel(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        true,
                        a.as_ptr(),
                        k,
                        1,
                        b.as_ptr(),
                        n,
                    )
                };
                for i in 0..m {
                    for j in 0..n {
                        let (mut want, mut scale) = (
                            f64::from(before[i * n + j]),
                            f64::from(before[i * n + j]).abs(),
                        );
                        for kk in 0..k {
                            let p = f64::from(a[i * k + kk]) * f64::from(b[kk * n + j]);
                            want += p;
                            scale += p.abs();
                        }
                        let got = f64::from(c[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-6 * scale.max(1e-30),
                            "{name} [{m}x{n}x{k}] ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
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
        unsafe {
            portable_panels(
                &x,
                rows,
                &packed,
                0,
                packed.panels(),
                slow.as_mut_ptr(),
                Engine::EXACT,
            )
        };
        for (a, b) in fast.iter().zip(&slow) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
    }
}
