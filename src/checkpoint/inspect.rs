//! `clef-tt inspect`: what a checkpoint holds and whether its parts agree with each other.

use super::{Checkpoint, LayerKind, LM_HEAD, TEXT_PREFIX, VISION_PREFIX};
use std::fmt::Write;

/// Tokens the encoder and the media path rely on, with the config field that names each id.
const SPECIAL_TOKENS: [&str; 6] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|image_pad|>",
    "<think>",
];

/// A checkpoint that cannot be inspected (its tokenizer does not load).
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Checkpoint(#[from] super::CheckpointError),
    #[error("writing the report")]
    Write(#[from] std::fmt::Error),
}

/// The report, and the inconsistencies found (the command fails when there are any).
pub fn report(ckpt: &Checkpoint) -> Result<(String, Vec<String>), InspectError> {
    let mut out = String::new();
    let mut problems = Vec::new();
    let c = &ckpt.config;
    let t = &c.text;
    writeln!(out, "model directory: {}", ckpt.dir.display())?;
    writeln!(out, "architecture: {} ({})", c.architecture, c.model_type)?;
    writeln!(
        out,
        "text: hidden {}, {} layers ({} Gated DeltaNet + {} full attention), MLP {}, vocab {}",
        t.hidden_size,
        t.layers.len(),
        t.count(LayerKind::DeltaNet),
        t.count(LayerKind::Attention),
        t.intermediate_size,
        t.vocab_size
    )?;
    writeln!(
        out,
        "attention: {} query heads, {} KV heads, head dim {}, rotary dim {}, theta {}, mrope {:?}",
        t.num_attention_heads,
        t.num_key_value_heads,
        t.head_dim,
        t.rotary_dim(),
        t.rope_theta,
        t.mrope_section
    )?;
    writeln!(
        out,
        "deltanet: {} key heads x {}, {} value heads x {}, conv kernel {}",
        t.linear_num_key_heads,
        t.linear_key_head_dim,
        t.linear_num_value_heads,
        t.linear_value_head_dim,
        t.linear_conv_kernel_dim
    )?;
    match &c.vision {
        Some(v) => writeln!(
            out,
            "vision: depth {}, hidden {}, {} heads, patch {}, merge {} (noted; not loaded yet)",
            v.depth, v.hidden_size, v.num_heads, v.patch_size, v.spatial_merge_size
        )?,
        None => writeln!(out, "vision: none")?,
    }
    // Tensor groups.
    let mut groups: Vec<(&str, usize, usize)> = vec![
        ("text", 0, 0),
        ("lm_head", 0, 0),
        ("visual", 0, 0),
        ("other", 0, 0),
    ];
    for (name, info) in ckpt.tensors.iter() {
        let g = if name.starts_with(TEXT_PREFIX) {
            0
        } else if name == LM_HEAD {
            1
        } else if name.starts_with(VISION_PREFIX) {
            2
        } else {
            3
        };
        groups[g].1 += 1;
        groups[g].2 += info.bytes();
    }
    writeln!(
        out,
        "files: {}",
        ckpt.tensors
            .files()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    for (g, n, bytes) in &groups {
        writeln!(out, "  {g:8} {n:5} tensors {:>14} bytes", bytes)?;
    }
    writeln!(
        out,
        "  mtp      {:5} tensors skipped",
        ckpt.tensors.skipped()
    )?;
    if groups[3].1 > 0 {
        problems.push(format!(
            "{} tensors outside the text model, LM head, vision tower and mtp",
            groups[3].1
        ));
    }
    // Head.
    match &ckpt.head {
        Some(h) => {
            let hc = &h.config;
            let params: usize = h.tensors.iter().map(|(_, i)| i.elements()).sum();
            writeln!(
                out,
                "joint head: hidden {}, width {}, {} heads (attention scale {:.6}), feedforward {}, {} routing + {} decoder layers; {} tensors, {} parameters",
                hc.hidden_size, hc.width, hc.heads, hc.attention_scale(), hc.feedforward,
                hc.routing_layers, hc.layers, h.tensors.iter().count(), params
            )?;
        }
        None => problems.push("no joint head".into()),
    }
    // Tokenizer.
    let tok = ckpt.tokenizer()?;
    let vocab = tok.get_vocab_size(true);
    writeln!(
        out,
        "tokenizer: {} ({} tokens with added ones)",
        ckpt.tokenizer_path.display(),
        vocab
    )?;
    if vocab > t.vocab_size {
        problems.push(format!(
            "the tokenizer has {vocab} tokens but the embedding only {} rows",
            t.vocab_size
        ));
    }
    let mut ids = Vec::new();
    for s in SPECIAL_TOKENS {
        match tok.token_to_id(s) {
            Some(id) => ids.push(format!("{s}={id}")),
            None => problems.push(format!("the tokenizer has no {s}")),
        }
    }
    writeln!(out, "special tokens: {}", ids.join(" "))?;
    for (field, want, token) in [
        ("image_token_id", c.image_token_id, "<|image_pad|>"),
        ("video_token_id", c.video_token_id, "<|video_pad|>"),
        (
            "vision_start_token_id",
            c.vision_start_token_id,
            "<|vision_start|>",
        ),
        (
            "vision_end_token_id",
            c.vision_end_token_id,
            "<|vision_end|>",
        ),
    ] {
        if let (Some(want), Some(got)) = (want, tok.token_to_id(token)) {
            if want != got {
                problems.push(format!(
                    "config {field} is {want} but the tokenizer's {token} is {got}"
                ));
            }
        }
    }
    Ok((out, problems))
}
