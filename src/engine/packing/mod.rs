//! Packed prefill passes: several short requests a worker took together run through the
//! backbone as one pass, so every weight is read once for all of them, and each request's
//! answer is exactly what it would have been alone. The pass is one of row segments on a mesh
//! that packs rows (`Backbone::prefill_segments`: the CPU), or a batch of whole prompts in
//! padded blocks on one that runs batched layer ops (`Backbone::prefill_batched`: ttnn); a mesh
//! that refuses a batch for the model's shapes runs the pack's requests one by one.
//!
//! A worker hands [`Pipeline::decide_pack`] the jobs it took. Each is prepared on its own
//! (validation, media, vision tower, encoding: a failure there answers that request and it
//! never enters a pass). Requests are then grouped in arrival order into packs of at most
//! `budget` prompt tokens (in a batched pass, rows of the padded blocks); one longer than the
//! budget, or with a piece longer than a prefill chunk, runs alone, chunked as always (in a
//! batched form, right after the pack open when it arrived, so that it does not split that
//! pack).
//!
//! A request runs as the same pieces it runs alone (`Pipeline::run_model`): the whole prompt,
//! or with the prefix cache on, the prefix `[0, P)` and the tail `[P, T)`. A pack runs in two
//! rounds: the first pass holds every whole prompt, every hit's tail (from its cached state)
//! and every miss's prefix; the second holds the misses' tails, each from the slot its prefix
//! just filled. A request whose prefix another request of the pack is computing waits for the
//! second round and is then a hit, as it would be right after that request alone. A batched
//! pass holds whole prompts, or tails that all continue one slot: there the first round holds
//! the whole prompts and the misses, each miss as its whole prompt keeping its prefix's state
//! (`RowBatch::keep`) for the cache (its head reads the prefix's rows as the slot's memory and
//! the rest as its tail, as alone); the second round is a pass per slot of the hits and the
//! requests that waited for a prefix (one request alone runs as alone). The head
//! runs per request on its own rows, the requests of a pass side by side (on the host, for
//! every mesh), as does their preparation on a mesh that packs rows. A failed pass fails only
//! the requests in it, each with the error it would have had alone; a request whose client
//! left is answered between rounds.

mod passes;

use super::prefix_cache::{boundary, CacheKey, CacheUse, PrefixSlot};
use super::{cancelled_error, Decision, ModelRows, Pipeline, Prepared, PREFILL_CHUNK};
use crate::backbone::PrefillState;
use crate::encode::LengthRule;
use crate::request::{RequestError, SystemOneRequest};
use clef_device::{HostTensor, MeshOps};
use rayon::prelude::*;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

type Slot<B> = Arc<PrefixSlot<PrefillState<<B as MeshOps>::Tensor>, crate::head::HeadMemory>>;
type State<B> = PrefillState<<B as MeshOps>::Tensor>;
/// One piece's member, final rows and state (none from a batched pass).
type PieceRows<B> = (usize, Vec<f32>, Option<State<B>>);
/// A pass's final rows (all pieces in order), each piece's state, and whether the pieces
/// shared one pass (not when the mesh refused the batch and ran them one by one).
type PiecesRows<B> = (HostTensor, Vec<Option<State<B>>>, bool);

/// How this pipeline's mesh packs requests.
#[derive(Clone, Copy)]
enum PackForm {
    Off,
    /// Row segments of any length in one pass (`MeshOps::packs_rows`: the CPU).
    Segments,
    /// A batch of at most this many whole prompts, text or media (`MeshOps::batch_limit`:
    /// ttnn).
    Batch(usize),
}

impl PackForm {
    fn max_requests(self) -> usize {
        match self {
            PackForm::Batch(n) => n,
            _ => usize::MAX,
        }
    }
}

/// How a packed request's prompt is computed, as `run_model` would compute it alone.
enum Plan<B: MeshOps> {
    /// One piece `[0, T)` (cache off, or a state too short to cache).
    Whole(CacheUse),
    /// A cached prefix: the tail `[P, T)` from the slot.
    Hit(Slot<B>, usize),
    /// The prefix `[0, P)` in the first round (then cached), the tail in the second.
    Miss(CacheKey, usize),
    /// The prefix another request of the pack computes in the first round: the tail in the
    /// second, from that slot.
    After(CacheKey, usize),
}

/// One request of a pack, between rounds.
struct Member<B: MeshOps> {
    job: usize,
    prepared: Prepared,
    plan: Plan<B>,
    /// The slot of a miss's prefix, once its first round ran.
    slot: Option<Slot<B>>,
    /// Requests in the largest pass it ran in.
    pass_requests: usize,
}

/// A member's final rows from its last pass, ready for the head.
struct Ready<B: MeshOps> {
    member: usize,
    hidden: Vec<f32>,
    /// The prompt position of the first row.
    first_row: usize,
    cache: CacheUse,
    /// The cached prefix the rows continue (its head memory comes first).
    prefix: Option<Slot<B>>,
}

/// One request's rows in one pass, continuing the state of a cached prefix (or none).
struct Piece<B: MeshOps> {
    member: usize,
    range: Range<usize>,
    start: Option<Slot<B>>,
    /// In a batched pass, a whole prompt keeping the state of its first rows.
    keep: Option<usize>,
}

/// A member's round-2 piece: its first row and the slot it continues (a miss's or a waiting
/// request's slot; in a batch, a hit's).
fn round_two<B: MeshOps>(m: &Member<B>, batched: bool) -> Option<(usize, Slot<B>)> {
    match (&m.slot, &m.plan) {
        (Some(slot), Plan::Miss(_, p) | Plan::After(_, p)) => Some((*p, slot.clone())),
        (_, Plan::Hit(slot, p)) if batched => Some((*p, slot.clone())),
        _ => None,
    }
}

/// The prefix-cache key of a request's first `p` tokens.
fn cache_key(prepared: &Prepared, p: usize) -> CacheKey {
    CacheKey {
        media: prepared
            .vision
            .as_ref()
            .map_or_else(Vec::new, |v| v.digest.clone()),
        ids: prepared.record.input_ids[..p].to_vec(),
    }
}

impl<B: MeshOps> Pipeline<B> {
    /// Answer `jobs` (in arrival order), packing short ones into shared prefill passes of at
    /// most `budget` prompt tokens. `cancelled(i)`: job `i`'s client left (also each pass's
    /// progress mark). `done(i, answer)` is called exactly once per job, as soon as its answer
    /// is ready.
    pub fn decide_pack(
        &self,
        jobs: &[(&SystemOneRequest, LengthRule)],
        budget: usize,
        cancelled: &dyn Fn(usize) -> bool,
        done: &mut dyn FnMut(usize, Result<Decision, RequestError>),
    ) {
        let form = self.pack_form();
        // Groups in arrival order: a pack (several jobs) or a job alone.
        let mut groups: Vec<Vec<(usize, Prepared)>> = Vec::new();
        let mut open: Vec<(usize, Prepared)> = Vec::new();
        // In a batch form, requests that run alone arriving while a pack is open: they run
        // right after that pack, so the short requests behind them still join it.
        let mut after_open: Vec<Vec<(usize, Prepared)>> = Vec::new();
        let mut open_tokens = 0;
        for (i, prepared) in self.prepare_all(jobs, cancelled) {
            let prepared = match prepared {
                Ok(p) => p,
                Err(e) => {
                    done(i, Err(e));
                    continue;
                }
            };
            let t = prepared.record.input_ids.len();
            let packable = match form {
                PackForm::Off => false,
                PackForm::Segments => true,
                // A batched pass takes whole prompts (a miss keeping its prefix's state) or
                // the tails of hits of one slot, each within a chunk.
                PackForm::Batch(_) => {
                    t <= PREFILL_CHUNK && self.cut(&prepared).is_none_or(|p| p % 32 == 0)
                }
            };
            if !packable || t > budget || !self.fits_one_pass(&prepared) {
                if matches!(form, PackForm::Batch(_)) && !open.is_empty() {
                    after_open.push(vec![(i, prepared)]);
                    continue;
                }
                groups.extend((!open.is_empty()).then(|| std::mem::take(&mut open)));
                open_tokens = 0;
                groups.push(vec![(i, prepared)]);
                continue;
            }
            // The pass's rows: its prompts, or in a batch their padded blocks.
            let over = match form {
                PackForm::Batch(_) => {
                    let mut lengths: Vec<usize> =
                        open.iter().map(|(_, p)| p.record.input_ids.len()).collect();
                    lengths.push(t);
                    self.backbone.batch_rows(&lengths) > budget
                }
                _ => open_tokens + t > budget,
            };
            if over || open.len() >= form.max_requests() {
                groups.extend((!open.is_empty()).then(|| std::mem::take(&mut open)));
                groups.append(&mut after_open);
                open_tokens = 0;
            }
            open_tokens += t;
            open.push((i, prepared));
        }
        groups.extend((!open.is_empty()).then_some(open));
        groups.append(&mut after_open);
        for group in groups {
            if group.len() == 1 {
                for (i, prepared) in group {
                    let (req, _) = jobs[i];
                    let rows = self.run_model(&prepared, &|| cancelled(i));
                    done(i, rows.and_then(|rows| self.finish(req, prepared, rows, 1)));
                }
            } else {
                self.run_pack(jobs, group, cancelled, done);
            }
        }
    }

    /// Every job prepared (validation, media, vision tower, encoding), in order. On a mesh that
    /// packs rows (the CPU) the jobs are prepared side by side; elsewhere one after another,
    /// each start a progress mark (a vision tower runs on the device there), and a job whose
    /// client left is not prepared.
    fn prepare_all(
        &self,
        jobs: &[(&SystemOneRequest, LengthRule)],
        cancelled: &dyn Fn(usize) -> bool,
    ) -> Vec<(usize, Result<Prepared, RequestError>)> {
        if self.backbone.mesh().packs_rows() {
            let live: Vec<bool> = (0..jobs.len()).map(|i| !cancelled(i)).collect();
            return jobs
                .par_iter()
                .zip(live)
                .enumerate()
                .map(|(i, (&(req, rule), live))| match live {
                    true => (i, self.prepare(req, rule)),
                    false => (i, Err(cancelled_error())),
                })
                .collect();
        }
        let each = |(i, &(req, rule)): (usize, &(&SystemOneRequest, LengthRule))| match cancelled(i)
        {
            true => (i, Err(cancelled_error())),
            false => (i, self.prepare(req, rule)),
        };
        jobs.iter().enumerate().map(each).collect()
    }

    /// Whether this pipeline packs requests at all (its mesh packs row segments or runs
    /// batched passes, and has not refused a batch for this model's shapes).
    pub fn packs(&self) -> bool {
        !matches!(self.pack_form(), PackForm::Off)
    }

    fn pack_form(&self) -> PackForm {
        if self.backbone.mesh().packs_rows() {
            return PackForm::Segments;
        }
        match self.backbone.batch_limit() {
            n if n >= 2 && !self.batch_refused.load(Ordering::Relaxed) => PackForm::Batch(n),
            _ => PackForm::Off,
        }
    }

    /// Whether every piece of the request's prompt fits one prefill pass (a chunk).
    fn fits_one_pass(&self, prepared: &Prepared) -> bool {
        let t = prepared.record.input_ids.len();
        match self.cut(prepared) {
            Some(p) => p <= PREFILL_CHUNK && t - p <= PREFILL_CHUNK,
            None => t <= PREFILL_CHUNK,
        }
    }

    /// The prefix length `run_model` would cache for this request (`None`: one piece).
    fn cut(&self, prepared: &Prepared) -> Option<usize> {
        let config = self.lock_cache().config();
        let t = prepared.record.input_ids.len();
        match config.slots {
            0 => None,
            _ => boundary(prepared.record.state_end, PREFILL_CHUNK, config.planner),
        }
        .filter(|&p| p < t)
    }

    /// The two rounds of one pack (see the module header).
    fn run_pack(
        &self,
        jobs: &[(&SystemOneRequest, LengthRule)],
        group: Vec<(usize, Prepared)>,
        cancelled: &dyn Fn(usize) -> bool,
        done: &mut dyn FnMut(usize, Result<Decision, RequestError>),
    ) {
        let slots_on = self.lock_cache().config().slots > 0;
        let batched = matches!(self.pack_form(), PackForm::Batch(_));
        let mut members: Vec<Member<B>> = Vec::with_capacity(group.len());
        let mut computing: Vec<CacheKey> = Vec::new();
        for (job, prepared) in group {
            let plan = match self.cut(&prepared) {
                None => Plan::Whole(if slots_on {
                    CacheUse::Uncacheable
                } else {
                    CacheUse::Off
                }),
                Some(p) => {
                    let key = cache_key(&prepared, p);
                    if computing.contains(&key) {
                        Plan::After(key, p)
                    } else {
                        match self.lock_cache().lookup(&key) {
                            Some(slot) => Plan::Hit(slot, p),
                            None => {
                                computing.push(key.clone());
                                Plan::Miss(key, p)
                            }
                        }
                    }
                }
            };
            members.push(Member {
                job,
                prepared,
                plan,
                slot: None,
                pass_requests: 1,
            });
        }
        let mut live: Vec<Option<Member<B>>> = members.into_iter().map(Some).collect();
        let mut alone = Vec::new();

        // Round 1: whole prompts, hits' tails, misses' prefixes (in a batch: whole prompts and
        // misses, whole; the hits wait for round 2).
        let pieces: Vec<Piece<B>> = live
            .iter()
            .enumerate()
            .filter_map(|(k, m)| {
                let m = m.as_ref()?;
                let t = m.prepared.record.input_ids.len();
                match &m.plan {
                    Plan::Whole(_) => Some((k, 0..t, None, None)),
                    Plan::Hit(..) if batched => None,
                    Plan::Hit(slot, p) => Some((k, *p..t, Some(slot.clone()), None)),
                    Plan::Miss(_, p) if batched => Some((k, 0..t, None, Some(*p))),
                    Plan::Miss(_, p) => Some((k, 0..*p, None, None)),
                    Plan::After(..) => None,
                }
            })
            .map(|(member, range, start, keep)| Piece {
                member,
                range,
                start,
                keep,
            })
            .collect();
        let outcome = self.pack_pass(&mut live, pieces, cancelled, done);
        let mut ready = Vec::new();
        for (k, mut hidden, state) in outcome {
            let Some(m) = live[k].as_mut() else {
                continue;
            };
            match &m.plan {
                Plan::Whole(cache) => ready.push(Ready {
                    member: k,
                    hidden,
                    first_row: 0,
                    cache: *cache,
                    prefix: None,
                }),
                Plan::Hit(slot, p) => ready.push(Ready {
                    member: k,
                    hidden,
                    first_row: *p,
                    cache: CacheUse::Hit,
                    prefix: Some(slot.clone()),
                }),
                Plan::Miss(key, p) => {
                    let Some(state) = state else {
                        // Not reachable: every miss's pass keeps its prefix's state.
                        if let Some(m) = live[k].take() {
                            let e = RequestError::internal("a pass left no state to cache");
                            done(m.job, Err(e));
                        }
                        continue;
                    };
                    // In a batch the rows are the whole prompt's: the tail's are answered now.
                    let tail = batched.then(|| hidden.split_off(*p * self.hidden));
                    let memory = self.head.memory(&hidden, *p);
                    let bytes = self.backbone.state_bytes(&state) + memory.bytes();
                    let slot = PrefixSlot {
                        key: key.clone(),
                        state,
                        memory,
                        bytes,
                    };
                    let slot = self.lock_cache().insert(slot);
                    match tail {
                        Some(hidden) => ready.push(Ready {
                            member: k,
                            hidden,
                            first_row: *p,
                            cache: CacheUse::Miss,
                            prefix: Some(slot),
                        }),
                        None => m.slot = Some(slot),
                    }
                }
                Plan::After(..) => {}
            }
        }
        self.answer(jobs, &mut live, ready, done);

        // Round 2: the misses' tails and the requests that waited for their prefixes (in a
        // batch: the hits and those requests, a pass per slot).
        for m in live.iter_mut().flatten() {
            if let Plan::After(key, _) = &m.plan {
                m.slot = self.lock_cache().lookup(key);
            }
        }
        for m in live.iter_mut() {
            if matches!(
                m,
                Some(Member {
                    plan: Plan::After(..),
                    slot: None,
                    ..
                })
            ) {
                // Its prefix was not kept (the cache's byte cap): it runs alone, a miss.
                alone.extend(m.take());
            }
        }
        let pieces: Vec<Piece<B>> = live
            .iter()
            .enumerate()
            .filter_map(|(k, m)| {
                let m = m.as_ref()?;
                let t = m.prepared.record.input_ids.len();
                let (p, slot) = round_two(m, batched)?;
                Some(Piece {
                    member: k,
                    range: p..t,
                    start: Some(slot),
                    keep: None,
                })
            })
            .collect();
        // A batch continues one state: a pass per slot, in order of first appearance.
        let mut passes: Vec<Vec<Piece<B>>> = Vec::new();
        for piece in pieces {
            let same = |pass: &&mut Vec<Piece<B>>| match (&pass[0].start, &piece.start) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            match passes.iter_mut().find(|pass| batched && same(pass)) {
                Some(pass) => pass.push(piece),
                None => passes.push(vec![piece]),
            }
        }
        if !batched && passes.len() > 1 {
            // Row segments continue any mix of states: one pass.
            let all = passes.into_iter().flatten().collect();
            passes = vec![all];
        }
        for pieces in passes {
            let outcome = self.pack_pass(&mut live, pieces, cancelled, done);
            let mut ready = Vec::new();
            for (k, hidden, _) in outcome {
                let Some(m) = live[k].as_ref() else {
                    continue;
                };
                let Some((p, slot)) = round_two(m, batched) else {
                    continue;
                };
                ready.push(Ready {
                    member: k,
                    hidden,
                    first_row: p,
                    cache: match m.plan {
                        Plan::Miss(..) => CacheUse::Miss,
                        _ => CacheUse::Hit,
                    },
                    prefix: Some(slot),
                });
            }
            self.answer(jobs, &mut live, ready, done);
        }
        for m in live.into_iter().flatten() {
            // Not reachable: every member was answered in a round or left as `alone`.
            done(
                m.job,
                Err(RequestError::internal(
                    "a packed request was left unanswered",
                )),
            );
        }
        for m in alone {
            let (req, _) = jobs[m.job];
            let rows = self.run_model(&m.prepared, &|| cancelled(m.job));
            done(
                m.job,
                rows.and_then(|rows| self.finish(req, m.prepared, rows, 1)),
            );
        }
    }

    /// The head and the answer of every member in `ready`, side by side (the head runs on the
    /// host for every mesh), each then handed to `done` in order. A member whose answer
    /// panicked (an injected fault) is left unanswered, its panic raised again once the
    /// others are answered: the worker fails that request alone.
    fn answer(
        &self,
        jobs: &[(&SystemOneRequest, LengthRule)],
        live: &mut [Option<Member<B>>],
        ready: Vec<Ready<B>>,
        done: &mut dyn FnMut(usize, Result<Decision, RequestError>),
    ) {
        let taken: Vec<(Member<B>, Ready<B>)> = ready
            .into_iter()
            .filter_map(|r| Some((live[r.member].take()?, r)))
            .collect();
        let answers: Vec<_> = taken
            .into_par_iter()
            .map(|(m, r)| {
                let t = m.prepared.record.input_ids.len();
                let job = m.job;
                let answer = catch_unwind(AssertUnwindSafe(|| {
                    let tail = self.head.memory(&r.hidden, t - r.first_row);
                    let rows = ModelRows {
                        memory: match &r.prefix {
                            Some(slot) => slot.memory.clone().then(tail),
                            None => tail,
                        },
                        hidden: r.hidden,
                        first_row: r.first_row,
                        cache: r.cache,
                    };
                    self.finish(jobs[job].0, m.prepared, rows, m.pass_requests)
                }));
                (job, answer)
            })
            .collect();
        let mut panicked = None;
        for (job, answer) in answers {
            match answer {
                Ok(a) => done(job, a),
                Err(p) => panicked = panicked.or(Some(p)),
            }
        }
        if let Some(p) = panicked {
            resume_unwind(p);
        }
    }
}
