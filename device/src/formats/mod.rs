//! Tenstorrent tile formats on the host: f32, bf16, bfp8_b and bfp4_b packed exactly as ttnn's
//! host conversion does (Tenstorrent's documentation, checked against ttnn's own bytes in
//! `tests/fixtures/bfp/`).
//!
//! A matrix is padded with zeros to whole 32x32 tiles, tiles follow each other in row-major
//! tile order, and inside a tile four 16x16 faces (top-left, top-right, bottom-left,
//! bottom-right) each row-major. In the block formats a block is one 16-element face row: it
//! shares one exponent byte; a tile is its 64 exponents then its sign|mantissa codes in the
//! same block order (`bfp`).

pub mod bf16;
pub mod bfp;

pub use bfp::BlockFormat;

/// Rows and columns of a tile.
pub const TILE: usize = 32;
/// Rows and columns of a face.
pub const FACE: usize = 16;
/// Blocks (face rows) per tile.
pub const BLOCKS_PER_TILE: usize = 64;

/// How the values of a tile are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileFormat {
    F32,
    Bf16,
    Bfp8,
    Bfp4,
}

impl TileFormat {
    pub fn name(self) -> &'static str {
        match self {
            TileFormat::F32 => "f32",
            TileFormat::Bf16 => "bf16",
            TileFormat::Bfp8 => "bfp8_b",
            TileFormat::Bfp4 => "bfp4_b",
        }
    }

    /// The tile format a weight format is held in on a Tenstorrent device.
    pub fn of(format: crate::WeightFormat) -> Self {
        match format {
            crate::WeightFormat::F32 => TileFormat::F32,
            crate::WeightFormat::Bf16 => TileFormat::Bf16,
            crate::WeightFormat::Bfp8 => TileFormat::Bfp8,
            crate::WeightFormat::Bfp4 => TileFormat::Bfp4,
        }
    }

    /// Bytes of one packed tile: 4096 (f32), 2048 (bf16), 1088 (bfp8_b), 576 (bfp4_b).
    pub fn tile_bytes(self) -> usize {
        match self {
            TileFormat::F32 => TILE * TILE * 4,
            TileFormat::Bf16 => TILE * TILE * 2,
            TileFormat::Bfp8 => BLOCKS_PER_TILE + TILE * TILE,
            TileFormat::Bfp4 => BLOCKS_PER_TILE + TILE * TILE / 2,
        }
    }

    fn block(self) -> Option<BlockFormat> {
        match self {
            TileFormat::F32 | TileFormat::Bf16 => None,
            TileFormat::Bfp8 => Some(BlockFormat::Bfp8),
            TileFormat::Bfp4 => Some(BlockFormat::Bfp4),
        }
    }
}

/// Why packed tiles cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("{format}: {got} bytes for a {rows}x{cols} matrix, expected {want}")]
    Size {
        format: &'static str,
        rows: usize,
        cols: usize,
        got: usize,
        want: usize,
    },
}

/// Tiles covering `n` rows or columns.
pub fn tiles_for(n: usize) -> usize {
    n.div_ceil(TILE)
}

/// Bytes of a `[rows, cols]` matrix packed in `format`.
pub fn packed_bytes(rows: usize, cols: usize, format: TileFormat) -> usize {
    tiles_for(rows) * tiles_for(cols) * format.tile_bytes()
}

/// Block `b` (0..64) of a tile: its first element's (row, column) inside the tile.
pub fn block_origin(b: usize) -> (usize, usize) {
    let (face, row) = (b / FACE, b % FACE);
    ((face / 2) * FACE + row, (face % 2) * FACE)
}

/// The 16 values of every block of tile `(tr, tc)` of a row-major `[rows, cols]` matrix, in
/// block order (zeros where the tile passes the matrix).
fn tile_blocks(values: &[f32], rows: usize, cols: usize, tr: usize, tc: usize) -> [[f32; 16]; 64] {
    let mut out = [[0.0f32; 16]; 64];
    for (b, block) in out.iter_mut().enumerate() {
        let (r0, c0) = block_origin(b);
        let r = tr * TILE + r0;
        if r >= rows {
            continue;
        }
        for (j, v) in block.iter_mut().enumerate() {
            let c = tc * TILE + c0 + j;
            if c < cols {
                *v = values[r * cols + c];
            }
        }
    }
    out
}

/// Pack a row-major `[rows, cols]` matrix into tiles of `format`.
pub fn pack(values: &[f32], rows: usize, cols: usize, format: TileFormat) -> Vec<u8> {
    debug_assert_eq!(values.len(), rows * cols);
    let (tiles_r, tiles_c) = (tiles_for(rows), tiles_for(cols));
    let mut out = Vec::with_capacity(packed_bytes(rows, cols, format));
    for tr in 0..tiles_r {
        for tc in 0..tiles_c {
            let blocks = tile_blocks(values, rows, cols, tr, tc);
            match format.block() {
                None if format == TileFormat::F32 => {
                    for v in blocks.iter().flatten() {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
                None => {
                    for v in blocks.iter().flatten() {
                        out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes());
                    }
                }
                Some(block) => {
                    let encoded: Vec<(u8, [u8; 16])> =
                        blocks.iter().map(|b| block.encode(b)).collect();
                    out.extend(encoded.iter().map(|(e, _)| *e));
                    for (_, codes) in &encoded {
                        block.write_codes(codes, &mut out);
                    }
                }
            }
        }
    }
    out
}

/// Decode tiles of `format` back to a row-major `[rows, cols]` matrix (padding dropped).
pub fn unpack(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    format: TileFormat,
) -> Result<Vec<f32>, FormatError> {
    let want = packed_bytes(rows, cols, format);
    if bytes.len() != want {
        return Err(FormatError::Size {
            format: format.name(),
            rows,
            cols,
            got: bytes.len(),
            want,
        });
    }
    let tiles_c = tiles_for(cols);
    let mut out = vec![0.0f32; rows * cols];
    for (t, tile) in bytes.chunks_exact(format.tile_bytes()).enumerate() {
        let (tr, tc) = (t / tiles_c, t % tiles_c);
        for b in 0..BLOCKS_PER_TILE {
            let values = match format.block() {
                None if format == TileFormat::F32 => {
                    let mut v = [0.0f32; 16];
                    for (j, x) in v.iter_mut().enumerate() {
                        let at = (b * 16 + j) * 4;
                        *x = f32::from_le_bytes([
                            tile[at],
                            tile[at + 1],
                            tile[at + 2],
                            tile[at + 3],
                        ]);
                    }
                    v
                }
                None => {
                    let mut v = [0.0f32; 16];
                    for (j, x) in v.iter_mut().enumerate() {
                        let at = (b * 16 + j) * 2;
                        *x = bf16::to_f32(u16::from_le_bytes([tile[at], tile[at + 1]]));
                    }
                    v
                }
                Some(block) => block.decode(tile[b], &block.read_codes(tile, b)),
            };
            let (r0, c0) = block_origin(b);
            let r = tr * TILE + r0;
            if r >= rows {
                continue;
            }
            for (j, v) in values.iter().enumerate() {
                let c = tc * TILE + c0 + j;
                if c < cols {
                    out[r * cols + c] = *v;
                }
            }
        }
    }
    Ok(out)
}
