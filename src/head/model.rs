//! The joint schema head (the reference's code), f32 on the host.
//!
//! Attention over the memory never projects all T memory rows through K and V: with few
//! queries, K's projection is folded onto the query side (`q·(m Wₖᵀ + bₖ) = (q Wₖ)·m + const`,
//! the constant cancels in the softmax) and V's is applied after the weighted sum
//! (`Σ p (m Wᵥᵀ + bᵥ) = (Σ p m) Wᵥᵀ + bᵥ`, the weights sum to 1). The evidence layers'
//! memory LayerNorm is folded the same way (its row statistics are shared by every layer), so
//! the normalised memory is never materialised. The memory projection (T × H × W) is then the
//! only work that grows with T × width²; each attention layer streams the memory twice (scores,
//! weighted sums), `T × W × queries × heads` multiply-adds each.

use super::ops::{dot, gelu, norm2, softmax, span_mean, LayerNorm, Linear};
use crate::checkpoint::{CheckpointError, JointHeadConfig, JointHeadFiles};
use clef_device::cpu::matmul::{self, small_matmul, PackedWeight};
use clef_device::{HostWeight, WeightFormat};
use rayon::prelude::*;
use std::sync::Arc;

/// One question as the head sees it.
#[derive(Clone, Debug)]
pub struct HeadQuestion {
    /// 0 noul, 1 choice, 2 score.
    pub type_index: usize,
    pub span: (usize, usize),
    pub option_spans: Vec<(usize, usize)>,
}

/// Mean and `1/sqrt(var + eps)` of a row (LayerNorm statistics).
fn row_stats(x: &[f32]) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + super::ops::LN_EPS).sqrt())
}

/// `nn.MultiheadAttention` weights, split into Q, K, V.
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    /// K's weight `[w, w]` row-major, for folding it onto the queries.
    wk: Vec<f32>,
    out: Linear,
}

struct EvidenceLayer {
    query_norm: LayerNorm,
    memory_norm: LayerNorm,
    attention: Attention,
    ff_norm: LayerNorm,
    ff1: Linear,
    ff2: Linear,
}

struct DecoderLayer {
    self_attn: Attention,
    cross_attn: Attention,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm3: LayerNorm,
    linear1: Linear,
    linear2: Linear,
}

/// The head with its weights in f32.
pub struct JointHead {
    pub config: JointHeadConfig,
    hidden_norm: LayerNorm,
    memory_projection: FoldedMemoryProjection,
    question_projection: Linear,
    option_question_projection: Linear,
    global_projection: Linear,
    option_context_projection: Linear,
    option_lexical_projection: Linear,
    type_embedding: Vec<f32>,
    evidence: Vec<EvidenceLayer>,
    option_summary_norm: LayerNorm,
    layers: Vec<DecoderLayer>,
    field_norm: LayerNorm,
    option_norm: LayerNorm,
    scorer1: Linear,
    scorer2: Linear,
    prior_scale: f32,
    joint_scale: f32,
    gate: f32,
}

/// The head's memory rows `M = memory_projection(LN(hidden))`, `[T, W]`. Rows are
/// independent, so they may sit in pieces: a cached prefix's rows (shared with its cache slot)
/// followed by the rows computed for this request.
#[derive(Clone, Debug)]
pub struct HeadMemory {
    parts: Vec<Arc<Vec<f32>>>,
    width: usize,
    rows: usize,
}

impl HeadMemory {
    /// Rows in all pieces.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes held by the rows.
    pub fn bytes(&self) -> usize {
        self.rows * self.width * 4
    }

    /// These rows followed by `next`'s.
    pub fn then(mut self, next: HeadMemory) -> HeadMemory {
        self.rows += next.rows;
        self.parts.extend(next.parts);
        self
    }

    /// Row `r` (`r < rows`).
    fn row(&self, mut r: usize) -> &[f32] {
        for part in &self.parts {
            let n = part.len() / self.width;
            if r < n {
                return &part[r * self.width..(r + 1) * self.width];
            }
            r -= n;
        }
        &[]
    }
}

/// The memory rows laid out for the attention passes of one decision.
struct MemoryOperands {
    rows: usize,
    /// `M` as `[T out, W in]` panels: the scores of every folded query in one pass.
    keys: PackedWeight,
    /// `M` as `[W out, T in]` panels: probability-weighted sums of the rows.
    values: PackedWeight,
    /// Mean and `1/σ` of every row: the evidence layers' memory LayerNorm statistics.
    mean: Vec<f32>,
    inv: Vec<f32>,
}

impl MemoryOperands {
    fn new(mem: &HeadMemory) -> Self {
        let (rows, width) = (mem.rows, mem.width);
        let row = |r| mem.row(r);
        // Each step is parallel inside; running them side by side was measured slower.
        let keys = PackedWeight::from_f32_rows(row, rows, width);
        let values = PackedWeight::from_f32_cols(row, rows, width);
        let (mean, inv) = (0..rows).into_par_iter().map(|r| row_stats(row(r))).unzip();
        MemoryOperands {
            rows: mem.rows,
            keys,
            values,
            mean,
            inv,
        }
    }
}

/// The memory projection with the hidden LayerNorm folded in:
/// `W·LN(h) = (W diag γ)·h / σ − (μ/σ)·Wγ + Wβ`, so the `[T, H]` normalised rows are never
/// materialised.
struct FoldedMemoryProjection {
    scaled: PackedWeight,
    gamma_sum: Vec<f32>,
    beta_term: Vec<f32>,
}

impl JointHead {
    pub fn load(files: &JointHeadFiles) -> Result<Self, CheckpointError> {
        let c = files.config.clone();
        let (h, w, f) = (c.hidden_size, c.width, c.feedforward);
        let get = |name: &str| -> Result<Vec<f32>, CheckpointError> {
            let info = files
                .tensors
                .info(name)
                .ok_or_else(|| CheckpointError::Tensor {
                    file: "joint_head.safetensors".into(),
                    tensor: name.into(),
                    msg: "missing".into(),
                })?;
            Ok(files.tensors.read_f32(info, 0, info.elements()))
        };
        let ln = |name: &str| -> Result<LayerNorm, CheckpointError> {
            Ok(LayerNorm {
                weight: get(&format!("{name}.weight"))?,
                bias: get(&format!("{name}.bias"))?,
            })
        };
        let lin =
            |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear, CheckpointError> {
                let b = if bias {
                    Some(get(&format!("{name}.bias"))?)
                } else {
                    None
                };
                Ok(Linear::new(get(&format!("{name}.weight"))?, out, inp, b))
            };
        let mha = |name: &str| -> Result<Attention, CheckpointError> {
            let wi = get(&format!("{name}.in_proj_weight"))?;
            let bi = get(&format!("{name}.in_proj_bias"))?;
            let part = |i: usize| {
                Linear::new(
                    wi[i * w * w..(i + 1) * w * w].to_vec(),
                    w,
                    w,
                    Some(bi[i * w..(i + 1) * w].to_vec()),
                )
            };
            Ok(Attention {
                q: part(0),
                k: part(1),
                v: part(2),
                wk: wi[w * w..2 * w * w].to_vec(),
                out: lin(&format!("{name}.out_proj"), w, w, true)?,
            })
        };
        let scalar = |name: &str| -> Result<f32, CheckpointError> {
            get(name)?
                .first()
                .copied()
                .ok_or_else(|| CheckpointError::Tensor {
                    file: "joint_head.safetensors".into(),
                    tensor: name.into(),
                    msg: "empty scalar".into(),
                })
        };
        let evidence = (0..c.routing_layers)
            .map(|i| {
                let l = format!("evidence_layers.{i}");
                Ok(EvidenceLayer {
                    query_norm: ln(&format!("{l}.query_norm"))?,
                    memory_norm: ln(&format!("{l}.memory_norm"))?,
                    attention: mha(&format!("{l}.attention"))?,
                    ff_norm: ln(&format!("{l}.feedforward_norm"))?,
                    ff1: lin(&format!("{l}.feedforward.0"), f, w, true)?,
                    ff2: lin(&format!("{l}.feedforward.3"), w, f, true)?,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let layers = (0..c.layers)
            .map(|i| {
                let l = format!("layers.{i}");
                Ok(DecoderLayer {
                    self_attn: mha(&format!("{l}.self_attn"))?,
                    cross_attn: mha(&format!("{l}.multihead_attn"))?,
                    norm1: ln(&format!("{l}.norm1"))?,
                    norm2: ln(&format!("{l}.norm2"))?,
                    norm3: ln(&format!("{l}.norm3"))?,
                    linear1: lin(&format!("{l}.linear1"), f, w, true)?,
                    linear2: lin(&format!("{l}.linear2"), w, f, true)?,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let hidden_norm = ln("hidden_norm")?;
        let wm = get("memory_projection.weight")?;
        let mut scaled = wm.clone();
        for row in scaled.chunks_mut(h) {
            row.iter_mut()
                .zip(&hidden_norm.weight)
                .for_each(|(v, g)| *v *= g);
        }
        let memory_projection = FoldedMemoryProjection {
            scaled: PackedWeight::pack(&HostWeight::f32(w, h, scaled), WeightFormat::F32),
            gamma_sum: wm.chunks(h).map(|r| dot(r, &hidden_norm.weight)).collect(),
            beta_term: wm.chunks(h).map(|r| dot(r, &hidden_norm.bias)).collect(),
        };
        Ok(JointHead {
            hidden_norm,
            memory_projection,
            question_projection: lin("question_projection", w, h, false)?,
            option_question_projection: lin("option_question_projection", w, h, false)?,
            global_projection: lin("global_projection", w, h, false)?,
            option_context_projection: lin("option_context_projection", w, h, false)?,
            option_lexical_projection: lin("option_lexical_projection", w, h, false)?,
            type_embedding: get("type_embedding.weight")?,
            evidence,
            option_summary_norm: ln("option_summary_norm")?,
            layers,
            field_norm: ln("field_norm")?,
            option_norm: ln("option_norm")?,
            scorer1: lin("residual_scorer.0", w, 4 * w, true)?,
            scorer2: lin("residual_scorer.3", 1, w, true)?,
            prior_scale: scalar("prior_logit_scale")?,
            joint_scale: scalar("joint_logit_scale")?,
            gate: scalar("residual_gate")?,
            config: c,
        })
    }

    /// Memory rows of `rows` hidden rows (LayerNorm folded into the projection).
    pub fn memory(&self, hidden: &[f32], rows: usize) -> HeadMemory {
        let (h, width) = (self.config.hidden_size, self.config.width);
        let fold = &self.memory_projection;
        let mut memory = matmul::linear(hidden, rows, &fold.scaled);
        memory
            .par_chunks_mut(width)
            .zip(hidden.par_chunks(h))
            .for_each(|(m, x)| {
                let (mean, inv) = row_stats(x);
                for ((v, gs), b) in m.iter_mut().zip(&fold.gamma_sum).zip(&fold.beta_term) {
                    *v = *v * inv - mean * inv * gs + b;
                }
            });
        HeadMemory {
            parts: vec![Arc::new(memory)],
            width,
            rows,
        }
    }

    /// The LayerNorm'd hidden row `t` of rows starting at position `first`.
    fn normed_row(&self, hidden: &[f32], first: usize, t: usize) -> Vec<f32> {
        let h = self.config.hidden_size;
        self.hidden_norm
            .forward(&hidden[(t - first) * h..(t - first + 1) * h])
    }

    /// Mean of the LayerNorm'd hidden rows `[s, e)` of rows starting at position `first`.
    fn normed_span_mean(&self, hidden: &[f32], first: usize, (s, e): (usize, usize)) -> Vec<f32> {
        let h = self.config.hidden_size;
        span_mean(
            &self
                .hidden_norm
                .forward(&hidden[(s - first) * h..(e - first) * h]),
            h,
            0,
            e - s,
        )
    }

    /// Per-question option logits, in model option order.
    ///
    /// `lexical[o]` is the mean LM-head row over option o's span (flattened in question order).
    /// `hidden` are the backbone's final rows from position `first` to the end (only the
    /// spans and the last row are read, so rows before the first span may be left out; the
    /// caller guarantees every span starts at or after `first`).
    pub fn logits(
        &self,
        hidden: &[f32],
        first: usize,
        mem: &HeadMemory,
        questions: &[HeadQuestion],
        lexical: &[Vec<f32>],
    ) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (h, w) = (c.hidden_size, c.width);
        let t = mem.rows;
        let g = &self.normed_row(hidden, first, t - 1);
        let nq = questions.len();
        let u: Vec<f32> = questions
            .iter()
            .flat_map(|q| self.normed_span_mean(hidden, first, q.span))
            .collect();
        let owner: Vec<usize> = questions
            .iter()
            .enumerate()
            .flat_map(|(i, q)| std::iter::repeat_n(i, q.option_spans.len()))
            .collect();
        let no = owner.len();
        let ctx: Vec<f32> = questions
            .iter()
            .flat_map(|q| {
                q.option_spans
                    .iter()
                    .flat_map(|s| self.normed_span_mean(hidden, first, *s))
            })
            .collect();
        let lex: Vec<f32> = lexical.iter().flatten().copied().collect();
        // z = (context + lexical) + option_question(u of the owner).
        let mut z = self.option_context_projection.forward(&ctx, no);
        let zl = self.option_lexical_projection.forward(&lex, no);
        z.iter_mut().zip(&zl).for_each(|(a, b)| *a += b);
        let uq = self.option_question_projection.forward(&u, nq);
        for (o, &q) in owner.iter().enumerate() {
            z[o * w..(o + 1) * w]
                .iter_mut()
                .zip(&uq[q * w..(q + 1) * w])
                .for_each(|(a, b)| *a += b);
        }
        // Evidence routing.
        let operands = MemoryOperands::new(mem);
        for layer in &self.evidence {
            let a = layer.query_norm.forward(&z);
            let att = self.cross_attention(
                &layer.attention,
                &a,
                no,
                &operands,
                Some(&layer.memory_norm),
            );
            z.iter_mut().zip(&att).for_each(|(x, y)| *x += y);
            let hdn: Vec<f32> = layer
                .ff1
                .forward(&layer.ff_norm.forward(&z), no)
                .into_iter()
                .map(gelu)
                .collect();
            let ff = layer.ff2.forward(&hdn, no);
            z.iter_mut().zip(&ff).for_each(|(x, y)| *x += y);
        }
        let r = z;
        // Option summary per question.
        let b = self.question_projection.forward(&u, nq);
        let mut s = vec![0.0f32; nq * w];
        for (q, bq) in b.chunks(w).enumerate() {
            let opts: Vec<usize> = (0..no).filter(|&o| owner[o] == q).collect();
            let mut scores: Vec<f32> = opts
                .iter()
                .map(|&o| dot(&r[o * w..(o + 1) * w], bq) * c.routing_scale())
                .collect();
            softmax(&mut scores);
            for (&o, p) in opts.iter().zip(&scores) {
                s[q * w..(q + 1) * w]
                    .iter_mut()
                    .zip(&r[o * w..(o + 1) * w])
                    .for_each(|(a, v)| *a += p * v);
            }
        }
        let s_norm = self.option_summary_norm.forward(&s);
        let gp = self.global_projection.forward(g, 1);
        let mut f = b.clone();
        for (q, question) in questions.iter().enumerate() {
            let row = &mut f[q * w..(q + 1) * w];
            let te = &self.type_embedding[question.type_index * w..(question.type_index + 1) * w];
            for i in 0..w {
                row[i] = ((row[i] + s_norm[q * w + i]) + gp[i]) + te[i];
            }
        }
        // Joint decoder.
        for layer in &self.layers {
            let a = layer.norm1.forward(&f);
            let sa = self.self_attention(&layer.self_attn, &a, nq);
            f.iter_mut().zip(&sa).for_each(|(x, y)| *x += y);
            let a = layer.norm2.forward(&f);
            let ca = self.cross_attention(&layer.cross_attn, &a, nq, &operands, None);
            f.iter_mut().zip(&ca).for_each(|(x, y)| *x += y);
            let hdn: Vec<f32> = layer
                .linear1
                .forward(&layer.norm3.forward(&f), nq)
                .into_iter()
                .map(gelu)
                .collect();
            let ff = layer.linear2.forward(&hdn, nq);
            f.iter_mut().zip(&ff).for_each(|(x, y)| *x += y);
        }
        let fields = self.field_norm.forward(&f);
        // Scoring.
        let ln100 = 100f32.ln();
        let prior_scale = self.prior_scale.min(ln100).exp();
        let joint_scale = self.joint_scale.min(ln100).exp();
        let gate = 1.0 / (1.0 + (-self.gate).exp());
        let v = self.option_norm.forward(&r);
        let mut pairs = vec![0.0f32; no * 4 * w];
        for o in 0..no {
            let fq = &fields[owner[o] * w..(owner[o] + 1) * w];
            let vo = &v[o * w..(o + 1) * w];
            let row = &mut pairs[o * 4 * w..(o + 1) * 4 * w];
            for i in 0..w {
                row[i] = fq[i];
                row[w + i] = vo[i];
                row[2 * w + i] = fq[i] * vo[i];
                row[3 * w + i] = (fq[i] - vo[i]).abs();
            }
        }
        let hidden: Vec<f32> = self
            .scorer1
            .forward(&pairs, no)
            .into_iter()
            .map(gelu)
            .collect();
        let residual = self.scorer2.forward(&hidden, no);
        let mut out: Vec<Vec<f32>> = questions.iter().map(|_| Vec::new()).collect();
        for o in 0..no {
            let q = owner[o];
            let mut anchor: Vec<f32> = u[q * h..(q + 1) * h]
                .iter()
                .zip(g)
                .map(|(a, b)| a + b)
                .collect();
            let an = norm2(&anchor).max(1e-12);
            anchor.iter_mut().for_each(|a| *a /= an);
            let lo = &lexical[o];
            let ln = norm2(lo).max(1e-12);
            let prior = prior_scale * lo.iter().zip(&anchor).map(|(l, a)| l / ln * a).sum::<f32>();
            let fq = &fields[q * w..(q + 1) * w];
            let vo = &v[o * w..(o + 1) * w];
            let (nf, nv) = (norm2(fq).max(1e-8), norm2(vo).max(1e-8));
            let cos: f32 = fq.iter().zip(vo).map(|(a, b)| (a / nf) * (b / nv)).sum();
            let joint = joint_scale * cos + residual[o];
            out[q].push(prior + gate * joint);
        }
        out
    }

    /// Multi-head attention of `nq` queries over the memory rows, K and V folded (see the
    /// module comment). With `norm`, the keys and values are `norm(M)`, folded too: scores
    /// `LN(m)·k = (m·(γ∘k) − μ Σγ∘k)/σ + β·k` (the last term cancels in the softmax) and
    /// weighted sums `Σ p LN(m) = γ∘(Σ (p/σ) m − Σ (p/σ) μ) + β`.
    fn cross_attention(
        &self,
        att: &Attention,
        a: &[f32],
        nq: usize,
        mem: &MemoryOperands,
        norm: Option<&LayerNorm>,
    ) -> Vec<f32> {
        let c = &self.config;
        let (w, heads, d) = (c.width, c.heads, c.head_dim());
        let (t, scale) = (mem.rows, c.attention_scale());
        // q = a Wqᵀ + bq, [nq, w].
        let q = att.q.forward(a, nq);
        // Folded keys: qk[(i, h)] = q_ih · Wk_h, a [w] vector per query and head.
        let pairs = nq * heads;
        let mut qk = vec![0.0f32; pairs * w];
        for hh in 0..heads {
            let mut block = vec![0.0f32; nq * w];
            // [nq, d] (head hh of every query) · Wk rows [hh*d, (hh+1)*d) as [d, w].
            small_matmul(
                nq,
                w,
                d,
                &mut block,
                false,
                &q[hh * d..],
                w,
                1,
                &att.wk[hh * d * w..],
                w,
                1,
            );
            for i in 0..nq {
                qk[(i * heads + hh) * w..(i * heads + hh + 1) * w]
                    .copy_from_slice(&block[i * w..(i + 1) * w]);
            }
        }
        // With a norm: qk ← γ∘qk, and Σγ∘qk per pair for the mean term.
        let gamma_sums: Vec<f32> = match norm {
            Some(ln) => qk
                .chunks_mut(w)
                .map(|row| {
                    row.iter_mut().zip(&ln.weight).for_each(|(v, g)| *v *= g);
                    row.iter().sum()
                })
                .collect(),
            None => vec![0.0; pairs],
        };
        // Scores [pairs, t] in one pass over the memory, then a softmax per (query, head); with
        // a norm the weights absorb 1/σ and `mean_terms` collects Σ (p/σ) μ.
        let mut probs = matmul::linear(&qk, pairs, &mem.keys);
        let mut mean_terms = vec![0.0f32; pairs];
        probs
            .par_chunks_mut(t)
            .zip(&gamma_sums)
            .zip(&mut mean_terms)
            .for_each(|((row, &gamma_sum), mean_term)| {
                if norm.is_some() {
                    for ((v, &mu), &inv) in row.iter_mut().zip(&mem.mean).zip(&mem.inv) {
                        *v = inv * (*v - mu * gamma_sum) * scale;
                    }
                } else {
                    row.iter_mut().for_each(|v| *v *= scale);
                }
                softmax(row);
                if norm.is_some() {
                    let mut sum = 0.0f32;
                    for ((p, &mu), &inv) in row.iter_mut().zip(&mem.mean).zip(&mem.inv) {
                        *p *= inv;
                        sum += *p * mu;
                    }
                    *mean_term = sum;
                }
            });
        // Weighted memory per pair: [pairs, w] = probs · M.
        let mut mixed = matmul::linear(&probs, pairs, &mem.values);
        if let Some(ln) = norm {
            mixed
                .par_chunks_mut(w)
                .zip(&mean_terms)
                .for_each(|(row, &mean_term)| {
                    for ((v, g), b) in row.iter_mut().zip(&ln.weight).zip(&ln.bias) {
                        *v = g * (*v - mean_term) + b;
                    }
                });
        }
        // V after the weighted sum: every pair through all of Wv, then each pair keeps its
        // head's columns (16x the needed FLOPs, but one packed matmul of a few hundred rows).
        let values = att.v.forward(&mixed, pairs);
        let mut heads_out = vec![0.0f32; nq * w];
        for i in 0..nq {
            for hh in 0..heads {
                let src =
                    &values[(i * heads + hh) * w + hh * d..(i * heads + hh) * w + (hh + 1) * d];
                heads_out[i * w + hh * d..i * w + (hh + 1) * d].copy_from_slice(src);
            }
        }
        att.out.forward(&heads_out, nq)
    }

    /// Plain multi-head self-attention over `n` rows (the fields), no mask.
    fn self_attention(&self, att: &Attention, a: &[f32], n: usize) -> Vec<f32> {
        let c = &self.config;
        let (w, heads, d) = (c.width, c.heads, c.head_dim());
        let scale = c.attention_scale();
        let q = att.q.forward(a, n);
        let k = att.k.forward(a, n);
        let v = att.v.forward(a, n);
        let mut out = vec![0.0f32; n * w];
        for hh in 0..heads {
            for i in 0..n {
                let qi = &q[i * w + hh * d..i * w + (hh + 1) * d];
                let mut s: Vec<f32> = (0..n)
                    .map(|j| dot(qi, &k[j * w + hh * d..j * w + (hh + 1) * d]) * scale)
                    .collect();
                softmax(&mut s);
                let dst = &mut out[i * w + hh * d..i * w + (hh + 1) * d];
                for (j, p) in s.iter().enumerate() {
                    dst.iter_mut()
                        .zip(&v[j * w + hh * d..j * w + (hh + 1) * d])
                        .for_each(|(o, x)| *o += p * x);
                }
            }
        }
        att.out.forward(&out, n)
    }
}
