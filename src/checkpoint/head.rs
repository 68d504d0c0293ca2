//! The joint schema head's files: `joint_head_config.json` and `joint_head.safetensors`,
//! checked for exactly the 122 tensors the reference `JointSchemaHead` loads strictly.

use super::tensors::TensorStore;
use super::CheckpointError;
use serde::Deserialize;
use std::path::Path;

/// `joint_head_config.json`. Attention and routing scales are derived from it, never stored.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JointHeadConfig {
    pub hidden_size: usize,
    pub width: usize,
    pub routing_layers: usize,
    pub layers: usize,
    pub heads: usize,
    pub feedforward: usize,
    /// Accepted by the reference constructor; no effect at inference.
    #[serde(default)]
    pub dropout: Option<f64>,
}

impl JointHeadConfig {
    /// The released heads' shape (Clef-Flash: hidden 4096; Clef: 5120): width 1024, 16 heads,
    /// feedforward 4096, 2 routing and 4 decoder layers.
    pub fn release(hidden_size: usize) -> Self {
        JointHeadConfig {
            hidden_size,
            width: 1024,
            routing_layers: 2,
            layers: 4,
            heads: 16,
            feedforward: 4096,
            dropout: None,
        }
    }

    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join("joint_head_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
        let cfg: JointHeadConfig =
            serde_json::from_str(&text).map_err(|e| CheckpointError::Config {
                file: path.display().to_string(),
                msg: format!("not a joint head config: {e}"),
            })?;
        if cfg.width == 0 || cfg.heads == 0 || !cfg.width.is_multiple_of(cfg.heads) {
            return Err(CheckpointError::Config {
                file: path.display().to_string(),
                msg: format!(
                    "width {} is not a positive multiple of heads {}",
                    cfg.width, cfg.heads
                ),
            });
        }
        Ok(cfg)
    }

    /// Per-head width of every attention block.
    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Attention scale `1/sqrt(width/heads)` (PyTorch `MultiheadAttention`).
    pub fn attention_scale(&self) -> f32 {
        1.0 / (self.head_dim() as f32).sqrt()
    }

    /// Routing scale `1/sqrt(width)` of the option summary.
    pub fn routing_scale(&self) -> f32 {
        1.0 / (self.width as f32).sqrt()
    }

    /// Every tensor name with its shape, as the reference module declares them.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, w, f) = (self.hidden_size, self.width, self.feedforward);
        let mut out: Vec<(String, Vec<usize>)> = Vec::new();
        let mut push = |name: String, shape: &[usize]| out.push((name, shape.to_vec()));
        let norm = |push: &mut dyn FnMut(String, &[usize]), name: &str, n: usize| {
            push(format!("{name}.weight"), &[n]);
            push(format!("{name}.bias"), &[n]);
        };
        let mha = |push: &mut dyn FnMut(String, &[usize]), name: &str| {
            push(format!("{name}.in_proj_weight"), &[3 * w, w]);
            push(format!("{name}.in_proj_bias"), &[3 * w]);
            push(format!("{name}.out_proj.weight"), &[w, w]);
            push(format!("{name}.out_proj.bias"), &[w]);
        };
        norm(&mut push, "hidden_norm", h);
        for p in [
            "memory_projection",
            "question_projection",
            "option_question_projection",
            "global_projection",
            "option_context_projection",
            "option_lexical_projection",
        ] {
            push(format!("{p}.weight"), &[w, h]);
        }
        push("type_embedding.weight".into(), &[3, w]);
        for i in 0..self.routing_layers {
            let l = format!("evidence_layers.{i}");
            norm(&mut push, &format!("{l}.query_norm"), w);
            norm(&mut push, &format!("{l}.memory_norm"), w);
            mha(&mut push, &format!("{l}.attention"));
            norm(&mut push, &format!("{l}.feedforward_norm"), w);
            push(format!("{l}.feedforward.0.weight"), &[f, w]);
            push(format!("{l}.feedforward.0.bias"), &[f]);
            push(format!("{l}.feedforward.3.weight"), &[w, f]);
            push(format!("{l}.feedforward.3.bias"), &[w]);
        }
        norm(&mut push, "option_summary_norm", w);
        for i in 0..self.layers {
            let l = format!("layers.{i}");
            mha(&mut push, &format!("{l}.self_attn"));
            mha(&mut push, &format!("{l}.multihead_attn"));
            push(format!("{l}.linear1.weight"), &[f, w]);
            push(format!("{l}.linear1.bias"), &[f]);
            push(format!("{l}.linear2.weight"), &[w, f]);
            push(format!("{l}.linear2.bias"), &[w]);
            for n in ["norm1", "norm2", "norm3"] {
                norm(&mut push, &format!("{l}.{n}"), w);
            }
        }
        norm(&mut push, "field_norm", w);
        norm(&mut push, "option_norm", w);
        push("residual_scorer.0.weight".into(), &[w, 4 * w]);
        push("residual_scorer.0.bias".into(), &[w]);
        push("residual_scorer.3.weight".into(), &[1, w]);
        push("residual_scorer.3.bias".into(), &[1]);
        for s in ["prior_logit_scale", "joint_logit_scale", "residual_gate"] {
            push(s.into(), &[]);
        }
        out
    }
}

/// The head's tensors, checked against the config (all present, right shapes, nothing extra).
pub struct JointHeadFiles {
    pub config: JointHeadConfig,
    pub tensors: TensorStore,
}

impl JointHeadFiles {
    pub fn open(dir: &Path, backbone_hidden: usize) -> Result<Self, CheckpointError> {
        let config = JointHeadConfig::read(dir)?;
        if config.hidden_size != backbone_hidden {
            return Err(CheckpointError::Config {
                file: dir.join("joint_head_config.json").display().to_string(),
                msg: format!(
                    "hidden_size {} differs from the backbone's hidden_size {backbone_hidden}",
                    config.hidden_size
                ),
            });
        }
        let tensors = TensorStore::open_files(&[dir.join("joint_head.safetensors")])?;
        let expected = config.expected_tensors();
        for (name, shape) in &expected {
            tensors.expect(name, shape)?;
        }
        if let Some(extra) = tensors
            .names()
            .find(|n| !expected.iter().any(|(e, _)| e == *n))
        {
            return Err(CheckpointError::Tensor {
                file: dir.join("joint_head.safetensors").display().to_string(),
                tensor: extra.clone(),
                msg: format!(
                    "unexpected tensor (the head has exactly {} tensors)",
                    expected.len()
                ),
            });
        }
        Ok(JointHeadFiles { config, tensors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_head_has_122_tensors_and_its_parameter_count() {
        let flash = JointHeadConfig::release(4096);
        let t = flash.expected_tensors();
        assert_eq!(t.len(), 122);
        let params: usize = t.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        // the reference's code: 121,762,820 for Clef-Flash, 128,056,324 for Clef.
        assert_eq!(params, 121_762_820);
        let clef = JointHeadConfig::release(5120);
        let params: usize = clef
            .expected_tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert_eq!(params, 128_056_324);
        assert_eq!(flash.attention_scale(), 0.125);
        assert_eq!(flash.routing_scale(), 1.0 / 32.0);
    }
}
