//! Precision profiles: the format each class of weights is held in on the device and how the
//! matrix engine computes (math fidelity, bf16 or f32 accumulation, bf16 activations), plus the
//! KV cache, embedding and DeltaNet state precisions. The profiles are `profiles/*.json`,
//! embedded in the binary; `CLEF_PRECISION` picks one (the CPU device defaults to `f32`, the
//! Tenstorrent device to `selected`) and every knob can be overridden by an environment
//! variable, with the Tenstorrent package's `QWEN36_*` names where it has one ([`OVERRIDES`]).
//!
//! Every knob reaches every device. The weight formats go to the loader and the tensor cache;
//! [`Precision::numerics`] carries the rest to the mesh: the matrix engine's settings, bf16
//! activations and the dtypes the mesh keeps the KV cache and the DeltaNet gates and state in
//! (the Tenstorrent mesh passes them through `clef_tt.h` when it opens). The CPU mesh imitates
//! all of them (bf16: rounded where the device would keep bf16), as does the host shim; the
//! ttnn shim keeps bf16 KV and f32 DeltaNet gates and state only and refuses to open a mesh
//! asked for anything else, naming the override that fixes it (so the `f32` profile, whose
//! KV cache is f32, needs `CLEF_KV_DTYPE=bf16` there).

use clef_device::cpu::matmul::{Fidelity, Numerics};
use clef_device::{Kept, WeightFormat};
use serde::Deserialize;
use serde_json::{json, Value};

/// The format of each class of matrices (vectors always stay f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightFormats {
    /// Attention `[q|gate, k, v]` and `o_proj`.
    pub attention: WeightFormat,
    /// DeltaNet `in_proj` and `out_proj`.
    pub deltanet: WeightFormat,
    pub mlp_gate_up: WeightFormat,
    pub mlp_down: WeightFormat,
    /// The vision tower's matrices.
    pub vision: WeightFormat,
}

impl WeightFormats {
    /// Every matrix in `format`.
    pub fn uniform(format: WeightFormat) -> Self {
        WeightFormats {
            attention: format,
            deltanet: format,
            mlp_gate_up: format,
            mlp_down: format,
            vision: format,
        }
    }
}

/// The profiles shipped with clef-tt, by name.
pub const PROFILES: [(&str, &str); 5] = [
    ("f32", include_str!("../../profiles/f32.json")),
    ("bf16", include_str!("../../profiles/bf16.json")),
    ("selected", include_str!("../../profiles/selected.json")),
    ("stage1", include_str!("../../profiles/stage1.json")),
    ("fast", include_str!("../../profiles/fast.json")),
];

/// Environment variables that override one knob each: (variable, knob).
pub const OVERRIDES: [(&str, &str); 12] = [
    ("QWEN36_MLP_GATE_UP_DTYPE", "mlp_gate_up"),
    ("QWEN36_MLP_DOWN_DTYPE", "mlp_down"),
    ("QWEN36_PROJ_DTYPE", "attention,deltanet"),
    ("QWEN36_MATMUL_FIDELITY", "fidelity"),
    ("QWEN36_GDN_GATE_FP32", "gdn_gate_fp32"),
    ("QWEN_GDN_FP32_STATE", "gdn_state_fp32"),
    ("CLEF_FP32_DEST_ACC", "fp32_dest_acc"),
    ("CLEF_BF16_ACTIVATIONS", "bf16_activations"),
    ("CLEF_KV_DTYPE", "kv_cache"),
    ("CLEF_EMBED_DTYPE", "embeddings"),
    ("CLEF_ATTENTION_DTYPE", "attention"),
    ("CLEF_VISION_DTYPE", "vision"),
];

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrecisionError {
    #[error("unknown precision profile {0:?} (profiles: f32, bf16, selected, stage1, fast)")]
    Unknown(String),
    #[error("profile {profile}: {msg}")]
    Invalid { profile: String, msg: String },
    #[error("{var}={value:?}: {msg}")]
    Override {
        var: String,
        value: String,
        msg: String,
    },
}

/// One profile, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Precision {
    pub name: String,
    pub description: String,
    pub mlp_gate_up: WeightFormat,
    pub mlp_down: WeightFormat,
    pub attention: WeightFormat,
    pub deltanet: WeightFormat,
    /// The vision tower's matrices.
    pub vision: WeightFormat,
    pub fidelity: Fidelity,
    pub fp32_dest_acc: bool,
    pub bf16_activations: bool,
    pub gdn_gate_fp32: bool,
    pub gdn_state_fp32: bool,
    /// f32 or bf16.
    pub kv_cache: WeightFormat,
    /// f32 or bf16.
    pub embeddings: WeightFormat,
    /// Knobs changed by environment variables: (variable, value).
    pub overridden: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    description: String,
    mlp_gate_up: String,
    mlp_down: String,
    attention: String,
    deltanet: String,
    vision: String,
    fidelity: String,
    fp32_dest_acc: bool,
    bf16_activations: bool,
    gdn_gate_fp32: bool,
    gdn_state_fp32: bool,
    kv_cache: String,
    embeddings: String,
}

fn weight_format(s: &str) -> Result<WeightFormat, String> {
    WeightFormat::parse(s)
        .ok_or_else(|| format!("{s:?} is not a format (f32, bf16, bfp8_b, bfp4_b)"))
}

/// f32 or bf16 only (KV cache, embeddings).
fn plain_format(s: &str) -> Result<WeightFormat, String> {
    match weight_format(s)? {
        f @ (WeightFormat::F32 | WeightFormat::Bf16) => Ok(f),
        _ => Err(format!("{s:?}: only f32 or bf16 here")),
    }
}

fn fidelity(s: &str) -> Result<Fidelity, String> {
    Fidelity::parse(s)
        .ok_or_else(|| format!("{s:?} is not a fidelity (LoFi, HiFi2, HiFi3, HiFi4, exact)"))
}

/// A boolean setting: `1`/`true`/`yes`/`on` (any case) or `0`/`false`/`no`/`off`/empty.
pub fn parse_flag(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (1/0, true/false)")),
    }
}

impl Precision {
    /// Profile `name` with the overrides found by `env` (normally `std::env::var`).
    pub fn resolve(
        name: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, PrecisionError> {
        let text = PROFILES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(_, t)| *t)
            .ok_or_else(|| PrecisionError::Unknown(name.to_string()))?;
        let invalid = |msg: String| PrecisionError::Invalid {
            profile: name.to_string(),
            msg,
        };
        let f: ProfileFile = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut p = Precision {
            name: name.trim().to_ascii_lowercase(),
            description: f.description,
            mlp_gate_up: weight_format(&f.mlp_gate_up).map_err(invalid)?,
            mlp_down: weight_format(&f.mlp_down).map_err(invalid)?,
            attention: weight_format(&f.attention).map_err(invalid)?,
            deltanet: weight_format(&f.deltanet).map_err(invalid)?,
            vision: weight_format(&f.vision).map_err(invalid)?,
            fidelity: fidelity(&f.fidelity).map_err(invalid)?,
            fp32_dest_acc: f.fp32_dest_acc,
            bf16_activations: f.bf16_activations,
            gdn_gate_fp32: f.gdn_gate_fp32,
            gdn_state_fp32: f.gdn_state_fp32,
            kv_cache: plain_format(&f.kv_cache).map_err(invalid)?,
            embeddings: plain_format(&f.embeddings).map_err(invalid)?,
            overridden: Vec::new(),
        };
        for (var, knob) in OVERRIDES {
            let Some(value) = env(var).filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            let bad = |msg: String| PrecisionError::Override {
                var: var.to_string(),
                value: value.clone(),
                msg,
            };
            for knob in knob.split(',') {
                match knob {
                    "mlp_gate_up" => p.mlp_gate_up = weight_format(&value).map_err(bad)?,
                    "mlp_down" => p.mlp_down = weight_format(&value).map_err(bad)?,
                    "attention" => p.attention = weight_format(&value).map_err(bad)?,
                    "deltanet" => p.deltanet = weight_format(&value).map_err(bad)?,
                    "vision" => p.vision = weight_format(&value).map_err(bad)?,
                    "fidelity" => p.fidelity = fidelity(&value).map_err(bad)?,
                    "gdn_gate_fp32" => p.gdn_gate_fp32 = parse_flag(&value).map_err(bad)?,
                    "gdn_state_fp32" => p.gdn_state_fp32 = parse_flag(&value).map_err(bad)?,
                    "fp32_dest_acc" => p.fp32_dest_acc = parse_flag(&value).map_err(bad)?,
                    "bf16_activations" => p.bf16_activations = parse_flag(&value).map_err(bad)?,
                    "kv_cache" => p.kv_cache = plain_format(&value).map_err(bad)?,
                    "embeddings" => p.embeddings = plain_format(&value).map_err(bad)?,
                    other => return Err(bad(format!("no knob {other:?}"))),
                }
            }
            p.overridden.push((var.to_string(), value.clone()));
        }
        Ok(p)
    }

    /// Profile `name` with the process environment's overrides.
    pub fn from_env(name: &str) -> Result<Self, PrecisionError> {
        Self::resolve(name, |v| std::env::var(v).ok())
    }

    /// The `f32` profile with every matrix in `format` (tests and benchmarks of one format).
    pub fn uniform(format: WeightFormat) -> Self {
        let f = WeightFormats::uniform(format);
        // The embedded f32 profile with no overrides always resolves (a test resolves every
        // profile), and the load paths taking a format have no error of their own for it.
        let mut p = Precision::resolve("f32", |_| None).unwrap_or_else(|_| unreachable!());
        p.name = format!("uniform-{}", format.name());
        p.description = format!(
            "every matrix in {}, the rest as the f32 profile",
            format.name()
        );
        (p.attention, p.deltanet, p.mlp_gate_up, p.mlp_down, p.vision) =
            (f.attention, f.deltanet, f.mlp_gate_up, f.mlp_down, f.vision);
        p
    }

    /// The backbone's matrix formats.
    pub fn weight_formats(&self) -> WeightFormats {
        WeightFormats {
            attention: self.attention,
            deltanet: self.deltanet,
            mlp_gate_up: self.mlp_gate_up,
            mlp_down: self.mlp_down,
            vision: self.vision,
        }
    }

    /// How the mesh computes and what it keeps: the matrix engine's settings, bf16
    /// activations, and the KV cache's and DeltaNet gates' and state's dtypes.
    pub fn numerics(&self) -> Numerics {
        let kept = |bf16: bool| if bf16 { Kept::Bf16 } else { Kept::F32 };
        Numerics {
            bf16_activations: self.bf16_activations,
            fidelity: self.fidelity,
            bf16_accumulation: !self.fp32_dest_acc,
            kv_cache: kept(self.kv_cache == WeightFormat::Bf16),
            gdn_gates: kept(!self.gdn_gate_fp32),
            gdn_state: kept(!self.gdn_state_fp32),
        }
    }

    pub fn bf16_embeddings(&self) -> bool {
        self.embeddings == WeightFormat::Bf16
    }

    /// The profile as the model card shows it.
    pub fn card(&self) -> Value {
        json!({
            "profile": self.name,
            "description": self.description,
            "mlp_gate_up": self.mlp_gate_up.name(),
            "mlp_down": self.mlp_down.name(),
            "attention": self.attention.name(),
            "deltanet": self.deltanet.name(),
            "vision": self.vision.name(),
            "math_fidelity": self.fidelity.name(),
            "fp32_dest_acc": self.fp32_dest_acc,
            "bf16_activations": self.bf16_activations,
            "gdn_gate_fp32": self.gdn_gate_fp32,
            "gdn_state_fp32": self.gdn_state_fp32,
            "kv_cache": self.kv_cache.name(),
            "embeddings": self.embeddings.name(),
            "overrides": self.overridden.iter().map(|(k, v)| json!({k: v})).collect::<Vec<_>>(),
            "imitated_on_cpu": ["weight formats", "math fidelity", "accumulation", "bf16 activations", "bf16 embeddings", "KV cache dtype", "DeltaNet gate and state dtypes"],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_dtypes_reach_the_numerics_the_mesh_opens_with() {
        let f32 = Precision::resolve("f32", |_| None).unwrap().numerics();
        assert_eq!(
            (f32.kv_cache, f32.gdn_gates, f32.gdn_state),
            (Kept::F32, Kept::F32, Kept::F32)
        );
        let bf16 = Precision::resolve("bf16", |_| None).unwrap().numerics();
        assert_eq!(
            (bf16.kv_cache, bf16.gdn_gates, bf16.gdn_state),
            (Kept::Bf16, Kept::F32, Kept::F32)
        );
        let env = |var: &str| match var {
            "CLEF_KV_DTYPE" => Some("bf16".to_string()),
            "QWEN36_GDN_GATE_FP32" | "QWEN_GDN_FP32_STATE" => Some("0".to_string()),
            _ => None,
        };
        let overridden = Precision::resolve("f32", env).unwrap();
        let n = overridden.numerics();
        assert_eq!(
            (n.kv_cache, n.gdn_gates, n.gdn_state),
            (Kept::Bf16, Kept::Bf16, Kept::Bf16)
        );
        assert_eq!(overridden.card()["kv_cache"], "bf16");
        assert_eq!(overridden.card()["gdn_state_fp32"], false);
    }

    #[test]
    fn every_profile_resolves_and_selected_is_the_packages_stage1() {
        for (name, _) in PROFILES {
            Precision::resolve(name, |_| None).unwrap();
        }
        let s = Precision::resolve("selected", |_| None).unwrap();
        assert_eq!(
            (s.mlp_gate_up, s.mlp_down, s.attention, s.deltanet),
            (
                WeightFormat::Bfp8,
                WeightFormat::Bf16,
                WeightFormat::Bfp8,
                WeightFormat::Bfp8
            )
        );
        assert_eq!(s.fidelity, Fidelity::HiFi2);
        assert!(s.fp32_dest_acc && s.gdn_gate_fp32 && s.gdn_state_fp32);
        let stage1 = Precision::resolve("stage1", |_| None).unwrap();
        assert_eq!(stage1.weight_formats(), s.weight_formats());
        assert_eq!(stage1.numerics(), s.numerics());
        let fast = Precision::resolve("fast", |_| None).unwrap();
        assert_eq!(
            (fast.mlp_gate_up, fast.fidelity),
            (WeightFormat::Bfp4, Fidelity::LoFi)
        );
        let f32 = Precision::resolve("f32", |_| None).unwrap();
        assert_eq!(f32.numerics(), Numerics::default());
        assert_eq!(
            f32.weight_formats(),
            WeightFormats::uniform(WeightFormat::F32)
        );
    }

    #[test]
    fn environment_variables_override_single_knobs() {
        let env = |v: &str| match v {
            "QWEN36_MLP_GATE_UP_DTYPE" => Some("bfp4".to_string()),
            "QWEN36_PROJ_DTYPE" => Some("bf16".to_string()),
            "QWEN36_MATMUL_FIDELITY" => Some("HiFi4".to_string()),
            "CLEF_FP32_DEST_ACC" => Some("0".to_string()),
            _ => None,
        };
        let p = Precision::resolve("selected", env).unwrap();
        assert_eq!(p.mlp_gate_up, WeightFormat::Bfp4);
        assert_eq!(
            (p.attention, p.deltanet),
            (WeightFormat::Bf16, WeightFormat::Bf16)
        );
        assert_eq!(p.fidelity, Fidelity::HiFi4);
        assert!(p.numerics().bf16_accumulation);
        assert_eq!(p.overridden.len(), 4);
        let bad = Precision::resolve("selected", |v| {
            (v == "CLEF_KV_DTYPE").then(|| "bfp8".to_string())
        })
        .unwrap_err();
        assert!(bad.to_string().contains("CLEF_KV_DTYPE"), "{bad}");
        assert!(matches!(
            Precision::resolve("turbo", |_| None),
            Err(PrecisionError::Unknown(_))
        ));
    }
}
