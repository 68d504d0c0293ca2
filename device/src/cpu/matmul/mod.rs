//! The CPU matmul seam: `y = x · Wᵀ` with f32 activations and f32, bf16 or bfp weights held in
//! panels ([`panels`]).
//!
//! One driver blocks every product for the caches and the cores: `x` is packed once into token
//! blocks of the kernel's tile height, in f32 or, for the bf16 dot-product kernel, in bf16
//! pairs of input channels; work units are (a block of rows, a group of panels), spread over
//! rayon; inside a unit, for each block of input channels, each panel's block stays in L1
//! while every token tile of the rows (their block of `x` sized for L2) passes over it.
//! Register tiles are per ISA ([`super::isa`], chosen once): `avx512` (12 tokens x 32 outputs,
//! 24 zmm accumulators, f32 FMAs), `avx512_bf16` (AVX512-BF16 `vdpbf16ps`, two input channels
//! per multiply-add, used for bf16 and bfp weights when the activations are bf16 and it measures
//! faster here: [`bf16_dot_enabled`]), `avx2` (6 x 32 in two halves of 16, 12 ymm accumulators);
//! without either, `gemm` multiplies panel by panel (`portable`). `bf16_dot` emulates
//! `vdpbf16ps` bit for bit, so the dot-product path is tested on every CPU.

use crate::formats::{self, BlockFormat};
pub use crate::numerics::{Fidelity, Numerics};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

mod bf16_dot;
mod panels;
mod portable;
use panels::{pairs, PanelData};
pub use panels::{PackedWeight, PANEL};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;

/// Bytes of packed `x` one work unit keeps in L2 (half of a 1 MiB L2; the other half holds a
/// panel's block of weights): its row block is as many tokens as fit, at least one tile.
const X_BLOCK_BYTES: usize = 1536 << 10;
/// Input channels per block of the small dense products.
const SMALL_KC: usize = 512;
/// Most panels in one work unit.
const MAX_GROUP: usize = 8;
/// Above this size of `x`, work units take whole row blocks and pack only those rows (a large
/// `x`, such as the head's 16,384 rows, is never copied whole).
const ROW_SPLIT_BYTES: usize = 64 << 20;

/// How a kernel wants a token block's activations laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Packing {
    /// f32, `[kc][mr]` per token block.
    F32,
    /// bf16 pairs of input channels in one u32 (the even channel low), `[ceil(kc/2)][mr]`.
    Bf16Pairs,
}

/// A block-format weight panel (a tile column of the device's tiles).
pub(super) struct BlockPanel<'a> {
    pub format: BlockFormat,
    pub tiles: &'a [u8],
    pub tiles_per_row: usize,
    pub p: usize,
}

/// How a kernel decodes channels `k0..k0 + kc` of a block panel into the weights it reads.
#[derive(Clone, Copy)]
pub(super) enum Decoder {
    /// f32 rows `[kc, PANEL]`.
    F32(unsafe fn(&BlockPanel, usize, usize, &mut [f32])),
    /// bf16 channel pairs `[ceil(kc/2), PANEL]`.
    Pairs(unsafe fn(&BlockPanel, usize, usize, &mut [u32])),
}

/// The weights one tile reads, at the tile's first input channel.
#[derive(Clone, Copy)]
pub(super) enum Weights {
    /// Rows of `PANEL` f32.
    F32(*const f32),
    /// Rows of `PANEL` bf16 channel pairs.
    Pairs(*const u32),
}

/// One register tile: `c[rows, cols] (+)= a[rows, kc] · b[kc, cols]`.
pub(super) struct TileJob {
    /// The token block at the tile's first input channel, laid out as the kernel's `Packing`.
    pub a: *const u8,
    /// Valid tokens, 1..=mr.
    pub rows: usize,
    pub b: Weights,
    pub kc: usize,
    pub c: *mut f32,
    pub ldc: usize,
    /// Valid outputs, 1..=PANEL.
    pub cols: usize,
    /// Add to `c` (a later block of input channels) instead of overwriting it.
    pub accumulate: bool,
    pub engine: Engine,
}

/// One register tile of the f32 FMA kernels with any strides for `a` (the small dense products)
/// or a packed token block.
pub(super) struct Tile {
    pub engine: Engine,
    pub a: *const f32,
    pub a_rs: usize,
    pub a_cs: usize,
    /// Row stride of `b` in elements.
    pub ldb: usize,
    pub kc: usize,
    pub c: *mut f32,
    pub ldc: usize,
    /// Valid outputs of the tile.
    pub cols: usize,
    pub accumulate: bool,
}

/// A register-tiled kernel of one ISA.
#[derive(Clone, Copy)]
pub(super) struct Kernel {
    pub name: &'static str,
    /// Tokens per tile and per packed token block.
    pub mr: usize,
    pub packing: Packing,
    /// Input channels per cache block (a multiple of 32, so a bf16 destination rounds on the
    /// device's 32-channel grid).
    pub kc: usize,
    pub tile: unsafe fn(&TileJob),
    pub decoder: Decoder,
}

/// The per-product part of [`Numerics`] the kernels apply.
#[derive(Clone, Copy, Debug)]
pub(super) struct Engine {
    /// Applied to every weight (math fidelity).
    pub weight_mask: u32,
    pub round_accumulators: bool,
}

impl Engine {
    pub const EXACT: Engine = Engine {
        weight_mask: u32::MAX,
        round_accumulators: false,
    };
}

/// What the device does to activations before a product: bf16 rounding (nearest even) and
/// the fidelity's mantissa mask.
#[derive(Clone, Copy, Debug)]
struct Rounding {
    bf16: bool,
    mask: u32,
}

impl Rounding {
    fn apply(self, v: f32) -> f32 {
        let v = if self.bf16 {
            formats::bf16::to_f32(formats::bf16::from_f32(v))
        } else {
            v
        };
        f32::from_bits(v.to_bits() & self.mask)
    }
}

/// `y[rows, w.n] = x[rows, w.k] · wᵀ`. The caller checks the shapes.
pub fn linear(x: &[f32], rows: usize, w: &PackedWeight) -> Vec<f32> {
    linear_with(x, rows, w, &Numerics::default())
}

/// [`linear`] with the device's numerics imitated as `numerics` says.
pub fn linear_with(x: &[f32], rows: usize, w: &PackedWeight, numerics: &Numerics) -> Vec<f32> {
    linear_on(kernel_for(w, numerics), x, rows, w, numerics)
}

/// Whether the activations a product sees are bf16 values (so bf16 dot products are exact).
fn bf16_activations(numerics: &Numerics) -> bool {
    numerics.bf16_activations || numerics.fidelity != Fidelity::Exact
}

/// The kernel for `w` under `numerics` on this process's ISA, or `None` for the portable path.
fn kernel_for(w: &PackedWeight, numerics: &Numerics) -> Option<&'static Kernel> {
    let bf16_weights = !matches!(w.data, PanelData::F32(_));
    match super::isa::isa() {
        #[cfg(target_arch = "x86_64")]
        super::isa::Isa::Avx512Bf16
            if bf16_weights && bf16_activations(numerics) && bf16_dot_enabled() =>
        {
            Some(&avx512_bf16::KERNEL)
        }
        #[cfg(target_arch = "x86_64")]
        super::isa::Isa::Avx512 | super::isa::Isa::Avx512Bf16 => Some(&avx512::KERNEL),
        #[cfg(target_arch = "x86_64")]
        super::isa::Isa::Avx2Fma => Some(&avx2::KERNEL),
        _ => None,
    }
}

/// Whether bf16 products use `vdpbf16ps` on this CPU: only with AVX512-BF16, and only where
/// it measures faster than the f32 FMA tile on the same operands (a few milliseconds, once per
/// process). `CLEF_CPU_BF16_DOT=on|off` decides instead.
pub fn bf16_dot_enabled() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        if super::isa::isa() < super::isa::Isa::Avx512Bf16 {
            return false;
        }
        match std::env::var("CLEF_CPU_BF16_DOT")
            .ok()
            .as_deref()
            .map(str::trim)
        {
            Some("on") => true,
            Some("off") => false,
            _ => bf16_dot_measures_faster(),
        }
    })
}

/// Times both AVX-512 kernels on one bf16 product (64 tokens x 1,024 x 1,024, best of three
/// each, interleaved) and says whether the dot-product one is at least 10% faster.
fn bf16_dot_measures_faster() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (rows, k, n) = (64, 1024, 1024);
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i % 89) as f32 - 44.0) / 512.0)
            .collect();
        let w = PackedWeight::pack(&crate::HostWeight::f32(n, k, w), crate::WeightFormat::Bf16);
        let numerics = Numerics {
            bf16_activations: true,
            ..Numerics::default()
        };
        let time = |kernel: &Kernel| {
            let t0 = std::time::Instant::now();
            std::hint::black_box(linear_on(Some(kernel), &x, rows, &w, &numerics));
            t0.elapsed()
        };
        let (mut fma, mut dot) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for _ in 0..3 {
            fma = fma.min(time(&avx512::KERNEL));
            dot = dot.min(time(&avx512_bf16::KERNEL));
        }
        return dot.as_secs_f64() * 1.1 <= fma.as_secs_f64();
    }
    #[allow(unreachable_code)]
    false
}

/// The kernel family a product of `w` under `numerics` runs on, for reports.
pub fn kernel_name(w: &PackedWeight, numerics: &Numerics) -> &'static str {
    kernel_for(w, numerics).map_or("portable gemm", |k| k.name)
}

/// [`linear_with`] on `kernel` (`None`: the portable path).
fn linear_on(
    kernel: Option<&Kernel>,
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
    let rounding = (!numerics.exact_matmul()).then_some(Rounding {
        bf16: bf16_activations(numerics),
        mask: activation_mask,
    });
    // The bf16 dot kernels round while they pack `x` (one pass over it); the others multiply
    // a rounded copy.
    let folded = matches!(kernel, Some(k) if k.packing == Packing::Bf16Pairs);
    let rounded;
    let x = match rounding {
        Some(r) if !folded => {
            rounded = x.par_iter().map(|&v| r.apply(v)).collect::<Vec<f32>>();
            &rounded[..]
        }
        _ => x,
    };
    let engine = Engine {
        weight_mask,
        round_accumulators: numerics.bf16_accumulation,
    };
    match kernel {
        Some(kernel) => blocked(kernel, x, rows, w, engine, rounding, &mut y),
        None => portable::product(x, rows, w, engine, &mut y),
    }
    y
}

/// Token blocks of `x` in a kernel's layout.
struct PackedRows {
    /// f32 values or u32 pairs, as 4-byte words.
    words: Vec<u32>,
    /// Words per token block.
    block_words: usize,
    mr: usize,
    packing: Packing,
}

impl PackedRows {
    /// Rows `x[rows, k]` in token blocks of `mr`, zero-padded; bf16 pairs are rounded by
    /// `rounding` on the way (their values must be bf16: it is `Some` for them).
    fn pack(
        x: &[f32],
        rows: usize,
        k: usize,
        mr: usize,
        packing: Packing,
        rounding: Option<Rounding>,
    ) -> Self {
        let depth = match packing {
            Packing::F32 => k,
            Packing::Bf16Pairs => pairs(k),
        };
        let block_words = depth * mr;
        let mut words = vec![0u32; rows.div_ceil(mr) * block_words];
        words
            .par_chunks_mut(block_words)
            .enumerate()
            .for_each(|(b, block)| {
                for r in 0..mr.min(rows - b * mr) {
                    let src = &x[(b * mr + r) * k..(b * mr + r + 1) * k];
                    match packing {
                        Packing::F32 => {
                            for (kk, v) in src.iter().enumerate() {
                                block[kk * mr + r] = v.to_bits();
                            }
                        }
                        Packing::Bf16Pairs => {
                            // Rounded to bf16: the high halves are the values.
                            let bits = |v: f32| rounding.map_or(v, |r| r.apply(v)).to_bits();
                            for (i, two) in src.chunks(2).enumerate() {
                                let hi = two.get(1).map_or(0, |&v| bits(v) & 0xFFFF_0000);
                                block[i * mr + r] = (bits(two[0]) >> 16) | hi;
                            }
                        }
                    }
                }
            });
        PackedRows {
            words,
            block_words,
            mr,
            packing,
        }
    }

    /// Token block `b` at input channel `k0` (even for pairs).
    fn at(&self, b: usize, k0: usize) -> *const u8 {
        let depth = match self.packing {
            Packing::F32 => k0,
            Packing::Bf16Pairs => k0 / 2,
        };
        self.words[b * self.block_words + depth * self.mr..].as_ptr() as *const u8
    }
}

/// The blocked product on `kernel` (see the module header); `rounding` is applied while packing
/// `x` for the bf16 dot kernels (the others get `x` rounded already).
fn blocked(
    kernel: &Kernel,
    x: &[f32],
    rows: usize,
    w: &PackedWeight,
    engine: Engine,
    rounding: Option<Rounding>,
    y: &mut [f32],
) {
    let k = w.k;
    let mr = kernel.mr;
    let bytes_per_row = 4 * match kernel.packing {
        Packing::F32 => k.min(kernel.kc),
        Packing::Bf16Pairs => pairs(k.min(kernel.kc)),
    };
    let mc = (X_BLOCK_BYTES / bytes_per_row / mr).max(1) * mr;
    let row_blocks = rows.div_ceil(mc);
    let out = SendPtr(y.as_mut_ptr());
    if rows * k * 4 > ROW_SPLIT_BYTES {
        // x does not stay in cache: each task takes a block of rows, lays out only those and
        // runs every panel over them, so x is read once and never copied whole.
        (0..row_blocks).into_par_iter().for_each(|rb| {
            let (r0, r1) = (rb * mc, ((rb + 1) * mc).min(rows));
            let local =
                PackedRows::pack(&x[r0 * k..r1 * k], r1 - r0, k, mr, kernel.packing, rounding);
            // SAFETY: each task writes only rows [r0, r1) of `y` (the pointer is moved to row
            // r0); shapes checked by the caller; the kernel's ISA was detected.
            unsafe {
                let y = out.ptr().add(r0 * w.n);
                unit(kernel, &local, 0, r1 - r0, w, 0..w.panels(), y, engine)
            };
        });
        return;
    }
    let packed = PackedRows::pack(x, rows, k, mr, kernel.packing, rounding);
    let threads = rayon::current_num_threads();
    let wanted = (4 * threads).div_ceil(row_blocks);
    let group = w.panels().div_ceil(wanted).clamp(1, MAX_GROUP);
    let groups = w.panels().div_ceil(group);
    (0..row_blocks * groups).into_par_iter().for_each(|u| {
        let (rb, g) = (u / groups, u % groups);
        let (r0, r1) = (rb * mc, ((rb + 1) * mc).min(rows));
        let panels = g * group..((g + 1) * group).min(w.panels());
        // SAFETY: each unit writes only rows [r0, r1) of the columns of its own panels (the
        // pointer is moved to row r0); the kernel's ISA was detected.
        unsafe {
            let y = out.ptr().add(r0 * w.n);
            unit(kernel, &packed, r0 / mr, r1 - r0, w, panels, y, engine)
        };
    });
}

/// One work unit: `rows` tokens from token block `first_block` of `xp` times `panels`, into
/// `y` (at the unit's first row).
#[allow(clippy::too_many_arguments)]
unsafe fn unit(
    kernel: &Kernel,
    xp: &PackedRows,
    first_block: usize,
    rows: usize,
    w: &PackedWeight,
    panels: std::ops::Range<usize>,
    y: *mut f32,
    engine: Engine,
) {
    let (n, k, mr) = (w.n, w.k, kernel.mr);
    // Block-format panels are decoded once per block of input channels into this buffer and
    // then shared by every token tile.
    let mut decoded_f32 = Vec::new();
    let mut decoded_pairs = Vec::new();
    if let PanelData::Blocks { .. } = w.data {
        match kernel.decoder {
            Decoder::F32(_) => decoded_f32 = vec![0.0f32; kernel.kc * PANEL],
            Decoder::Pairs(_) => decoded_pairs = vec![0u32; pairs(kernel.kc) * PANEL],
        }
    }
    let kp = pairs(k);
    let mut k0 = 0;
    while k0 < k {
        let kc = kernel.kc.min(k - k0);
        for p in panels.clone() {
            let b = match &w.data {
                PanelData::F32(d) => Weights::F32(d.as_ptr().add((p * k + k0) * PANEL)),
                PanelData::Bf16Pairs(d) => {
                    Weights::Pairs(d.as_ptr().add((p * kp + k0 / 2) * PANEL))
                }
                PanelData::Blocks {
                    format,
                    tiles,
                    tiles_per_row,
                } => {
                    let panel = BlockPanel {
                        format: *format,
                        tiles,
                        tiles_per_row: *tiles_per_row,
                        p,
                    };
                    match kernel.decoder {
                        Decoder::F32(decode) => {
                            decode(&panel, k0, kc, &mut decoded_f32);
                            Weights::F32(decoded_f32.as_ptr())
                        }
                        Decoder::Pairs(decode) => {
                            decode(&panel, k0, kc, &mut decoded_pairs);
                            Weights::Pairs(decoded_pairs.as_ptr())
                        }
                    }
                }
            };
            let cols = PANEL.min(n - p * PANEL);
            for t in 0..rows.div_ceil(mr) {
                let job = TileJob {
                    a: xp.at(first_block + t, k0),
                    rows: mr.min(rows - t * mr),
                    b,
                    kc,
                    c: y.add(t * mr * n + p * PANEL),
                    ldc: n,
                    cols,
                    accumulate: k0 > 0,
                    engine,
                };
                (kernel.tile)(&job);
            }
        }
        k0 += kc;
    }
}

impl BlockPanel<'_> {
    /// Channels `k0..k0 + kc` as f32 rows `[kc, PANEL]` (any CPU).
    fn decode_rows(&self, k0: usize, kc: usize, out: &mut [f32]) {
        panels::decode_block_rows(
            self.format,
            self.tiles,
            self.tiles_per_row,
            self.p,
            k0,
            kc,
            out,
        );
    }
}

/// [`BlockPanel::decode_rows`] as a kernel's decoder (CPUs without a vector decoder).
unsafe fn decode_rows_portable(panel: &BlockPanel, k0: usize, kc: usize, out: &mut [f32]) {
    panel.decode_rows(k0, kc, out);
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
        for k0 in (0..k).step_by(SMALL_KC) {
            let kc = SMALL_KC.min(k - k0);
            for r0 in (0..m).step_by(height) {
                tile(r0, height.min(m - r0), j0, cols, k0, kc);
            }
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
mod tests;
