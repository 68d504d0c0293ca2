//! Placing tensors and weights on the CPU mesh and reading them back: replicate, shard,
//! gather, weight upload (packed for the matmul), tensor-cache export and import, sizes.

use crate::cpu::matmul::PackedWeight;
use crate::cpu::{shape, CpuMesh, CpuTensor, CpuWeight, CpuWeightPart, Placement};
use crate::{
    DeviceError, GatherAxis, HostTensor, HostWeight, MeshOps, Result, SharedBytes, WeightBytes,
    WeightFormat, WeightKind,
};
use rayon::prelude::*;

pub(in crate::cpu) fn replicate(mesh: &CpuMesh, host: &HostTensor) -> Result<CpuTensor> {
    Ok(CpuTensor {
        placement: Placement::Replicated,
        shards: vec![host.clone(); mesh.devices()],
    })
}

pub(in crate::cpu) fn shard(mesh: &CpuMesh, parts: Vec<HostTensor>) -> Result<CpuTensor> {
    if parts.len() != mesh.devices() {
        return Err(DeviceError::Parts {
            op: "shard",
            got: parts.len(),
            devices: mesh.devices(),
        });
    }
    Ok(CpuTensor {
        placement: Placement::Sharded,
        shards: parts,
    })
}

pub(in crate::cpu) fn gather(
    mesh: &CpuMesh,
    t: &CpuTensor,
    axis: GatherAxis,
) -> Result<HostTensor> {
    match t.placement {
        Placement::Replicated => Ok(t.shards[0].clone()),
        Placement::Partial => Ok(mesh.all_reduce(t)?.shards[0].clone()),
        Placement::Sharded => match axis {
            GatherAxis::Rows => {
                let cols = t.shards[0].cols;
                if t.shards.iter().any(|s| s.cols != cols) {
                    return Err(shape("gather", "shards of different widths".into()));
                }
                let rows = t.shards.iter().map(|s| s.rows).sum();
                let data = t
                    .shards
                    .iter()
                    .flat_map(|s| s.data.iter().copied())
                    .collect();
                Ok(HostTensor::new(rows, cols, data))
            }
            GatherAxis::Cols => {
                let rows = t.shards[0].rows;
                if t.shards.iter().any(|s| s.rows != rows) {
                    return Err(shape("gather", "shards of different heights".into()));
                }
                let cols: usize = t.shards.iter().map(|s| s.cols).sum();
                let mut data = Vec::with_capacity(rows * cols);
                for r in 0..rows {
                    for s in &t.shards {
                        data.extend_from_slice(s.row(r));
                    }
                }
                Ok(HostTensor::new(rows, cols, data))
            }
        },
    }
}

pub(in crate::cpu) fn device_parts(_mesh: &CpuMesh, t: &CpuTensor) -> Result<Vec<HostTensor>> {
    Ok(t.shards.clone())
}

pub(in crate::cpu) fn tensor_bytes(_mesh: &CpuMesh, t: &CpuTensor) -> usize {
    t.shards.iter().map(|s| s.data.len() * 4).sum()
}

pub(in crate::cpu) fn upload_weight(
    mesh: &CpuMesh,
    parts: Vec<HostWeight>,
    format: WeightFormat,
    kind: WeightKind,
) -> Result<CpuWeight> {
    if parts.len() != mesh.devices() {
        return Err(DeviceError::Parts {
            op: "upload_weight",
            got: parts.len(),
            devices: mesh.devices(),
        });
    }
    let parts = parts
        .into_par_iter()
        .map(|p| match kind {
            WeightKind::Matrix => CpuWeightPart::Matrix(PackedWeight::pack(&p, format)),
            WeightKind::Vector => CpuWeightPart::Vector(p.to_f32()),
        })
        .collect();
    Ok(CpuWeight { parts })
}

pub(in crate::cpu) fn export_weight(_mesh: &CpuMesh, w: &CpuWeight) -> Result<Vec<WeightBytes>> {
    Ok(w.parts
        .iter()
        .map(|p| match p {
            CpuWeightPart::Matrix(m) => WeightBytes {
                kind: WeightKind::Matrix,
                format: m.format(),
                rows: m.n,
                cols: m.k,
                data: SharedBytes::owned(m.to_bytes()),
            },
            CpuWeightPart::Vector(v) => WeightBytes {
                kind: WeightKind::Vector,
                format: WeightFormat::F32,
                rows: v.len(),
                cols: 1,
                data: SharedBytes::owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            },
        })
        .collect())
}

pub(in crate::cpu) fn import_weight(mesh: &CpuMesh, parts: Vec<WeightBytes>) -> Result<CpuWeight> {
    if parts.len() != mesh.devices() {
        return Err(DeviceError::Parts {
            op: "import_weight",
            got: parts.len(),
            devices: mesh.devices(),
        });
    }
    let parts = parts
        .into_par_iter()
        .map(|p| {
            let bad = || {
                shape(
                    "import_weight",
                    format!(
                        "{} bytes do not hold a {}x{} {} {:?}",
                        p.data.len(),
                        p.rows,
                        p.cols,
                        p.format.name(),
                        p.kind
                    ),
                )
            };
            match p.kind {
                WeightKind::Matrix => {
                    PackedWeight::from_bytes(p.rows, p.cols, p.format, p.data.clone())
                        .map(CpuWeightPart::Matrix)
                        .ok_or_else(bad)
                }
                WeightKind::Vector if p.data.len() == p.rows * 4 => Ok(CpuWeightPart::Vector(
                    p.data
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )),
                WeightKind::Vector => Err(bad()),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CpuWeight { parts })
}

pub(in crate::cpu) fn weight_bytes(_mesh: &CpuMesh, w: &CpuWeight) -> usize {
    w.parts
        .iter()
        .map(|p| match p {
            CpuWeightPart::Matrix(m) => m.bytes(),
            CpuWeightPart::Vector(v) => v.len() * 4,
        })
        .sum()
}
