//! Reading a Clef checkpoint: a Hugging Face snapshot directory as Cloudflare ships it.
//!
//! - `config.json` → [`ModelConfig`];
//! - `model.safetensors` or shards + index → a memory-mapped [`TensorStore`]
//!   (`model.language_model.*` for the backbone, `lm_head.weight` as a host [`RowTable`],
//!   `model.visual.*` noted, `mtp.*` skipped);
//! - `joint_head_config.json` + `joint_head.safetensors` → [`JointHeadFiles`];
//! - `tokenizer.json` → a `tokenizers` tokenizer.
//!
//! A hub id (`Cloudflare/clef`) is resolved in the local Hugging Face cache; nothing is ever
//! downloaded.

mod config;
mod head;
mod hub;
pub mod inspect;
mod rows;
#[cfg(feature = "server")]
pub mod shapes;
mod tensors;

pub use config::{LayerKind, ModelConfig, TextConfig, VisionConfig};
pub use head::{JointHeadConfig, JointHeadFiles};
pub use hub::{resolve_in_cache, resolve_model_dir, snapshot_commit};
pub use rows::{RowError, RowTable};
pub use tensors::{widen_f32, StoredDtype, TensorInfo, TensorStore};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// The pre-tokenizer split of transformers' `Qwen2Tokenizer` for Qwen3.5 vocabularies: letters
/// and combining marks form one run. The reference loads Clef's tokenizer through that class
/// (`tokenizer_config.json` names it), which installs this split whatever `tokenizer.json`
/// says; the released file carries the older Qwen2 form without `\p{M}`. The goldens settle it:
/// Devanagari, Hebrew points and other marks tokenize as with this pattern.
const QWEN2_TOKENIZER_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Prefix of the text model's tensors in a `Qwen3_5ForConditionalGeneration` checkpoint.
pub const TEXT_PREFIX: &str = "model.language_model.";
/// Prefix of the vision tower's tensors.
pub const VISION_PREFIX: &str = "model.visual.";
/// The LM head: a table of rows for the joint head's lexical option vectors.
pub const LM_HEAD: &str = "lm_head.weight";

/// Everything that can be wrong with a checkpoint; each names the file and what was expected.
#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{file}: {msg}")]
    Io { file: String, msg: String },
    #[error("{file}: {msg}")]
    Config { file: String, msg: String },
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
    #[error("{file}: tensor {tensor}: {msg}")]
    Tensor {
        file: String,
        tensor: String,
        msg: String,
    },
    #[error("model {model:?}: {msg}")]
    Resolve { model: String, msg: String },
    #[error("{file}: tokenizer: {msg}")]
    Tokenizer { file: String, msg: String },
}

impl From<clef_device::plan::SplitError> for CheckpointError {
    fn from(e: clef_device::plan::SplitError) -> Self {
        CheckpointError::Tensor {
            file: "(tensor-parallel plan)".into(),
            tensor: e.tensor,
            msg: e.msg,
        }
    }
}

impl CheckpointError {
    fn io(path: &Path, e: std::io::Error) -> Self {
        CheckpointError::Io {
            file: path.display().to_string(),
            msg: e.to_string(),
        }
    }
}

/// What [`default_model_dir`] returns when this installation has no built-in model: opening
/// it fails with [`CheckpointError::Resolve`] saying what to pass instead.
pub const NO_BUILTIN_MODEL: &str = "<no built-in model>";

/// The directory of the built-in default model: the tiny random-weight Clef fixture of the
/// source checkout (a demo model; its answers mean nothing). `CLEF_DEFAULT_MODEL` overrides
/// it. The checkout is found at run time from where the running executable is (see
/// [`checkout_fixture`]), never from a path fixed at compile time: an installed binary (the
/// wheel, `cargo install`) has no built-in model, and [`NO_BUILTIN_MODEL`] makes opening it
/// say so.
pub fn default_model_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CLEF_DEFAULT_MODEL") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().ok();
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    exe.as_deref()
        .and_then(checkout_fixture)
        .or_else(|| manifest_dir.and_then(|d| fixture_in(&d)))
        .unwrap_or_else(|| PathBuf::from(NO_BUILTIN_MODEL))
}

/// The fixture of the checkout an executable was built in: `exe` inside the checkout's
/// `target/` (`target/<profile>/clef-tt`, test executables in `target/<profile>/deps/`,
/// `target/<triple>/<profile>/...`). `None` anywhere else, e.g. a virtualenv's `bin/`.
pub fn checkout_fixture(exe: &Path) -> Option<PathBuf> {
    exe.ancestors()
        .skip(1)
        .take(4)
        .find(|dir| dir.file_name().is_some_and(|n| n == "target"))
        .and_then(Path::parent)
        .and_then(fixture_in)
}

/// `DIR/tests/fixtures/tiny-clef` when `DIR` is a clef-tt checkout holding it.
fn fixture_in(dir: &Path) -> Option<PathBuf> {
    let fixture = dir.join("tests").join("fixtures").join("tiny-clef");
    (dir.join("Cargo.toml").is_file() && fixture.join("config.json").is_file()).then_some(fixture)
}

/// The error for [`NO_BUILTIN_MODEL`].
fn no_builtin_model() -> CheckpointError {
    CheckpointError::Resolve {
        model: NO_BUILTIN_MODEL.into(),
        msg: "this clef-tt has no built-in demo model (it comes with a source checkout only): \
              pass --model DIR or a hub id, or set HF_MODEL, CLEF_MODEL or CLEF_DEFAULT_MODEL"
            .into(),
    }
}

/// A checkpoint opened from a snapshot directory.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    /// The model's tensors, shared with loaders that read rows on demand (embeddings).
    pub tensors: Arc<TensorStore>,
    /// The joint head (`None` for a bare backbone opened with [`Checkpoint::open_text`]).
    pub head: Option<JointHeadFiles>,
    pub tokenizer_path: PathBuf,
}

impl Checkpoint {
    /// Open and check a snapshot directory: config, every text tensor with its shape, the
    /// LM head, the joint head and the tokenizer file.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        let mut ckpt = Self::open_text(dir)?;
        ckpt.head = Some(JointHeadFiles::open(dir, ckpt.config.text.hidden_size)?);
        if !ckpt.tokenizer_path.is_file() {
            return Err(CheckpointError::Io {
                file: ckpt.tokenizer_path.display().to_string(),
                msg: "missing".into(),
            });
        }
        Ok(ckpt)
    }

    /// Open only the backbone: config and text tensors (a bare Qwen3.5 checkpoint).
    pub fn open_text(dir: &Path) -> Result<Self, CheckpointError> {
        if dir == Path::new(NO_BUILTIN_MODEL) {
            return Err(no_builtin_model());
        }
        let config = ModelConfig::read(dir)?;
        let tensors = TensorStore::open_model(dir)?;
        check_text_tensors(&config.text, &tensors)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            tensors: Arc::new(tensors),
            head: None,
            tokenizer_path: dir.join("tokenizer.json"),
        })
    }

    /// Load the tokenizer (`tokenizer.json`, HF `tokenizers`) with the pipeline the reference
    /// gets from transformers (see [`QWEN2_TOKENIZER_SPLIT`]).
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer, CheckpointError> {
        let err = |msg: String| CheckpointError::Tokenizer {
            file: self.tokenizer_path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(&self.tokenizer_path).map_err(|e| err(e.to_string()))?;
        let mut json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if self.tokenizer_class().as_deref() == Some("Qwen2Tokenizer") {
            if let Some(p) = json.pointer_mut("/pre_tokenizer/pretokenizers/0/pattern/Regex") {
                *p = serde_json::Value::from(QWEN2_TOKENIZER_SPLIT);
            }
        }
        let text = serde_json::to_string(&json).map_err(|e| err(e.to_string()))?;
        text.parse::<tokenizers::Tokenizer>()
            .map_err(|e| err(e.to_string()))
    }

    /// `tokenizer_class` of `tokenizer_config.json`, when the file exists.
    pub fn tokenizer_class(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join("tokenizer_config.json")).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        json.get("tokenizer_class")?.as_str().map(str::to_string)
    }

    /// The LM head as a row table read on demand from its file.
    pub fn lm_head(&self) -> Result<RowTable, CheckpointError> {
        let t = &self.config.text;
        RowTable::new(&self.tensors, LM_HEAD, t.vocab_size, t.hidden_size)
    }

    /// The input embedding table as a row table.
    pub fn embeddings(&self) -> Result<RowTable, CheckpointError> {
        let t = &self.config.text;
        let name = format!("{TEXT_PREFIX}embed_tokens.weight");
        RowTable::new(&self.tensors, &name, t.vocab_size, t.hidden_size)
    }
}

/// Every text tensor the backbone needs, with the shape the config implies.
pub fn expected_text_tensors(t: &TextConfig) -> Vec<(String, Vec<usize>)> {
    let h = t.hidden_size;
    let mut out = vec![
        ("embed_tokens.weight".to_string(), vec![t.vocab_size, h]),
        ("norm.weight".to_string(), vec![h]),
    ];
    for (i, kind) in t.layers.iter().enumerate() {
        let l = format!("layers.{i}");
        out.push((format!("{l}.input_layernorm.weight"), vec![h]));
        out.push((format!("{l}.post_attention_layernorm.weight"), vec![h]));
        out.push((
            format!("{l}.mlp.gate_proj.weight"),
            vec![t.intermediate_size, h],
        ));
        out.push((
            format!("{l}.mlp.up_proj.weight"),
            vec![t.intermediate_size, h],
        ));
        out.push((
            format!("{l}.mlp.down_proj.weight"),
            vec![h, t.intermediate_size],
        ));
        match kind {
            LayerKind::DeltaNet => {
                let nv = t.linear_num_value_heads;
                let a = format!("{l}.linear_attn");
                out.push((format!("{a}.in_proj_qkv.weight"), vec![t.conv_dim(), h]));
                out.push((format!("{a}.in_proj_z.weight"), vec![t.value_dim(), h]));
                out.push((format!("{a}.in_proj_b.weight"), vec![nv, h]));
                out.push((format!("{a}.in_proj_a.weight"), vec![nv, h]));
                out.push((
                    format!("{a}.conv1d.weight"),
                    vec![t.conv_dim(), 1, t.linear_conv_kernel_dim],
                ));
                out.push((format!("{a}.dt_bias"), vec![nv]));
                out.push((format!("{a}.A_log"), vec![nv]));
                out.push((format!("{a}.norm.weight"), vec![t.linear_value_head_dim]));
                out.push((format!("{a}.out_proj.weight"), vec![h, t.value_dim()]));
            }
            LayerKind::Attention => {
                let d = t.head_dim;
                let a = format!("{l}.self_attn");
                out.push((
                    format!("{a}.q_proj.weight"),
                    vec![t.num_attention_heads * 2 * d, h],
                ));
                out.push((
                    format!("{a}.k_proj.weight"),
                    vec![t.num_key_value_heads * d, h],
                ));
                out.push((
                    format!("{a}.v_proj.weight"),
                    vec![t.num_key_value_heads * d, h],
                ));
                out.push((
                    format!("{a}.o_proj.weight"),
                    vec![h, t.num_attention_heads * d],
                ));
                out.push((format!("{a}.q_norm.weight"), vec![d]));
                out.push((format!("{a}.k_norm.weight"), vec![d]));
            }
        }
    }
    out
}

fn check_text_tensors(t: &TextConfig, store: &TensorStore) -> Result<(), CheckpointError> {
    for (name, shape) in expected_text_tensors(t) {
        store.expect(&format!("{TEXT_PREFIX}{name}"), &shape)?;
    }
    if !t.tie_word_embeddings {
        store.expect(LM_HEAD, &[t.vocab_size, t.hidden_size])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_is_found_from_a_checkouts_target_dir_only() {
        let root = std::env::temp_dir().join(format!("clef-checkout-{}", std::process::id()));
        let fixture = root.join("tests/fixtures/tiny-clef");
        std::fs::create_dir_all(&fixture).unwrap();
        std::fs::write(root.join("Cargo.toml"), "").unwrap();
        std::fs::write(fixture.join("config.json"), "{}").unwrap();
        for exe in [
            "target/release/clef-tt",
            "target/debug/deps/clef_tt-0123",
            "target/x86_64-unknown-linux-gnu/release/clef-tt",
        ] {
            assert_eq!(
                checkout_fixture(&root.join(exe)).as_deref(),
                Some(fixture.as_path()),
                "{exe}"
            );
        }
        // An installed binary: a virtualenv inside the checkout still has no built-in model.
        assert_eq!(checkout_fixture(&root.join(".venv/bin/clef-tt")), None);
        assert_eq!(checkout_fixture(Path::new("/usr/local/bin/clef-tt")), None);
        // A `target` folder that is not a checkout's.
        std::fs::remove_file(root.join("Cargo.toml")).unwrap();
        assert_eq!(checkout_fixture(&root.join("target/release/clef-tt")), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_installation_without_a_built_in_model_says_what_to_pass() {
        let err = Checkpoint::open(Path::new(NO_BUILTIN_MODEL))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--model"), "{err}");
        assert!(err.contains("HF_MODEL"), "{err}");
    }
}
