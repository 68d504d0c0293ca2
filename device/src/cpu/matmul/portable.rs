//! The matmul on any CPU: each panel widened to f32 `[k, PANEL]` (bf16 pairs split, bfp tiles
//! decoded), the fidelity truncation applied, then `gemm`, panel by panel, groups of panels
//! spread over rayon. The reference the ISA kernels are tested against.

use super::panels::{decode_block_rows, PanelData};
use super::{Engine, PackedWeight, SendPtr, PANEL};
use crate::formats;
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Panels per rayon task.
const PANELS_PER_TASK: usize = 2;

/// `y[rows, w.n] = x · wᵀ` (the caller checks the shapes).
pub(super) fn product(x: &[f32], rows: usize, w: &PackedWeight, engine: Engine, y: &mut [f32]) {
    let out = SendPtr(y.as_mut_ptr());
    let groups: Vec<usize> = (0..w.panels()).step_by(PANELS_PER_TASK).collect();
    groups.par_iter().for_each(|&first| {
        let last = (first + PANELS_PER_TASK).min(w.panels());
        // SAFETY: each task writes only the columns of its own panels; `x` is `[rows, k]` and
        // `y` is `[rows, n]` (checked by the caller).
        unsafe { panels(x, rows, w, first, last, out.ptr(), engine) };
    });
}

/// Panel `p` of `w` as f32 `[k, PANEL]`.
pub(super) fn widen_panel(w: &PackedWeight, p: usize, out: &mut [f32]) {
    let k = w.k;
    match &w.data {
        PanelData::F32(d) => out.copy_from_slice(&d[p * k * PANEL..(p + 1) * k * PANEL]),
        PanelData::Bf16Pairs(d) => {
            let kp = super::pairs(k);
            for (i, row) in d[p * kp * PANEL..(p + 1) * kp * PANEL]
                .chunks(PANEL)
                .enumerate()
            {
                for (j, pair) in row.iter().enumerate() {
                    out[2 * i * PANEL + j] = f32::from_bits(pair << 16);
                    if 2 * i + 1 < k {
                        out[(2 * i + 1) * PANEL + j] = f32::from_bits(pair & 0xFFFF_0000);
                    }
                }
            }
        }
        PanelData::Blocks {
            format,
            tiles,
            tiles_per_row,
        } => decode_block_rows(*format, tiles, *tiles_per_row, p, 0, k, out),
    }
}

/// Panels `[first, last)` with `gemm`.
unsafe fn panels(
    x: &[f32],
    rows: usize,
    w: &PackedWeight,
    first: usize,
    last: usize,
    y: *mut f32,
    engine: Engine,
) {
    let (n, k) = (w.n, w.k);
    let mut scratch = vec![0.0f32; k * PANEL];
    for p in first..last {
        widen_panel(w, p, &mut scratch);
        if engine.weight_mask != u32::MAX {
            for v in scratch.iter_mut() {
                *v = f32::from_bits(v.to_bits() & engine.weight_mask);
            }
        }
        let cols = PANEL.min(n - p * PANEL);
        // With a bf16 destination the sum is rounded after every 32 input channels.
        let step = if engine.round_accumulators { 32 } else { k };
        let mut k0 = 0;
        while k0 < k {
            let kc = step.min(k - k0);
            gemm(
                rows,
                cols,
                kc,
                y.add(p * PANEL),
                1,
                n as isize,
                k0 > 0,
                x.as_ptr().add(k0),
                1,
                k as isize,
                scratch.as_ptr().add(k0 * PANEL),
                1,
                PANEL as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
            if engine.round_accumulators {
                for r in 0..rows {
                    for j in 0..cols {
                        let v = y.add(r * n + p * PANEL + j);
                        *v = formats::bf16::to_f32(formats::bf16::from_f32(*v));
                    }
                }
            }
            k0 += kc;
        }
    }
}
