//! The tolerance of each quantity of a layer trace: from the unit roundoff of the precision it
//! runs in and how deep in the model it sits (docs/tenstorrent.md, "The layer trace", gives the
//! arithmetic and the unmutated errors it covers).
//!
//! Under every profile but `f32` the activations, keys and values and the DeltaNet state are
//! bf16 (8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3) on both sides, and the weights
//! are the same bits (bf16, or bfp8 packed once); what differs is where each side rounds and
//! in which order it sums. One layer's rounding moves its outputs by about u (measured: 0.4u
//! to 1.9u after the first layer of both fixtures); every layer after it adds its own and
//! carries what came in, so the error grows about linearly with depth (tiny-clef: 0.9u after
//! layer 0, 8u after layer 7). The relative-error bound is 3u per layer of depth, the worst
//! element's (over the reference's largest) 4 times that: a few outliers of a softmax or a
//! norm stand far above the norm's mean error.
//!
//! Under `f32` (u = 2^-24) nothing is rounded to a narrower type and the sides differ only in
//! the order they sum: a sum over a chunk's up to 1,024 rows in another order moves by about
//! sqrt(1,024) u = 32u (the delta rule's state, chunked or not), so the bound is 64u per layer
//! (measured CPU against CPU, a continued tail against the prompt alone: 14u at layer 0).

/// A quantity's bounds: on its relative error and on its worst element over the reference's
/// largest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rel: f64,
    pub worst: f64,
}

/// Relative-error bound per layer of depth, in units of the profile's roundoff: where values
/// are rounded to bf16, and where they stay f32.
const PER_LAYER_BF16: f64 = 3.0;
const PER_LAYER_F32: f64 = 64.0;
/// The worst element's bound over the relative error's.
const WORST: f64 = 4.0;

/// The relative-error bound per layer of depth under `profile`.
fn per_layer(profile: &str) -> f64 {
    match profile {
        "f32" => PER_LAYER_F32 * f64::powi(2.0, -24),
        _ => PER_LAYER_BF16 * f64::powi(2.0, -8),
    }
}

/// The tolerance of a quantity `depth` layers (or vision blocks) into the model under
/// `profile`.
pub fn tolerance(depth: usize, profile: &str) -> Tolerance {
    let rel = per_layer(profile) * depth.max(1) as f64;
    Tolerance {
        rel,
        worst: WORST * rel,
    }
}

/// How deep quantity `name` sits: layer `I` (`...layer.I...`) or vision block `J`
/// (`...block.J`) is at depth I + 1 (J + 1); what comes after the last of them one deeper:
/// `final` after `last("layer")`, a merger `vision.K.merger` after `last("vision.K.")` (the
/// deepest layer, or block of that tower run, the trace holds).
pub fn depth(name: &str, last: impl Fn(&str) -> usize) -> usize {
    let parts: Vec<&str> = name.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        if matches!(*p, "layer" | "block") {
            if let Some(n) = parts.get(i + 1).and_then(|n| n.parse::<usize>().ok()) {
                return n + 1;
            }
        }
    }
    match parts.last() {
        Some(&"merger") => last(&name[..name.len() - "merger".len()]) + 2,
        _ => last("layer") + 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_comes_from_the_names() {
        let last = |what: &str| if what == "layer" { 7 } else { 1 };
        assert_eq!(depth("alone.layer.3.keys", last), 4);
        assert_eq!(depth("packed.kept.layer.0.recurrent", last), 1);
        assert_eq!(depth("vision.video.block.11", last), 12);
        assert_eq!(depth("vision.video.merger", last), 3);
        assert_eq!(depth("served.final", last), 9);
    }

    #[test]
    fn bounds_grow_with_depth_from_the_roundoff() {
        let t = tolerance(1, "selected");
        assert!((t.rel - 3.0 / 256.0).abs() < 1e-12 && (t.worst - 12.0 / 256.0).abs() < 1e-12);
        assert_eq!(tolerance(4, "bf16").rel, 4.0 * t.rel);
        assert!((tolerance(2, "f32").rel - 128.0 * f64::powi(2.0, -24)).abs() < 1e-15);
    }
}
