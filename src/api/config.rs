//! A server's configuration as its operator set it ([`ServeOptions`], resolved from flags and
//! `CLEF_*` variables by the command line) and what the server publishes from it: the model
//! card of `/v1/models` and the settings the routes run with.

use super::server::ServerSettings;
use super::DrainBounds;
use crate::checkpoint::Checkpoint;
use crate::encode::LengthRule;
use crate::engine::prefix_cache::PREFIX_ALIGN;
use crate::engine::serving::{PrefixCacheOptions, PrefixCachePlan};
use crate::engine::worker::Packing;
use crate::media::MediaLimits;
use crate::precision::Precision;
use crate::request::HostLimits;
use clef_device::select::{Backend, MeshLayout};
use serde_json::json;
use std::time::Duration;

/// Everything `serve` needs, resolved from flags and `CLEF_*` variables.
pub struct ServeOptions {
    pub model_dir: std::path::PathBuf,
    pub is_default_model: bool,
    pub revision: Option<String>,
    pub host: String,
    pub port: u16,
    pub workers: usize,
    /// Where the workers' meshes sit (`layout.shape` is each worker's mesh).
    pub layout: MeshLayout,
    pub device: Backend,
    pub precision: Precision,
    pub max_queue: usize,
    pub rule: LengthRule,
    pub api_key: Option<String>,
    /// The only account id the Workers AI route accepts.
    pub account_id: Option<String>,
    pub model_names: Vec<String>,
    pub warmup: bool,
    pub strict: bool,
    pub max_body_bytes: usize,
    /// How much of a body refused unread is drained before the answer.
    pub refused_body_drain: DrainBounds,
    /// Serve the browser demo page at `/`.
    pub demo: bool,
    /// Bounds on images and videos.
    pub media_limits: MediaLimits,
    pub prefix_cache: PrefixCacheOptions,
    pub tensor_cache: Option<std::path::PathBuf>,
    /// Where converted weights are kept (`TT_CACHE_PATH`): converted on the first start.
    pub tensor_cache_root: Option<std::path::PathBuf>,
    /// Written to stderr once every worker is ready.
    pub ready_message: Option<String>,
    /// How long the requests in flight get after SIGTERM (and after a missed device deadline).
    pub shutdown_timeout: Duration,
    /// The device deadline (`None`: none).
    pub device_timeout: Option<Duration>,
    /// How workers pack queued requests into shared prefill passes.
    pub packing: Packing,
}

/// The media part of the card's limits: whether media are on (the checkpoint has a vision
/// tower) and their bounds.
fn media_card(m: &MediaLimits, on: bool) -> serde_json::Value {
    serde_json::json!({
        "enabled": on, "max_images": m.max_images, "max_image_bytes": m.max_image_bytes,
        "max_image_pixels": m.max_image_pixels, "max_media_bytes": m.max_total_bytes,
        "max_videos": m.max_videos, "max_video_frames": m.max_frames,
        "remote_images": m.remote.enabled,
    })
}

impl ServeOptions {
    /// What the routes know besides the engine.
    pub fn settings(
        &self,
        ckpt: &Checkpoint,
        rule: LengthRule,
        limits: HostLimits,
        card: serde_json::Value,
    ) -> ServerSettings {
        ServerSettings {
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            model_names: self.model_names.clone(),
            max_body_bytes: self.max_body_bytes,
            refused_body_drain: self.refused_body_drain,
            demo: self.demo,
            rule,
            limits,
            card,
            media: ckpt
                .config
                .vision
                .is_some()
                .then(|| self.media_limits.clone()),
            account_id: self.account_id.clone().filter(|a| !a.is_empty()),
        }
    }

    /// The request limits the host enforces.
    pub fn host_limits(&self) -> HostLimits {
        HostLimits {
            strict: self.strict,
            ..HostLimits::default()
        }
    }

    /// The model card of `/v1/models`; `packing` is the engine's (off where the mesh cannot
    /// pack).
    pub fn card(
        &self,
        ckpt: &Checkpoint,
        limits: &HostLimits,
        cache: &PrefixCachePlan,
        packing: &Packing,
    ) -> serde_json::Value {
        let name = self.model_names.first().cloned().unwrap_or_else(|| {
            if self.is_default_model {
                "clef-tt-demo".into()
            } else {
                "clef".into()
            }
        });
        let description = if self.is_default_model {
            "DEMO: the built-in tiny random-weight Clef checkpoint (answers mean nothing)"
                .to_string()
        } else {
            format!(
                "Cloudflare Clef decision model from {}",
                self.model_dir.display()
            )
        };
        let t = &ckpt.config.text;
        let (max_state, max_tail, truncate) = match self.rule {
            LengthRule::Server {
                max_state,
                max_tail,
                truncate,
            } => (Some(max_state), Some(max_tail), truncate),
            LengthRule::Reference { max_length } => (Some(max_length), None, true),
        };
        json!({
            "name": name,
            "description": description,
            "release_date": "2026-11-29",
            "demo": self.is_default_model,
            // The revision is the commit opened (a snapshot of the HF cache), not the ref asked for:
            // tt-model leaves an existing refs/main alone, so `main` can name other weights.
            "weights": {
                "path": self.model_dir.display().to_string(),
                "revision": crate::checkpoint::snapshot_commit(&self.model_dir),
                "requested_revision": self.revision,
            },
            "device": self.device.name(),
            "cpu_kernels": clef_device::cpu::isa::isa().name(),
            "device_backend": self.device.describe(),
            "mesh": self.layout.shape.to_string(),
            "plan": format!("tensor parallel over the {} mesh of each worker", self.layout.shape),
            "workers": self.workers,
            "precision": self.precision.card(),
            "backbone": {"hidden_size": t.hidden_size, "layers": t.layers.len(), "vocab_size": t.vocab_size},
            "limits": {
                "max_state_tokens": max_state, "max_tail_tokens": max_tail,
                "truncate_states": truncate, "max_queue": self.max_queue,
                "pack_tokens": packing.tokens, "pack_max_requests": packing.max_jobs,
                "pack_wait_ms": packing.wait.as_millis() as u64,
                "max_body_bytes": self.max_body_bytes, "max_questions": limits.max_questions,
                "max_choice_options": limits.max_choice_options, "max_score_levels": limits.max_score_levels,
                "max_id_chars": limits.max_id_chars, "strict": limits.strict,
                "media": media_card(&self.media_limits, ckpt.config.vision.is_some()),
            },
            "workers_ai": {
                "routes": crate::api::workers_ai::ROUTES,
                "models": crate::api::workers_ai::MODELS
                    .iter()
                    .filter(|(_, s)| self.model_names.is_empty() || self.model_names.iter().any(|n| n == s))
                    .map(|(id, _)| *id)
                    .collect::<Vec<_>>(),
                "account_id": self.account_id,
            },
            "prefix_cache": {
                "slots_per_worker": cache.config.slots,
                "slots_asked": cache.asked_slots,
                "bytes_per_slot": cache.slot_bytes,
                "max_bytes": cache.cap,
                "planner": cache.config.planner,
                "alignment": PREFIX_ALIGN,
                "note": "bytes_per_slot is a slot at the longest cacheable state piece"
            }
        })
    }
}
