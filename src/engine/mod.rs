//! The decision pipeline of one worker: a validated request → encoded record → backbone
//! prefill on the mesh → joint head on the host → the reference's response.
//! `worker` runs pipelines on worker threads behind a bounded queue.

pub mod worker;

use crate::api::{parse_body, validate, ApiError, HostLimits, SystemOneRequest};
use crate::backbone::{Backbone, LoadError};
use crate::checkpoint::{Checkpoint, CheckpointError, RowTable};
use crate::encode::{encode, EncodeError, EncodedRecord, LengthRule};
use crate::head::answer::{answer, probabilities};
use crate::head::{HeadQuestion, JointHead};
use clef_device::{HostTensor, MeshOps, WeightFormat};
use serde_json::{json, Map, Value};
use std::time::Instant;

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
}

/// Everything one worker needs to answer requests.
pub struct Pipeline<B: MeshOps> {
    pub backbone: Backbone<B>,
    pub head: JointHead,
    tokenizer: tokenizers::Tokenizer,
    lm_head: RowTable,
    hidden: usize,
}

impl<B: MeshOps> Pipeline<B> {
    pub fn new(ckpt: &Checkpoint, mesh: B, format: WeightFormat) -> Result<Self, PipelineError> {
        let head_files = ckpt.head.as_ref().ok_or_else(|| CheckpointError::Config {
            file: ckpt
                .dir
                .join("joint_head_config.json")
                .display()
                .to_string(),
            msg: "no joint head".into(),
        })?;
        let head = JointHead::load(head_files)?;
        Ok(Pipeline {
            backbone: Backbone::load(ckpt, mesh, format)?,
            head,
            tokenizer: ckpt.tokenizer()?,
            lm_head: ckpt.lm_head()?,
            hidden: ckpt.config.text.hidden_size,
        })
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
    ) -> Result<Decision, ApiError> {
        let value = parse_body(body)?;
        let req = validate(&value, limits)?;
        self.decide(&req, rule)
    }

    /// Encode a validated request under `rule` and answer it.
    pub fn decide(&self, req: &SystemOneRequest, rule: LengthRule) -> Result<Decision, ApiError> {
        self.decide_cancellable(req, rule, &|| false)
    }

    /// [`Pipeline::decide`], giving up between prefill chunks once `cancelled()` is true.
    pub fn decide_cancellable(
        &self,
        req: &SystemOneRequest,
        rule: LengthRule,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Decision, ApiError> {
        if req.has_media {
            return Err(ApiError::invalid(
                &["images"],
                "images and videos are not supported by this server yet",
                "value_error",
            ));
        }
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
        let record = encode(&self.tokenizer, req, &[], rule).map_err(|e| match e {
            EncodeError::Api(a) => a,
            EncodeError::Tokenizer(m) => ApiError::internal(format!("tokenizer: {m}")),
        })?;
        let started = Instant::now();
        let hidden = self.chunked_prefill(&record.input_ids, cancelled)?;
        let memory = self.head.memory(&hidden.data, hidden.rows);
        let logits = self.logits(&record, &hidden.data, &memory)?;
        let model_seconds = started.elapsed().as_secs_f64();
        let probabilities: Vec<Vec<f32>> = logits.iter().map(|l| probabilities(l)).collect();
        let mut answers = Map::new();
        for ((q, enc), probs) in req
            .questions
            .iter()
            .zip(&record.questions)
            .zip(&probabilities)
        {
            answers.insert(q.id.clone(), answer(q, enc, probs));
        }
        let mut response = json!({
            "model": req.model,
            "answers": Value::Object(answers),
            "usage": {"input_tokens": record.input_ids.len(), "output_tokens": 0},
        });
        // The reference cuts silently; the server says so.
        if record.truncated && matches!(rule, LengthRule::Server { .. }) {
            response["truncated"] = Value::Bool(true);
        }
        Ok(Decision {
            response,
            record,
            logits,
            probabilities,
            model_seconds,
        })
    }

    /// The prefill in chunks of [`PREFILL_CHUNK`] tokens, each continuing the state of the one
    /// before, checking `cancelled` between chunks.
    fn chunked_prefill(
        &self,
        ids: &[u32],
        cancelled: &dyn Fn() -> bool,
    ) -> Result<HostTensor, ApiError> {
        let fail = |e: crate::backbone::PrefillError| ApiError::internal(format!("prefill: {e}"));
        let mut state = None;
        let mut rows: Vec<f32> = Vec::with_capacity(ids.len() * self.hidden);
        for chunk in ids.chunks(PREFILL_CHUNK) {
            if cancelled() {
                return Err(ApiError {
                    status: 499,
                    loc: vec![],
                    msg: "the client closed the request".into(),
                    kind: "cancelled".into(),
                });
            }
            let (hidden, next) = self.backbone.prefill(chunk, state.as_ref()).map_err(fail)?;
            rows.extend_from_slice(&hidden.data);
            state = Some(next);
        }
        Ok(HostTensor::new(ids.len(), self.hidden, rows))
    }

    /// The head's logits for an encoded record, given its memory rows.
    pub fn logits(
        &self,
        record: &EncodedRecord,
        hidden: &[f32],
        memory: &crate::head::HeadMemory,
    ) -> Result<Vec<Vec<f32>>, ApiError> {
        let h = self.hidden;
        let mut lexical = Vec::new();
        let mut questions = Vec::with_capacity(record.questions.len());
        for q in &record.questions {
            for &(s, e) in &q.option_spans {
                let mut mean = vec![0.0f32; h];
                for &id in &record.input_ids[s..e] {
                    let values = self.lm_head.row_f32(id as usize).ok_or_else(|| {
                        ApiError::internal(format!("token id {id} is outside the LM head"))
                    })?;
                    mean.iter_mut().zip(&values).for_each(|(m, v)| *m += v);
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
        Ok(self.head.logits(hidden, memory, &questions, &lexical))
    }
}
