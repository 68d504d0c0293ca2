//! Weights as the matmul kernels read them: packed once, at upload, into panels of [`PANEL`]
//! output channels in their own format (a bf16 or bfp weight is never widened in memory).
//!
//! - f32: `[in, PANEL]` per panel.
//! - bf16: `[ceil(in / 2), PANEL, 2]` per panel: the two bf16 of consecutive input channels
//!   `2i, 2i + 1` of one output share a 32-bit word (the even channel in the low half), which
//!   is the operand order of AVX512-BF16's `vdpbf16ps`; the f32 kernels widen a word's halves
//!   with a shift and a mask, no shuffle.
//! - bfp8_b / bfp4_b: the device's own tiles (`[in, out]` in ttnn's 32x32 tiles), a panel being a
//!   tile column, decoded per block of input channels by the kernels.

use crate::formats::{self, BlockFormat, TileFormat};
use crate::{HostWeight, SharedBytes, WeightData, WeightFormat};
use rayon::prelude::*;

/// Output channels per panel (two AVX-512 vectors of f32).
pub const PANEL: usize = 32;

/// Plain little-endian values a panel can hold.
pub(super) trait Plain: Copy + PartialEq + std::fmt::Debug {
    fn from_le(bytes: &[u8]) -> Self;
}

impl Plain for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Plain for u32 {
    fn from_le(b: &[u8]) -> Self {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
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
pub(super) enum Held<T: Plain> {
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
            // of T, and little-endian like T's in-memory form; T is plain data (f32, u32, u8)
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
pub(super) enum PanelData {
    F32(Held<f32>),
    /// bf16 bit patterns in pairs of input channels (see the module header).
    Bf16Pairs(Held<u32>),
    /// The weight as `[K = in, N = out]` in ttnn's bfp8_b / bfp4_b tiles (the device's bytes):
    /// a panel is a tile column, each panel row two blocks of 16 outputs.
    Blocks {
        format: BlockFormat,
        tiles: Held<u8>,
        /// Tiles per tile row (`ceil(n / 32)`).
        tiles_per_row: usize,
    },
}

/// Pairs of input channels of a `k`-channel weight (the last one half zero when `k` is odd).
pub(super) fn pairs(k: usize) -> usize {
    k.div_ceil(2)
}

/// `[n, k]` row-major values laid out as `ceil(n/PANEL)` panels of `[k, PANEL]`, zero-padded.
fn into_panels(src: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; n.div_ceil(PANEL) * k * PANEL];
    for (row, values) in src.chunks(k).enumerate().take(n) {
        let (p, j) = (row / PANEL, row % PANEL);
        for (kk, v) in values.iter().enumerate() {
            out[(p * k + kk) * PANEL + j] = *v;
        }
    }
    out
}

/// `[n, k]` row-major bf16 bits laid out as `ceil(n/PANEL)` panels of `[ceil(k/2), PANEL]`
/// channel pairs, zero-padded.
fn into_pair_panels(bits: &[u16], n: usize, k: usize) -> Vec<u32> {
    let kp = pairs(k);
    let mut out = vec![0u32; n.div_ceil(PANEL) * kp * PANEL];
    out.par_chunks_mut(kp * PANEL)
        .enumerate()
        .for_each(|(p, panel)| {
            for j in 0..PANEL.min(n - p * PANEL) {
                let row = &bits[(p * PANEL + j) * k..(p * PANEL + j + 1) * k];
                for (i, two) in row.chunks(2).enumerate() {
                    let hi = two.get(1).copied().unwrap_or(0);
                    panel[i * PANEL + j] = u32::from(two[0]) | (u32::from(hi) << 16);
                }
            }
        });
    out
}

/// A weight `[n, k]` packed as `ceil(n/PANEL)` panels (zero-padded columns).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    pub n: usize,
    pub k: usize,
    pub(super) data: PanelData,
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
                    WeightData::F32(v) => v.iter().map(|&f| formats::bf16::from_f32(f)).collect(),
                };
                PanelData::Bf16Pairs(Held::Owned(into_pair_panels(&bits, n, k)))
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
            PanelData::Bf16Pairs(_) => WeightFormat::Bf16,
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
            PanelData::Bf16Pairs(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
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
        let panels = n.div_ceil(PANEL);
        let data = match format {
            WeightFormat::F32 => (bytes.len() == panels * k * PANEL * 4)
                .then(|| PanelData::F32(Held::from_bytes(bytes)))?,
            WeightFormat::Bf16 => (bytes.len() == panels * pairs(k) * PANEL * 4)
                .then(|| PanelData::Bf16Pairs(Held::from_bytes(bytes)))?,
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
            PanelData::Bf16Pairs(v) => v.len() * 4,
            PanelData::Blocks { tiles, .. } => tiles.len(),
        }
    }

    pub(super) fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
}

/// Input channels `k0..k0 + kc` of panel `p` of a block-format weight decoded to `[kc, PANEL]`
/// f32 (any CPU; the AVX-512 kernels decode with vector code instead).
pub(super) fn decode_block_rows(
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

/// f32 rows `[kc, PANEL]` (bf16-exact values: decoded bfp blocks) as bf16 channel pairs
/// `[ceil(kc/2), PANEL]`; an odd last channel pairs with zeros.
pub(super) fn rows_to_pairs(rows: &[f32], kc: usize, out: &mut [u32]) {
    for i in 0..pairs(kc) {
        for j in 0..PANEL {
            let even = rows[2 * i * PANEL + j].to_bits() >> 16;
            let odd = if 2 * i + 1 < kc {
                rows[(2 * i + 1) * PANEL + j].to_bits() & 0xFFFF_0000
            } else {
                0
            };
            out[i * PANEL + j] = even | odd;
        }
    }
}
