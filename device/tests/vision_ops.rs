//! The vision tower's ops on the CPU mesh against independent f64 computations, on one device
//! and split over two (heads sharded), and their shape checks.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::{
    DeviceError, GatherAxis, Gelu, HostTensor, HostWeight, MeshOps, MeshShape, WeightFormat,
    WeightKind,
};
use common::values;

fn vector(mesh: &CpuMesh, v: &[f32]) -> <CpuMesh as MeshOps>::Weight {
    let part = HostWeight::f32(v.len(), 1, v.to_vec());
    mesh.upload_weight(
        vec![part; mesh.mesh().devices()],
        WeightFormat::F32,
        WeightKind::Vector,
    )
    .unwrap()
}

/// Softmax attention of each row over the rows of its segment, per head, in f64.
fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    d: usize,
    segments: &[std::ops::Range<usize>],
) -> Vec<f64> {
    let width = heads * d;
    let at = |x: &[f32], row: usize, h: usize, c: usize| f64::from(x[row * width + h * d + c]);
    let mut out = vec![0.0f64; q.len()];
    for seg in segments {
        for i in seg.clone() {
            for h in 0..heads {
                let scores: Vec<f64> = seg
                    .clone()
                    .map(|j| (0..d).map(|c| at(q, i, h, c) * at(k, j, h, c)).sum::<f64>())
                    .map(|s| s / (d as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (j, s) in seg.clone().zip(&scores) {
                    let p = (s - max).exp() / total;
                    for c in 0..d {
                        out[i * width + h * d + c] += p * at(v, j, h, c);
                    }
                }
            }
        }
    }
    out
}

/// Each device's block of heads as its shard.
fn head_shards(x: &[f32], rows: usize, width: usize, devices: usize) -> Vec<HostTensor> {
    let per = width / devices;
    (0..devices)
        .map(|dev| {
            let data = x
                .chunks(width)
                .flat_map(|r| &r[dev * per..(dev + 1) * per])
                .copied()
                .collect();
            HostTensor::new(rows, per, data)
        })
        .collect()
}

fn gathered(mesh: &CpuMesh, t: &<CpuMesh as MeshOps>::Tensor) -> HostTensor {
    mesh.gather(t, GatherAxis::Cols).unwrap()
}

#[test]
fn segment_attention_sees_only_its_segment_on_one_and_two_devices() {
    let (rows, heads, d) = (300, 4, 8);
    let width = heads * d;
    let segments = vec![0..20, 20..280, 280..300];
    let (q, k, v) = (
        values(rows * width, 1),
        values(rows * width, 2),
        values(rows * width, 3),
    );
    let want = attention_f64(&q, &k, &v, heads, d, &segments);
    // The op's list: each segment's first row and end row.
    let bounds = |s: &[std::ops::Range<usize>]| -> Vec<u32> {
        s.iter()
            .flat_map(|r| [r.start as u32, r.end as u32])
            .collect()
    };
    for shape in [MeshShape::ONE, MeshShape::PAIR] {
        let mesh = CpuMesh::new(shape);
        let n = shape.devices();
        let put = |x: &[f32]| mesh.shard(head_shards(x, rows, width, n)).unwrap();
        let out = mesh
            .segment_attention(
                &put(&q),
                &put(&k),
                &put(&v),
                heads / n,
                d,
                &bounds(&segments),
            )
            .unwrap();
        let worst = gathered(&mesh, &out)
            .data
            .iter()
            .zip(&want)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "{shape}: off by {worst}");
    }
    // The segments must tile the rows in order.
    let mesh = CpuMesh::new(MeshShape::ONE);
    let t = mesh.replicate(&HostTensor::new(rows, width, q)).unwrap();
    let short: Vec<std::ops::Range<usize>> = std::iter::once(0..299).collect();
    for bad in [vec![0..20, 21..300], short, vec![0..0, 0..300]] {
        let e = mesh
            .segment_attention(&t, &t, &t, heads, d, &bounds(&bad))
            .unwrap_err();
        assert!(matches!(e, DeviceError::Shape { .. }), "{bad:?}");
    }
}

#[test]
fn layer_norm_bias_gelu_rotary_and_fold_match_their_definitions() {
    let mesh = CpuMesh::new(MeshShape::ONE);
    let (rows, cols) = (5, 16);
    let x: Vec<f32> = values(rows * cols, 7)
        .iter()
        .map(|v| v * 3.0 + 0.5)
        .collect();
    let (w, b) = (values(cols, 8), values(cols, 9));
    let t = mesh
        .replicate(&HostTensor::new(rows, cols, x.clone()))
        .unwrap();
    // LayerNorm.
    let normed = mesh
        .layer_norm(&t, &vector(&mesh, &w), &vector(&mesh, &b), 1e-6)
        .unwrap();
    let normed = gathered(&mesh, &normed);
    for r in 0..rows {
        let row: Vec<f64> = x[r * cols..(r + 1) * cols]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            let want = (row[c] - mean) / (var + 1e-6).sqrt() * f64::from(w[c]) + f64::from(b[c]);
            assert!((f64::from(normed.data[r * cols + c]) - want).abs() < 1e-5);
        }
    }
    // Bias on every row.
    let biased = gathered(&mesh, &mesh.add_bias(&t, &vector(&mesh, &b)).unwrap());
    assert_eq!(biased.data[cols + 3], x[cols + 3] + b[3]);
    // Exact GELU: gelu(x) - gelu(-x) = x Φ(x) + x (1 - Φ(x)) = x.
    let neg = mesh
        .replicate(&HostTensor::new(rows, cols, x.iter().map(|v| -v).collect()))
        .unwrap();
    let g = gathered(&mesh, &mesh.gelu(&t, Gelu::Erf).unwrap());
    let gn = gathered(&mesh, &mesh.gelu(&neg, Gelu::Erf).unwrap());
    for ((p, n), v) in g.data.iter().zip(&gn.data).zip(&x) {
        assert!((p - n - v).abs() < 1e-5);
    }
    // Rotary: a quarter turn moves x[j] to -x[j+half] and x[j+half] to x[j] in every head; no
    // turn leaves x as it is.
    let (heads, d) = (2, 8);
    let ones = mesh
        .replicate(&HostTensor::new(rows, d, vec![1.0; rows * d]))
        .unwrap();
    let zeros = mesh.replicate(&HostTensor::zeros(rows, d)).unwrap();
    let turned = gathered(&mesh, &mesh.rotary(&t, &zeros, &ones, heads, d).unwrap());
    assert_eq!(turned.data[0], -x[4]);
    assert_eq!(turned.data[4], x[0]);
    assert_eq!(turned.data[8 + 1], -x[8 + 5]);
    let same = gathered(&mesh, &mesh.rotary(&t, &ones, &zeros, heads, d).unwrap());
    assert_eq!(same.data, x);
    // Folding joins consecutive rows.
    let four = mesh
        .replicate(&HostTensor::new(4, cols, x[..4 * cols].to_vec()))
        .unwrap();
    let folded = gathered(&mesh, &mesh.fold_rows(&four, 4).unwrap());
    assert_eq!((folded.rows, folded.cols), (1, 4 * cols));
    assert_eq!(folded.data, x[..4 * cols]);
    assert!(mesh.fold_rows(&t, 4).is_err());
}
