//! The tile packer against ttnn's own bytes (`tests/fixtures/bfp/`): for every matrix, bf16,
//! bfp8_b and bfp4_b tiles must equal ttnn's bit for bit, and decoding them must give ttnn's
//! decoded values (NaN where ttnn has NaN).

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::formats::{pack, unpack, TileFormat};
use clef_device::{MeshOps, MeshShape, WeightFormat, WeightKind};
use clef_tt::backbone::plan::MixerPlan;
use clef_tt::backbone::{device_parts, TpPlan};
use clef_tt::checkpoint::Checkpoint;
use safetensors::SafeTensors;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The host shim's C++ decoder (written independently from Tenstorrent's documentation) reads
/// ttnn's own tile bytes, uploaded as matrices, back to ttnn's decoded values (NaN where ttnn
/// has NaN).
#[test]
fn the_host_shim_decodes_ttnn_tiles_to_ttnn_values() {
    use clef_device::{SharedBytes, WeightBytes};
    let dir = common::fixtures().join("bfp");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("bfp_fixtures.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mesh = common::tt_mesh(MeshShape::ONE, Default::default());
    let mut checked = 0;
    for (name, m) in manifest["matrices"].as_object().unwrap() {
        let (rows, cols) = (
            m["shape"][0].as_u64().unwrap() as usize,
            m["shape"][1].as_u64().unwrap() as usize,
        );
        for (format, key) in [
            (WeightFormat::Bf16, "bf16"),
            (WeightFormat::Bfp8, "bfp8_b"),
            (WeightFormat::Bfp4, "bfp4_b"),
        ] {
            let tiles = st.tensor(&format!("{name}.{key}.tiles")).unwrap();
            // A weight's tiles are [in, out]: the fixture's [rows, cols] is rows inputs of
            // cols outputs.
            let w = mesh
                .import_weight(vec![WeightBytes {
                    kind: WeightKind::Matrix,
                    format,
                    rows: cols,
                    cols: rows,
                    data: SharedBytes::owned(tiles.data().to_vec()),
                }])
                .unwrap();
            let decoded = mesh.download_weight(&w, 0).unwrap();
            assert_eq!((decoded.rows, decoded.cols), (rows, cols));
            let ttnn = f32s(st.tensor(&format!("{name}.{key}.decoded")).unwrap().data());
            for (i, (a, b)) in decoded.data.iter().zip(&ttnn).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{name} {key}: element {i} decodes to {a}, ttnn {b}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 15);
}

#[test]
fn packed_tiles_equal_ttnn_bytes_and_decode_to_ttnn_values() {
    let dir = common::fixtures().join("bfp");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("bfp_fixtures.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let matrices = manifest["matrices"].as_object().unwrap();
    assert_eq!(matrices.len(), 5);
    let mut checked = 0;
    for (name, m) in matrices {
        let (rows, cols) = (
            m["shape"][0].as_u64().unwrap() as usize,
            m["shape"][1].as_u64().unwrap() as usize,
        );
        let input = f32s(st.tensor(&format!("{name}.input")).unwrap().data());
        for (format, key) in [
            (TileFormat::Bf16, "bf16"),
            (TileFormat::Bfp8, "bfp8_b"),
            (TileFormat::Bfp4, "bfp4_b"),
        ] {
            let want = st.tensor(&format!("{name}.{key}.tiles")).unwrap();
            let got = pack(&input, rows, cols, format);
            assert_eq!(got.len(), want.data().len(), "{name} {key}: size");
            let tile = format.tile_bytes();
            for (t, (g, w)) in got.chunks(tile).zip(want.data().chunks(tile)).enumerate() {
                if let Some(i) = g.iter().zip(w).position(|(a, b)| a != b) {
                    panic!("{name} {key}: tile {t} byte {i}: {} vs ttnn {}", g[i], w[i]);
                }
            }
            let decoded = unpack(want.data(), rows, cols, format).unwrap();
            let ttnn = f32s(st.tensor(&format!("{name}.{key}.decoded")).unwrap().data());
            for (i, (a, b)) in decoded.iter().zip(&ttnn).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{name} {key}: element {i} decodes to {a}, ttnn {b}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 15);
}

/// Found by the `bfp` fuzz target: a block holding an infinity takes exponent 255, and ttnn
/// reads every non-zero code of such a block as Inf/NaN, large finite neighbours included; a block of
/// finite values up to f32::MAX stays finite and packs back to the same bytes.
#[test]
fn a_non_finite_value_poisons_its_block_and_finite_extremes_round_trip() {
    for format in [TileFormat::Bfp8, TileFormat::Bfp4] {
        let mut m = vec![0.0f32; 32 * 32];
        m[0] = f32::INFINITY;
        m[1] = -2.355_287_7e38;
        m[2] = 1.0;
        let decoded = unpack(&pack(&m, 32, 32, format), 32, 32, format).unwrap();
        assert!(decoded[0].is_infinite(), "{format:?}");
        assert!(!decoded[1].is_finite(), "{format:?}: {}", decoded[1]);
        // 1.0 is shifted out under exponent 255 (code 0), and zero codes stay zero.
        assert_eq!((decoded[2], decoded[3]), (0.0, 0.0), "{format:?}");

        m[0] = f32::MAX;
        let bytes = pack(&m, 32, 32, format);
        let decoded = unpack(&bytes, 32, 32, format).unwrap();
        assert!(decoded.iter().all(|v| v.is_finite()), "{format:?}");
        assert_eq!(pack(&decoded, 32, 32, format), bytes, "{format:?}");
    }
}

#[test]
fn a_wrong_byte_count_is_refused() {
    let err = unpack(&[0u8; 100], 32, 32, TileFormat::Bfp8).unwrap_err();
    assert!(err.to_string().contains("expected 1088"), "{err}");
}

#[test]
fn fused_weights_are_split_per_device_then_quantised_as_in_out() {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let plan = TpPlan::new(&ckpt.config.text, 2).unwrap();
    let in_proj = plan
        .layers
        .iter()
        .find_map(|l| match &l.mixer {
            MixerPlan::DeltaNet { in_proj, .. } => Some(in_proj.clone()),
            _ => None,
        })
        .unwrap();
    // Each device's fused [q, k, v, z, b, a] rows, assembled first.
    let parts = device_parts(&ckpt.tensors, &in_proj, 2).unwrap();
    let mesh = CpuMesh::new(MeshShape::PAIR);
    for (format, tile) in [
        (WeightFormat::Bfp8, TileFormat::Bfp8),
        (WeightFormat::Bfp4, TileFormat::Bfp4),
    ] {
        let placed = mesh
            .upload_weight(parts.clone(), format, WeightKind::Matrix)
            .unwrap();
        for (d, part) in parts.iter().enumerate() {
            let (out, inp) = (part.rows, part.cols);
            let values = part.to_f32();
            let mut kn = vec![0.0f32; inp * out];
            for o in 0..out {
                for i in 0..inp {
                    kn[i * out + o] = values[o * inp + i];
                }
            }
            let held = placed.matrix(d).unwrap().block_tiles().unwrap();
            assert_eq!(
                held,
                pack(&kn, inp, out, tile).as_slice(),
                "device {d} {format:?}"
            );
        }
    }
}
