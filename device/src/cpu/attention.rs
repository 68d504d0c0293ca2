//! Softmax attention of one device's heads, fp32: causal over a KV cache (GQA) for the text
//! model, bidirectional within segments for the vision tower. Both run per (head, block of
//! queries) so the score block stays small at long contexts.

use super::denormals::FlushDenormals;
use super::exp::exp_in_place;
use super::matmul::small_matmul;
use crate::AttentionSpec;
use rayon::prelude::*;
use std::ops::Range;

/// Query rows handled at once: the block's score rows (a whole context or image wide) then
/// stay in L2 while the values multiply them (256 rows at 2,048 tokens were 2 MiB of scores,
/// re-read from L3 for every 16 output channels).
const QUERY_BLOCK: usize = 64;

/// Where one block of queries of one head reads.
struct Block<'a> {
    /// The first query row of the block, at column `head * d` of a row of width `q_width`.
    q: &'a [f32],
    q_width: usize,
    /// The first visible key, at channel 0 of this head's KV head; channel `c` of key `j` is
    /// at `c * key_channel_stride + j * key_stride`.
    keys: &'a [f32],
    key_channel_stride: usize,
    key_stride: usize,
    /// The first visible value row, at the column of this head's KV head.
    values: &'a [f32],
    kv_width: usize,
    rows: usize,
    /// Keys the block reads (the last query row sees at most this many).
    visible: usize,
    d: usize,
}

/// `softmax(q kᵀ · d^-0.5) v` for one block; query row `i` sees keys `0..limit(i)`. `scratch`
/// holds the score block and is reused between the blocks a rayon job runs (a score block of a
/// large image is megabytes; allocating it per block costs page faults, not arithmetic).
fn attend(b: &Block, limit: impl Fn(usize) -> usize, scratch: &mut Vec<f32>) -> Vec<f32> {
    let _ftz = FlushDenormals::new();
    let (rows, visible, d) = (b.rows, b.visible, b.d);
    let scale = (d as f32).powf(-0.5);
    if scratch.len() < rows * visible {
        scratch.resize(rows * visible, 0.0);
    }
    // Every entry is written: the product below overwrites, the softmax zeroes the masked tail.
    let scores = &mut scratch[..rows * visible];
    small_matmul(
        rows,
        visible,
        d,
        scores,
        false,
        b.q,
        b.q_width,
        1,
        b.keys,
        b.key_channel_stride,
        b.key_stride,
    );
    for (i, row) in scores.chunks_mut(visible).enumerate() {
        let (live, masked) = row.split_at_mut(limit(i));
        let max = scale_and_max(live, scale);
        live.iter_mut().for_each(|s| *s -= max);
        exp_in_place(live);
        let inv = 1.0 / lane_sum(live);
        live.iter_mut().for_each(|s| *s *= inv);
        masked.fill(0.0);
    }
    let mut o = vec![0.0f32; rows * d];
    small_matmul(
        rows, d, visible, &mut o, false, scores, visible, 1, b.values, b.kv_width, 1,
    );
    o
}

/// Lanes of the softmax reductions: eight partial results side by side, so the loops below
/// compile to vector code (one running value is a serial chain the compiler must keep).
const LANES: usize = 8;

/// `row *= scale`, returning the largest entry (scores are never NaN).
fn scale_and_max(row: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (m, s) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *s *= scale;
            *m = if *s > *m { *s } else { *m };
        }
    }
    for s in chunks.into_remainder() {
        *s *= scale;
        lanes[0] = if *s > lanes[0] { *s } else { lanes[0] };
    }
    lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// The sum of `row`, in `LANES` interleaved partial sums.
fn lane_sum(row: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (acc, s) in lanes.iter_mut().zip(chunk) {
            *acc += s;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Each head's keys of `k` `[rows, heads*d]` transposed once, `[d, rows]`, so every query
/// block reads them with unit stride (the matmul would otherwise transpose them per block).
fn transpose_heads(k: &[f32], rows: usize, heads: usize, d: usize) -> Vec<Vec<f32>> {
    let width = heads * d;
    (0..heads)
        .into_par_iter()
        .map(|h| {
            let mut kt = vec![0.0f32; d * rows];
            for (j, row) in k.chunks_exact(width).take(rows).enumerate() {
                for (c, &x) in row[h * d..(h + 1) * d].iter().enumerate() {
                    kt[c * rows + j] = x;
                }
            }
            kt
        })
        .collect()
}

/// Write per-(head, first row) outputs `[rows, d]` into `[T, heads*d]`.
fn scatter(results: Vec<(usize, usize, Vec<f32>)>, t: usize, heads: usize, d: usize) -> Vec<f32> {
    let width = heads * d;
    let mut out = vec![0.0f32; t * width];
    for (h, r0, o) in results {
        for (i, row) in o.chunks(d).enumerate() {
            let at = (r0 + i) * width + h * d;
            out[at..at + d].copy_from_slice(row);
        }
    }
    out
}

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
    let transposed = transpose_heads(keys, seq, nkv, d);
    let tasks: Vec<(usize, usize)> = (0..nh)
        .flat_map(|h| (0..t).step_by(QUERY_BLOCK).map(move |r| (h, r)))
        .collect();
    let results = tasks
        .par_iter()
        .map_init(Vec::new, |scratch, &(h, r0)| {
            let r1 = (r0 + QUERY_BLOCK).min(t);
            let kvh = h / group;
            let block = Block {
                q: &q[r0 * width + h * d..],
                q_width: width,
                keys: &transposed[kvh],
                key_channel_stride: seq,
                key_stride: 1,
                values: &values[kvh * d..],
                kv_width,
                rows: r1 - r0,
                // keys 0..visible are needed by the last row
                visible: start + r1,
                d,
            };
            (h, r0, attend(&block, |i| start + r0 + i + 1, scratch))
        })
        .collect();
    scatter(results, t, nh, d)
}

/// `q`, `k`, `v` `[T, heads*d]`; each row attends to the rows of its segment. Returns
/// `[T, heads*d]`.
pub fn segments(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    d: usize,
    segments: &[Range<usize>],
) -> Vec<f32> {
    let width = heads * d;
    let t = q.len().checked_div(width).unwrap_or(0);
    let transposed = transpose_heads(k, t, heads, d);
    let tasks: Vec<(usize, usize, &Range<usize>)> = (0..heads)
        .flat_map(|h| {
            segments
                .iter()
                .flat_map(move |s| s.clone().step_by(QUERY_BLOCK).map(move |r| (h, r, s)))
        })
        .collect();
    let results = tasks
        .par_iter()
        .map_init(Vec::new, |scratch, &(h, r0, seg)| {
            let r1 = (r0 + QUERY_BLOCK).min(seg.end);
            let block = Block {
                q: &q[r0 * width + h * d..],
                q_width: width,
                keys: &transposed[h][seg.start..],
                key_channel_stride: t,
                key_stride: 1,
                values: &v[seg.start * width + h * d..],
                kv_width: width,
                rows: r1 - r0,
                visible: seg.len(),
                d,
            };
            (h, r0, attend(&block, |_| seg.len(), scratch))
        })
        .collect();
    scatter(results, t, heads, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-wise reductions against one running value, on every length around the lane
    /// count (empty rows, tails, the largest entry in the tail).
    #[test]
    fn lane_reductions_match_a_running_value() {
        for len in 0..3 * LANES + 2 {
            let row: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3 + if i + 1 == len { 9.0 } else { 0.0 })
                .collect();
            let mut scaled = row.clone();
            let max = scale_and_max(&mut scaled, 0.5);
            let want: Vec<f32> = row.iter().map(|s| s * 0.5).collect();
            assert_eq!(scaled, want);
            assert_eq!(max, want.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            let exact: f64 = want.iter().map(|&s| f64::from(s)).sum();
            assert!((f64::from(lane_sum(&want)) - exact).abs() <= 1e-5 * (1.0 + exact.abs()));
        }
    }
}
