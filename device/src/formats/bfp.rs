//! The block floating point formats bfp8_b and bfp4_b: 16 values share the largest of their
//! fp32 exponent fields; each keeps a sign and a W-bit magnitude with the hidden bit explicit
//! (W = 7 or 3), aligned to the shared exponent by a truncating shift, then rounded to
//! nearest-even and saturated at 2^W − 1 (no carry into the exponent). fp32 subnormals and
//! zeros encode as 0 with the sign cleared. Decoding is `±m · 2^(e − 127 − (W − 1))`; a block
//! whose exponent is 255 (an Inf or NaN was in it) decodes as ttnn's `to_list()` does.

/// A block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    Bfp8,
    Bfp4,
}

impl BlockFormat {
    /// Magnitude bits W (hidden bit included).
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            BlockFormat::Bfp8 => 7,
            BlockFormat::Bfp4 => 3,
        }
    }

    /// Bytes of the 16 codes of one block.
    pub const fn code_bytes(self) -> usize {
        match self {
            BlockFormat::Bfp8 => 16,
            BlockFormat::Bfp4 => 8,
        }
    }

    /// Bytes of one packed 32x32 tile: 64 exponents and 64 blocks of codes.
    pub const fn tile_bytes(self) -> usize {
        super::BLOCKS_PER_TILE * (1 + self.code_bytes())
    }

    /// `2^(e − 127 − (W − 1))`, the weight of magnitude 1 under shared exponent `e`, as f32
    /// (exact: subnormal below the normal range). For e = 255 it is the finite power; only
    /// [`BlockFormat::value`] gives ttnn's Inf/NaN reading of such blocks.
    pub fn scale(self, e: u8) -> f32 {
        let shift = self.mantissa_bits() - 1;
        let e = u32::from(e);
        if e > shift {
            f32::from_bits((e - shift) << 23)
        } else {
            f32::from_bits(1 << (e + 22 - shift))
        }
    }

    /// The shared exponent and the 16 `sign << W | m` codes of a block.
    pub fn encode(self, values: &[f32; 16]) -> (u8, [u8; 16]) {
        let w = self.mantissa_bits();
        let exp_of = |v: f32| ((v.to_bits() >> 23) & 0xFF) as u8;
        let shared = values.iter().map(|v| exp_of(*v)).max().unwrap_or(0);
        let mut codes = [0u8; 16];
        for (code, v) in codes.iter_mut().zip(values) {
            let bits = v.to_bits();
            let e = exp_of(*v);
            if bits & 0x7FFF_FFFF == 0 || e == 0 {
                continue; // zero or flushed subnormal: 0 with the sign cleared
            }
            let mut m = (1u32 << 23) | (bits & 0x7F_FFFF);
            let shift = u32::from(shared - e);
            m = if shift >= 32 { 0 } else { m >> shift };
            let drop = 24 - w;
            let rest = m & ((1 << drop) - 1);
            m >>= drop;
            let tie = 1 << (drop - 1);
            if rest > tie || (rest == tie && m & 1 == 1) {
                m += 1;
            }
            m = m.min((1 << w) - 1);
            if m != 0 {
                *code = (((bits >> 31) as u8) << w) | m as u8;
            }
        }
        (shared, codes)
    }

    /// The value of one code under shared exponent `exp`.
    pub fn value(self, exp: u8, code: u8) -> f32 {
        let w = self.mantissa_bits();
        let m = u32::from(code) & ((1 << w) - 1);
        let negative = code >> w & 1 == 1;
        let magnitude = if exp == 255 && m != 0 {
            if m == 1 << (w - 1) {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else {
            (f64::from(m) * 2f64.powi(i32::from(exp) - 127 - (w as i32 - 1))) as f32
        };
        if negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The 16 values of a block.
    pub fn decode(self, exp: u8, codes: &[u8; 16]) -> [f32; 16] {
        codes.map(|c| self.value(exp, c))
    }

    /// Append a block's codes in tile byte order (bfp4: element 2i in the low nibble).
    pub fn write_codes(self, codes: &[u8; 16], out: &mut Vec<u8>) {
        match self {
            BlockFormat::Bfp8 => out.extend_from_slice(codes),
            BlockFormat::Bfp4 => out.extend(codes.chunks(2).map(|p| (p[0] & 0x0F) | (p[1] << 4))),
        }
    }

    /// The codes of block `b` of a packed tile.
    pub fn read_codes(self, tile: &[u8], b: usize) -> [u8; 16] {
        let start = super::BLOCKS_PER_TILE + b * self.code_bytes();
        let raw = &tile[start..start + self.code_bytes()];
        let mut codes = [0u8; 16];
        match self {
            BlockFormat::Bfp8 => codes.copy_from_slice(raw),
            BlockFormat::Bfp4 => {
                for (i, byte) in raw.iter().enumerate() {
                    codes[2 * i] = byte & 0x0F;
                    codes[2 * i + 1] = byte >> 4;
                }
            }
        }
        codes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturates_instead_of_carrying_into_the_exponent() {
        let mut block = [0.0f32; 16];
        block[0] = f32::from_bits(0x3FFF_FFFF); // 1.99999988
        let (e, codes) = BlockFormat::Bfp8.encode(&block);
        assert_eq!((e, codes[0]), (127, 127));
        let (e, codes) = BlockFormat::Bfp4.encode(&block);
        assert_eq!((e, codes[0]), (127, 7));
        assert_eq!(BlockFormat::Bfp8.value(127, 127), 1.984375);
        assert_eq!(BlockFormat::Bfp4.value(127, 7), 1.75);
    }

    #[test]
    fn small_members_lose_bits_and_subnormals_flush() {
        let mut block = [0.0f32; 16];
        block[0] = 1.0;
        block[1] = -0.25;
        block[2] = f32::from_bits(1); // subnormal
        block[3] = -0.0;
        let (e, codes) = BlockFormat::Bfp8.encode(&block);
        assert_eq!(e, 127);
        assert_eq!(codes[0], 64);
        assert_eq!(codes[1], 0x80 | 16);
        assert_eq!(codes[2], 0);
        assert_eq!(codes[3], 0);
        assert_eq!(BlockFormat::Bfp8.decode(e, &codes)[1], -0.25);
    }

    #[test]
    fn the_scale_is_the_decode_of_magnitude_one() {
        for format in [BlockFormat::Bfp8, BlockFormat::Bfp4] {
            for e in 0..=254u8 {
                assert_eq!(format.scale(e), format.value(e, 1), "{format:?} e={e}");
            }
        }
    }
}
