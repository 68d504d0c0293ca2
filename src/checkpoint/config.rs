//! `config.json` of a Qwen3.5 checkpoint (`Qwen3_5ForConditionalGeneration`): the text model's
//! shape, its layer types and the parts of the vision config clef-tt reads.

use super::CheckpointError;
use serde::Deserialize;
use std::path::Path;

/// Which mixer a decoder layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    DeltaNet,
    /// Gated full attention (`full_attention`).
    Attention,
}

/// The text model configuration, with every default Hugging Face applies made explicit.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: Vec<LayerKind>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub mrope_section: [usize; 3],
    pub rms_norm_eps: f32,
    pub linear_conv_kernel_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
}

impl TextConfig {
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    pub fn count(&self, kind: LayerKind) -> usize {
        self.layers.iter().filter(|k| **k == kind).count()
    }
}

/// The vision tower's configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct VisionConfig {
    #[serde(default = "d_depth")]
    pub depth: usize,
    #[serde(default = "d_vis_hidden")]
    pub hidden_size: usize,
    #[serde(default = "d_vis_heads")]
    pub num_heads: usize,
    #[serde(default = "d_vis_inter")]
    pub intermediate_size: usize,
    #[serde(default = "d_patch")]
    pub patch_size: usize,
    #[serde(default = "d_two")]
    pub temporal_patch_size: usize,
    #[serde(default = "d_two")]
    pub spatial_merge_size: usize,
    #[serde(default)]
    pub out_hidden_size: Option<usize>,
    /// Rows of the learned position table (a square grid).
    #[serde(default = "d_positions")]
    pub num_position_embeddings: usize,
    #[serde(default = "d_channels")]
    pub in_channels: usize,
}

fn d_depth() -> usize {
    27
}
fn d_vis_hidden() -> usize {
    1152
}
fn d_vis_heads() -> usize {
    16
}
fn d_vis_inter() -> usize {
    4304
}
fn d_patch() -> usize {
    16
}
fn d_two() -> usize {
    2
}
fn d_positions() -> usize {
    2304
}
fn d_channels() -> usize {
    3
}

/// The whole `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub model_type: String,
    pub text: TextConfig,
    pub vision: Option<VisionConfig>,
    pub image_token_id: Option<u32>,
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: String,
    text_config: Option<RawText>,
    vision_config: Option<VisionConfig>,
    image_token_id: Option<u32>,
    video_token_id: Option<u32>,
    vision_start_token_id: Option<u32>,
    vision_end_token_id: Option<u32>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
}

#[derive(Deserialize)]
struct RawRope {
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    mrope_section: Option<Vec<usize>>,
}

#[derive(Deserialize)]
struct RawText {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_parameters: Option<RawRope>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    rms_norm_eps: Option<f32>,
    linear_conv_kernel_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
}

impl ModelConfig {
    /// Read and check `config.json` from a snapshot directory.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
        Self::parse(&text).map_err(|msg| CheckpointError::Config {
            file: path.display().to_string(),
            msg,
        })
    }

    /// Parse the text of a `config.json` (Hugging Face defaults of transformers 5.24 applied).
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| format!("not a valid config: {e}"))?;
        let architecture = raw.architectures.first().cloned().unwrap_or_default();
        if architecture != "Qwen3_5ForConditionalGeneration" {
            return Err(format!(
                "architectures[0] is {architecture:?}, expected \"Qwen3_5ForConditionalGeneration\""
            ));
        }
        let t = raw
            .text_config
            .ok_or_else(|| "missing text_config".to_string())?;
        let rope = t.rope_parameters.as_ref();
        let n_layers = t.num_hidden_layers.unwrap_or(32);
        let layers = match &t.layer_types {
            Some(types) => types
                .iter()
                .map(|s| match s.as_str() {
                    "linear_attention" => Ok(LayerKind::DeltaNet),
                    "full_attention" => Ok(LayerKind::Attention),
                    other => Err(format!(
                        "text_config.layer_types: unknown layer type {other:?}"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let interval = t.full_attention_interval.unwrap_or(4);
                if interval == 0 {
                    return Err("text_config.full_attention_interval must be positive".into());
                }
                (0..n_layers)
                    .map(|i| {
                        if (i + 1).is_multiple_of(interval) {
                            LayerKind::Attention
                        } else {
                            LayerKind::DeltaNet
                        }
                    })
                    .collect()
            }
        };
        if layers.len() != n_layers {
            return Err(format!(
                "text_config.layer_types has {} entries for num_hidden_layers {n_layers}",
                layers.len()
            ));
        }
        let mrope = rope
            .and_then(|r| r.mrope_section.clone())
            .unwrap_or_else(|| vec![11, 11, 10]);
        let mrope_section: [usize; 3] = mrope
            .as_slice()
            .try_into()
            .map_err(|_| format!("mrope_section must have 3 entries, got {mrope:?}"))?;
        let text = TextConfig {
            vocab_size: t.vocab_size.unwrap_or(248_320),
            hidden_size: t.hidden_size.unwrap_or(4096),
            intermediate_size: t.intermediate_size.unwrap_or(12_288),
            layers,
            num_attention_heads: t.num_attention_heads.unwrap_or(16),
            num_key_value_heads: t.num_key_value_heads.unwrap_or(4),
            head_dim: t.head_dim.unwrap_or(256),
            rope_theta: rope
                .and_then(|r| r.rope_theta)
                .or(t.rope_theta)
                .unwrap_or(10_000.0),
            partial_rotary_factor: rope
                .and_then(|r| r.partial_rotary_factor)
                .or(t.partial_rotary_factor)
                .unwrap_or(0.25),
            mrope_section,
            rms_norm_eps: t.rms_norm_eps.unwrap_or(1e-6),
            linear_conv_kernel_dim: t.linear_conv_kernel_dim.unwrap_or(4),
            linear_num_key_heads: t.linear_num_key_heads.unwrap_or(16),
            linear_num_value_heads: t.linear_num_value_heads.unwrap_or(32),
            linear_key_head_dim: t.linear_key_head_dim.unwrap_or(128),
            linear_value_head_dim: t.linear_value_head_dim.unwrap_or(128),
            tie_word_embeddings: t
                .tie_word_embeddings
                .or(raw.tie_word_embeddings)
                .unwrap_or(false),
            max_position_embeddings: t.max_position_embeddings.unwrap_or(32_768),
        };
        check_text(&text)?;
        Ok(ModelConfig {
            architecture,
            model_type: raw.model_type,
            text,
            vision: raw.vision_config,
            image_token_id: raw.image_token_id,
            video_token_id: raw.video_token_id,
            vision_start_token_id: raw.vision_start_token_id,
            vision_end_token_id: raw.vision_end_token_id,
        })
    }
}

fn check_text(t: &TextConfig) -> Result<(), String> {
    let positive = [
        ("vocab_size", t.vocab_size),
        ("hidden_size", t.hidden_size),
        ("intermediate_size", t.intermediate_size),
        ("num_attention_heads", t.num_attention_heads),
        ("num_key_value_heads", t.num_key_value_heads),
        ("head_dim", t.head_dim),
        ("linear_num_key_heads", t.linear_num_key_heads),
        ("linear_num_value_heads", t.linear_num_value_heads),
        ("linear_key_head_dim", t.linear_key_head_dim),
        ("linear_value_head_dim", t.linear_value_head_dim),
        ("linear_conv_kernel_dim", t.linear_conv_kernel_dim),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(format!("text_config.{name} must be positive"));
        }
    }
    if !t.num_attention_heads.is_multiple_of(t.num_key_value_heads) {
        return Err(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            t.num_attention_heads, t.num_key_value_heads
        ));
    }
    if !t
        .linear_num_value_heads
        .is_multiple_of(t.linear_num_key_heads)
    {
        return Err(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            t.linear_num_value_heads, t.linear_num_key_heads
        ));
    }
    let r = t.rotary_dim();
    if !r.is_multiple_of(2) || r > t.head_dim || t.mrope_section.iter().sum::<usize>() * 2 > r {
        return Err(format!(
            "rotary dim {r} does not fit head_dim {}",
            t.head_dim
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types_fall_back_to_the_full_attention_interval() {
        let cfg = ModelConfig::parse(
            r#"{"architectures":["Qwen3_5ForConditionalGeneration"],
                "text_config":{"num_hidden_layers":8,"full_attention_interval":4}}"#,
        )
        .unwrap();
        use LayerKind::*;
        assert_eq!(
            cfg.text.layers,
            vec![DeltaNet, DeltaNet, DeltaNet, Attention, DeltaNet, DeltaNet, DeltaNet, Attention]
        );
        assert_eq!(cfg.text.rotary_dim(), 64);
    }

    #[test]
    fn refuses_another_architecture_and_bad_layer_types() {
        let e = ModelConfig::parse(r#"{"architectures":["LlamaForCausalLM"],"text_config":{}}"#)
            .unwrap_err();
        assert!(e.contains("Qwen3_5ForConditionalGeneration"), "{e}");
        let e = ModelConfig::parse(
            r#"{"architectures":["Qwen3_5ForConditionalGeneration"],
                "text_config":{"num_hidden_layers":2,"layer_types":["full_attention","mamba"]}}"#,
        )
        .unwrap_err();
        assert!(e.contains("mamba"), "{e}");
    }
}
