//! The decision pipeline of one worker: a validated request → (media decoded, resized and run
//! through the vision tower) → encoded record → backbone prefill on the mesh (vision rows
//! spliced at the pad positions, M-RoPE positions) → joint head on the host → the reference's
//! response.
//! `worker` runs pipelines on worker threads behind a bounded queue; `prefix_cache` keeps the
//! state prefixes a worker has seen recently; `serving` builds a server's workers; `eval` scores a profile against the reference's answers;
//! `layer_trace` reads a request's every layer back for `clef-tt compare-layers`.

pub mod deadline;
pub mod eval;
pub mod layer_trace;
mod packing;
pub mod prefix_cache;
pub mod serving;
pub mod worker;

use crate::backbone::{Backbone, LoadError, PrefillError, PrefillState};
use crate::checkpoint::{Checkpoint, CheckpointError, RowTable};
use crate::encode::{encode, EncodeError, EncodedRecord, LengthRule};
use crate::head::answer::{answer, probabilities};
use crate::head::{HeadMemory, HeadQuestion, JointHead};
use crate::media::{load_tower, media_tokens, positions, prepare, MediaLimits, PreparedMedia};
use crate::precision::Precision;
use crate::request::{parse_body, validate, HostLimits, RequestError, SystemOneRequest};
use crate::request::{DecisionBody, Usage};
use clef_device::{HostTensor, MeshOps, WeightFormat};
use clef_vision::{MediaTokens, VisionTower};
use prefix_cache::{
    boundary, CacheKey, CacheUse, PrefixCache, PrefixCacheConfig, PrefixCacheStats, PrefixSlot,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The error `kind` of a request stopped between prefill chunks because its client left.
pub const CANCELLED: &str = "cancelled";

/// Tokens per prefill pass: a running request can be cancelled between passes. (The
/// Tenstorrent port caps its prefill chunks at 1024 tokens too.)
pub const PREFILL_CHUNK: usize = 1024;

/// Errors while building a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// One decision, with what the caller may want to report.
#[derive(Clone, Debug)]
pub struct Decision {
    pub response: Value,
    pub record: EncodedRecord,
    /// Per question, logits and probabilities in model option order.
    pub logits: Vec<Vec<f32>>,
    pub probabilities: Vec<Vec<f32>>,
    pub model_seconds: f64,
    /// How the prefix cache served this request.
    pub cache: CacheUse,
    /// Requests in the largest prefill pass this one ran in: 1 alone, more when packed
    /// (`packing.rs`).
    pub pass_requests: usize,
}

/// A request ready for the model (`Pipeline::prepare`).
struct Prepared {
    rule: LengthRule,
    /// When the pipeline took it (its `model_seconds` start here).
    started: Instant,
    record: EncodedRecord,
    vision: Option<VisionInput>,
    /// [`Pipeline::with_device_fault`] matched it: its passes fail.
    device_fault: bool,
}

/// A failed prefill as the request's answer (the same for a request alone or packed).
fn fail(e: PrefillError) -> RequestError {
    RequestError::internal(format!("prefill: {e}"))
}

/// The failure [`Pipeline::with_device_fault`] injects into a pass.
fn injected_device_fault() -> PrefillError {
    PrefillError::State(INJECTED_DEVICE_FAULT.into())
}

/// The answer of a request stopped because its client left.
fn cancelled_error() -> RequestError {
    RequestError {
        status: 499,
        loc: vec![],
        msg: "the client closed the request".into(),
        kind: CANCELLED.into(),
    }
}

/// What the model computed for one prompt: the backbone's final rows from `first_row` on (the
/// rows of a cached prefix are not needed: every span the head reads lies after the state)
/// and the head's memory rows of the whole prompt.
struct ModelRows {
    hidden: Vec<f32>,
    first_row: usize,
    memory: HeadMemory,
    cache: CacheUse,
}

type Cache<B> = PrefixCache<PrefillState<<B as MeshOps>::Tensor>, HeadMemory>;

/// Everything one worker needs to answer requests.
pub struct Pipeline<B: MeshOps> {
    pub backbone: Backbone<B>,
    pub head: JointHead,
    tokenizer: tokenizers::Tokenizer,
    lm_head: RowTable,
    hidden: usize,
    cache: Mutex<Cache<B>>,
    fault: Option<FaultSwitch>,
    /// Fails every prefill pass holding a request it matches, as a device error would.
    device_fault: Option<FaultSwitch>,
    /// The checkpoint's vision tower on the backbone's mesh and the tokenizer's media tokens;
    /// `None`: media requests are refused.
    vision: Option<(VisionTower<B>, MediaTokens)>,
    media_limits: MediaLimits,
    /// Set when the mesh refused a batched pass for this model's shapes (packing.rs): packs
    /// run their requests one by one from then on.
    batch_refused: std::sync::atomic::AtomicBool,
}

/// What a media prompt adds to its token ids: the rows that replace the pad embeddings, in
/// prompt order, the 3-D positions of every token and a digest of the decoded pixels (part of
/// the prefix cache key).
struct VisionInput {
    /// Prompt index of each pad, images' first, in the order the rows come.
    pads: Vec<usize>,
    /// `[pads, hidden]`.
    rows: Vec<f32>,
    positions: [Vec<u32>; 3],
    digest: Vec<u8>,
}

/// How a request's media go through the vision tower (`Pipeline::prepare_with`).
enum TowerRun<'a> {
    /// As served.
    Plain,
    /// Every block's output and the merger's rows to the probe (`layer_trace`); the text
    /// model then takes the rows given, if any (the reference's, so that both sides of a
    /// layer trace read the same input), else the tower's.
    Probed(&'a mut TowerProbe<'a>, Option<&'a [f32]>),
}

/// Receives the vision tower's named outputs (`layer_trace`).
type TowerProbe<'a> = dyn FnMut(&str, HostTensor) -> Result<(), clef_device::DeviceError> + 'a;

/// A switch for fault-injection tests: a request it matches makes the pipeline panic after the
/// model ran (the prefix cache already updated) and before the head. Only code sets it
/// ([`Pipeline::with_fault_switch`]); no request field or environment variable reaches it.
pub type FaultSwitch = Arc<dyn Fn(&SystemOneRequest) -> bool + Send + Sync>;

/// The panic message of an injected fault.
pub const INJECTED_FAULT: &str = "injected fault (test switch)";

/// The error of a prefill pass failed by [`Pipeline::with_device_fault`].
pub const INJECTED_DEVICE_FAULT: &str = "injected device fault (test switch)";

impl<B: MeshOps> Pipeline<B> {
    /// Every matrix in `format`, the rest as the `f32` profile ([`Precision::uniform`]).
    pub fn new(ckpt: &Checkpoint, mesh: B, format: WeightFormat) -> Result<Self, PipelineError> {
        Self::load(ckpt, mesh, &Precision::uniform(format))
    }

    /// A pipeline whose weights are held as `precision` says, on a mesh opened with
    /// `precision.numerics()`.
    pub fn load(ckpt: &Checkpoint, mesh: B, precision: &Precision) -> Result<Self, PipelineError> {
        let backbone = Backbone::load_with(ckpt, mesh, precision)?;
        Self::with_backbone(ckpt, backbone, precision)
    }

    /// A pipeline around a backbone already placed (e.g. from a tensor cache); the vision
    /// tower, if the checkpoint has one, is placed on the same mesh with matrices in
    /// `precision`'s vision format.
    pub fn with_backbone(
        ckpt: &Checkpoint,
        backbone: Backbone<B>,
        precision: &Precision,
    ) -> Result<Self, PipelineError> {
        let vision_format = precision.vision;
        let head_files = ckpt.head.as_ref().ok_or_else(|| CheckpointError::Config {
            file: ckpt
                .dir
                .join("joint_head_config.json")
                .display()
                .to_string(),
            msg: "no joint head".into(),
        })?;
        let head = JointHead::load(head_files)?;
        let tokenizer = ckpt.tokenizer()?;
        let vision = match load_tower(ckpt, backbone.mesh(), vision_format)? {
            Some(tower) => {
                let tokens = media_tokens(&tokenizer).map_err(|e| CheckpointError::Tokenizer {
                    file: ckpt.tokenizer_path.display().to_string(),
                    msg: e.msg,
                })?;
                Some((tower, tokens))
            }
            None => None,
        };
        Ok(Pipeline {
            backbone,
            head,
            tokenizer,
            lm_head: ckpt.lm_head()?,
            hidden: ckpt.config.text.hidden_size,
            cache: Mutex::new(PrefixCache::new(
                PrefixCacheConfig {
                    slots: 0,
                    ..Default::default()
                },
                Arc::default(),
            )),
            fault: None,
            device_fault: None,
            vision,
            media_limits: MediaLimits::default(),
            batch_refused: Default::default(),
        })
    }

    /// Bound images and videos by `limits` (default: [`MediaLimits::default`]).
    pub fn with_media_limits(self, limits: MediaLimits) -> Self {
        Pipeline {
            media_limits: limits,
            ..self
        }
    }

    /// Panic on the requests `switch` matches (fault-injection tests only).
    #[doc(hidden)]
    pub fn with_fault_switch(self, switch: FaultSwitch) -> Self {
        Pipeline {
            fault: Some(switch),
            ..self
        }
    }

    /// Fail every prefill pass that holds a request `switch` matches, as a device error
    /// during the pass would (failure-isolation tests only).
    #[doc(hidden)]
    pub fn with_device_fault(self, switch: FaultSwitch) -> Self {
        Pipeline {
            device_fault: Some(switch),
            ..self
        }
    }

    /// Forget everything a failed request may have left behind: the prefix cache slots.
    pub fn reset_after_failure(&self) {
        self.lock_cache().clear();
    }

    /// Cache state prefixes as `config` says, counting into `stats` (shared by the workers of
    /// a server). A new pipeline caches nothing.
    pub fn with_prefix_cache(
        self,
        config: PrefixCacheConfig,
        stats: Arc<PrefixCacheStats>,
    ) -> Self {
        Pipeline {
            cache: Mutex::new(PrefixCache::new(config, stats)),
            ..self
        }
    }

    /// Bytes one cache slot holds at cached length `p`: the backbone state and the head's
    /// memory rows.
    pub fn prefix_slot_bytes(&self, p: usize) -> usize {
        self.backbone.state_bytes_at(p) + p * self.head.config.width * 4
    }

    /// Warm the mesh's whole passes (traced on ttnn: `Backbone::warm_passes`) with KV room for
    /// every prefix-cache slot at the longest state piece under `rule` and two prompts at the
    /// longest; `None` where the mesh runs none.
    pub fn warm_passes(
        &self,
        rule: LengthRule,
    ) -> Result<Option<crate::backbone::PassWarmup>, PrefillError> {
        let (state, prompt) = match rule {
            LengthRule::Server {
                max_state,
                max_tail,
                ..
            } => (max_state, max_state + max_tail),
            LengthRule::Reference { max_length } => (max_length, max_length),
        };
        let slots = self.lock_cache().config().slots;
        self.backbone.warm_passes(slots * state + 2 * prompt)
    }

    /// The counters this pipeline's cache adds to.
    pub fn cache_stats(&self) -> Arc<PrefixCacheStats> {
        self.lock_cache().stats()
    }

    /// Cached lengths, least recently used first.
    pub fn cached_lengths(&self) -> Vec<usize> {
        self.lock_cache().lengths()
    }

    /// The cache; a panic elsewhere while it was held cannot leave it half-changed (its
    /// methods do not panic), so a poisoned lock is taken over.
    fn lock_cache(&self) -> MutexGuard<'_, Cache<B>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// Parse, validate, encode and answer one body.
    pub fn decide_body(
        &self,
        body: &[u8],
        rule: LengthRule,
        limits: Option<&HostLimits>,
    ) -> Result<Decision, RequestError> {
        let value = parse_body(body)?;
        let req = validate(&value, limits)?;
        self.decide(&req, rule)
    }

    /// Encode a validated request under `rule` and answer it.
    pub fn decide(
        &self,
        req: &SystemOneRequest,
        rule: LengthRule,
    ) -> Result<Decision, RequestError> {
        self.decide_cancellable(req, rule, &|| false)
    }

    /// [`Pipeline::decide`], giving up between prefill chunks once `cancelled()` is true.
    pub fn decide_cancellable(
        &self,
        req: &SystemOneRequest,
        rule: LengthRule,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Decision, RequestError> {
        let prepared = self.prepare(req, rule)?;
        let rows = self.run_model(&prepared, cancelled)?;
        self.finish(req, prepared, rows, 1)
    }

    /// A request up to the model: its length rule, media (decoded and through the vision
    /// tower) and encoded record. Every failure here is the request's own (4xx or its media).
    fn prepare(&self, req: &SystemOneRequest, rule: LengthRule) -> Result<Prepared, RequestError> {
        self.prepare_with(req, rule, &mut TowerRun::Plain)
    }

    /// [`Pipeline::prepare`], the vision tower run as `tower` says.
    fn prepare_with(
        &self,
        req: &SystemOneRequest,
        rule: LengthRule,
        tower: &mut TowerRun<'_>,
    ) -> Result<Prepared, RequestError> {
        let rule = match rule {
            LengthRule::Server {
                max_state,
                max_tail,
                truncate,
            } => LengthRule::Server {
                max_state,
                max_tail,
                truncate: truncate || req.truncate == Some(true),
            },
            r => r,
        };
        let started = Instant::now();
        let media = if req.has_media {
            Some(self.prepare_media(req)?)
        } else {
            None
        };
        let media_ids = media.as_ref().map_or(&[][..], |m| &m.block.ids[..]);
        let record = encode(&self.tokenizer, req, media_ids, rule).map_err(|e| match e {
            EncodeError::Request(a) => a,
            EncodeError::Tokenizer(m) => RequestError::internal(format!("tokenizer: {m}")),
        })?;
        let vision = match &media {
            Some(m) => Some(self.vision_input(&record, m, tower)?),
            None => None,
        };
        Ok(Prepared {
            rule,
            started,
            record,
            vision,
            device_fault: self.device_fault.as_ref().is_some_and(|m| m(req)),
        })
    }

    /// The head's answer to a prepared request from the model's rows; `pass_requests`: the
    /// requests of the largest pass it ran in (1: alone).
    fn finish(
        &self,
        req: &SystemOneRequest,
        prepared: Prepared,
        rows: ModelRows,
        pass_requests: usize,
    ) -> Result<Decision, RequestError> {
        let Prepared {
            rule,
            started,
            record,
            ..
        } = prepared;
        if self.fault.as_ref().is_some_and(|matches| matches(req)) {
            std::panic::panic_any(INJECTED_FAULT);
        }
        let logits = self.logits(&record, &rows.hidden, rows.first_row, &rows.memory)?;
        let model_seconds = started.elapsed().as_secs_f64();
        let probabilities: Vec<Vec<f32>> = logits.iter().map(|l| probabilities(l)).collect();
        let answers = req
            .questions
            .iter()
            .zip(&record.questions)
            .zip(&probabilities)
            .map(|((q, enc), probs)| (q.id.clone(), answer(q, enc, probs)))
            .collect();
        let body = DecisionBody {
            model: req.model.clone(),
            answers,
            usage: Usage {
                input_tokens: record.input_ids.len(),
                output_tokens: 0,
            },
            // The reference cuts silently; the server says so.
            truncated: (record.truncated && matches!(rule, LengthRule::Server { .. }))
                .then_some(true),
            latency_ms: None,
        };
        let response = serde_json::to_value(&body)
            .map_err(|e| RequestError::internal(format!("serialising the answer: {e}")))?;
        Ok(Decision {
            response,
            record,
            logits,
            probabilities,
            model_seconds,
            cache: rows.cache,
            pass_requests,
        })
    }

    /// Decode, check, resize and patch the request's media (422s name the index).
    fn prepare_media(&self, req: &SystemOneRequest) -> Result<PreparedMedia, RequestError> {
        let Some((_, tokens)) = &self.vision else {
            return Err(RequestError::invalid(
                &["images"],
                "this model has no vision tower: images and videos are not supported",
                "value_error",
            ));
        };
        prepare(
            &self.tokenizer,
            tokens,
            &req.images,
            &req.videos,
            &self.media_limits,
        )
    }

    /// The vision rows and positions of an encoded media prompt. Pads typed in the state fail
    /// here as the reference fails (422 with its message).
    fn vision_input(
        &self,
        record: &EncodedRecord,
        media: &PreparedMedia,
        run: &mut TowerRun<'_>,
    ) -> Result<VisionInput, RequestError> {
        let (tower, tokens) = self
            .vision
            .as_ref()
            .ok_or_else(|| RequestError::internal("media without a vision tower"))?;
        let positions = positions(&record.input_ids, tokens, media)?;
        let mesh = self.backbone.mesh();
        let mut rows = Vec::new();
        for (what, pixels, grids) in [
            ("image", &media.pixel_values, &media.image_grids),
            ("video", &media.pixel_values_videos, &media.video_grids),
        ] {
            if !grids.is_empty() {
                let tower_err = |e| RequestError::internal(format!("vision tower: {e}"));
                let embedded = match run {
                    TowerRun::Plain => tower.embed(mesh, pixels, grids),
                    TowerRun::Probed(probe, _) => {
                        layer_trace::probed_tower(tower, mesh, pixels, grids, &mut |name, t| {
                            probe(&format!("vision.{what}.{name}"), t)
                        })
                    }
                }
                .map_err(tower_err)?;
                rows.extend(embedded);
            }
        }
        if let TowerRun::Probed(_, Some(given)) = run {
            if given.len() != rows.len() {
                return Err(RequestError::internal(format!(
                    "{} vision values given for {}",
                    given.len(),
                    rows.len()
                )));
            }
            rows = given.to_vec();
        }
        let pads_of = |pad: u32| {
            record
                .input_ids
                .iter()
                .enumerate()
                .filter(move |(_, &id)| id == pad)
                .map(|(i, _)| i)
        };
        let pads: Vec<usize> = pads_of(tokens.image_pad)
            .chain(pads_of(tokens.video_pad))
            .collect();
        if rows.len() != pads.len() * self.hidden {
            return Err(RequestError::internal(format!(
                "the vision tower gave {} rows of {} for {} pads",
                rows.len() / self.hidden.max(1),
                self.hidden,
                pads.len()
            )));
        }
        let mut digest = Sha256::new();
        for v in media.pixel_values.iter().chain(&media.pixel_values_videos) {
            digest.update(v.to_le_bytes());
        }
        Ok(VisionInput {
            pads,
            rows,
            positions,
            digest: digest.finalize().to_vec(),
        })
    }

    /// Backbone and head memory for a record. With the cache on and a state piece of at least
    /// one aligned block, the prompt runs as two passes, the prefix `[0, P)` and the tail
    /// `[P, T)`, whether the prefix is cached or not, so a hit computes exactly what its miss
    /// did. The slot is kept only once its prefix pass finished; its key holds the media
    /// digest, so the same text with other pixels is another prefix.
    fn run_model(
        &self,
        prepared: &Prepared,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<ModelRows, RequestError> {
        let (record, vision) = (&prepared.record, prepared.vision.as_ref());
        let fault = prepared.device_fault;
        let ids = &record.input_ids;
        let config = self.lock_cache().config();
        let cut = match config.slots {
            0 => None,
            _ => boundary(record.state_end, PREFILL_CHUNK, config.planner),
        };
        let Some(p) = cut.filter(|&p| p < ids.len()) else {
            let (hidden, _) =
                self.chunked_prefill(ids, vision, fault, 0..ids.len(), None, cancelled)?;
            let memory = self.head.memory(&hidden, ids.len());
            let cache = match config.slots {
                0 => CacheUse::Off,
                _ => CacheUse::Uncacheable,
            };
            return Ok(ModelRows {
                hidden,
                first_row: 0,
                memory,
                cache,
            });
        };
        let key = CacheKey {
            media: vision.map_or_else(Vec::new, |v| v.digest.clone()),
            ids: ids[..p].to_vec(),
        };
        let found = self.lock_cache().lookup(&key);
        let (slot, cache) = match found {
            Some(slot) => (slot, CacheUse::Hit),
            None => {
                let (hidden, state) =
                    self.chunked_prefill(ids, vision, fault, 0..p, None, cancelled)?;
                let memory = self.head.memory(&hidden, p);
                let bytes = self.backbone.state_bytes(&state) + memory.bytes();
                let slot = PrefixSlot {
                    key,
                    state,
                    memory,
                    bytes,
                };
                (self.lock_cache().insert(slot), CacheUse::Miss)
            }
        };
        let (hidden, _) = self.chunked_prefill(
            ids,
            vision,
            fault,
            p..ids.len(),
            Some(&slot.state),
            cancelled,
        )?;
        let memory = slot
            .memory
            .clone()
            .then(self.head.memory(&hidden, ids.len() - p));
        Ok(ModelRows {
            hidden,
            first_row: p,
            memory,
            cache,
        })
    }

    /// The prefill of prompt positions `range` of `ids` (at least one) in chunks of
    /// [`PREFILL_CHUNK`] tokens, the first continuing `start`, each next one the state of the
    /// one before, checking `cancelled` between chunks. Token embeddings come from the table,
    /// except at media pads, which take the vision rows; positions are the text positions, or
    /// the media prompt's M-RoPE positions. Returns the final rows `[range, hidden]` and the
    /// state after the last id.
    #[allow(clippy::too_many_arguments)]
    fn chunked_prefill(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        device_fault: bool,
        range: std::ops::Range<usize>,
        start: Option<&PrefillState<B::Tensor>>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<(Vec<f32>, PrefillState<B::Tensor>), RequestError> {
        let h = self.hidden;
        let mut state: Option<PrefillState<B::Tensor>> = None;
        let mut rows: Vec<f32> = Vec::with_capacity(range.len() * h);
        let mut from = range.start;
        while from < range.end {
            let to = (from + PREFILL_CHUNK).min(range.end);
            if cancelled() {
                return Err(cancelled_error());
            }
            if device_fault {
                return Err(fail(injected_device_fault()));
            }
            let (embedded, positions) = self.piece_input(ids, vision, from..to).map_err(fail)?;
            // The previous chunk's state is dropped right after (consumed); `start` is kept.
            let consume = state.is_some();
            let (hidden, next) = self
                .backbone
                .prefill_chunk(&embedded, &positions, state.as_ref().or(start), consume)
                .map_err(fail)?;
            rows.extend_from_slice(&hidden.data);
            state = Some(next);
            from = to;
        }
        let state = state.ok_or_else(|| RequestError::internal("prefill of an empty prompt"))?;
        Ok((rows, state))
    }

    /// The embedding rows and M-RoPE positions of prompt positions `range` of `ids`: rows from
    /// the table, except at media pads, which take the vision rows; text positions, or the
    /// media prompt's.
    fn piece_input(
        &self,
        ids: &[u32],
        vision: Option<&VisionInput>,
        range: std::ops::Range<usize>,
    ) -> Result<(HostTensor, Vec<[u32; 3]>), PrefillError> {
        let h = self.hidden;
        let (from, to) = (range.start, range.end);
        let mut embedded: HostTensor = self.backbone.embed(&ids[from..to])?;
        let positions: Vec<[u32; 3]> = match vision {
            None => Backbone::<B>::text_positions(from, to - from),
            Some(v) => {
                for (k, &at) in v.pads.iter().enumerate() {
                    if (from..to).contains(&at) {
                        let row = at - from;
                        embedded.data[row * h..(row + 1) * h]
                            .copy_from_slice(&v.rows[k * h..(k + 1) * h]);
                    }
                }
                (from..to)
                    .map(|i| [v.positions[0][i], v.positions[1][i], v.positions[2][i]])
                    .collect()
            }
        };
        Ok((embedded, positions))
    }

    /// The head's logits for an encoded record, given its final hidden rows from position
    /// `first_row` on and its memory rows.
    fn logits(
        &self,
        record: &EncodedRecord,
        hidden: &[f32],
        first_row: usize,
        memory: &HeadMemory,
    ) -> Result<Vec<Vec<f32>>, RequestError> {
        let h = self.hidden;
        let spans_start = record
            .questions
            .iter()
            .flat_map(|q| std::iter::once(q.span).chain(q.option_spans.iter().copied()))
            .map(|(s, _)| s)
            .min()
            .unwrap_or(first_row);
        if spans_start < first_row || hidden.len() / h + first_row != record.input_ids.len() {
            return Err(RequestError::internal(format!(
                "the head needs rows from {spans_start}; rows from {first_row} were kept"
            )));
        }
        let mut lexical = Vec::new();
        let mut questions = Vec::with_capacity(record.questions.len());
        for q in &record.questions {
            for &(s, e) in &q.option_spans {
                let mut mean = vec![0.0f32; h];
                let ids: Vec<usize> = record.input_ids[s..e]
                    .iter()
                    .map(|&id| id as usize)
                    .collect();
                let values = self
                    .lm_head
                    .rows_f32(&ids)
                    .map_err(|e| RequestError::internal(format!("LM head: {e}")))?;
                for row in values.chunks_exact(h) {
                    mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
                }
                let n = (e - s) as f32;
                mean.iter_mut().for_each(|m| *m /= n);
                lexical.push(mean);
            }
            questions.push(HeadQuestion {
                type_index: q.kind as usize,
                span: q.span,
                option_spans: q.option_spans.clone(),
            });
        }
        Ok(self
            .head
            .logits(hidden, first_row, memory, &questions, &lexical))
    }
}
