//! Position ops of the CPU mesh: the query/gate split of gated attention, partial M-RoPE
//! and the vision tower's rotary embedding.

use super::Kernel;
use crate::cpu::{layout, shape, CpuMesh, CpuTensor, Placement};
use crate::{HostTensor, Result, RopeSpec};
use rayon::prelude::*;

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "split_query_gate" => |m, c| {
            let (q, g) = split_query_gate(m, c.tensor_at(0)?, c.size_at(0)?, c.size_at(1)?)?;
            Ok(vec![q, g])
        },
        "rope" => |m, c| {
            let spec = RopeSpec {
                heads: c.size_at(0)?,
                head_dim: c.size_at(1)?,
                rotary_dim: c.size_at(2)?,
                mrope_section: [c.size_at(3)?, c.size_at(4)?, c.size_at(5)?],
                theta: c.real_at(6)?,
            };
            if c.list.len() % 3 != 0 {
                return Err(shape("rope", "positions are not (t, h, w) triples".into()));
            }
            let positions: Vec<[u32; 3]> =
                c.list.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
            Ok(vec![rope(m, c.tensor_at(0)?, &spec, &positions)?])
        },
        "rotary" => |m, c| {
            let (x, cos, sin) = (c.tensor_at(0)?, c.tensor_at(1)?, c.tensor_at(2)?);
            Ok(vec![rotary(m, x, cos, sin, c.size_at(0)?, c.size_at(1)?)?])
        },
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn split_query_gate(
    mesh: &CpuMesh,
    qg: &CpuTensor,
    heads: usize,
    head_dim: usize,
) -> Result<(CpuTensor, CpuTensor)> {
    let _t = mesh.timer("split_query_gate");
    let q = mesh.elementwise("split_query_gate", &[qg], |_, p| {
        pick_half(p[0], heads, head_dim, 0)
    })?;
    let g = mesh.elementwise("split_query_gate", &[qg], |_, p| {
        pick_half(p[0], heads, head_dim, 1)
    })?;
    Ok((q, g))
}

pub(in crate::cpu) fn rope(
    mesh: &CpuMesh,
    x: &CpuTensor,
    spec: &RopeSpec,
    positions: &[[u32; 3]],
) -> Result<CpuTensor> {
    let _t = mesh.timer("rope");
    let half = spec.rotary_dim / 2;
    // Inverse frequencies in f32, as PyTorch computes them.
    let inv: Vec<f32> = (0..half)
        .map(|j| {
            let exponent = (2 * j) as f32 / spec.rotary_dim as f32;
            1.0 / (spec.theta as f32).powf(exponent)
        })
        .collect();
    let axis: Vec<usize> = (0..half)
        .map(|j| {
            if j % 3 == 1 && j < 3 * spec.mrope_section[1] {
                1
            } else if j % 3 == 2 && j < 3 * spec.mrope_section[2] {
                2
            } else {
                0
            }
        })
        .collect();
    mesh.elementwise("rope", &[x], |_, p| {
        let s = p[0];
        if s.cols != spec.heads * spec.head_dim || s.rows != positions.len() {
            return Err(shape(
                "rope",
                format!(
                    "{}x{} for {} positions of {} heads x {}",
                    s.rows,
                    s.cols,
                    positions.len(),
                    spec.heads,
                    spec.head_dim
                ),
            ));
        }
        let mut out = s.clone();
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (r, pos) in positions.iter().enumerate() {
            for j in 0..half {
                let angle = pos[axis[j]] as f32 * inv[j];
                cos[j] = angle.cos();
                sin[j] = angle.sin();
            }
            let row = &mut out.data[r * s.cols..(r + 1) * s.cols];
            for head in row.chunks_mut(spec.head_dim) {
                for j in 0..half {
                    let (a, b) = (head[j], head[j + half]);
                    head[j] = a * cos[j] - b * sin[j];
                    head[j + half] = b * cos[j] + a * sin[j];
                }
            }
        }
        Ok(out)
    })
}

pub(in crate::cpu) fn rotary(
    mesh: &CpuMesh,
    x: &CpuTensor,
    cos: &CpuTensor,
    sin: &CpuTensor,
    heads: usize,
    head_dim: usize,
) -> Result<CpuTensor> {
    let _t = mesh.timer("rotary");
    if cos.placement != Placement::Replicated || sin.placement != Placement::Replicated {
        return Err(layout("rotary", "replicated tables", cos.placement));
    }
    mesh.elementwise("rotary", &[x], |d, p| {
        let (s, cos, sin) = (p[0], &cos.shards[d], &sin.shards[d]);
        if s.cols != heads * head_dim
            || !head_dim.is_multiple_of(2)
            || cos.rows != s.rows
            || cos.cols != head_dim
            || sin.rows != s.rows
            || sin.cols != head_dim
        {
            return Err(shape(
                "rotary",
                format!(
                    "{}x{} for {heads} heads x {head_dim} with tables {}x{}",
                    s.rows, s.cols, cos.rows, cos.cols
                ),
            ));
        }
        let half = head_dim / 2;
        let mut out = s.clone();
        out.data
            .par_chunks_mut(s.cols.max(1))
            .enumerate()
            .for_each(|(r, row)| {
                let (c, sn) = (cos.row(r), sin.row(r));
                for head in row.chunks_mut(head_dim) {
                    for j in 0..half {
                        let (a, b) = (head[j], head[j + half]);
                        head[j] = a * c[j] - b * sn[j];
                        head[j + half] = b * c[j + half] + a * sn[j + half];
                    }
                }
            });
        Ok(out)
    })
}

/// Columns `[half*d, (half+1)*d)` of every head's `2d` slice.
fn pick_half(s: &HostTensor, heads: usize, d: usize, half: usize) -> Result<HostTensor> {
    if s.cols != heads * 2 * d {
        return Err(shape(
            "split_query_gate",
            format!(
                "{} columns for {heads} heads of [query | gate] x {d}",
                s.cols
            ),
        ));
    }
    let mut data = Vec::with_capacity(s.rows * heads * d);
    for r in 0..s.rows {
        let row = s.row(r);
        for h in 0..heads {
            let at = h * 2 * d + half * d;
            data.extend_from_slice(&row[at..at + d]);
        }
    }
    Ok(HostTensor::new(s.rows, heads * d, data))
}
