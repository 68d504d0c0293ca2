//! Workers and the bounded queue. Each worker is an OS thread that owns one pipeline (one mesh)
//! and takes jobs from a queue of fixed capacity; a full queue refuses at once (the caller
//! answers 429). A job whose client has gone before its turn is dropped unstarted, and one
//! running stops at the next prefill chunk boundary. A request that panics is answered with a
//! 500 and its worker is replaced (a new thread on the same weights, prefix cache cleared). The
//! blocking model work never runs on the async runtime's threads.

use super::prefix_cache::PrefixCacheStats;
use super::{Decision, Pipeline, CANCELLED};
use crate::encode::LengthRule;
use crate::request::{RequestError, SystemOneRequest};
use clef_device::{MeshOps, RuntimeCalls};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
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
    /// The workers' prefix caches.
    pub prefix_cache: Arc<PrefixCacheStats>,
}

/// The queue front: submit jobs, read the counters.
pub struct Engine {
    tx: mpsc::Sender<Job>,
    pub stats: Arc<EngineStats>,
    pub workers: usize,
    pub capacity: usize,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    Full,
    Closed,
}

impl Engine {
    /// Start `pipelines.len()` workers over one queue of `capacity` jobs. `warmup` is answered
    /// once by every worker before it counts as ready. The pipelines should share one
    /// [`PrefixCacheStats`] (see [`Pipeline::with_prefix_cache`]).
    pub fn start<B: MeshOps + Send + 'static>(
        pipelines: Vec<Pipeline<B>>,
        capacity: usize,
        warmup: Option<(SystemOneRequest, LengthRule)>,
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
        for (i, pipeline) in pipelines.into_iter().enumerate() {
            spawn_worker(i, 0, pipeline, rx.clone(), stats.clone(), warmup.clone());
        }
        Engine {
            tx,
            stats,
            workers,
            capacity: capacity.max(1),
        }
    }

    /// Queue a job, or refuse at once when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
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
    rx: Queue,
    stats: Arc<EngineStats>,
    warmup: Option<(SystemOneRequest, LengthRule)>,
) where
    B::Tensor: Send,
{
    let spawned = std::thread::Builder::new()
        .name(format!("clef-worker-{index}"))
        .spawn(move || {
            if let Some((request, rule)) = warmup {
                let t0 = Instant::now();
                match pipeline.decide(&request, rule) {
                    Ok(_) => tracing::info!(
                        worker = index,
                        ms = t0.elapsed().as_millis() as u64,
                        "warm-up done"
                    ),
                    Err(e) => tracing::warn!(worker = index, "warm-up failed: {e}"),
                }
            }
            stats.ready.fetch_add(1, Ordering::SeqCst);
            match worker_loop(index, &pipeline, &rx, &stats) {
                WorkerEnd::QueueClosed => {}
                WorkerEnd::Failed => {
                    stats.ready.fetch_sub(1, Ordering::SeqCst);
                    pipeline.reset_after_failure();
                    tracing::warn!(
                        worker = index,
                        generation = generation + 1,
                        "replacing the worker after a failed request"
                    );
                    spawn_worker(index, generation + 1, pipeline, rx, stats, None);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start worker {index} (generation {generation}): {e}");
    }
}

/// Answer jobs until the queue closes or one of them panics.
fn worker_loop<B: MeshOps>(
    index: usize,
    pipeline: &Pipeline<B>,
    rx: &Queue,
    stats: &EngineStats,
) -> WorkerEnd {
    loop {
        // One worker waits on the queue at a time; the others wait for the lock.
        let job = match rx.lock() {
            Ok(mut guard) => guard.blocking_recv(),
            Err(_) => return WorkerEnd::QueueClosed,
        };
        let Some(job) = job else {
            return WorkerEnd::QueueClosed;
        };
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        if job.reply.is_closed() {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::info!(id = %job.id, worker = index, "abandoned: the client left before its turn");
            continue;
        }
        stats.running.fetch_add(1, Ordering::SeqCst);
        let reply = &job.reply;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            pipeline.decide_cancellable(&job.request, job.rule, &|| reply.is_closed())
        }));
        stats.running.fetch_sub(1, Ordering::SeqCst);
        log_runtime_calls(
            &job.id,
            index,
            &pipeline.backbone.mesh().take_runtime_calls(),
        );
        match outcome {
            Ok(result) => {
                match &result {
                    Ok(d) => {
                        stats
                            .tokens
                            .fetch_add(d.record.input_ids.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.kind == CANCELLED => {
                        stats.cancelled.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(id = %job.id, worker = index, "cancelled: the client left while it ran");
                    }
                    Err(_) => {}
                }
                // A client that left while we ran is fine: the answer is dropped.
                let _ = job.reply.send(result);
            }
            Err(panic) => {
                stats.panics.fetch_add(1, Ordering::Relaxed);
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(id = %job.id, worker = index, "request panicked: {msg}");
                let _ = job.reply.send(Err(RequestError::internal(format!(
                    "the worker failed on this request: {msg}"
                ))));
                return WorkerEnd::Failed;
            }
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
