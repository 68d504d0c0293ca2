//! The Tenstorrent backend through a shim against the CPU mesh: every op of the backbone and
//! the vision tower on 1x1 and 1x2 meshes with odd shapes (tile padding), every weight format
//! and matmul numerics, plus placements, copies, the live-tensor count and the shim's refusals.
//!
//! The host shim by default; `CLEF_TT_SHIM` names another. Through the ttnn shim on tt-metal's
//! mock cluster (`hardware: mock`: ops validated, dispatched and allocated by the real ttnn
//! runtime, device data not computed) every op must be accepted and give the shapes the ABI
//! promises, and memory and live tensors come back to their baseline; values are compared only
//! where a device computes them (the host shim, or chips).

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::formats::{pack, packed_bytes, TileFormat};
use clef_device::tt::{MeshPlacement, Shim, TtMesh, TtTensor};
use clef_device::{
    AttentionSpec, DeltaNetSpec, DeviceError, Fidelity, GatherAxis, Gelu, HostTensor, HostWeight,
    Kept, MeshOps, MeshShape, Numerics, RopeSpec, WeightFormat, WeightKind,
};
use common::values;
use std::sync::Arc;

fn rows(r: usize, c: usize, seed: u64) -> HostTensor {
    HostTensor::new(r, c, values(r * c, seed))
}

/// The host shim this build made, or the shim `CLEF_TT_SHIM` names (on a Tenstorrent host,
/// the op-by-op comparison with the CPU mesh is the first bring-up check; see ffi/BRINGUP.md).
fn shim() -> Arc<Shim> {
    let path = std::env::var_os("CLEF_TT_SHIM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(clef_tt_abi::HOST_SHIM));
    Shim::load(Some(&path)).expect("the host shim (cargo build makes it) or CLEF_TT_SHIM")
}

/// Devices the shim sees (4 for the host shim; a mock P150 has 1, a P150x2 2).
fn visible() -> usize {
    shim().visible_devices().unwrap() as usize
}

/// The mesh shapes of the battery this shim can open.
fn shapes() -> Vec<MeshShape> {
    [MeshShape::ONE, MeshShape::PAIR]
        .into_iter()
        .filter(|s| s.devices() <= visible())
        .collect()
}

/// False (with a note) when the shim sees fewer than two devices.
fn two_devices(test: &str) -> bool {
    let ok = visible() >= 2;
    if !ok {
        eprintln!("{test}: skipped, it needs two devices");
    }
    ok
}

/// Whether the shim runs on tt-metal's mock cluster (device data are not computed there).
fn mock() -> bool {
    let facts = shim().describe().expect("the shim describes itself");
    facts.replace(' ', "").contains("\"hardware\":\"mock\"")
}

/// The relative tolerance of the op comparisons: `default` for the host shim, or
/// `CLEF_TT_OP_TOLERANCE` (a device computes in bf16 / HiFi fidelity and approximates
/// transcendentals).
fn tolerance(default: f32) -> f32 {
    std::env::var("CLEF_TT_OP_TOLERANCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn tt(shape: MeshShape, numerics: Numerics) -> TtMesh {
    TtMesh::open(&shim(), MeshPlacement::direct(shape), kept(numerics)).unwrap()
}

/// `numerics` as the shim under test keeps them: the ttnn shim keeps the KV cache in bf16 only
/// (it refuses an f32 one; its ops are compared within `CLEF_TT_OP_TOLERANCE`), the host shim
/// keeps what it is asked.
fn kept(numerics: Numerics) -> Numerics {
    if shim().backend() == "ttnn" {
        numerics.with_bf16_kv()
    } else {
        numerics
    }
}

/// One weight per device (different values per device), as a plan would place it.
fn weight<B: MeshOps>(
    m: &B,
    rows: usize,
    cols: usize,
    format: WeightFormat,
    kind: WeightKind,
    seed: u64,
) -> B::Weight {
    let parts = (0..m.mesh().devices())
        .map(|d| HostWeight::f32(rows, cols, values(rows * cols, seed + d as u64)))
        .collect();
    m.upload_weight(parts, format, kind).unwrap()
}

fn vector<B: MeshOps>(m: &B, n: usize, seed: u64) -> B::Weight {
    weight(m, n, 1, WeightFormat::F32, WeightKind::Vector, seed)
}

/// Runs the text and vision ops on `m` and returns every result, named, as host rows.
fn battery<B: MeshOps>(m: &B, format: WeightFormat) -> Vec<(String, HostTensor)> {
    let mut out: Vec<(String, HostTensor)> = Vec::new();
    let mut keep = |name: &str, t: &B::Tensor| {
        for (d, part) in m.device_parts(t).unwrap().into_iter().enumerate() {
            out.push((format!("{name}[{d}]"), part));
        }
    };
    let n = m.mesh().devices();
    let (t, hidden) = (37, 64);
    let x = m.replicate(&rows(t, hidden, 1)).unwrap();
    // Column-parallel projection, row-parallel projection, all-reduce.
    let w_in = weight(m, 96, hidden, format, WeightKind::Matrix, 10);
    let y = m.linear(&x, &w_in).unwrap();
    keep("linear", &y);
    let w_out = weight(m, hidden, 96, format, WeightKind::Matrix, 20);
    let partial = m.linear(&y, &w_out).unwrap();
    let reduced = m.all_reduce(&partial).unwrap();
    keep("all_reduce", &reduced);
    let parts = m.split_cols(&y, &[40, 24, 32]).unwrap();
    keep("split_cols.0", &parts[0]);
    keep("split_cols.2", &parts[2]);
    keep("add", &m.add(&reduced, &x).unwrap());
    keep(
        "rms_norm",
        &m.rms_norm(&x, &vector(m, 32, 30), 32, 1e-6, true).unwrap(),
    );
    keep(
        "rms_norm.plain",
        &m.rms_norm(&x, &vector(m, 64, 31), 64, 1e-6, false).unwrap(),
    );
    keep("swiglu", &m.swiglu(&y).unwrap());
    // Attention: 2 heads x 24 of [query | gate], 1 KV head of 24 per device.
    let (heads, kv_heads, d) = (2, 1, 24);
    let qg = m
        .shard(
            (0..n)
                .map(|i| rows(t, heads * 2 * d, 40 + i as u64))
                .collect(),
        )
        .unwrap();
    let (q, gate) = m.split_query_gate(&qg, heads, d).unwrap();
    keep("gate", &gate);
    // Rotary dim 12, sections of 2 pairs per axis, theta 1e7; (t, h, w) per row.
    let positions: Vec<u32> = (0..t as u32).flat_map(|p| [p + 5, p / 3, p % 7]).collect();
    let rope = |x, h| m.rope(x, h, d, 12, 2, 2, 2, 1e7, &positions);
    let q = rope(&q, heads).unwrap();
    keep("rope", &q);
    let k = m
        .shard(
            (0..n)
                .map(|i| rows(t, kv_heads * d, 50 + i as u64))
                .collect(),
        )
        .unwrap();
    let v = m
        .shard(
            (0..n)
                .map(|i| rows(t, kv_heads * d, 60 + i as u64))
                .collect(),
        )
        .unwrap();
    let cache_k = m
        .shard(
            (0..n)
                .map(|i| rows(19, kv_heads * d, 70 + i as u64))
                .collect(),
        )
        .unwrap();
    let cache_v = m
        .shard(
            (0..n)
                .map(|i| rows(19, kv_heads * d, 80 + i as u64))
                .collect(),
        )
        .unwrap();
    let keys = m.append_rows(Some(&cache_k), &k, kv_heads).unwrap();
    let vals = m.append_rows(Some(&cache_v), &v, kv_heads).unwrap();
    keep("append_rows", &keys);
    keep(
        "append_rows.none",
        &m.append_rows(None, &v, kv_heads).unwrap(),
    );
    let attn = m
        .causal_attention(&q, &keys, &vals, heads, kv_heads, d)
        .unwrap();
    keep("causal_attention", &attn);
    keep("mul_sigmoid", &m.mul_sigmoid(&attn, &gate).unwrap());
    // DeltaNet: 1 key head x 16, 3 value heads x 12 per device, conv over q|k|v.
    let delta = DeltaNetSpec {
        key_heads: 1,
        value_heads: 3,
        key_dim: 16,
        value_dim: 12,
        conv_kernel: 4,
    };
    let ch = delta.conv_channels();
    let qkv = m
        .shard((0..n).map(|i| rows(t, ch, 90 + i as u64)).collect())
        .unwrap();
    let taps = weight(m, ch, 4, WeightFormat::F32, WeightKind::Vector, 100);
    let (conv, carry) = m.causal_conv1d_silu(&qkv, &taps, None, 4).unwrap();
    keep("conv", &conv);
    keep("conv.carry", &carry);
    let (conv2, _) = m.causal_conv1d_silu(&qkv, &taps, Some(&carry), 4).unwrap();
    keep("conv.continued", &conv2);
    let a = m
        .shard((0..n).map(|i| rows(t, 3, 110 + i as u64)).collect())
        .unwrap();
    let b = m
        .shard((0..n).map(|i| rows(t, 3, 120 + i as u64)).collect())
        .unwrap();
    let (g, beta) = m
        .delta_gates(&a, &b, &vector(m, 3, 130), &vector(m, 3, 131))
        .unwrap();
    keep("delta_gates.g", &g);
    keep("delta_gates.beta", &beta);
    let (kh, vh, kd, vd) = (
        delta.key_heads,
        delta.value_heads,
        delta.key_dim,
        delta.value_dim,
    );
    let (core, state) = m
        .gated_delta_rule(&conv, &g, &beta, None, kh, vh, kd, vd)
        .unwrap();
    keep("delta_rule", &core);
    keep("delta_rule.state", &state);
    let (core2, state2) = m
        .gated_delta_rule(&conv2, &g, &beta, Some(&state), kh, vh, kd, vd)
        .unwrap();
    keep("delta_rule.continued", &core2);
    keep("delta_rule.state2", &state2);
    let z = m
        .shard((0..n).map(|i| rows(t, 36, 140 + i as u64)).collect())
        .unwrap();
    keep(
        "gated_rms_norm",
        &m.gated_rms_norm(&core, &z, &vector(m, 12, 150), 12, 1e-6)
            .unwrap(),
    );
    // Vision ops.
    let ln = m
        .layer_norm(&x, &vector(m, 64, 160), &vector(m, 64, 161), 1e-6)
        .unwrap();
    keep("layer_norm", &ln);
    keep("add_bias", &m.add_bias(&y, &vector(m, 96, 170)).unwrap());
    keep("gelu.tanh", &m.gelu(&y, Gelu::Tanh).unwrap());
    keep("gelu.erf", &m.gelu(&y, Gelu::Erf).unwrap());
    let cos = m.replicate(&rows(t, d, 180)).unwrap();
    let sin = m.replicate(&rows(t, d, 181)).unwrap();
    let rq = m.rotary(&attn, &cos, &sin, heads, d).unwrap();
    keep("rotary", &rq);
    let segs = [0, 16, 16, 20, 20, 37];
    keep(
        "segment_attention",
        &m.segment_attention(&rq, &attn, &gate, heads, d, &segs)
            .unwrap(),
    );
    let patches = m
        .shard((0..n).map(|i| rows(36, 24, 190 + i as u64)).collect())
        .unwrap();
    let folded = m.fold_rows(&patches, 4).unwrap();
    keep("fold_rows", &folded);
    out.push((
        "gather.cols".into(),
        m.gather(&y, GatherAxis::Cols).unwrap(),
    ));
    out.push((
        "gather.rows".into(),
        m.gather(&state, GatherAxis::Rows).unwrap(),
    ));
    out.push((
        "gather.partial".into(),
        m.gather(&partial, GatherAxis::Cols).unwrap(),
    ));
    out
}

/// Every result of `tt` with the name and shape of `cpu`'s, and (unless the device is a mock)
/// the same values within `rel` of each result's largest magnitude.
fn compare(cpu: &[(String, HostTensor)], tt: &[(String, HostTensor)], rel: f32, what: &str) {
    assert_eq!(cpu.len(), tt.len(), "{what}: result count");
    let values = !mock();
    for ((name, a), (name_b, b)) in cpu.iter().zip(tt) {
        assert_eq!(name, name_b);
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "{what} {name}: shape");
        if !values {
            continue;
        }
        let scale = a.data.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3);
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= rel * scale,
            "{what} {name}: |cpu - tt| up to {worst} (scale {scale})"
        );
    }
}

#[test]
fn every_op_through_the_shim_matches_the_cpu_mesh() {
    for shape in shapes() {
        for format in [
            WeightFormat::F32,
            WeightFormat::Bf16,
            WeightFormat::Bfp8,
            WeightFormat::Bfp4,
        ] {
            let cpu = battery(&CpuMesh::new(shape), format);
            let tt = battery(&tt(shape, Numerics::default()), format);
            let rel = tolerance(2e-5);
            compare(&cpu, &tt, rel, &format!("{shape} {}", format.name()));
        }
    }
}

#[test]
fn matmul_numerics_are_imitated_like_the_cpu_mesh() {
    for numerics in [
        Numerics {
            bf16_activations: true,
            fidelity: Fidelity::HiFi4,
            bf16_accumulation: false,
            ..Numerics::default()
        },
        Numerics {
            bf16_activations: true,
            fidelity: Fidelity::HiFi2,
            bf16_accumulation: true,
            ..Numerics::default()
        },
        Numerics {
            bf16_activations: true,
            fidelity: Fidelity::LoFi,
            bf16_accumulation: false,
            ..Numerics::default()
        },
    ] {
        for shape in shapes() {
            let cpu = battery(
                &CpuMesh::new(shape).with_numerics(numerics),
                WeightFormat::Bfp8,
            );
            let tt = battery(&tt(shape, numerics), WeightFormat::Bfp8);
            // Same truncations; the sums run in another order, so a bf16 accumulator may round
            // the other way at a chunk boundary (one bf16 ulp, 2^-8 relative).
            let rel = if numerics.bf16_accumulation {
                1e-2
            } else {
                2e-5
            };
            compare(&cpu, &tt, rel, &format!("{shape} {numerics:?}"));
        }
    }
}

/// Numerics keeping the KV cache and the DeltaNet gates and state in bf16.
fn bf16_kept() -> Numerics {
    Numerics {
        kv_cache: Kept::Bf16,
        gdn_gates: Kept::Bf16,
        gdn_state: Kept::Bf16,
        ..Numerics::default()
    }
}

#[test]
fn kept_dtypes_are_honoured_like_the_cpu_mesh_or_refused_at_open() {
    let s = shim();
    let one = MeshPlacement::direct(MeshShape::ONE);
    if s.backend() == "ttnn" {
        // ttnn keeps bf16 KV and f32 DeltaNet gates and state only: anything else is refused
        // before a device opens, naming the override that fixes it.
        let e = shim_error(TtMesh::open(&s, one, Numerics::default()));
        assert!(
            e.contains("the KV cache cannot be kept in f32") && e.contains("CLEF_KV_DTYPE=bf16"),
            "{e}"
        );
        let e = shim_error(TtMesh::open(&s, one, bf16_kept()));
        assert!(e.contains("cannot be kept in bf16"), "{e}");
        let state_only = Numerics {
            gdn_state: Kept::Bf16,
            ..Numerics::default().with_bf16_kv()
        };
        let e = shim_error(TtMesh::open(&s, one, state_only));
        assert!(e.contains("QWEN_GDN_FP32_STATE=1"), "{e}");
        assert!(TtMesh::open(&s, one, Numerics::default().with_bf16_kv()).is_ok());
        return;
    }
    // The host shim keeps f32 and rounds what is kept as bf16, as the CPU mesh does.
    for shape in shapes() {
        let cpu = battery(
            &CpuMesh::new(shape).with_numerics(bf16_kept()),
            WeightFormat::F32,
        );
        let tt = battery(&tt(shape, bf16_kept()), WeightFormat::F32);
        compare(&cpu, &tt, 2e-5, &format!("{shape} bf16 kept"));
        let exact = battery(&CpuMesh::new(shape), WeightFormat::F32);
        for ((name, kept), (_, full)) in cpu.iter().zip(&exact) {
            let is_bf16 = |t: &HostTensor| {
                t.data
                    .iter()
                    .all(|&v| half::bf16::from_f32(v).to_f32() == v)
            };
            let kept_class = ["append_rows.none", "delta_gates", "delta_rule.state"]
                .iter()
                .any(|c| name.starts_with(c));
            if kept_class {
                assert!(is_bf16(kept), "{shape} {name} is not kept in bf16");
                assert!(!is_bf16(full), "{shape} {name} is already bf16 at f32");
            }
        }
    }
    let facts = TtMesh::open(&s, one, bf16_kept())
        .unwrap()
        .describe()
        .unwrap()
        .replace(' ', "");
    assert!(facts.contains("\"kv_dtype\":\"bf16\""), "{facts}");
    assert!(facts.contains("\"gdn_state_dtype\":\"bf16\""), "{facts}");
}

#[test]
fn weights_are_held_as_the_rust_packer_writes_them_and_round_trip_through_a_cache() {
    if !two_devices(
        "weights_are_held_as_the_rust_packer_writes_them_and_round_trip_through_a_cache",
    ) {
        return;
    }
    let m = tt(MeshShape::PAIR, Numerics::default());
    let cpu = CpuMesh::new(MeshShape::PAIR);
    for format in [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::Bfp8,
        WeightFormat::Bfp4,
    ] {
        let (n, k) = (40, 72);
        let w = weight(&m, n, k, format, WeightKind::Matrix, 7);
        let exported = m.export_weight(&w).unwrap();
        if mock() {
            // The device keeps no data: what can be checked is the size of every part and that
            // the parts upload again.
            for part in &exported {
                assert_eq!(part.data.len(), packed_bytes(k, n, TileFormat::of(format)));
            }
            assert!(m.weight_bytes(&m.import_weight(exported).unwrap()) > 0);
            continue;
        }
        for (d, part) in exported.iter().enumerate() {
            let src = values(n * k, 7 + d as u64);
            let mut kn = vec![0.0f32; n * k];
            for o in 0..n {
                for i in 0..k {
                    kn[i * n + o] = src[o * k + i];
                }
            }
            assert_eq!(
                &part.data[..],
                &pack(&kn, k, n, TileFormat::of(format))[..],
                "{format:?} device {d}"
            );
            assert_eq!((part.rows, part.cols), (n, k));
        }
        let back = m.import_weight(exported).unwrap();
        let x = m.replicate(&rows(5, k, 3)).unwrap();
        let cpu_w = weight(&cpu, n, k, format, WeightKind::Matrix, 7);
        let want = cpu
            .gather(
                &cpu.linear(&cpu.replicate(&rows(5, k, 3)).unwrap(), &cpu_w)
                    .unwrap(),
                GatherAxis::Cols,
            )
            .unwrap();
        let got = m
            .gather(&m.linear(&x, &back).unwrap(), GatherAxis::Cols)
            .unwrap();
        for (a, b) in want.data.iter().zip(&got.data) {
            assert!(
                (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                "{format:?}: {a} vs {b}"
            );
        }
        assert!(m.weight_bytes(&back) > 0);
    }
    // A cache part of the wrong size is refused by the shim, naming the sizes.
    let w = weight(&m, 8, 8, WeightFormat::Bfp8, WeightKind::Matrix, 1);
    let mut parts = m.export_weight(&w).unwrap();
    parts[1].data = clef_device::SharedBytes::owned(vec![0u8; 17]);
    let err = m.import_weight(parts).err().unwrap().to_string();
    assert!(err.contains("upload") && err.contains("17 bytes"), "{err}");
}

#[test]
fn copies_are_new_buffers_and_every_tensor_is_freed() {
    if !two_devices("copies_are_new_buffers_and_every_tensor_is_freed") {
        return;
    }
    let m = tt(MeshShape::PAIR, Numerics::default());
    let base = m.status().unwrap();
    assert_eq!(base.device_ids, vec![0, 1]);
    assert_eq!(base.live_tensors, 0);
    {
        let x = m.replicate(&rows(33, 40, 5)).unwrap();
        let copy = m.copy(&x).unwrap();
        let s = m.status().unwrap();
        assert_eq!(s.live_tensors, 2);
        if mock() {
            // ttnn's allocator: whole pages in every DRAM bank, the same on both devices.
            assert!(s.bytes_per_device[0] >= 2 * 4 * 4096, "{s:?}");
            assert_eq!(s.bytes_per_device[0], s.bytes_per_device[1]);
        } else {
            // Two f32 tensors of 2x2 tiles on each device.
            assert_eq!(s.bytes_per_device, vec![2 * 4 * 4096, 2 * 4 * 4096]);
            assert_eq!(
                m.gather(&x, GatherAxis::Cols).unwrap(),
                m.gather(&copy, GatherAxis::Cols).unwrap()
            );
        }
        drop(x);
        assert_eq!(m.status().unwrap().live_tensors, 1);
        if !mock() {
            assert_eq!(m.gather(&copy, GatherAxis::Cols).unwrap(), rows(33, 40, 5));
        }
        // A whole battery of ops leaves nothing behind once its results are dropped.
        let _ = battery(&m, WeightFormat::Bfp8);
    }
    let end = m.status().unwrap();
    assert_eq!(end.live_tensors, 0);
    assert_eq!(end.bytes_per_device, vec![0, 0]);
}

fn shim_error(r: Result<impl Sized, DeviceError>) -> String {
    match r {
        Err(e @ DeviceError::Shim { .. }) => e.to_string(),
        Err(e) => panic!("not a shim error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn bad_arguments_are_refused_by_the_shim_naming_the_op_and_the_argument() {
    if !two_devices("bad_arguments_are_refused_by_the_shim_naming_the_op_and_the_argument") {
        return;
    }
    let m = tt(MeshShape::PAIR, Numerics::default());
    let x = m.replicate(&rows(4, 64, 1)).unwrap();
    let w = weight(&m, 8, 32, WeightFormat::Bf16, WeightKind::Matrix, 2);
    let e = shim_error(m.linear(&x, &w));
    assert!(e.contains("linear") && e.contains("input width 64"), "{e}");
    let y = m
        .linear(&m.replicate(&rows(4, 32, 3)).unwrap(), &w)
        .unwrap();
    let partial = m.linear(
        &y,
        &weight(&m, 4, 8, WeightFormat::F32, WeightKind::Matrix, 3),
    );
    let partial = partial.unwrap();
    let e = shim_error(m.add(&partial, &partial));
    assert!(
        e.contains("add") && e.contains("argument a") && e.contains("partial"),
        "{e}"
    );
    let e = shim_error(m.all_reduce(&y));
    assert!(e.contains("all_reduce") && e.contains("sharded"), "{e}");
    let e = shim_error(m.rms_norm(&x, &vector(&m, 10, 4), 10, 1e-6, true));
    assert!(
        e.contains("rms_norm") && e.contains("64 columns in groups of 10"),
        "{e}"
    );
    let e = shim_error(m.rms_norm(&x, &w, 64, 1e-6, true));
    assert!(
        e.contains("argument w") && e.contains("expected a vector"),
        "{e}"
    );
    let e = shim_error(m.split_cols(&x, &[10, 10]));
    assert!(
        e.contains("split_cols") && e.contains("64 columns split as [10, 10]"),
        "{e}"
    );
    let e = shim_error(m.segment_attention(&x, &x, &x, 2, 32, &[0, 2, 3, 4]));
    assert!(
        e.contains("segment_attention") && e.contains("segments"),
        "{e}"
    );
    // Shard parts that do not match the mesh.
    assert!(m.shard(vec![rows(2, 2, 1)]).is_err());
    let live = m.status().unwrap().live_tensors;
    drop((x, w, y, partial));
    assert_eq!(m.status().unwrap().live_tensors, live - 4);
}

#[test]
fn a_tensor_of_another_mesh_is_refused() {
    if !two_devices("a_tensor_of_another_mesh_is_refused") {
        return;
    }
    // Two meshes at once on different devices: the halves of a 1x2 parent (a device cannot be
    // opened twice on chips).
    let half = |offset| MeshPlacement {
        shape: MeshShape::ONE,
        parent_cols: Some(2),
        submesh_offset: offset,
    };
    let s = shim();
    let m = TtMesh::open(&s, half(0), kept(Numerics::default())).unwrap();
    let other = TtMesh::open(&s, half(1), kept(Numerics::default())).unwrap();
    let x = m.replicate(&rows(4, 64, 1)).unwrap();
    let foreign = other.replicate(&rows(4, 64, 1)).unwrap();
    let e = shim_error(m.add(&x, &foreign));
    assert!(e.contains("argument b belongs to another mesh"), "{e}");
}

#[test]
fn meshes_open_directly_or_as_submeshes_of_a_shared_parent_within_the_visible_devices() {
    let s = shim();
    // The host shim shows 4 devices (CLEF_TT_HOST_DEVICES), a P150x2 two.
    let visible = s.visible_devices().unwrap() as usize;
    assert!(matches!(visible, 1 | 2 | 4), "{visible} devices");
    let placement = |cols, parent: Option<usize>, offset| MeshPlacement {
        shape: MeshShape { rows: 1, cols },
        parent_cols: parent,
        submesh_offset: offset,
    };
    let open = |p| TtMesh::open(&s, p, kept(Numerics::default()));
    let wide = open(placement(2 * visible, None, 0))
        .err()
        .unwrap()
        .to_string();
    let needs = format!("needs {} devices", 2 * visible);
    assert!(
        wide.contains("mesh_open")
            && wide.contains(&needs)
            && wide.contains(&format!("sees {visible}")),
        "{wide}"
    );
    if visible == 1 {
        // One chip: the direct 1x1 mesh only.
        let one = open(placement(1, None, 0)).unwrap();
        assert_eq!(one.status().unwrap().device_ids, vec![0]);
        return;
    }
    let (cols, parent) = (visible / 2, Some(visible));
    let first = open(placement(cols, parent, 0)).unwrap();
    let second = open(placement(cols, parent, cols)).unwrap();
    let ids = |from: u32| (from..from + cols as u32).collect::<Vec<_>>();
    assert_eq!(first.status().unwrap().device_ids, ids(0));
    assert_eq!(second.status().unwrap().device_ids, ids(cols as u32));
    let taken = open(placement(cols, parent, cols))
        .err()
        .unwrap()
        .to_string();
    assert!(
        taken.contains("already belongs to an open submesh"),
        "{taken}"
    );
    let outside = open(placement(cols, parent, visible))
        .err()
        .unwrap()
        .to_string();
    assert!(
        outside.contains(&format!("outside the 1x{visible} parent")),
        "{outside}"
    );
    drop(second);
    // Its columns are free again.
    let again = open(placement(cols, parent, cols)).unwrap();
    assert_eq!(again.status().unwrap().device_ids, ids(cols as u32));
}

/// The layer ops through the ABI's one layer-op entry: the ttnn shim runs each (results of the
/// promised shapes and placements, a second attention chunk appends to the first's KV, every
/// tensor freed after), the host shim declines each (`None`: the backbone composes the fine
/// ops), and a form the ttnn package does not take is declined too. Their values against the
/// composition: ffi/shim/ttnn/tests/test_layer_ops_mock.py (op by op, golden shadow) and
/// tests/tt_golden.rs (the model).
#[test]
fn layer_ops_run_on_the_ttnn_shim_and_are_declined_where_a_backend_has_none() {
    use clef_device::{AttentionLayer, DeltaNetLayer, MlpLayer};
    if !two_devices("layer_ops_run_on_the_ttnn_shim_and_are_declined_where_a_backend_has_none") {
        return;
    }
    let numerics = Numerics {
        bf16_activations: true,
        ..Numerics::default()
    };
    let m = tt(MeshShape::PAIR, numerics);
    let runs = shim().backend() == "ttnn";
    let live = m.status().unwrap().live_tensors;
    let (hidden, t) = (64, 40);
    let (bf16, matrix) = (WeightFormat::Bf16, WeightKind::Matrix);
    let shape = |x: &TtTensor| {
        let g = m.gather(x, GatherAxis::Cols).unwrap();
        (g.rows, g.cols)
    };
    {
        let h = m.replicate(&rows(t, hidden, 1)).unwrap();
        let norm = vector(&m, hidden, 2);
        // Attention: 2 query heads and 1 KV head of 64 per device, rotary 32.
        let spec = AttentionSpec {
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
        };
        let qkv = weight(&m, (2 * 2 + 2) * 64, hidden, bf16, matrix, 3);
        let (qn, kn) = (vector(&m, 64, 4), vector(&m, 64, 5));
        let o = weight(&m, hidden, 2 * 64, bf16, matrix, 6);
        let positions: Vec<[u32; 3]> = (0..2 * t as u32).map(|p| [p, p, p]).collect();
        let attention = |h, cache, positions| AttentionLayer {
            h,
            norm: &norm,
            qkv: &qkv,
            q_norm: &qn,
            k_norm: &kn,
            o_proj: &o,
            cache,
            positions,
            spec,
            rope: RopeSpec {
                heads: 2,
                head_dim: 64,
                rotary_dim: 32,
                theta: 1e7,
                mrope_section: [6, 5, 5],
            },
            eps: 1e-6,
            all_reduce: true,
        };
        let first = m.attention_layer(&attention(&h, None, &positions[..t]));
        // DeltaNet: 1 key and 1 value head of 32 per device (conv channels 96).
        let delta_spec = DeltaNetSpec {
            key_heads: 1,
            value_heads: 1,
            key_dim: 32,
            value_dim: 32,
            conv_kernel: 4,
        };
        let in_proj = weight(&m, 96 + 32 + 2, hidden, bf16, matrix, 7);
        let conv = vector(&m, 96 * 4, 8);
        let (a_log, dt_bias, gnorm) = (vector(&m, 1, 9), vector(&m, 1, 10), vector(&m, 32, 11));
        let out_proj = weight(&m, hidden, 32, bf16, matrix, 12);
        let delta = m.delta_net_layer(&DeltaNetLayer {
            h: &h,
            norm: &norm,
            in_proj: &in_proj,
            conv: &conv,
            a_log: &a_log,
            dt_bias: &dt_bias,
            gated_norm: &gnorm,
            out_proj: &out_proj,
            carried: None,
            spec: delta_spec,
            eps: 1e-6,
            all_reduce: true,
        });
        let gate_up = weight(&m, 2 * 64, hidden, bf16, matrix, 13);
        let down = weight(&m, hidden, 64, bf16, matrix, 14);
        let mlp = m.mlp_layer(&MlpLayer {
            h: &h,
            norm: &norm,
            gate_up: &gate_up,
            down: &down,
            eps: 1e-6,
            all_reduce: true,
        });
        // A rotary width rotary_embedding_hf refuses: declined by every backend.
        let mut odd = attention(&h, None, &positions[..t]);
        odd.rope.rotary_dim = 8;
        odd.rope.mrope_section = [2, 1, 1];
        assert!(m.attention_layer(&odd).is_none());
        if !runs {
            assert!(first.is_none() && delta.is_none() && mlp.is_none());
        } else {
            let [h1, keys, values] = first.expect("the ttnn shim runs attention").unwrap();
            assert_eq!(
                (shape(&h1), shape(&keys), shape(&values)),
                ((t, hidden), (t, 2 * 64), (t, 2 * 64))
            );
            let second =
                m.attention_layer(&attention(&h1, Some((&keys, &values)), &positions[t..]));
            let [_, keys2, _] = second.expect("with a cache").unwrap();
            assert_eq!(shape(&keys2), (2 * t, 2 * 64));
            let [h2, carry, state] = delta.expect("the ttnn shim runs DeltaNet").unwrap();
            assert_eq!(
                (shape(&h2), shape(&carry), shape(&state)),
                ((t, hidden), (3, 2 * 96), (32, 2 * 32))
            );
            let h3 = mlp.expect("the ttnn shim runs the MLP").unwrap();
            assert_eq!(shape(&h3), (t, hidden));
        }
    }
    assert_eq!(m.status().unwrap().live_tensors, live);
}
