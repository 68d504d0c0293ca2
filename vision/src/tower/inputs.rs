//! What the host computes for a batch of media before the tower runs on the mesh: the learned
//! position table resampled bilinearly (align_corners) to each grid in merge-block order, the
//! 2-D rotary tables, and the attention segments (one per image, one per frame pair of a video).

use crate::preprocess::{Grid, MERGE};
use std::ops::Range;

/// torch.linspace(0, end, steps) in f32 (symmetric halves, as PyTorch computes it).
pub fn linspace(end: f32, steps: usize) -> Vec<f32> {
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
pub fn patch_coordinates(grid: &Grid) -> Vec<(usize, usize)> {
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

/// The learned positions `table` (`[side², hidden]`) resampled to `grid`, in merge-block order,
/// `[patches, hidden]`.
pub fn position_rows(table: &[f32], hidden: usize, grid: &Grid) -> Vec<f32> {
    let side = ((table.len() / hidden.max(1)) as f64).sqrt() as usize;
    let hs = linspace(side.saturating_sub(1) as f32, grid.h);
    let ws = linspace(side.saturating_sub(1) as f32, grid.w);
    let row = |r: usize, c: usize| &table[(r * side + c) * hidden..(r * side + c + 1) * hidden];
    let mut out = Vec::with_capacity(grid.patches() * hidden);
    for (r, c) in patch_coordinates(grid) {
        let (h, w) = (hs[r], ws[c]);
        let (h0, w0) = (h as usize, w as usize);
        let (h1, w1) = ((h0 + 1).min(side - 1), (w0 + 1).min(side - 1));
        let (dh, dw) = (h - h0 as f32, w - w0 as f32);
        let taps = [
            (row(h0, w0), (1.0 - dh) * (1.0 - dw)),
            (row(h0, w1), (1.0 - dh) * dw),
            (row(h1, w0), dh * (1.0 - dw)),
            (row(h1, w1), dh * dw),
        ];
        for k in 0..hidden {
            out.push(taps.iter().fold(0.0f32, |s, (v, wt)| s + v[k] * wt));
        }
    }
    out
}

/// The tower's host inputs for media with `grids`, concatenated in that order.
pub struct TowerInputs {
    /// `[patches, hidden]`.
    pub positions: Vec<f32>,
    /// `[patches, head_dim]` each: angles `[row·f, col·f]` twice, `f_i = 10000^(-2i/(d/2))`.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub segments: Vec<Range<usize>>,
}

impl TowerInputs {
    /// `table` is the learned position table `[side², hidden]`.
    pub fn new(table: &[f32], hidden: usize, head_dim: usize, grids: &[Grid]) -> Self {
        let quarter = head_dim / 4;
        let inv: Vec<f32> = (0..quarter)
            .map(|i| 1.0 / 10_000f32.powf((2 * i) as f32 / (head_dim / 2) as f32))
            .collect();
        let mut inputs = TowerInputs {
            positions: Vec::new(),
            cos: Vec::new(),
            sin: Vec::new(),
            segments: Vec::new(),
        };
        let mut at = 0;
        for grid in grids {
            inputs.positions.extend(position_rows(table, hidden, grid));
            for (r, c) in patch_coordinates(grid) {
                let half = inv
                    .iter()
                    .map(|f| r as f32 * f)
                    .chain(inv.iter().map(|f| c as f32 * f));
                let angles: Vec<f32> = half.clone().chain(half).collect();
                inputs.cos.extend(angles.iter().map(|a| a.cos()));
                inputs.sin.extend(angles.iter().map(|a| a.sin()));
            }
            let per_frame = grid.h * grid.w;
            for f in 0..grid.t {
                inputs
                    .segments
                    .push(at + f * per_frame..at + (f + 1) * per_frame);
            }
            at += grid.patches();
        }
        inputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_is_exact_on_integers() {
        assert_eq!(
            linspace(7.0, 8),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(linspace(7.0, 1), vec![0.0]);
    }

    #[test]
    fn a_video_attends_per_frame_pair_and_images_apart() {
        let grids = [Grid { t: 2, h: 4, w: 2 }, Grid { t: 1, h: 2, w: 2 }];
        let table = vec![0.0f32; 4 * 8];
        let inputs = TowerInputs::new(&table, 8, 8, &grids);
        assert_eq!(inputs.segments, vec![0..8, 8..16, 16..20]);
        assert_eq!(inputs.cos.len(), 20 * 8);
        // Patch 2 of the first frame is row 1, col 0: the row half turns, the column half not.
        assert_eq!(patch_coordinates(&grids[0])[2], (1, 0));
        assert_eq!(inputs.cos[2 * 8 + 2], 1.0);
        assert!((inputs.cos[2 * 8] - 1f32.cos()).abs() < 1e-7);
    }
}
