//! The bfp8_b / bfp4_b / bf16 packers on arbitrary f32 bit patterns (NaN, infinities,
//! subnormals included) and on arbitrary tile bytes: packing gives the advertised byte count, decoding gives finite values
//! for a finite matrix, and packing what was decoded gives the same bytes (a fixed point).
#![no_main]

use clef_device::formats::{pack, packed_bytes, unpack, TileFormat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let rows = 1 + data[0] as usize % 40;
    let values: Vec<f32> = data[1..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if values.is_empty() {
        return;
    }
    let cols = values.len().div_ceil(rows);
    let mut m = values.clone();
    m.resize(rows * cols, 0.0);
    for format in [TileFormat::Bf16, TileFormat::Bfp8, TileFormat::Bfp4] {
        // Arbitrary tile bytes (any exponent, any code) decode without panicking.
        let mut raw = data[1..].to_vec();
        raw.resize(format.tile_bytes(), 0);
        assert_eq!(
            unpack(&raw, 32, 32, format).map(|v| v.len()).ok(),
            Some(1024)
        );
        let bytes = pack(&m, rows, cols, format);
        assert_eq!(bytes.len(), packed_bytes(rows, cols, format));
        let decoded = unpack(&bytes, rows, cols, format).expect("packed size");
        assert_eq!(decoded.len(), rows * cols);
        // A block holding Inf or NaN takes exponent 255, which reads as Inf/NaN for all of the
        // block (ttnn's rule), so finiteness is only promised for a finite matrix.
        if format != TileFormat::Bf16 && m.iter().all(|x| x.is_finite()) {
            assert!(decoded.iter().all(|d| d.is_finite()), "{format:?}");
        }
        if decoded.iter().all(|d| d.is_finite()) {
            assert_eq!(pack(&decoded, rows, cols, format), bytes, "{format:?}");
        }
    }
});
