//! The dense ops of the CPU mesh: the linear projection (the packed matmul of `cpu::matmul`),
//! the all-reduce between shards, and the reshapes (split and fold columns; slice and concat
//! rows, around the time-mixing ops of a packed pass).

use super::Kernel;
use crate::cpu::matmul;
use crate::cpu::{layout, shape, CpuMesh, CpuTensor, CpuWeight, CpuWeightPart, Placement};
use crate::{HostTensor, MeshOps, Result};

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "linear" => |m, c| Ok(vec![linear(m, c.tensor_at(0)?, c.weight_at(1)?)?]),
        "all_reduce" => |m, c| Ok(vec![all_reduce(m, c.tensor_at(0)?)?]),
        "split_cols" => |m, c| {
            let widths: Vec<usize> = c.list.iter().map(|&w| w as usize).collect();
            split_cols(m, c.tensor_at(0)?, &widths)
        },
        "fold_rows" => |m, c| Ok(vec![fold_rows(m, c.tensor_at(0)?, c.size_at(0)?)?]),
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn linear(mesh: &CpuMesh, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
    let _t = mesh.timer("linear");
    let placement = match x.placement {
        Placement::Replicated => Placement::Sharded,
        Placement::Sharded => Placement::Partial,
        Placement::Partial => return Err(layout("linear", "complete", x.placement)),
    };
    // A replicated input against a replicated (1-device) plan stays replicated.
    let placement = if mesh.devices() == 1 && x.placement == Placement::Replicated {
        Placement::Replicated
    } else {
        placement
    };
    let shards = mesh.per_device(|d| {
        let xs = &x.shards[d];
        let CpuWeightPart::Matrix(wp) = &w.parts[d] else {
            return Err(shape("linear", "a vector weight used as a matrix".into()));
        };
        if xs.cols != wp.k {
            return Err(shape(
                "linear",
                format!("input width {} vs weight [{}, {}]", xs.cols, wp.n, wp.k),
            ));
        }
        Ok(HostTensor::new(
            xs.rows,
            wp.n,
            matmul::linear_with(&xs.data, xs.rows, wp, &mesh.numerics),
        ))
    })?;
    Ok(CpuTensor { placement, shards })
}

pub(in crate::cpu) fn all_reduce(mesh: &CpuMesh, x: &CpuTensor) -> Result<CpuTensor> {
    let _t = mesh.timer("all_reduce");
    match x.placement {
        Placement::Replicated => Ok(x.clone()),
        Placement::Sharded => Err(layout("all_reduce", "partial", x.placement)),
        Placement::Partial => {
            let first = &x.shards[0];
            let mut sum = first.clone();
            for s in &x.shards[1..] {
                CpuMesh::same_shape("all_reduce", first, s)?;
                sum.data.iter_mut().zip(&s.data).for_each(|(a, b)| *a += b);
            }
            mesh.replicate(&sum)
        }
    }
}

pub(in crate::cpu) fn split_cols(
    mesh: &CpuMesh,
    x: &CpuTensor,
    widths: &[usize],
) -> Result<Vec<CpuTensor>> {
    let _t = mesh.timer("split_cols");
    if x.placement == Placement::Partial {
        return Err(layout("split_cols", "complete", x.placement));
    }
    let total: usize = widths.iter().sum();
    let mut outs: Vec<CpuTensor> = widths
        .iter()
        .map(|_| CpuTensor {
            placement: x.placement,
            shards: Vec::with_capacity(x.shards.len()),
        })
        .collect();
    for s in &x.shards {
        if s.cols != total {
            return Err(shape(
                "split_cols",
                format!("{} columns split as {widths:?}", s.cols),
            ));
        }
        let mut start = 0;
        for (out, &w) in outs.iter_mut().zip(widths) {
            let mut data = Vec::with_capacity(s.rows * w);
            for r in 0..s.rows {
                data.extend_from_slice(&s.row(r)[start..start + w]);
            }
            out.shards.push(HostTensor::new(s.rows, w, data));
            start += w;
        }
    }
    Ok(outs)
}

pub(in crate::cpu) fn fold_rows(mesh: &CpuMesh, x: &CpuTensor, group: usize) -> Result<CpuTensor> {
    let _t = mesh.timer("fold_rows");
    mesh.elementwise("fold_rows", &[x], |_, p| {
        let s = p[0];
        if group == 0 || !s.rows.is_multiple_of(group) {
            return Err(shape(
                "fold_rows",
                format!("{} rows in groups of {group}", s.rows),
            ));
        }
        Ok(HostTensor::new(
            s.rows / group,
            s.cols * group,
            s.data.clone(),
        ))
    })
}

/// Rows `rows` of every part ([`MeshOps::slice_rows`]).
pub(in crate::cpu) fn slice_rows(
    mesh: &CpuMesh,
    x: &CpuTensor,
    rows: std::ops::Range<usize>,
) -> Result<CpuTensor> {
    let _t = mesh.timer("slice_rows");
    let mut shards = Vec::with_capacity(x.shards.len());
    for s in &x.shards {
        if rows.start > rows.end || rows.end > s.rows {
            return Err(shape(
                "slice_rows",
                format!("rows {rows:?} of a part of {} rows", s.rows),
            ));
        }
        let data = s.data[rows.start * s.cols..rows.end * s.cols].to_vec();
        shards.push(HostTensor::new(rows.len(), s.cols, data));
    }
    Ok(CpuTensor {
        placement: x.placement,
        shards,
    })
}

/// The parts stacked by rows ([`MeshOps::concat_rows`]).
pub(in crate::cpu) fn concat_rows(mesh: &CpuMesh, parts: &[CpuTensor]) -> Result<CpuTensor> {
    let _t = mesh.timer("concat_rows");
    let Some(first) = parts.first() else {
        return Err(shape("concat_rows", "no parts".into()));
    };
    let mut shards = Vec::with_capacity(first.shards.len());
    for d in 0..first.shards.len() {
        let cols = first.shards[d].cols;
        let mut rows = 0;
        let mut data = Vec::new();
        for p in parts {
            let s = p.shards.get(d).filter(|s| s.cols == cols).ok_or_else(|| {
                shape("concat_rows", format!("parts of {cols} columns and others"))
            })?;
            if p.placement != first.placement {
                return Err(layout("concat_rows", "uniformly placed", p.placement));
            }
            rows += s.rows;
            data.extend_from_slice(&s.data);
        }
        shards.push(HostTensor::new(rows, cols, data));
    }
    Ok(CpuTensor {
        placement: first.placement,
        shards,
    })
}
