//! Attention ops of the CPU mesh: the KV append, causal attention over the cache and the
//! vision tower's segment attention (the block kernels of `cpu::attention`).

use super::Kernel;
use crate::cpu::attention;
use crate::cpu::{shape, CpuMesh, CpuTensor};
use crate::{AttentionSpec, HostTensor, Kept, Result};

/// This family's fine ops by name, each reading its call (the encoding of `MeshOps`' default
/// body) and running the maths below; `cpu/ops/mod.rs` looks an op up here.
pub(in crate::cpu) fn kernel(op: &str) -> Option<Kernel> {
    let kernel: Kernel = match op {
        "append_rows" => |m, c| {
            Ok(vec![append_rows(
                m,
                c.optional_at(0)?,
                c.tensor_at(1)?,
                c.size_at(0)?,
            )?])
        },
        "causal_attention" => |m, c| {
            let spec = AttentionSpec {
                heads: c.size_at(0)?,
                kv_heads: c.size_at(1)?,
                head_dim: c.size_at(2)?,
            };
            let (q, k, v) = (c.tensor_at(0)?, c.tensor_at(1)?, c.tensor_at(2)?);
            Ok(vec![causal_attention(m, q, k, v, &spec)?])
        },
        "segment_attention" => |m, c| {
            if c.list.len() % 2 != 0 {
                return Err(shape(
                    "segment_attention",
                    "segment bounds are not pairs".into(),
                ));
            }
            let segments: Vec<std::ops::Range<usize>> = c
                .list
                .chunks_exact(2)
                .map(|s| s[0] as usize..s[1] as usize)
                .collect();
            let (q, k, v) = (c.tensor_at(0)?, c.tensor_at(1)?, c.tensor_at(2)?);
            let (heads, head_dim) = (c.size_at(0)?, c.size_at(1)?);
            Ok(vec![segment_attention(
                m, q, k, v, heads, head_dim, &segments,
            )?])
        },
        _ => return None,
    };
    Some(kernel)
}

pub(in crate::cpu) fn append_rows(
    mesh: &CpuMesh,
    cache: Option<&CpuTensor>,
    new: &CpuTensor,
    _heads: usize,
) -> Result<CpuTensor> {
    let _t = mesh.timer("append_rows");
    // The new rows as the KV cache keeps them (bf16: rounded, as a device typecasts them).
    let kv = mesh.numerics().kv_cache;
    let rounded;
    let new = if kv == Kept::F32 {
        new
    } else {
        rounded = mesh.elementwise("append_rows", &[new], |_, p| {
            let mut rows = p[0].clone();
            kv.keep(&mut rows.data);
            Ok(rows)
        })?;
        &rounded
    };
    let Some(cache) = cache else {
        return Ok(new.clone());
    };
    mesh.elementwise("append_rows", &[cache, new], |_, p| {
        if p[0].cols != p[1].cols {
            return Err(shape(
                "append_rows",
                format!("{} vs {} columns", p[0].cols, p[1].cols),
            ));
        }
        let mut data = Vec::with_capacity(p[0].data.len() + p[1].data.len());
        data.extend_from_slice(&p[0].data);
        data.extend_from_slice(&p[1].data);
        Ok(HostTensor::new(p[0].rows + p[1].rows, p[0].cols, data))
    })
}

pub(in crate::cpu) fn causal_attention(
    mesh: &CpuMesh,
    q: &CpuTensor,
    keys: &CpuTensor,
    values: &CpuTensor,
    spec: &AttentionSpec,
) -> Result<CpuTensor> {
    let _t = mesh.timer("causal_attention");
    mesh.elementwise("causal_attention", &[q, keys, values], |_, p| {
        let (q, k, v) = (p[0], p[1], p[2]);
        let kvw = spec.kv_heads * spec.head_dim;
        if q.cols != spec.heads * spec.head_dim
            || k.cols != kvw
            || v.cols != kvw
            || k.rows != v.rows
            || k.rows < q.rows
            || spec.kv_heads == 0
            || !spec.heads.is_multiple_of(spec.kv_heads)
        {
            return Err(shape(
                "causal_attention",
                format!(
                    "q {}x{}, k {}x{}, v {}x{}",
                    q.rows, q.cols, k.rows, k.cols, v.rows, v.cols
                ),
            ));
        }
        let out = attention::causal(&q.data, &k.data, &v.data, k.rows, spec);
        Ok(HostTensor::new(q.rows, q.cols, out))
    })
}

pub(in crate::cpu) fn segment_attention(
    mesh: &CpuMesh,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    heads: usize,
    head_dim: usize,
    segments: &[std::ops::Range<usize>],
) -> Result<CpuTensor> {
    let _t = mesh.timer("segment_attention");
    mesh.elementwise("segment_attention", &[q, k, v], |_, p| {
        let (q, k, v) = (p[0], p[1], p[2]);
        let width = heads * head_dim;
        let mut next = 0;
        let tiled = segments.iter().all(|s| {
            let ok = s.start == next && s.end > s.start;
            next = s.end;
            ok
        }) && next == q.rows;
        if q.cols != width
            || k.cols != width
            || v.cols != width
            || k.rows != q.rows
            || v.rows != q.rows
            || !tiled
        {
            return Err(shape(
                "segment_attention",
                format!(
                    "q {}x{}, k {}x{}, v {}x{} for {heads} heads x {head_dim}, segments {segments:?}",
                    q.rows, q.cols, k.rows, k.cols, v.rows, v.cols
                ),
            ));
        }
        let out = attention::segments(&q.data, &k.data, &v.data, heads, head_dim, segments);
        Ok(HostTensor::new(q.rows, width, out))
    })
}
