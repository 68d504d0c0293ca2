//! From RGB frames to the vision tower's input (goldens-media README §3.2, §3.4): the target size
//! (`smart_resize`, in f64 with Python's round-half-even), then `(k − 127.5) / 127.5` in f32 and
//! patch rows of 1,536 values — `(channel 3, temporal 2, y 16, x 16)` — ordered by frame pair,
//! 2x2 block row, block column, row and column inside the block.

use crate::RgbImage;

/// Patch side in pixels.
pub const PATCH: usize = 16;
/// Patches merged per side by the merger.
pub const MERGE: usize = 2;
/// Frames per temporal patch.
pub const TEMPORAL: usize = 2;
/// Values in one patch row: 3 channels × 2 frames × 16 × 16.
pub const ROW_VALUES: usize = 3 * TEMPORAL * PATCH * PATCH;

/// The processor's pixel bounds for one kind of media.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRule {
    pub min_pixels: u64,
    pub max_pixels: u64,
}

/// Images (the fixture's `processor_config.json`).
pub const IMAGE_RULE: SizeRule = SizeRule {
    min_pixels: 65_536,
    max_pixels: 16_777_216,
};

/// Videos: the bounds count the pixels of all sampled frames.
pub const VIDEO_RULE: SizeRule = SizeRule {
    min_pixels: 4_096,
    max_pixels: 25_165_824,
};

/// Patches along time, height and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
}

impl Grid {
    /// Rows of `pixel_values`.
    pub fn patches(&self) -> usize {
        self.t * self.h * self.w
    }

    /// Tokens after the 2x2 merge.
    pub fn tokens(&self) -> usize {
        self.patches() / (MERGE * MERGE)
    }
}

/// `(height, width)` to resize a `height × width` image to, or the frames of a video when
/// `video_frames` gives how many were sampled. Python's `smart_resize` of the processor,
/// operation for operation.
pub fn smart_resize(height: usize, width: usize, video_frames: Option<usize>) -> (usize, usize) {
    let factor = (PATCH * MERGE) as f64;
    let (mut h, mut w) = (height as f64, width as f64);
    let (rule, t_bar, frames) = match video_frames {
        None => (IMAGE_RULE, 1.0, 1.0),
        Some(n) => {
            // Videos first scale frames below the factor up, truncating like Python's int().
            if h < factor || w < factor {
                let s = (factor / h).max(factor / w);
                h = (h * s).trunc();
                w = (w * s).trunc();
            }
            let pairs = (n as f64 / TEMPORAL as f64).round_ties_even();
            (VIDEO_RULE, pairs * TEMPORAL as f64, n as f64)
        }
    };
    let mut hb = (h / factor).round_ties_even() * factor;
    let mut wb = (w / factor).round_ties_even() * factor;
    if t_bar * hb * wb > rule.max_pixels as f64 {
        let beta = (frames * h * w / rule.max_pixels as f64).sqrt();
        hb = factor.max((h / beta / factor).floor() * factor);
        wb = factor.max((w / beta / factor).floor() * factor);
    } else if t_bar * hb * wb < rule.min_pixels as f64 {
        let beta = (rule.min_pixels as f64 / (frames * h * w)).sqrt();
        hb = (h * beta / factor).ceil() * factor;
        wb = (w * beta / factor).ceil() * factor;
    }
    (hb as usize, wb as usize)
}

/// One uint8 level normalised: `(k − 127.5) / 127.5` in f32.
fn normalise(k: u8) -> f32 {
    (f32::from(k) - 127.5) / 127.5
}

/// The patch rows of `frames` (all one size, an even count: an image is given twice) and their
/// grid.
pub fn patch_rows(frames: &[&RgbImage]) -> (Vec<f32>, Grid) {
    let (height, width) = frames.first().map_or((0, 0), |f| (f.height, f.width));
    let grid = Grid {
        t: frames.len() / TEMPORAL,
        h: height / PATCH,
        w: width / PATCH,
    };
    let mut out = Vec::with_capacity(grid.patches() * ROW_VALUES);
    for pair in frames.chunks_exact(TEMPORAL) {
        for by in 0..grid.h / MERGE {
            for bx in 0..grid.w / MERGE {
                for iy in 0..MERGE {
                    for ix in 0..MERGE {
                        let (py, px) = ((by * MERGE + iy) * PATCH, (bx * MERGE + ix) * PATCH);
                        for c in 0..3 {
                            for frame in pair {
                                for y in 0..PATCH {
                                    let row = ((py + y) * width + px) * 3 + c;
                                    out.extend(
                                        (0..PATCH).map(|x| normalise(frame.data[row + x * 3])),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    (out, grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_readme_examples() {
        // Half to even: 464x272 → 448x256; 1200 → 1216; 20x20 grows to 256x256.
        assert_eq!(smart_resize(272, 464, None), (256, 448));
        assert_eq!(smart_resize(1200, 1600, None), (1216, 1600));
        assert_eq!(smart_resize(20, 20, None), (256, 256));
        assert_eq!(smart_resize(217, 333, None), (224, 320));
        // Video frames below the factor: 24x40 (w x h) → 32x64.
        assert_eq!(smart_resize(40, 24, Some(3)), (64, 32));
    }

    #[test]
    fn normalisation_spans_minus_one_to_one() {
        assert_eq!(normalise(0), -1.0);
        assert_eq!(normalise(255), 1.0);
    }
}
