//! Pointwise ops of the CPU mesh: add, bias, SwiGLU, sigmoid gating and GELU (the
//! activations of `cpu::activations`, on the vectorised `exp`).

use super::Kernel;
use crate::cpu::activations::{gelu_erf, gelu_tanh_in_place, sigmoid_in_place, silu_in_place};
use crate::cpu::{shape, CpuMesh, CpuTensor, CpuWeight, ROW_BLOCK};
use crate::{Gelu, HostTensor, Result};
use rayon::prelude::*;

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "add" => |m, c| Ok(vec![add(m, c.tensor_at(0)?, c.tensor_at(1)?)?]),
        "swiglu" => |m, c| Ok(vec![swiglu(m, c.tensor_at(0)?)?]),
        "mul_sigmoid" => |m, c| Ok(vec![mul_sigmoid(m, c.tensor_at(0)?, c.tensor_at(1)?)?]),
        "add_bias" => |m, c| Ok(vec![add_bias(m, c.tensor_at(0)?, c.weight_at(1)?)?]),
        "gelu" => |m, c| {
            let code = u32::try_from(c.size_at(0)?).unwrap_or(u32::MAX);
            let kind = Gelu::from_code(code)
                .ok_or_else(|| shape("gelu", format!("no GELU kind of code {code}")))?;
            Ok(vec![gelu(m, c.tensor_at(0)?, kind)?])
        },
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn add(mesh: &CpuMesh, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
    let _t = mesh.timer("add");
    mesh.elementwise("add", &[a, b], |_, p| {
        CpuMesh::same_shape("add", p[0], p[1])?;
        let data = p[0]
            .data
            .iter()
            .zip(&p[1].data)
            .map(|(x, y)| x + y)
            .collect();
        Ok(HostTensor::new(p[0].rows, p[0].cols, data))
    })
}

pub(in crate::cpu) fn swiglu(mesh: &CpuMesh, gate_up: &CpuTensor) -> Result<CpuTensor> {
    let _t = mesh.timer("swiglu");
    mesh.elementwise("swiglu", &[gate_up], |_, p| {
        let s = p[0];
        if !s.cols.is_multiple_of(2) {
            return Err(shape(
                "swiglu",
                format!("{} columns are not [gate | up]", s.cols),
            ));
        }
        let half = s.cols / 2;
        let mut data = vec![0.0f32; s.rows * half];
        data.par_chunks_mut(half).enumerate().for_each(|(r, out)| {
            let row = s.row(r);
            out.copy_from_slice(&row[..half]);
            silu_in_place(out);
            out.iter_mut().zip(&row[half..]).for_each(|(o, u)| *o *= u);
        });
        Ok(HostTensor::new(s.rows, half, data))
    })
}

pub(in crate::cpu) fn mul_sigmoid(
    mesh: &CpuMesh,
    x: &CpuTensor,
    gate: &CpuTensor,
) -> Result<CpuTensor> {
    let _t = mesh.timer("mul_sigmoid");
    mesh.elementwise("mul_sigmoid", &[x, gate], |_, p| {
        CpuMesh::same_shape("mul_sigmoid", p[0], p[1])?;
        let mut data = p[1].data.clone();
        data.par_chunks_mut(ROW_BLOCK)
            .zip(p[0].data.par_chunks(ROW_BLOCK))
            .for_each(|(g, x)| {
                sigmoid_in_place(g);
                g.iter_mut().zip(x).for_each(|(g, x)| *g *= x);
            });
        Ok(HostTensor::new(p[0].rows, p[0].cols, data))
    })
}

pub(in crate::cpu) fn add_bias(mesh: &CpuMesh, x: &CpuTensor, b: &CpuWeight) -> Result<CpuTensor> {
    let _t = mesh.timer("add_bias");
    mesh.elementwise("add_bias", &[x], |d, p| {
        let n = p[0].cols;
        let b = CpuMesh::vector("add_bias", b, d, n)?;
        let mut out = p[0].clone();
        out.data.par_chunks_mut(n.max(1)).for_each(|row| {
            row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
        });
        Ok(out)
    })
}

pub(in crate::cpu) fn gelu(mesh: &CpuMesh, x: &CpuTensor, kind: Gelu) -> Result<CpuTensor> {
    let _t = mesh.timer("gelu");
    mesh.elementwise("gelu", &[x], |_, p| {
        let mut out = p[0].clone();
        out.data.par_chunks_mut(ROW_BLOCK).for_each(|c| match kind {
            Gelu::Tanh => gelu_tanh_in_place(c),
            Gelu::Erf => c.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        });
        Ok(out)
    })
}
