//! Criterion benches of the CPU kernels that dominate a prefill on the 0.8B shape: the
//! projection matmul with f32 and bf16 weights, and the chunked delta rule of one head.

use clef_device::cpu::{delta_rule, matmul};
use clef_device::{HostWeight, WeightFormat};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::bf16;

mod common;
use common::values;

fn linear(c: &mut Criterion) {
    // The 0.8B MLP gate|up projection at 512 tokens: [512, 1024] x [7168, 1024]^T.
    let (t, k, n) = (512, 1024, 7168);
    let x = values(t * k, 1);
    let w = values(n * k, 2);
    let wf = matmul::PackedWeight::pack(&HostWeight::f32(n, k, w.clone()), WeightFormat::F32);
    let wb = matmul::PackedWeight::pack(
        &HostWeight::bf16(n, k, w.iter().map(|&v| bf16::from_f32(v)).collect()),
        WeightFormat::Bf16,
    );
    let mut g = c.benchmark_group("linear_512x1024x7168");
    g.throughput(Throughput::Elements((2 * t * k * n) as u64));
    g.sample_size(10);
    g.bench_function("f32_weights", |b| b.iter(|| matmul::linear(&x, t, &wf)));
    g.bench_function("bf16_weights", |b| b.iter(|| matmul::linear(&x, t, &wb)));
    g.finish();
}

fn delta(c: &mut Criterion) {
    let (t, dk, dv) = (512, 128, 128);
    let norm = |mut v: Vec<f32>, scale: f32| {
        for r in v.chunks_mut(dk) {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            r.iter_mut().for_each(|x| *x = *x / n * scale);
        }
        v
    };
    let q = norm(values(t * dk, 3), (dk as f32).powf(-0.5));
    let k = norm(values(t * dk, 4), 1.0);
    let v = values(t * dv, 5);
    let g: Vec<f32> = values(t, 6).iter().map(|x| -0.1 - 0.2 * x.abs()).collect();
    let beta: Vec<f32> = values(t, 7).iter().map(|x| 0.5 + 0.4 * x).collect();
    let h = delta_rule::HeadInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        key_dim: dk,
        value_dim: dv,
    };
    let mut grp = c.benchmark_group("delta_rule_512_tokens_one_head");
    grp.sample_size(10);
    grp.bench_function("chunked", |b| {
        b.iter(|| {
            let mut s = vec![0.0; dk * dv];
            let mut o = vec![0.0; t * dv];
            delta_rule::chunked(&h, &mut s, &mut o);
            o
        })
    });
    grp.bench_function("token_loop", |b| {
        b.iter(|| {
            let mut s = vec![0.0; dk * dv];
            let mut o = vec![0.0; t * dv];
            delta_rule::recurrent(&h, &mut s, &mut o);
            o
        })
    });
    grp.finish();
}

criterion_group!(benches, linear, delta);
criterion_main!(benches);
