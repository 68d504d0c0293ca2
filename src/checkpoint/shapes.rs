//! The real model shapes, as configurations without weights: Qwen3.5-0.8B's trunk with
//! Clef-Flash's head, the tiny fixture's shape, Clef 27B's trunk and its vision tower. The
//! device plan (`clef-tt plan`), the benchmarks and `clef-tt make-random` take them from here.

use super::{JointHeadConfig, LayerKind, TextConfig};

/// A named benchmark shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// The Qwen3.5-0.8B trunk with a joint head at Clef-Flash's head shape.
    #[value(name = "0.8b")]
    Qwen08b,
    /// The tiny-clef fixture's shape (hidden 64, 8 layers), for quick checks.
    Tiny,
    /// Clef 27B's trunk (Qwen3.5-27B class: hidden 5120, 64 layers, every 4th full attention,
    /// 24/4 heads of 256, DeltaNet 16/48 heads of 128, MLP 17408; Tenstorrent's documentation).
    #[value(name = "clef-27b")]
    Clef27b,
}

/// The text config and head config of a shape.
pub fn shape_configs(shape: Shape) -> (TextConfig, JointHeadConfig) {
    let layers = |n: usize| {
        (0..n)
            .map(|i| {
                if (i + 1).is_multiple_of(4) {
                    LayerKind::Attention
                } else {
                    LayerKind::DeltaNet
                }
            })
            .collect::<Vec<_>>()
    };
    match shape {
        Shape::Qwen08b => (
            TextConfig {
                vocab_size: 248_320,
                hidden_size: 1024,
                intermediate_size: 3584,
                layers: layers(24),
                num_attention_heads: 8,
                num_key_value_heads: 2,
                head_dim: 256,
                rope_theta: 1e7,
                partial_rotary_factor: 0.25,
                mrope_section: [11, 11, 10],
                rms_norm_eps: 1e-6,
                linear_conv_kernel_dim: 4,
                linear_num_key_heads: 16,
                linear_num_value_heads: 16,
                linear_key_head_dim: 128,
                linear_value_head_dim: 128,
                tie_word_embeddings: false,
                max_position_embeddings: 262_144,
            },
            JointHeadConfig::release(1024),
        ),
        Shape::Clef27b => (
            TextConfig {
                vocab_size: 248_320,
                hidden_size: 5120,
                intermediate_size: 17_408,
                layers: layers(64),
                num_attention_heads: 24,
                num_key_value_heads: 4,
                head_dim: 256,
                rope_theta: 1e7,
                partial_rotary_factor: 0.25,
                mrope_section: [11, 11, 10],
                rms_norm_eps: 1e-6,
                linear_conv_kernel_dim: 4,
                linear_num_key_heads: 16,
                linear_num_value_heads: 48,
                linear_key_head_dim: 128,
                linear_value_head_dim: 128,
                tie_word_embeddings: false,
                max_position_embeddings: 262_144,
            },
            JointHeadConfig::release(5120),
        ),
        Shape::Tiny => (
            TextConfig {
                vocab_size: 248_320,
                hidden_size: 64,
                intermediate_size: 160,
                layers: layers(8),
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 32,
                rope_theta: 1e7,
                partial_rotary_factor: 0.25,
                mrope_section: [2, 1, 1],
                rms_norm_eps: 1e-6,
                linear_conv_kernel_dim: 4,
                linear_num_key_heads: 2,
                linear_num_value_heads: 6,
                linear_key_head_dim: 16,
                linear_value_head_dim: 12,
                tie_word_embeddings: false,
                max_position_embeddings: 32_768,
            },
            JointHeadConfig {
                hidden_size: 64,
                width: 48,
                routing_layers: 2,
                layers: 4,
                heads: 4,
                feedforward: 96,
                dropout: None,
            },
        ),
    }
}

/// The Clef-27B vision tower's shape (depth 27, hidden 1152, 16 heads, MLP 4304, out 5120,
/// a 48 x 48 position table).
pub const CLEF_27B_VISION: clef_vision::VisionShape = clef_vision::VisionShape {
    depth: 27,
    hidden: 1152,
    heads: 16,
    intermediate: 4304,
    out_hidden: 5120,
    positions: 48 * 48,
    patch_values: clef_vision::ROW_VALUES,
};
