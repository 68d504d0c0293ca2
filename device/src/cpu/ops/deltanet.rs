//! DeltaNet ops of the CPU mesh: the causal conv1d + SiLU with carry, the delta gates and
//! the chunked gated delta rule per device (the kernels of `cpu::delta_rule`).

use super::Kernel;
use crate::cpu::activations::{sigmoid_in_place, silu_in_place, softplus};
use crate::cpu::delta_rule;
use crate::cpu::{shape, CpuMesh, CpuTensor, CpuWeight, Placement};
use crate::{DeltaNetSpec, HostTensor, Result};
use rayon::prelude::*;

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "causal_conv1d_silu" => |m, c| {
            let (x, w, carry) = (c.tensor_at(0)?, c.weight_at(1)?, c.optional_at(2)?);
            let (out, carry) = causal_conv1d_silu(m, x, w, carry, c.size_at(0)?)?;
            Ok(vec![out, carry])
        },
        "delta_gates" => |m, c| {
            let (a, b) = (c.tensor_at(0)?, c.tensor_at(1)?);
            let (g, beta) = delta_gates(m, a, b, c.weight_at(2)?, c.weight_at(3)?)?;
            Ok(vec![g, beta])
        },
        "gated_delta_rule" => |m, c| {
            // The rule does not read the conv kernel's width: the call does not carry it.
            let spec = DeltaNetSpec {
                key_heads: c.size_at(0)?,
                value_heads: c.size_at(1)?,
                key_dim: c.size_at(2)?,
                value_dim: c.size_at(3)?,
                conv_kernel: 0,
            };
            let (qkv, g, beta) = (c.tensor_at(0)?, c.tensor_at(1)?, c.tensor_at(2)?);
            let (out, state) = gated_delta_rule(m, qkv, g, beta, c.optional_at(3)?, &spec)?;
            Ok(vec![out, state])
        },
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn causal_conv1d_silu(
    mesh: &CpuMesh,
    x: &CpuTensor,
    w: &CpuWeight,
    carry: Option<&CpuTensor>,
    kernel: usize,
) -> Result<(CpuTensor, CpuTensor)> {
    let _t = mesh.timer("causal_conv1d_silu");
    let keep = kernel.saturating_sub(1);
    let pairs = mesh.per_device(|d| {
        let xs = &x.shards[d];
        let ch = xs.cols;
        let wv = CpuMesh::vector("causal_conv1d_silu", w, d, ch * kernel)?;
        let zeros = HostTensor::zeros(keep, ch);
        let prev = carry.map(|c| &c.shards[d]).unwrap_or(&zeros);
        if prev.rows != keep || prev.cols != ch {
            return Err(shape(
                "causal_conv1d_silu",
                format!("carry {}x{} for {keep}x{ch}", prev.rows, prev.cols),
            ));
        }
        // The input extended in time by the carried rows.
        let ext = |t: usize| -> &[f32] {
            if t < keep {
                prev.row(t)
            } else {
                xs.row(t - keep)
            }
        };
        // Taps transposed to [kernel, channels] so the inner loop runs along channels.
        let taps: Vec<f32> = (0..kernel)
            .flat_map(|j| (0..ch).map(move |c| (c, j)))
            .map(|(c, j)| wv[c * kernel + j])
            .collect();
        let mut out = vec![0.0f32; xs.rows * ch];
        out.par_chunks_mut(ch).enumerate().for_each(|(t, o)| {
            for j in 0..kernel {
                let src = ext(t + j);
                let tap = &taps[j * ch..(j + 1) * ch];
                for ((oc, xc), w) in o.iter_mut().zip(src).zip(tap) {
                    *oc += w * xc;
                }
            }
            silu_in_place(o);
        });
        let total = keep + xs.rows;
        let mut next = Vec::with_capacity(keep * ch);
        for t in total - keep..total {
            next.extend_from_slice(ext(t));
        }
        Ok((
            HostTensor::new(xs.rows, ch, out),
            HostTensor::new(keep, ch, next),
        ))
    })?;
    let placement = if x.placement == Placement::Replicated && mesh.devices() == 1 {
        Placement::Replicated
    } else {
        Placement::Sharded
    };
    Ok(two_tensors(placement, pairs))
}

pub(in crate::cpu) fn delta_gates(
    mesh: &CpuMesh,
    a: &CpuTensor,
    b: &CpuTensor,
    a_log: &CpuWeight,
    dt_bias: &CpuWeight,
) -> Result<(CpuTensor, CpuTensor)> {
    let _t = mesh.timer("delta_gates");
    // The gates as the delta rule reads them (bf16: rounded).
    let gates = mesh.numerics().gdn_gates;
    let g = mesh.elementwise("delta_gates", &[a], |d, p| {
        let nv = p[0].cols;
        let alog = CpuMesh::vector("delta_gates", a_log, d, nv)?;
        let bias = CpuMesh::vector("delta_gates", dt_bias, d, nv)?;
        let mut out = p[0].clone();
        for row in out.data.chunks_mut(nv) {
            for (h, v) in row.iter_mut().enumerate() {
                *v = -alog[h].exp() * softplus(*v + bias[h]);
            }
        }
        gates.keep(&mut out.data);
        Ok(out)
    })?;
    let beta = mesh.elementwise("delta_gates", &[b], |_, p| {
        let mut out = p[0].clone();
        sigmoid_in_place(&mut out.data);
        gates.keep(&mut out.data);
        Ok(out)
    })?;
    Ok((g, beta))
}

pub(in crate::cpu) fn gated_delta_rule(
    mesh: &CpuMesh,
    qkv: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    state: Option<&CpuTensor>,
    spec: &DeltaNetSpec,
) -> Result<(CpuTensor, CpuTensor)> {
    let _t = mesh.timer("gated_delta_rule");
    // The state as it is kept between calls (bf16: rounded).
    let kept = mesh.numerics().gdn_state;
    let pairs = mesh.per_device(|d| {
        let (out, mut state) = delta_rule_device(
            &qkv.shards[d],
            &g.shards[d],
            &beta.shards[d],
            state.map(|s| &s.shards[d]),
            spec,
        )?;
        kept.keep(&mut state.data);
        Ok((out, state))
    })?;
    let placement = if mesh.devices() == 1 {
        qkv.placement
    } else {
        Placement::Sharded
    };
    Ok(two_tensors(placement, pairs))
}

/// One device's delta rule: split q|k|v, L2-normalise, expand key heads, run every value head.
fn delta_rule_device(
    qkv: &HostTensor,
    g: &HostTensor,
    beta: &HostTensor,
    state: Option<&HostTensor>,
    spec: &DeltaNetSpec,
) -> Result<(HostTensor, HostTensor)> {
    let (nk, nv, dk, dv) = (
        spec.key_heads,
        spec.value_heads,
        spec.key_dim,
        spec.value_dim,
    );
    let t = qkv.rows;
    if qkv.cols != spec.conv_channels()
        || g.cols != nv
        || beta.cols != nv
        || g.rows != t
        || beta.rows != t
        || nk == 0
        || !nv.is_multiple_of(nk)
    {
        return Err(shape(
            "gated_delta_rule",
            format!(
                "qkv {}x{}, g {}x{}, beta {}x{}",
                qkv.rows, qkv.cols, g.rows, g.cols, beta.rows, beta.cols
            ),
        ));
    }
    if let Some(s) = state {
        if s.rows != nv * dk || s.cols != dv {
            return Err(shape(
                "gated_delta_rule",
                format!("state {}x{}", s.rows, s.cols),
            ));
        }
    }
    let ratio = nv / nk;
    let q_scale = (dk as f32).powf(-0.5);
    // Per key head, normalised q and k laid out [head][t][dk].
    let norm_heads = |offset: usize, scale: f32| -> Vec<Vec<f32>> {
        (0..nk)
            .map(|h| {
                let mut m = Vec::with_capacity(t * dk);
                for r in 0..t {
                    let x = &qkv.row(r)[offset + h * dk..offset + (h + 1) * dk];
                    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
                    m.extend(x.iter().map(|v| v * inv * scale));
                }
                m
            })
            .collect()
    };
    let qs = norm_heads(0, q_scale);
    let ks = norm_heads(nk * dk, 1.0);
    let v_off = 2 * nk * dk;
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..nv)
        .into_par_iter()
        .map(|h| {
            let kh = h / ratio;
            let mut v = Vec::with_capacity(t * dv);
            for r in 0..t {
                v.extend_from_slice(&qkv.row(r)[v_off + h * dv..v_off + (h + 1) * dv]);
            }
            let gh: Vec<f32> = (0..t).map(|r| g.data[r * nv + h]).collect();
            let bh: Vec<f32> = (0..t).map(|r| beta.data[r * nv + h]).collect();
            let mut s = match state {
                Some(s) => s.data[h * dk * dv..(h + 1) * dk * dv].to_vec(),
                None => vec![0.0; dk * dv],
            };
            let mut o = vec![0.0; t * dv];
            let inputs = delta_rule::HeadInputs {
                q: &qs[kh],
                k: &ks[kh],
                v: &v,
                g: &gh,
                beta: &bh,
                key_dim: dk,
                value_dim: dv,
            };
            delta_rule::chunked(&inputs, &mut s, &mut o);
            (o, s)
        })
        .collect();
    let mut out = vec![0.0f32; t * nv * dv];
    let mut next = Vec::with_capacity(nv * dk * dv);
    for (h, (o, s)) in per_head.iter().enumerate() {
        for r in 0..t {
            out[r * nv * dv + h * dv..r * nv * dv + (h + 1) * dv]
                .copy_from_slice(&o[r * dv..(r + 1) * dv]);
        }
        next.extend_from_slice(s);
    }
    Ok((
        HostTensor::new(t, nv * dv, out),
        HostTensor::new(nv * dk, dv, next),
    ))
}

/// Per-device pairs of results (output, carried state) as two tensors of one placement.
fn two_tensors(
    placement: Placement,
    pairs: Vec<(HostTensor, HostTensor)>,
) -> (CpuTensor, CpuTensor) {
    let (first, second): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    (
        CpuTensor {
            placement,
            shards: first,
        },
        CpuTensor {
            placement,
            shards: second,
        },
    )
}
