//! torchvision's `resize(uint8, size, BICUBIC, antialias=True)` on the CPU, bit for bit
//! (goldens-media README §3.3): separable, the horizontal pass first (only if the width changes),
//! then the vertical one (only if the height changes), each writing uint8. Per axis the Keys
//! cubic (a = −0.5) is stretched by the scale when shrinking, normalised per output, turned into
//! int16 weights at the largest precision that keeps them under 2^15, and applied with a
//! rounding shift and a clamp.

use crate::RgbImage;

/// Keys' cubic convolution kernel at a = −0.5, in PyTorch's operation order.
fn keys_cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// The fixed-point taps of one axis: for output `i`, `size[i]` weights from input `first[i]`.
struct Taps {
    first: Vec<usize>,
    size: Vec<usize>,
    /// `out × stride` int16 weights.
    weights: Vec<i16>,
    stride: usize,
    precision: u32,
}

fn taps(input: usize, output: usize) -> Taps {
    let scale = input as f64 / output as f64;
    let (support, invscale) = if scale >= 1.0 {
        (2.0 * scale, 1.0 / scale)
    } else {
        (2.0, 1.0)
    };
    let stride = support.ceil() as usize * 2 + 1;
    let mut first = Vec::with_capacity(output);
    let mut size = Vec::with_capacity(output);
    let mut real = vec![0.0f64; output * stride];
    for i in 0..output {
        let center = scale * (i as f64 + 0.5);
        // Python's int() truncates toward zero.
        let xmin = ((center - support + 0.5).trunc() as i64).max(0);
        let xmax = ((center + support + 0.5).trunc() as i64).min(input as i64);
        let n = (xmax - xmin).clamp(0, stride as i64) as usize;
        let row = &mut real[i * stride..i * stride + n];
        let mut total = 0.0;
        for (j, w) in row.iter_mut().enumerate() {
            *w = keys_cubic((j as f64 + xmin as f64 - center + 0.5) * invscale);
            total += *w;
        }
        if total != 0.0 {
            row.iter_mut().for_each(|w| *w /= total);
        }
        first.push(xmin as usize);
        size.push(n);
    }
    let wmax = real.iter().copied().fold(0.0f64, f64::max);
    let mut precision = 0u32;
    while precision < 22 && ((0.5 + wmax * f64::from(1u32 << (precision + 1))) as i64) < 1 << 15 {
        precision += 1;
    }
    let unit = f64::from(1u32 << precision);
    let weights = real
        .iter()
        .map(|&w| {
            let v = w * unit;
            (if v < 0.0 { v - 0.5 } else { v + 0.5 }).trunc() as i16
        })
        .collect();
    Taps {
        first,
        size,
        weights,
        stride,
        precision,
    }
}

/// Apply `taps` along an axis: `lines` independent lines of `len` samples `step` apart, each
/// line starting at `line_start(l)`; channels interleaved by 3.
fn pass(
    src: &[u8],
    dst: &mut [u8],
    taps: &Taps,
    lines: usize,
    line_start: impl Fn(usize) -> (usize, usize),
    step_in: usize,
    step_out: usize,
) {
    let round = if taps.precision > 0 {
        1i32 << (taps.precision - 1)
    } else {
        0
    };
    for l in 0..lines {
        let (src0, dst0) = line_start(l);
        for (i, (&first, &n)) in taps.first.iter().zip(&taps.size).enumerate() {
            let w = &taps.weights[i * taps.stride..i * taps.stride + n];
            for c in 0..3 {
                let mut acc = round;
                for (j, &wj) in w.iter().enumerate() {
                    acc += i32::from(wj) * i32::from(src[src0 + (first + j) * step_in + c]);
                }
                dst[dst0 + i * step_out + c] = (acc >> taps.precision).clamp(0, 255) as u8;
            }
        }
    }
}

/// `image` resized to `width × height`.
pub fn resize(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    let mut current = image.clone();
    if width != current.width {
        let t = taps(current.width, width);
        let mut out = vec![0u8; current.height * width * 3];
        let (w_in, w_out) = (current.width, width);
        pass(
            &current.data,
            &mut out,
            &t,
            current.height,
            |row| (row * w_in * 3, row * w_out * 3),
            3,
            3,
        );
        current = RgbImage {
            width,
            height: current.height,
            data: out,
        };
    }
    if height != current.height {
        let t = taps(current.height, height);
        let mut out = vec![0u8; height * width * 3];
        pass(
            &current.data,
            &mut out,
            &t,
            width,
            |col| (col * 3, col * 3),
            width * 3,
            width * 3,
        );
        current = RgbImage {
            width,
            height,
            data: out,
        };
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_size_is_a_copy_and_a_flat_image_stays_flat() {
        let flat = RgbImage {
            width: 7,
            height: 5,
            data: vec![77; 7 * 5 * 3],
        };
        assert_eq!(resize(&flat, 7, 5), flat);
        for (w, h) in [(3, 2), (20, 13), (7, 9)] {
            let r = resize(&flat, w, h);
            assert_eq!((r.width, r.height), (w, h));
            assert!(r.data.iter().all(|&v| v == 77), "{w}x{h}");
        }
    }

    #[test]
    fn weights_are_normalised_and_fit_in_int16() {
        for (i, o) in [(20, 256), (333, 320), (217, 224), (1600, 37)] {
            let t = taps(i, o);
            for k in 0..o {
                let sum: i32 = t.weights[k * t.stride..k * t.stride + t.size[k]]
                    .iter()
                    .map(|&w| i32::from(w))
                    .sum();
                assert!(
                    (sum - (1 << t.precision)).abs() <= t.size[k] as i32,
                    "{i}->{o} at {k}"
                );
            }
        }
    }
}
