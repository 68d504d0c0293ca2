//! Workers and the bounded queue. Each worker is an OS thread that owns one pipeline (one mesh)
//! and takes jobs from a queue of fixed capacity; a full queue refuses at once (the caller
//! answers 429). With packing on ([`Packing`]) a worker takes every queued job up to a count
//! at once and the pipeline packs the short ones into shared prefill passes (`packing.rs`). A job whose client has gone before its turn is dropped unstarted, and one
//! running stops at the next prefill chunk boundary. A request that panics is answered with a
//! 500 and its worker is replaced (a new thread on the same weights, prefix cache cleared). A
//! worker whose device stops answering is found by the device deadline (`deadline.rs`): the
//! engine then refuses everything with a 503. The blocking model work never runs on the async
//! runtime's threads.

use super::deadline::DeviceDeadline;
use super::prefix_cache::PrefixCacheStats;
use super::{Decision, Pipeline, CANCELLED};
use crate::encode::LengthRule;
use crate::request::{RequestError, SystemOneRequest};
use clef_device::{MeshOps, RuntimeCalls};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// One request waiting for a worker.
pub struct Job {
    /// The request's id, for the worker's log lines.
    pub id: String,
    pub request: SystemOneRequest,
    pub rule: LengthRule,
    pub reply: oneshot::Sender<Result<Decision, RequestError>>,
}

/// Counters the server reports.
#[derive(Default, Debug)]
pub struct EngineStats {
    /// Jobs in the queue, not yet taken by a worker.
    pub queued: AtomicUsize,
    /// Jobs a worker is running.
    pub running: AtomicUsize,
    /// Workers that finished their warm-up.
    pub ready: AtomicUsize,
    /// Jobs dropped because their client went away before their turn.
    pub abandoned: AtomicU64,
    /// Prompt tokens run through the model.
    pub tokens: AtomicU64,
    /// Jobs that panicked inside a worker (each one replaced its worker).
    pub panics: AtomicU64,
    /// Running jobs stopped between prefill chunks because their client left.
    pub cancelled: AtomicU64,
    /// Jobs answered from a prefill pass shared with other jobs (a packed pass).
    pub packed: AtomicU64,
    /// The workers' prefix caches.
    pub prefix_cache: Arc<PrefixCacheStats>,
    /// Each worker's device usage as it was after its last request (`MeshOps::usage`; read
    /// here, never from the mesh, so no reader waits on a device call).
    pub device_usage: Mutex<Vec<Option<clef_device::DeviceUsage>>>,
    /// Each worker's whole passes (traced or eager) as they were after its last request.
    pub passes: Mutex<Vec<Option<clef_device::PassStats>>>,
}

/// The queue front: submit jobs, read the counters.
pub struct Engine {
    tx: mpsc::Sender<Job>,
    pub stats: Arc<EngineStats>,
    pub workers: usize,
    pub capacity: usize,
    /// The device deadline and, once a worker missed it, why.
    pub deadline: Arc<DeviceDeadline>,
    /// How the workers pack jobs: as asked, or off where the mesh cannot.
    pub packing: Packing,
}

/// How workers pack queued jobs into shared prefill passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Prompt tokens of one packed pass (`CLEF_PACK_TOKENS`); 0 turns packing off.
    pub tokens: usize,
    /// Most jobs a worker takes at once.
    pub max_jobs: usize,
    /// How long a worker that took a job waits for more before it starts (`CLEF_PACK_WAIT_MS`;
    /// zero: it takes what is queued and waits for no one).
    pub wait: Duration,
}

impl Packing {
    /// One job at a time.
    pub const OFF: Packing = Packing {
        tokens: 0,
        max_jobs: 1,
        wait: Duration::ZERO,
    };
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    Full,
    Closed,
    /// A worker's device stopped answering (the reason): the engine takes nothing any more.
    DeviceHung(String),
}

impl Engine {
    /// Start `pipelines.len()` workers over one queue of `capacity` jobs. `warmup` is answered
    /// once by every worker before it counts as ready. The pipelines should share one
    /// [`PrefixCacheStats`] (see [`Pipeline::with_prefix_cache`]). `device_timeout`: the
    /// device deadline (`deadline.rs`; `None`: none, no watchdog). `packing`: how workers pack
    /// jobs (off where the pipelines cannot: [`Pipeline::packs`]).
    pub fn start<B: MeshOps + Send + 'static>(
        pipelines: Vec<Pipeline<B>>,
        capacity: usize,
        warmup: Option<(SystemOneRequest, LengthRule)>,
        device_timeout: Option<Duration>,
        packing: Packing,
    ) -> Engine
    where
        B::Tensor: Send,
    {
        let (tx, rx) = mpsc::channel::<Job>(capacity.max(1));
        let rx = Arc::new(Mutex::new(rx));
        // Pipelines of one server share their cache counters; the first one's are reported.
        let stats = Arc::new(EngineStats {
            prefix_cache: pipelines
                .first()
                .map(|p| p.cache_stats())
                .unwrap_or_default(),
            ..EngineStats::default()
        });
        let workers = pipelines.len();
        if let Ok(mut usage) = stats.device_usage.lock() {
            *usage = vec![None; workers];
        }
        if let Ok(mut passes) = stats.passes.lock() {
            *passes = vec![None; workers];
        }
        let deadline = Arc::new(DeviceDeadline::new(workers, device_timeout));
        let packs = pipelines.iter().all(|p| p.packs());
        if packing.tokens > 0 && !packs {
            tracing::info!("packing is off: this device backend does not run packed passes");
        }
        let packing = match packs && packing.tokens > 0 {
            true => packing,
            false => Packing::OFF,
        };
        let context = WorkerContext {
            rx: rx.clone(),
            stats: stats.clone(),
            deadline: deadline.clone(),
            packing,
            workers,
        };
        for (i, pipeline) in pipelines.into_iter().enumerate() {
            spawn_worker(i, 0, pipeline, context.clone(), warmup.clone());
        }
        if deadline.limit.is_some() {
            spawn_watchdog(context);
        }
        Engine {
            tx,
            stats,
            workers,
            capacity: capacity.max(1),
            deadline,
            packing,
        }
    }

    /// Queue a job, or refuse at once when the queue is full or the device stopped answering.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        if let Some(reason) = self.deadline.hung() {
            return Err(SubmitError::DeviceHung(reason.to_string()));
        }
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    mpsc::error::TrySendError::Full(_) => SubmitError::Full,
                    mpsc::error::TrySendError::Closed(_) => SubmitError::Closed,
                })
            }
        }
    }

    pub fn is_ready(&self) -> bool {
        self.workers > 0 && self.stats.ready.load(Ordering::SeqCst) == self.workers
    }
}

/// The receiving end every worker takes jobs from.
type Queue = Arc<Mutex<mpsc::Receiver<Job>>>;

/// What every worker thread (and the watchdog) shares.
#[derive(Clone)]
struct WorkerContext {
    rx: Queue,
    stats: Arc<EngineStats>,
    deadline: Arc<DeviceDeadline>,
    packing: Packing,
    /// Workers taking from the queue.
    workers: usize,
}

/// The device deadline's watchdog (`deadline.rs`): looks at the workers every tick; once the
/// engine is hung, answers every queued job with a 503 (a worker waiting on the queue answers
/// the ones it takes itself). Ends with the engine's last worker.
fn spawn_watchdog(context: WorkerContext) {
    let weak = Arc::downgrade(&context.deadline);
    let (rx, stats) = (context.rx, context.stats);
    drop(context.deadline);
    let spawned = std::thread::Builder::new()
        .name("clef-device-watchdog".into())
        .spawn(move || loop {
            let Some(deadline) = weak.upgrade() else {
                return;
            };
            std::thread::sleep(deadline.tick());
            if !deadline.check() {
                continue;
            }
            let reason = deadline.hung().unwrap_or_default().to_string();
            if let Ok(mut queue) = rx.try_lock() {
                while let Ok(job) = queue.try_recv() {
                    stats.queued.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.reply.send(Err(DeviceDeadline::unavailable(&reason)));
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the device watchdog: {e}");
    }
}

/// Why a worker thread ended.
enum WorkerEnd {
    /// The queue closed: the server is shutting down.
    QueueClosed,
    /// A request panicked: the thread is replaced.
    Failed,
}

/// Start worker `index` (its `generation`-th thread) on `pipeline`. When a request panics, the
/// thread answers it with a 500, clears what requests leave in the pipeline (the prefix cache)
/// and hands the pipeline to a new thread before it ends: a failed worker is replaced.
fn spawn_worker<B: MeshOps + Send + 'static>(
    index: usize,
    generation: u64,
    pipeline: Pipeline<B>,
    context: WorkerContext,
    warmup: Option<(SystemOneRequest, LengthRule)>,
) where
    B::Tensor: Send,
{
    let spawned = std::thread::Builder::new()
        .name(format!("clef-worker-{index}"))
        .spawn(move || {
            if let Some((request, rule)) = warmup {
                let t0 = Instant::now();
                context.deadline.begin(index, Vec::new());
                warm_passes(index, &pipeline, rule);
                match pipeline.decide(&request, rule) {
                    Ok(_) => tracing::info!(
                        worker = index,
                        ms = t0.elapsed().as_millis() as u64,
                        "warm-up done"
                    ),
                    Err(e) => tracing::warn!(worker = index, "warm-up failed: {e}"),
                }
                context.deadline.end(index);
            }
            record_usage(index, &pipeline, &context.stats);
            context.stats.ready.fetch_add(1, Ordering::SeqCst);
            match worker_loop(index, &pipeline, &context) {
                WorkerEnd::QueueClosed => {}
                WorkerEnd::Failed => {
                    context.stats.ready.fetch_sub(1, Ordering::SeqCst);
                    pipeline.reset_after_failure();
                    tracing::warn!(
                        worker = index,
                        generation = generation + 1,
                        "replacing the worker after a failed request"
                    );
                    spawn_worker(index, generation + 1, pipeline, context, None);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start worker {index} (generation {generation}): {e}");
    }
}

/// Worker `index`'s whole passes warmed (every bucket captured as a trace on ttnn), with the
/// time it took and the trace memory in the log; a failure is logged and leaves the passes to
/// warm on first use.
fn warm_passes<B: MeshOps>(index: usize, pipeline: &Pipeline<B>, rule: LengthRule) {
    match pipeline.warm_passes(rule) {
        Ok(Some(w)) => tracing::info!(
            worker = index,
            ms = w.took.as_millis() as u64,
            buckets = ?w.stats.buckets,
            traces = w.stats.traces,
            trace_region_mib = w.stats.trace_region_bytes as f64 / (1u64 << 20) as f64,
            reserved_mib = w.stats.reserved_bytes as f64 / (1u64 << 20) as f64,
            "prefill passes traced"
        ),
        Ok(None) => {}
        Err(e) => tracing::warn!(worker = index, "tracing the prefill passes failed: {e}"),
    }
}

/// Worker `index`'s device usage and passes, kept in the stats for `/v1/models` and
/// `/metrics`.
fn record_usage<B: MeshOps>(index: usize, pipeline: &Pipeline<B>, stats: &EngineStats) {
    let mesh = pipeline.backbone.mesh();
    let usage = mesh.usage();
    if let Ok(mut all) = stats.device_usage.lock() {
        if let Some(slot) = all.get_mut(index) {
            *slot = usage;
        }
    }
    let passes = mesh.pass_stats();
    if let Ok(mut all) = stats.passes.lock() {
        if let Some(slot) = all.get_mut(index) {
            *slot = passes;
        }
    }
}

/// The next jobs for a worker: one (waiting for it), then, with packing on, its share of what
/// else is queued (waiting up to the fill window for more): at most the packing's count, and
/// with several workers no more than an even share, so no worker idles while another holds a
/// second pack. `None` once the queue closed.
fn take_jobs(rx: &Queue, packing: &Packing, workers: usize) -> Option<Vec<Job>> {
    let mut queue = rx.lock().ok()?;
    // One worker waits on the queue at a time; the others wait for the lock.
    let mut jobs = vec![queue.blocking_recv()?];
    // (With a fill window the worker waits for jobs not queued yet: the count alone bounds it.)
    let share = (1 + queue.len()).div_ceil(workers.max(1));
    let limit = match packing.wait.is_zero() {
        true => packing.max_jobs.min(share),
        false => packing.max_jobs,
    };
    let until = Instant::now() + packing.wait;
    while jobs.len() < limit {
        match queue.try_recv() {
            Ok(job) => jobs.push(job),
            Err(mpsc::error::TryRecvError::Empty) if Instant::now() < until => {
                std::thread::sleep(Duration::from_micros(500));
            }
            Err(_) => break,
        }
    }
    Some(jobs)
}

/// Answer jobs until the queue closes or one of them panics.
fn worker_loop<B: MeshOps>(
    index: usize,
    pipeline: &Pipeline<B>,
    context: &WorkerContext,
) -> WorkerEnd {
    let (rx, stats, deadline) = (&context.rx, &context.stats, &context.deadline);
    loop {
        let Some(taken) = take_jobs(rx, &context.packing, context.workers) else {
            return WorkerEnd::QueueClosed;
        };
        stats.queued.fetch_sub(taken.len(), Ordering::SeqCst);
        let mut jobs = Vec::with_capacity(taken.len());
        for job in taken {
            if let Some(reason) = deadline.hung() {
                // Another worker's device stopped answering: the server is going down.
                let _ = job.reply.send(Err(DeviceDeadline::unavailable(reason)));
            } else if job.reply.is_closed() {
                stats.abandoned.fetch_add(1, Ordering::Relaxed);
                tracing::info!(id = %job.id, worker = index, "abandoned: the client left before its turn");
            } else {
                jobs.push(job);
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let n = jobs.len();
        stats.running.fetch_add(n, Ordering::SeqCst);
        let mut ids = Vec::with_capacity(n);
        let mut work = Vec::with_capacity(n);
        let mut replies = Vec::with_capacity(n);
        for job in jobs {
            ids.push(job.id);
            work.push((job.request, job.rule));
            replies.push(job.reply);
        }
        let pairs: Vec<(&SystemOneRequest, LengthRule)> =
            work.iter().map(|(r, rule)| (r, *rule)).collect();
        deadline.begin(index, replies);
        let beacon = deadline.beacon(index);
        // Each prefill pass is progress, and where a job whose client left stops.
        let cancelled = |member: usize| {
            deadline.beat(index);
            beacon.is_some_and(|b| b.client_gone(member))
        };
        // Each answer goes out as soon as it is ready (a packed pass's short jobs do not wait
        // for a long one after them).
        let answered = std::cell::Cell::new(0usize);
        let mut answer = |member: usize, result: Result<Decision, RequestError>| {
            answered.set(answered.get() + 1);
            let id = &ids[member];
            match &result {
                Ok(d) => {
                    stats
                        .tokens
                        .fetch_add(d.record.input_ids.len() as u64, Ordering::Relaxed);
                    if d.pass_requests > 1 {
                        stats.packed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) if e.kind == CANCELLED => {
                    stats.cancelled.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(id = %id, worker = index, "cancelled: the client left while it ran");
                }
                Err(_) => {}
            }
            stats.running.fetch_sub(1, Ordering::SeqCst);
            // A client that left while we ran is fine: the answer is dropped (as is an answer
            // the watchdog already gave).
            if let Some(reply) = beacon.and_then(|b| b.take_reply(member)) {
                let _ = reply.send(result);
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            pipeline.decide_pack(&pairs, context.packing.tokens, &cancelled, &mut answer)
        }));
        let unanswered = deadline.end(index);
        log_runtime_calls(
            &ids.join(","),
            index,
            &pipeline.backbone.mesh().take_runtime_calls(),
        );
        record_usage(index, pipeline, stats);
        if let Err(panic) = outcome {
            stats.panics.fetch_add(1, Ordering::Relaxed);
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(ids = %ids.join(","), worker = index, "request panicked: {msg}");
            stats
                .running
                .fetch_sub(n.saturating_sub(answered.get()), Ordering::SeqCst);
            for reply in unanswered.into_iter().flatten() {
                let _ = reply.send(Err(RequestError::internal(format!(
                    "the worker failed on this request: {msg}"
                ))));
            }
            return WorkerEnd::Failed;
        }
    }
}

/// One line per request of the device runtime's calls (ttnn ops under the Tenstorrent shim):
/// their number, host time and the ops that took most of it.
fn log_runtime_calls(id: &impl std::fmt::Display, worker: usize, calls: &[RuntimeCalls]) {
    if calls.is_empty() {
        return;
    }
    let total: u64 = calls.iter().map(|c| c.calls).sum();
    let ms: f64 = calls.iter().map(|c| c.seconds).sum::<f64>() * 1e3;
    let top: Vec<String> = calls
        .iter()
        .take(6)
        .map(|c| format!("{}:{}/{:.1}ms", c.op, c.calls, c.seconds * 1e3))
        .collect();
    tracing::info!(
        id = %id,
        worker,
        runtime_calls = total,
        runtime_ms = format!("{ms:.1}"),
        top = %top.join(" "),
        "device runtime calls"
    );
}
