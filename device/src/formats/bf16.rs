//! fp32 → bf16 as ttnn's host conversion does it: round to nearest, ties to even (overflow
//! rounds to ±Inf, subnormals are rounded like any value), and every NaN becomes 0x7FC0.

/// The bf16 bit pattern of `v`.
pub fn from_f32(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FC0;
    }
    let bits = v.to_bits();
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// The f32 value of a bf16 bit pattern (exact).
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even_and_canonicalises_nan() {
        assert_eq!(from_f32(1.0), 0x3F80);
        assert_eq!(from_f32(f32::from_bits(0x3F808000)), 0x3F80); // tie, even stays
        assert_eq!(from_f32(f32::from_bits(0x3F818000)), 0x3F82); // tie, odd rounds up
        assert_eq!(from_f32(f32::MAX), 0x7F80);
        assert_eq!(from_f32(-f32::MAX), 0xFF80);
        assert_eq!(from_f32(f32::from_bits(0xFFC0_0001)), 0x7FC0);
        assert_eq!(from_f32(f32::from_bits(0x7FFF_FFFF)), 0x7FC0);
        assert_eq!(from_f32(f32::from_bits(0x0000_8000)), 0x0000); // subnormal tie to even
        assert_eq!(to_f32(0x3FC0), 1.5);
    }
}
