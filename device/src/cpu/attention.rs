//! Causal softmax attention of one device's heads over its KV cache (GQA), fp32.

use super::denormals::FlushDenormals;
use super::matmul::small_matmul;
use crate::AttentionSpec;
use rayon::prelude::*;

/// Query rows handled at once, so the score block stays small at long contexts.
const QUERY_BLOCK: usize = 256;

/// `q` `[T, heads*d]` at positions `start..start+T` where `start = S - T`; `keys`, `values`
/// `[S, kv_heads*d]`. Returns `[T, heads*d]`.
pub fn causal(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    seq: usize,
    spec: &AttentionSpec,
) -> Vec<f32> {
    let d = spec.head_dim;
    let (nh, nkv) = (spec.heads, spec.kv_heads);
    let width = nh * d;
    let kv_width = nkv * d;
    let t = q.len().checked_div(width).unwrap_or(0);
    let start = seq - t;
    let group = nh / nkv.max(1);
    let scale = (d as f32).powf(-0.5);
    let mut out = vec![0.0f32; t * width];
    // Per (head, query block) tasks; each writes its own rows of its own head.
    let tasks: Vec<(usize, usize)> = (0..nh)
        .flat_map(|h| (0..t).step_by(QUERY_BLOCK).map(move |r| (h, r)))
        .collect();
    let results: Vec<(usize, usize, Vec<f32>)> = tasks
        .par_iter()
        .map(|&(h, r0)| {
            let _ftz = FlushDenormals::new();
            let r1 = (r0 + QUERY_BLOCK).min(t);
            let rows = r1 - r0;
            let kvh = h / group;
            let visible = start + r1; // keys 0..visible are needed by the last row
            let mut scores = vec![0.0f32; rows * visible];
            small_matmul(
                rows,
                visible,
                d,
                &mut scores,
                false,
                &q[r0 * width + h * d..],
                width,
                1,
                &keys[kvh * d..],
                1,
                kv_width,
            );
            for (i, row) in scores.chunks_mut(visible).enumerate() {
                let limit = start + r0 + i + 1;
                let mut max = f32::NEG_INFINITY;
                for s in row[..limit].iter_mut() {
                    *s *= scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0f32;
                for s in row[..limit].iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                row[..limit].iter_mut().for_each(|s| *s *= inv);
                row[limit..].fill(0.0);
            }
            let mut o = vec![0.0f32; rows * d];
            small_matmul(
                rows,
                d,
                visible,
                &mut o,
                false,
                &scores,
                visible,
                1,
                &values[kvh * d..],
                kv_width,
                1,
            );
            (h, r0, o)
        })
        .collect();
    for (h, r0, o) in results {
        for (i, row) in o.chunks(d).enumerate() {
            let at = (r0 + i) * width + h * d;
            out[at..at + d].copy_from_slice(row);
        }
    }
    out
}
