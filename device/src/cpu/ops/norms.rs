//! Normalisations of the CPU mesh: RMSNorm (1 + w), the gated RMSNorm of DeltaNet
//! (vectorised SiLU gate) and LayerNorm with bias.

use super::Kernel;
use crate::cpu::activations::silu_in_place;
use crate::cpu::{shape, CpuMesh, CpuTensor, CpuWeight, ROW_BLOCK};
use crate::Result;
use rayon::prelude::*;

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "rms_norm" => |m, c| {
            let (group, eps, one_plus) = (c.size_at(0)?, c.real_at(1)? as f32, c.flag_at(2)?);
            Ok(vec![rms_norm(
                m,
                c.tensor_at(0)?,
                c.weight_at(1)?,
                group,
                eps,
                one_plus,
            )?])
        },
        "gated_rms_norm" => |m, c| {
            let (x, z, w) = (c.tensor_at(0)?, c.tensor_at(1)?, c.weight_at(2)?);
            let (group, eps) = (c.size_at(0)?, c.real_at(1)? as f32);
            Ok(vec![gated_rms_norm(m, x, z, w, group, eps)?])
        },
        "layer_norm" => |m, c| {
            let (x, w, b) = (c.tensor_at(0)?, c.weight_at(1)?, c.weight_at(2)?);
            Ok(vec![layer_norm(m, x, w, b, c.real_at(0)? as f32)?])
        },
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn rms_norm(
    mesh: &CpuMesh,
    x: &CpuTensor,
    w: &CpuWeight,
    group: usize,
    eps: f32,
    one_plus: bool,
) -> Result<CpuTensor> {
    let _t = mesh.timer("rms_norm");
    mesh.elementwise("rms_norm", &[x], |d, p| {
        let offset = if one_plus { 1.0 } else { 0.0 };
        let w: Vec<f32> = CpuMesh::vector("rms_norm", w, d, group)?
            .iter()
            .map(|v| v + offset)
            .collect();
        if group == 0 || !p[0].cols.is_multiple_of(group) {
            return Err(shape(
                "rms_norm",
                format!("{} columns in groups of {group}", p[0].cols),
            ));
        }
        let mut out = p[0].clone();
        out.data
            .par_chunks_mut(group * ROW_BLOCK.div_ceil(group).max(1))
            .for_each(|block| {
                for g in block.chunks_mut(group) {
                    let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    g.iter_mut().zip(&w).for_each(|(v, wv)| *v = *v * inv * wv);
                }
            });
        Ok(out)
    })
}

pub(in crate::cpu) fn gated_rms_norm(
    mesh: &CpuMesh,
    x: &CpuTensor,
    z: &CpuTensor,
    w: &CpuWeight,
    group: usize,
    eps: f32,
) -> Result<CpuTensor> {
    let _t = mesh.timer("gated_rms_norm");
    mesh.elementwise("gated_rms_norm", &[x, z], |d, p| {
        CpuMesh::same_shape("gated_rms_norm", p[0], p[1])?;
        let w = CpuMesh::vector("gated_rms_norm", w, d, group)?;
        if group == 0 || !p[0].cols.is_multiple_of(group) {
            return Err(shape(
                "gated_rms_norm",
                format!("{} columns in groups of {group}", p[0].cols),
            ));
        }
        let mut out = p[0].clone();
        let block = group * ROW_BLOCK.div_ceil(group).max(1);
        out.data
            .par_chunks_mut(block)
            .zip(p[1].data.par_chunks(block))
            .for_each(|(xb, zb)| {
                let mut gates = zb.to_vec();
                silu_in_place(&mut gates);
                for (g, zg) in xb.chunks_mut(group).zip(gates.chunks(group)) {
                    let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    for ((v, wv), zv) in g.iter_mut().zip(w).zip(zg) {
                        *v = wv * (*v * inv) * zv;
                    }
                }
            });
        Ok(out)
    })
}

pub(in crate::cpu) fn layer_norm(
    mesh: &CpuMesh,
    x: &CpuTensor,
    w: &CpuWeight,
    b: &CpuWeight,
    eps: f32,
) -> Result<CpuTensor> {
    let _t = mesh.timer("layer_norm");
    mesh.elementwise("layer_norm", &[x], |d, p| {
        let n = p[0].cols;
        let (w, b) = (
            CpuMesh::vector("layer_norm", w, d, n)?,
            CpuMesh::vector("layer_norm", b, d, n)?,
        );
        let mut out = p[0].clone();
        out.data
            .par_chunks_mut(n * ROW_BLOCK.div_ceil(n.max(1)).max(1))
            .for_each(|block| {
                for row in block.chunks_mut(n) {
                    let mean = row.iter().sum::<f32>() / n as f32;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                    let inv = 1.0 / (var + eps).sqrt();
                    for ((v, wv), bv) in row.iter_mut().zip(w).zip(b) {
                        *v = (*v - mean) * inv * wv + bv;
                    }
                }
            });
        Ok(out)
    })
}
