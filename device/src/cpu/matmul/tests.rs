//! Tests of the matmul: every kernel against the naive product and the portable path on odd
//! shapes, formats and numerics, the bf16 dot-product kernel against its emulation bit for bit,
//! the packers and the byte round trips.

use super::*;
use crate::formats::TileFormat;
use crate::{HostWeight, SharedBytes, WeightFormat};
use half::bf16;

/// Every weight format.
const FORMATS: [WeightFormat; 4] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::Bfp8,
    WeightFormat::Bfp4,
];

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
fn both_kernels(x: &[f32], rows: usize, w: &PackedWeight, numerics: &Numerics) -> [Vec<f32>; 2] {
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
    for format in FORMATS {
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

/// The kernels this CPU can run, the emulated bf16 dot one among them.
fn kernels_here() -> Vec<&'static Kernel> {
    let mut out: Vec<&'static Kernel> = vec![&bf16_dot::EMULATED];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::isa::Isa;
        let have = Isa::detected();
        if have >= Isa::Avx2Fma {
            out.push(&avx2::KERNEL);
        }
        if have >= Isa::Avx512 {
            out.push(&avx512::KERNEL);
        }
        if have >= Isa::Avx512Bf16 {
            out.push(&avx512_bf16::KERNEL);
        }
    }
    out
}

/// Whether `kernel` can multiply `format` weights under `numerics` (a bf16 dot-product kernel
/// needs bf16-exact weights and activations).
fn applies(kernel: &Kernel, format: WeightFormat, numerics: &Numerics) -> bool {
    kernel.packing == Packing::F32 || (format != WeightFormat::F32 && bf16_activations(numerics))
}

/// Every ISA kernel against the portable path on odd shapes (tails of tokens, outputs and
/// input channels; channel blocks; every format): within 2·√k·ε of the sum of |x·w| for
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
            ..Numerics::default()
        },
        Numerics {
            bf16_activations: true,
            fidelity: Fidelity::LoFi,
            bf16_accumulation: false,
            ..Numerics::default()
        },
        Numerics {
            bf16_activations: true,
            fidelity: Fidelity::HiFi2,
            bf16_accumulation: true,
            ..Numerics::default()
        },
    ];
    let mut checked = 0;
    for kernel in kernels_here() {
        let name = kernel.name;
        for &(rows, n, k) in &shapes {
            let x = ragged(rows * k, 3);
            let w = ragged(n * k, 5);
            for format in FORMATS {
                let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
                for num in numerics.iter().filter(|num| applies(kernel, format, num)) {
                    let fast = linear_on(Some(kernel), &x, rows, &packed, num);
                    let slow = linear_on(None, &x, rows, &packed, num);
                    for r in 0..rows {
                        for j in 0..n {
                            let scale: f32 = (0..k)
                                .map(|kk| (x[r * k + kk] * w[j * k + kk]).abs())
                                .sum::<f32>()
                                .max(1e-30);
                            let (a, b) = (fast[r * n + j], slow[r * n + j]);
                            // The kernels add the same products in another order (blocks of
                            // channels, channel pairs): a random-walk bound on the roundings.
                            let bound = if num.bf16_accumulation {
                                scale / 128.0
                            } else {
                                2.0 * (k as f32).sqrt() * f32::EPSILON * scale
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
    type Small =
        unsafe fn(usize, usize, usize, *mut f32, bool, *const f32, usize, usize, *const f32, usize);
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

/// The AVX512-BF16 kernel equals the emulation of its instruction bit for bit, on odd shapes
/// (token, output and channel tails, an odd channel count, several channel blocks), every
/// bf16-exact format and the fidelity / accumulation imitations (only where the CPU has it).
#[test]
fn the_bf16_dot_kernel_equals_its_emulation_bit_for_bit() {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::isa::Isa::detected() < crate::cpu::isa::Isa::Avx512Bf16 {
            eprintln!("no AVX512-BF16 on this CPU: the real vdpbf16ps kernel is not run");
            return;
        }
        let numerics = [
            Numerics {
                bf16_activations: true,
                ..Numerics::default()
            },
            Numerics {
                bf16_activations: true,
                fidelity: Fidelity::LoFi,
                bf16_accumulation: true,
                ..Numerics::default()
            },
            Numerics {
                bf16_activations: true,
                fidelity: Fidelity::HiFi2,
                bf16_accumulation: false,
                ..Numerics::default()
            },
        ];
        let mut checked = 0;
        for (rows, n, k) in [(1, 1, 1), (13, 70, 601), (25, 33, 1030), (12, 64, 1024)] {
            let x = ragged(rows * k, 7);
            let w = ragged(n * k, 8);
            for format in [WeightFormat::Bf16, WeightFormat::Bfp8, WeightFormat::Bfp4] {
                let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
                for num in &numerics {
                    let real = linear_on(Some(&avx512_bf16::KERNEL), &x, rows, &packed, num);
                    let emulated = linear_on(Some(&bf16_dot::EMULATED), &x, rows, &packed, num);
                    for (i, (a, b)) in real.iter().zip(&emulated).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{format:?} {num:?} [{rows}x{n}x{k}] at {i}: {a} vs {b}"
                        );
                    }
                    checked += 1;
                }
            }
        }
        eprintln!("{checked} cases bit-identical");
    }
}

/// The bf16 dot product is chosen only for bf16-exact weights and activations.
#[test]
fn the_bf16_dot_kernel_is_chosen_only_for_bf16_operands() {
    let (n, k) = (40, 64);
    let w = ragged(n * k, 1);
    let f32_activations = Numerics::default();
    let bf16 = Numerics {
        bf16_activations: true,
        ..Numerics::default()
    };
    for format in FORMATS {
        let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), format);
        for num in [&f32_activations, &bf16] {
            if let Some(kernel) = kernel_for(&packed, num) {
                let dot = kernel.packing == Packing::Bf16Pairs;
                assert_eq!(
                    dot,
                    format != WeightFormat::F32 && num.bf16_activations && bf16_dot_enabled(),
                    "{format:?} {num:?}: {}",
                    kernel.name
                );
            }
        }
    }
}

/// bf16 panels hold channel pairs: an odd channel count pairs the last channel with zero, and
/// the portable widening gives back every value.
#[test]
fn bf16_panels_pair_input_channels() {
    let (n, k) = (3, 5);
    let w: Vec<f32> = (0..n * k).map(|i| i as f32 + 1.0).collect();
    let packed = PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), WeightFormat::Bf16);
    let PanelData::Bf16Pairs(d) = &packed.data else {
        panic!("bf16 weights are held as pairs");
    };
    assert_eq!(d.len(), 3 * PANEL);
    let word = |i: usize, j: usize| d[i * PANEL + j];
    assert_eq!(
        word(0, 1),
        u32::from(bf16::from_f32(6.0).to_bits()) | (u32::from(bf16::from_f32(7.0).to_bits()) << 16)
    );
    assert_eq!(word(2, 2) >> 16, 0, "the missing sixth channel is zero");
    let mut widened = vec![0.0f32; k * PANEL];
    portable::widen_panel(&packed, 0, &mut widened);
    for j in 0..n {
        for kk in 0..k {
            assert_eq!(widened[kk * PANEL + j], w[j * k + kk]);
        }
    }
}
