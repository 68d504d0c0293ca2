//! The Qwen3.5 vision tower on the host in f32 (spec qwen35-backbone.md §11): patch embedding
//! (the Conv3d as a 1536 → hidden linear map), the learned 2-D position table resampled
//! bilinearly (align_corners) to each grid and put in merge-block order, pre-LayerNorm blocks
//! with 2-D rotary attention restricted to each image or frame pair and a tanh-GELU MLP, then
//! the merger (LayerNorm, 2x2 patches concatenated, fc1, erf-GELU, fc2) giving one text-space
//! embedding per merged token. Host f32: the projections use `clef-device`'s packed CPU matmul,
//! attention runs per head in blocks of queries; the mesh port (a TP plan like the backbone's)
//! is not written yet.

use crate::preprocess::{Grid, MERGE, ROW_VALUES};
use clef_device::cpu::matmul::{linear, small_matmul, PackedWeight};
use rayon::prelude::*;

/// `y = x·Wᵀ + b` with `W` `[out, in]`, packed once for the CPU matmul of `clef-device`.
#[derive(Clone, Debug)]
pub struct Linear {
    packed: PackedWeight,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Linear {
    /// From the checkpoint layout: `weight` `[outputs, inputs]` row-major, `bias` `[outputs]`.
    pub fn new(weight: &[f32], bias: Vec<f32>, outputs: usize) -> Self {
        let inputs = weight.len() / outputs.max(1);
        Linear {
            packed: PackedWeight::from_f32_rows(
                |o| &weight[o * inputs..(o + 1) * inputs],
                outputs,
                inputs,
            ),
            bias,
            inputs,
            outputs,
        }
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let rows = x.len() / self.inputs;
        let mut y = linear(x, rows, &self.packed);
        y.par_chunks_mut(self.outputs)
            .for_each(|row| row.iter_mut().zip(&self.bias).for_each(|(v, b)| *v += b));
        y
    }
}

/// LayerNorm with weight and bias, eps 1e-6.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

impl LayerNorm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = self.weight.len();
        let mut y = x.to_vec();
        y.par_chunks_mut(n).for_each(|row| {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + 1e-6).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * inv * w + b;
            }
        });
        y
    }
}

/// One pre-LN block.
#[derive(Clone, Debug)]
pub struct Block {
    pub norm1: LayerNorm,
    pub qkv: Linear,
    pub proj: Linear,
    pub norm2: LayerNorm,
    pub fc1: Linear,
    pub fc2: Linear,
}

/// The tower's weights.
#[derive(Clone, Debug)]
pub struct VisionTower {
    pub heads: usize,
    pub patch_embed: Linear,
    /// `[side², hidden]` learned positions on a `side × side` grid.
    pub pos_embed: Vec<f32>,
    pub blocks: Vec<Block>,
    pub merger_norm: LayerNorm,
    pub merger_fc1: Linear,
    pub merger_fc2: Linear,
}

fn gelu_tanh(x: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// erf in f64 (Abramowitz–Stegun 7.1.26 is too coarse; this is the series / continued fraction
/// pair, accurate to ~1e-15), returned as f32.
fn erf(x: f32) -> f32 {
    let x = f64::from(x);
    let t = x.abs();
    let v = if t < 2.5 {
        // Maclaurin series.
        let mut sum = t;
        let mut term = t;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -t * t / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // Continued fraction for erfc.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = f64::from(k) / 2.0 / (t + f);
        }
        1.0 - (-t * t).exp() / std::f64::consts::PI.sqrt() / (t + f)
    };
    (if x < 0.0 { -v } else { v }) as f32
}

/// torch.linspace(0, end, steps) in f32 (symmetric halves, as PyTorch computes it).
fn linspace(end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![0.0];
    }
    let step = end / (steps - 1) as f32;
    (0..steps)
        .map(|i| {
            if i < steps / 2 {
                step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}

/// (row, col) of each patch of a `t × h × w` grid in merge-block order.
fn patch_coordinates(grid: &Grid) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(grid.patches());
    for _ in 0..grid.t {
        for by in 0..grid.h / MERGE {
            for bx in 0..grid.w / MERGE {
                for iy in 0..MERGE {
                    for ix in 0..MERGE {
                        out.push((by * MERGE + iy, bx * MERGE + ix));
                    }
                }
            }
        }
    }
    out
}

impl VisionTower {
    pub fn hidden_size(&self) -> usize {
        self.patch_embed.outputs()
    }

    /// The learned positions resampled to `grid`, in merge-block order.
    fn positions(&self, grid: &Grid) -> Vec<f32> {
        let d = self.hidden_size();
        let side = ((self.pos_embed.len() / d) as f64).sqrt() as usize;
        let hs = linspace((side - 1) as f32, grid.h);
        let ws = linspace((side - 1) as f32, grid.w);
        let table =
            |r: usize, c: usize| &self.pos_embed[(r * side + c) * d..(r * side + c + 1) * d];
        let mut out = Vec::with_capacity(grid.patches() * d);
        for (r, c) in patch_coordinates(grid) {
            let (h, w) = (hs[r], ws[c]);
            let (h0, w0) = (h as usize, w as usize);
            let (h1, w1) = ((h0 + 1).min(side - 1), (w0 + 1).min(side - 1));
            let (dh, dw) = (h - h0 as f32, w - w0 as f32);
            let taps = [
                (table(h0, w0), (1.0 - dh) * (1.0 - dw)),
                (table(h0, w1), (1.0 - dh) * dw),
                (table(h1, w0), dh * (1.0 - dw)),
                (table(h1, w1), dh * dw),
            ];
            for k in 0..d {
                out.push(taps.iter().fold(0.0f32, |s, (row, wt)| s + row[k] * wt));
            }
        }
        out
    }

    /// The tower's output after the last block (before the merger), `[patches, hidden]`, for the
    /// patch rows of media with `grids` (concatenated in that order).
    pub fn hidden(&self, pixel_rows: &[f32], grids: &[Grid]) -> Vec<f32> {
        let d = self.hidden_size();
        let head_dim = d / self.heads;
        let mut x = self.patch_embed.apply(pixel_rows);
        debug_assert_eq!(pixel_rows.len() / ROW_VALUES, x.len() / d);
        // Positions and rotary angles per patch; attention segments (one image or frame pair).
        let mut coordinates = Vec::new();
        let mut segments = Vec::new();
        let mut at = 0;
        for grid in grids {
            let pos = self.positions(grid);
            let n = grid.patches();
            x[at * d..(at + n) * d]
                .iter_mut()
                .zip(&pos)
                .for_each(|(v, p)| *v += p);
            coordinates.extend(patch_coordinates(grid));
            let per_frame = grid.h * grid.w;
            for f in 0..grid.t {
                segments.push(at + f * per_frame..at + (f + 1) * per_frame);
            }
            at += n;
        }
        let quarter = head_dim / 4;
        let inv: Vec<f32> = (0..quarter)
            .map(|i| 1.0 / 10_000f32.powf((2 * i) as f32 / (head_dim / 2) as f32))
            .collect();
        // [patches, head_dim]: [h·inv, w·inv] twice.
        let angles: Vec<f32> = coordinates
            .iter()
            .flat_map(|&(r, c)| {
                let half: Vec<f32> = inv
                    .iter()
                    .map(|f| r as f32 * f)
                    .chain(inv.iter().map(|f| c as f32 * f))
                    .collect();
                half.iter()
                    .chain(half.iter())
                    .copied()
                    .collect::<Vec<f32>>()
            })
            .collect();
        for block in &self.blocks {
            let h = block.norm1.apply(&x);
            let attended = self.attention(block, &h, &angles, &segments);
            let attended = block.proj.apply(&attended);
            x.iter_mut().zip(&attended).for_each(|(a, b)| *a += b);
            let h = block.norm2.apply(&x);
            let mut up = block.fc1.apply(&h);
            up.iter_mut().for_each(|v| *v = gelu_tanh(*v));
            let down = block.fc2.apply(&up);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        x
    }

    /// Bidirectional attention of every head within each segment, 2-D rotary on q and k; each
    /// head runs in blocks of queries (scores `[block, segment]`).
    fn attention(
        &self,
        block: &Block,
        h: &[f32],
        angles: &[f32],
        segments: &[std::ops::Range<usize>],
    ) -> Vec<f32> {
        const QUERY_BLOCK: usize = 256;
        let d = self.hidden_size();
        let hd = d / self.heads;
        let n = h.len() / d;
        let qkv = block.qkv.apply(h);
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        // One head's q, k or v as [n, hd], rotated for q and k.
        let split = |which: usize, head: usize, rotate: bool| -> Vec<f32> {
            let mut out = vec![0.0f32; n * hd];
            let half = hd / 2;
            for (i, row) in out.chunks_exact_mut(hd).enumerate() {
                let src = &qkv[i * 3 * d + which * d + head * hd..][..hd];
                if !rotate {
                    row.copy_from_slice(src);
                    continue;
                }
                for k in 0..hd {
                    let turned = if k < half {
                        -src[k + half]
                    } else {
                        src[k - half]
                    };
                    row[k] = src[k] * cos[i * hd + k] + turned * sin[i * hd + k];
                }
            }
            out
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let heads: Vec<Vec<f32>> = (0..self.heads)
            .into_par_iter()
            .map(|head| {
                let (q, k, v) = (
                    split(0, head, true),
                    split(1, head, true),
                    split(2, head, false),
                );
                let mut o = vec![0.0f32; n * hd];
                for seg in segments {
                    let len = seg.len();
                    let mut scores = vec![0.0f32; QUERY_BLOCK.min(len) * len];
                    let mut q0 = seg.start;
                    while q0 < seg.end {
                        let m = QUERY_BLOCK.min(seg.end - q0);
                        let s = &mut scores[..m * len];
                        // q_block · kᵀ: k read column-wise (row stride 1, column stride hd).
                        let (qb, ks) = (&q[q0 * hd..], &k[seg.start * hd..]);
                        small_matmul(m, len, hd, s, false, qb, hd, 1, ks, 1, hd);
                        for row in s.chunks_exact_mut(len) {
                            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b * scale));
                            let mut total = 0.0f32;
                            for x in row.iter_mut() {
                                *x = (*x * scale - max).exp();
                                total += *x;
                            }
                            row.iter_mut().for_each(|x| *x /= total);
                        }
                        let out = &mut o[q0 * hd..(q0 + m) * hd];
                        small_matmul(
                            m,
                            hd,
                            len,
                            out,
                            false,
                            s,
                            len,
                            1,
                            &v[seg.start * hd..],
                            hd,
                            1,
                        );
                        q0 += m;
                    }
                }
                o
            })
            .collect();
        let mut out = vec![0.0f32; n * d];
        for (head, o) in heads.iter().enumerate() {
            for (i, row) in o.chunks_exact(hd).enumerate() {
                out[i * d + head * hd..i * d + (head + 1) * hd].copy_from_slice(row);
            }
        }
        out
    }

    /// The merger: one embedding of the text model's width per 2x2 block of `hidden`.
    pub fn merge(&self, hidden: &[f32]) -> Vec<f32> {
        let normed = self.merger_norm.apply(hidden);
        let mut up = self.merger_fc1.apply(&normed);
        up.iter_mut().for_each(|v| *v = gelu_erf(*v));
        self.merger_fc2.apply(&up)
    }

    /// `merge(hidden(..))`: the rows spliced at the pad positions.
    pub fn embed(&self, pixel_rows: &[f32], grids: &[Grid]) -> Vec<f32> {
        self.merge(&self.hidden(pixel_rows, grids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_and_linspace_are_accurate() {
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (3.0, 0.999_977_909_503_001_4),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((f64::from(erf(x)) - want).abs() < 1e-7, "{x}");
        }
        assert_eq!(
            linspace(7.0, 8),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(linspace(7.0, 1), vec![0.0]);
    }
}
