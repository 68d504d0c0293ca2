//! `clef-tt make-random`: a complete random-weight Clef checkpoint in the release layout
//! (config, two safetensors shards with an index, joint head, tokenizer), at the shape every
//! benchmark uses. Weights are uniform with the std of Hugging Face's init, stored as bf16;
//! norms and gates are set so activations stay finite through every layer.

use crate::checkpoint::shapes::{shape_configs, Shape};
use crate::checkpoint::{
    expected_text_tensors, JointHeadConfig, LayerKind, TextConfig, LM_HEAD, TEXT_PREFIX,
};
use half::bf16;
use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;
use std::path::Path;

/// `config.json` text for a text config (transformers 5.24 field names).
pub fn config_json(t: &TextConfig) -> serde_json::Value {
    let types: Vec<&str> = t
        .layers
        .iter()
        .map(|k| match k {
            LayerKind::DeltaNet => "linear_attention",
            LayerKind::Attention => "full_attention",
        })
        .collect();
    json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "dtype": "bfloat16",
        "image_token_id": 248056,
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": false,
            "eos_token_id": 248046,
            "head_dim": t.head_dim,
            "hidden_act": "silu",
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "layer_types": types,
            "linear_conv_kernel_dim": t.linear_conv_kernel_dim,
            "linear_key_head_dim": t.linear_key_head_dim,
            "linear_num_key_heads": t.linear_num_key_heads,
            "linear_num_value_heads": t.linear_num_value_heads,
            "linear_value_head_dim": t.linear_value_head_dim,
            "max_position_embeddings": t.max_position_embeddings,
            "model_type": "qwen3_5_text",
            "num_attention_heads": t.num_attention_heads,
            "num_hidden_layers": t.layers.len(),
            "num_key_value_heads": t.num_key_value_heads,
            "rms_norm_eps": t.rms_norm_eps,
            "rope_parameters": {
                "mrope_interleaved": true,
                "mrope_section": t.mrope_section,
                "partial_rotary_factor": t.partial_rotary_factor,
                "rope_theta": t.rope_theta,
                "rope_type": "default"
            },
            "tie_word_embeddings": false,
            "vocab_size": t.vocab_size
        },
        "tie_word_embeddings": false,
        "video_token_id": 248057,
        "vision_end_token_id": 248054,
        "vision_start_token_id": 248053
    })
}

/// SplitMix64: a tiny deterministic generator (benchmarks need reproducible weights, not
/// statistical quality).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How a tensor is filled.
#[derive(Clone, Copy)]
enum Fill {
    /// Uniform with mean `mean` and standard deviation `std`.
    Uniform { mean: f32, std: f32 },
    /// `ln U(lo, hi)` (DeltaNet `A_log`).
    LogUniform { lo: f32, hi: f32 },
}

impl Fill {
    /// One value, drawing from `state`.
    fn sample(self, state: &mut u64) -> f32 {
        let u = (splitmix(state) >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        match self {
            Fill::Uniform { mean, std } => mean + std * 3f32.sqrt() * (2.0 * u - 1.0),
            Fill::LogUniform { lo, hi } => (lo + (hi - lo) * u).ln(),
        }
    }
}

fn fill_for(name: &str, std: f32) -> Fill {
    let zero_centred_norm = name.ends_with("layernorm.weight")
        || name.ends_with("q_norm.weight")
        || name.ends_with("k_norm.weight")
        || name == "norm.weight";
    if zero_centred_norm {
        Fill::Uniform {
            mean: 0.0,
            std: 0.0,
        }
    } else if name.ends_with("linear_attn.norm.weight") {
        Fill::Uniform {
            mean: 1.0,
            std: 0.0,
        }
    } else if name.ends_with("A_log") {
        Fill::LogUniform { lo: 1.0, hi: 16.0 }
    } else if name.ends_with("dt_bias") {
        Fill::Uniform {
            mean: 1.0,
            std: 0.0,
        }
    } else if name.ends_with("conv1d.weight") {
        Fill::Uniform {
            mean: 0.0,
            std: 0.2,
        }
    } else {
        Fill::Uniform { mean: 0.0, std }
    }
}

fn head_fill(name: &str) -> Fill {
    if name.ends_with("norm.weight") {
        Fill::Uniform {
            mean: 1.0,
            std: 0.0,
        }
    } else if name.ends_with(".bias") {
        Fill::Uniform {
            mean: 0.0,
            std: 0.0,
        }
    } else if name == "prior_logit_scale" {
        Fill::Uniform {
            mean: std::f32::consts::LN_10,
            std: 0.0,
        }
    } else if name == "joint_logit_scale" {
        Fill::Uniform {
            mean: 2.0,
            std: 0.0,
        }
    } else if name == "residual_gate" {
        Fill::Uniform {
            mean: -2.0,
            std: 0.0,
        }
    } else {
        Fill::Uniform {
            mean: 0.0,
            std: 0.02,
        }
    }
}

/// Little-endian bf16 bytes of `n` values, generated in parallel blocks from `seed`.
fn random_bf16(n: usize, fill: Fill, seed: u64) -> Vec<u8> {
    const BLOCK: usize = 1 << 16;
    let mut out = vec![0u8; n * 2];
    out.par_chunks_mut(BLOCK * 2)
        .enumerate()
        .for_each(|(b, chunk)| {
            let mut s = seed ^ ((b as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            for c in chunk.chunks_exact_mut(2) {
                let v = fill.sample(&mut s);
                c.copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        });
    out
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xA076_1D64_78BD_642F, |h, b| {
        (h ^ b as u64).wrapping_mul(0x1000_0000_01B3)
    })
}

/// Why a random checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MakeRandomError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Safetensors {
        path: String,
        source: safetensors::SafeTensorError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MakeRandomError + '_ {
    move |source| MakeRandomError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn write_json(
    path: &Path,
    value: &serde_json::Value,
    newline: bool,
) -> Result<(), MakeRandomError> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    if newline {
        text.push('\n');
    }
    std::fs::write(path, text).map_err(io_err(path))
}

fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
) -> Result<(), MakeRandomError> {
    let st = |source| MakeRandomError::Safetensors {
        path: path.display().to_string(),
        source,
    };
    let views = tensors
        .iter()
        .map(|(n, s, b)| {
            Ok((
                n.clone(),
                TensorView::new(Dtype::BF16, s.clone(), b).map_err(st)?,
            ))
        })
        .collect::<Result<Vec<_>, MakeRandomError>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).map_err(st)
}

/// Write `joint_head_config.json` and a random `joint_head.safetensors` of `head`'s shape.
pub fn write_random_head(
    head: &JointHeadConfig,
    out: &Path,
    seed: u64,
) -> Result<(), MakeRandomError> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let head_tensors: Vec<(String, Vec<usize>, Vec<u8>)> = head
        .expected_tensors()
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product::<usize>().max(1);
            let bytes = random_bf16(n, head_fill(&name), name_seed(seed, &name));
            (name, shape, bytes)
        })
        .collect();
    write_safetensors(&out.join("joint_head.safetensors"), &head_tensors)?;
    let head_json = json!({
        "hidden_size": head.hidden_size, "width": head.width, "routing_layers": head.routing_layers,
        "layers": head.layers, "heads": head.heads, "feedforward": head.feedforward
    });
    write_json(&out.join("joint_head_config.json"), &head_json, true)
}

/// Write a random checkpoint of `shape` into `out` (created if needed), with the tokenizer
/// files copied from `tokenizer_dir`.
pub fn make_random(
    shape: Shape,
    out: &Path,
    seed: u64,
    tokenizer_dir: &Path,
) -> Result<(), MakeRandomError> {
    let (text, head) = shape_configs(shape);
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let std = 0.02f32;
    // Shard 1: the language model; shard 2: the LM head (as the tiny-clef fixture lays it out).
    let mut shard1 = Vec::new();
    for (name, shape) in expected_text_tensors(&text) {
        let n: usize = shape.iter().product();
        let full = format!("{TEXT_PREFIX}{name}");
        let bytes = random_bf16(n, fill_for(&name, std), name_seed(seed, &full));
        shard1.push((full, shape, bytes));
    }
    let lm = vec![text.vocab_size, text.hidden_size];
    let shard2 = vec![(
        LM_HEAD.to_string(),
        lm.clone(),
        random_bf16(
            lm.iter().product(),
            Fill::Uniform {
                mean: 0.0,
                std: 0.05,
            },
            name_seed(seed, LM_HEAD),
        ),
    )];
    let files = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write_safetensors(&out.join(files[0]), &shard1)?;
    write_safetensors(&out.join(files[1]), &shard2)?;
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for (i, shard) in [&shard1, &shard2].iter().enumerate() {
        for (name, _, bytes) in shard.iter() {
            weight_map.insert(name.clone(), json!(files[i]));
            total += bytes.len();
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    write_json(&out.join("model.safetensors.index.json"), &index, false)?;
    write_json(&out.join("config.json"), &config_json(&text), false)?;
    write_random_head(&head, out, seed)?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "processor_config.json",
        "chat_template.jinja",
    ] {
        let src = tokenizer_dir.join(f);
        if src.exists() {
            std::fs::copy(&src, out.join(f)).map_err(io_err(&src))?;
        }
    }
    Ok(())
}

/// Random weights for a vision tower of `shape`, for `clef-tt bench vision`: uniform with std
/// 0.02, LayerNorms at 1 and 0. Each value is a hash of the seed, the tensor name and its index,
/// so the devices of a split read parts of the same tensor.
pub struct RandomVisionWeights {
    pub shape: clef_vision::VisionShape,
    pub seed: u64,
}

impl clef_device::plan::WeightSource for RandomVisionWeights {
    type Error = clef_device::plan::SplitError;

    fn rows(
        &self,
        tensor: &str,
        rows: std::ops::Range<usize>,
        _matrix: bool,
    ) -> Result<clef_device::HostWeight, Self::Error> {
        let s = &self.shape;
        let norm = tensor.contains("norm");
        let cols = if tensor.ends_with(".bias") || norm {
            1
        } else if tensor.starts_with("patch_embed") {
            s.patch_values
        } else if tensor.ends_with("linear_fc2.weight") && tensor.starts_with("blocks") {
            s.intermediate
        } else if tensor.starts_with("merger") {
            s.merged()
        } else {
            s.hidden
        };
        let fill = match (norm, tensor.ends_with("weight")) {
            (true, true) => Fill::Uniform {
                mean: 1.0,
                std: 0.0,
            },
            (true, false) => Fill::Uniform {
                mean: 0.0,
                std: 0.0,
            },
            _ => Fill::Uniform {
                mean: 0.0,
                std: 0.02,
            },
        };
        let seed = name_seed(self.seed, tensor);
        let data = (rows.start * cols..rows.end * cols)
            .into_par_iter()
            .map(|i| fill.sample(&mut (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))))
            .collect();
        Ok(clef_device::HostWeight::f32(rows.len(), cols, data))
    }
}
