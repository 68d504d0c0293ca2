//! Video frames as the processor samples them (goldens-media README §3.5): frames given as a
//! list carry no fps, so 24 is assumed; `k = min(max(⌊n / 24 · 2⌋, 4), 768, n)` frames at
//! `round_half_even(linspace(0, n − 1, k))`; the list is padded to an even count by repeating
//! its last index; each pair is labelled `<{mean of the pair's times:.1} seconds>`.

/// Assumed frame rate of a list of frames.
const FPS: f64 = 24.0;
/// Sampled frames per second of video.
const SAMPLE_FPS: f64 = 2.0;
const MIN_FRAMES: usize = 4;
const MAX_FRAMES: usize = 768;

/// Indices of the frames kept out of `n` (before temporal padding).
pub fn sample_frames(n: usize) -> Vec<usize> {
    let k = ((n as f64 / FPS * SAMPLE_FPS) as usize)
        .clamp(MIN_FRAMES, MAX_FRAMES)
        .min(n);
    if k == 0 {
        return Vec::new();
    }
    if k == 1 {
        return vec![0];
    }
    // numpy's linspace: i · step from 0, the last value set to the end exactly.
    let stop = (n - 1) as f64;
    let step = stop / (k - 1) as f64;
    (0..k)
        .map(|i| {
            let v = if i + 1 == k { stop } else { i as f64 * step };
            v.round_ties_even() as usize
        })
        .collect()
}

/// The timestamp text of each frame pair of `indices` (padded to an even count).
pub fn timestamps(indices: &[usize]) -> Vec<String> {
    let mut padded = indices.to_vec();
    if padded.len() % 2 == 1 {
        padded.extend(padded.last().copied());
    }
    padded
        .chunks_exact(2)
        .map(|p| {
            let t = (p[0] as f64 / FPS + p[1] as f64 / FPS) / 2.0;
            format!("<{t:.1} seconds>")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_and_timestamps_follow_the_readme() {
        assert_eq!(sample_frames(8), vec![0, 2, 5, 7]);
        assert_eq!(sample_frames(5), vec![0, 1, 3, 4]);
        assert_eq!(sample_frames(6), vec![0, 2, 3, 5]);
        assert_eq!(sample_frames(3), vec![0, 1, 2]);
        assert_eq!(sample_frames(2), vec![0, 1]);
        assert_eq!(
            timestamps(&[0, 2, 5, 7]),
            vec!["<0.0 seconds>", "<0.2 seconds>"]
        );
        assert_eq!(
            timestamps(&[0, 1, 2]),
            vec!["<0.0 seconds>", "<0.1 seconds>"]
        );
    }
}
