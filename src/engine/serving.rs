//! Building a server's workers: one pipeline per worker on the mesh it owns, its weights from
//! the tensor cache (kept under a root, converted on the first start) or the checkpoint, and
//! the prefix cache fitted under its byte cap; with the settings a server derives from the
//! backend it runs on (the packing budget, the device deadline) and its warm-up request. The
//! `serve` command keeps only its arguments, signals and the HTTP loop.

use super::prefix_cache::{boundary, PrefixCacheConfig, PrefixCacheStats};
use super::worker::Packing;
use super::{Pipeline, PipelineError, PREFILL_CHUNK};
use crate::backbone::{Backbone, LoadError};
use crate::checkpoint::Checkpoint;
use crate::encode::LengthRule;
use crate::media::MediaLimits;
use crate::precision::Precision;
use crate::request::{parse_body, validate, SystemOneRequest};
use crate::tensor_cache::{CacheError, TensorCache};
use clef_device::select::Backend;
use clef_device::{MeshOps, MeshShape};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a worker's mesh did not open (the caller's error).
pub type OpenError = Box<dyn std::error::Error + Send + Sync>;

/// Errors while building the workers.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("worker {worker}: {source}")]
    Open { worker: usize, source: OpenError },
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("{0}")]
    Setting(String),
}

/// Most requests a worker takes at once to pack.
pub const PACK_MAX_REQUESTS: usize = 16;

/// The packing budget asked (`--pack-tokens`), else one prefill chunk on `tt` (the rows the
/// device path is sized for) and none on the CPU, where packing gains ~1.27x on the tiny model
/// but nothing at the 0.8B shape, whose passes are compute-bound (docs/packing.md); `wait` is
/// the fill window (`--pack-wait-ms`).
pub fn packing(asked_tokens: Option<usize>, wait: Duration, backend: &Backend) -> Packing {
    let tokens = asked_tokens.unwrap_or(match backend {
        Backend::Tt(_) => PREFILL_CHUNK,
        Backend::Cpu => 0,
    });
    match tokens {
        0 => Packing::OFF,
        tokens => Packing {
            tokens,
            max_jobs: PACK_MAX_REQUESTS,
            wait,
        },
    }
}

/// The device deadline on a Tenstorrent device unless one is set (docs/reliability.md, "A hung
/// device"): the longest legal time between two progress marks on a P150x2 is a 1,024-token
/// chunk (0.34 s of device time as the port measured it) plus, on a cold kernel cache,
/// compiling the programs a new chunk shape needs (~60-120 s): 300 s is 2.5x that.
pub const TT_DEVICE_TIMEOUT: Duration = Duration::from_secs(300);

/// `--device-timeout`: seconds (0: none), else [`TT_DEVICE_TIMEOUT`] on `tt`, none on the CPU.
pub fn device_timeout(
    asked_secs: Option<f64>,
    backend: &Backend,
) -> Result<Option<Duration>, ServingError> {
    match asked_secs {
        Some(s) => {
            let d = Duration::try_from_secs_f64(s).map_err(|_| {
                ServingError::Setting(format!(
                    "--device-timeout must be a number of seconds >= 0, not {s}"
                ))
            })?;
            Ok((!d.is_zero()).then_some(d))
        }
        None => Ok(matches!(backend, Backend::Tt(_)).then_some(TT_DEVICE_TIMEOUT)),
    }
}

/// A tiny request each worker answers before it counts as ready.
const WARMUP: &str = r#"{"model":"warmup","state":"warm-up","questions":{"ok":{"type":"noul","instructions":"Is the server ready?"}}}"#;

/// The warm-up request, under `rule`.
pub fn warmup(rule: LengthRule) -> Result<(SystemOneRequest, LengthRule), ServingError> {
    let setting = |e: String| ServingError::Setting(format!("the warm-up request: {e}"));
    let value = parse_body(WARMUP.as_bytes()).map_err(|e| setting(e.to_string()))?;
    let request = validate(&value, None).map_err(|e| setting(e.to_string()))?;
    Ok((request, rule))
}

/// The prefix cache as asked for (`CLEF_PREFIX_CACHE`, `CLEF_PREFIX_CACHE_BYTES`,
/// `CLEF_PLANNER`).
#[derive(Clone, Copy, Debug)]
pub struct PrefixCacheOptions {
    pub slots: usize,
    /// For all workers together; `None`: half the memory available at start.
    pub max_bytes: Option<usize>,
    pub planner: bool,
}

/// What the server runs with after fitting the asked slots under the byte cap.
#[derive(Clone, Copy, Debug)]
pub struct PrefixCachePlan {
    pub config: PrefixCacheConfig,
    pub asked_slots: usize,
    /// A slot at the longest cacheable state piece.
    pub slot_bytes: usize,
    /// For all workers together.
    pub cap: Option<usize>,
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Fit the slots under the cap: a slot can grow to the longest cacheable state piece (under
/// `rule`), so `workers × slots × slot_bytes` must stay under it; fewer slots (with a warning)
/// otherwise.
pub fn plan_prefix_cache(
    asked: &PrefixCacheOptions,
    rule: LengthRule,
    workers: usize,
    slot_bytes_at: impl Fn(usize) -> usize,
) -> PrefixCachePlan {
    let longest = match rule {
        LengthRule::Server { max_state, .. } => max_state,
        LengthRule::Reference { max_length } => max_length,
    };
    let p = boundary(longest, PREFILL_CHUNK, asked.planner).unwrap_or(0);
    let slot_bytes = slot_bytes_at(p);
    let cap = asked
        .max_bytes
        .or_else(|| available_memory().map(|m| m / 2));
    let workers = workers.max(1);
    let mut slots = asked.slots;
    if let Some(cap) = cap {
        let fit = cap / workers / slot_bytes.max(1);
        if fit < slots {
            tracing::warn!(
                asked = slots,
                kept = fit,
                slot_mib = slot_bytes >> 20,
                cap_mib = cap >> 20,
                "the prefix cache would not fit its byte cap at the longest state: fewer slots per worker"
            );
            slots = fit;
        }
    }
    PrefixCachePlan {
        config: PrefixCacheConfig {
            slots,
            max_bytes: cap.map(|c| c / workers),
            planner: asked.planner,
        },
        asked_slots: asked.slots,
        slot_bytes,
        cap,
    }
}

/// Progress of a long load: `stage(label)` starts a stage and returns its reporter of
/// `(done, total)`; the stage ends when the reporter is dropped.
pub trait LoadProgress {
    fn stage(&self, label: &str) -> Box<dyn Fn(usize, usize) + '_>;
}

/// No progress shown.
pub struct Quiet;

impl LoadProgress for Quiet {
    fn stage(&self, _label: &str) -> Box<dyn Fn(usize, usize) + '_> {
        Box::new(|_, _| {})
    }
}

/// Where the weights load from.
#[derive(Clone, Copy, Debug)]
pub enum WeightSource<'a> {
    /// The checkpoint itself.
    Checkpoint,
    /// A tensor cache made by `clef-tt convert` (it must match).
    Cache(&'a Path),
    /// The tensor cache kept under a root (`TT_CACHE_PATH`), converted when missing or stale.
    ManagedCache(&'a Path),
}

/// What the workers are built from.
pub struct WorkerSpec<'a> {
    pub precision: &'a Precision,
    pub workers: usize,
    /// Each worker's mesh.
    pub shape: MeshShape,
    pub weights: WeightSource<'a>,
    pub media_limits: &'a MediaLimits,
    pub prefix_cache: PrefixCacheOptions,
    /// The length rule requests run under (the longest cacheable state piece).
    pub rule: LengthRule,
}

/// The workers' pipelines and the prefix cache they share the plan of.
pub struct Workers<B: MeshOps> {
    pub pipelines: Vec<Pipeline<B>>,
    pub prefix_cache: PrefixCachePlan,
}

/// One pipeline per worker on the mesh `open(i)` gives, loaded as `spec` says.
pub fn load_workers<B: MeshOps>(
    ckpt: &Checkpoint,
    spec: &WorkerSpec,
    open: &dyn Fn(usize) -> Result<B, OpenError>,
    progress: &dyn LoadProgress,
) -> Result<Workers<B>, ServingError> {
    let open = |worker| open(worker).map_err(|source| ServingError::Open { worker, source });
    let shape = spec.shape.to_string();
    let profile = &spec.precision.name;
    let mut first = Some(open(0)?);
    let cache = match (spec.weights, &first) {
        (WeightSource::Cache(dir), Some(mesh)) => Some(TensorCache::open(
            dir,
            ckpt,
            mesh.backend_name(),
            &shape,
            spec.precision,
        )?),
        (WeightSource::ManagedCache(root), Some(mesh)) => {
            managed_cache(root, ckpt, mesh, spec, progress)
        }
        _ => None,
    };
    let stats = Arc::new(PrefixCacheStats::default());
    let mut pipelines = Vec::new();
    let mut plan = None;
    for i in 0..spec.workers.max(1) {
        let mesh = match first.take() {
            Some(m) => m,
            None => open(i)?,
        };
        tracing::info!(worker = i, mesh = %shape, precision = %profile, "loading weights");
        let t0 = Instant::now();
        let backbone = match &cache {
            Some(cache) => {
                let report = progress.stage("loading the tensor cache");
                cache.load_backbone(ckpt, mesh, spec.precision, &report)?
            }
            None => {
                let report = progress.stage("loading the checkpoint");
                Backbone::load_reporting(ckpt, mesh, spec.precision, &report)?
            }
        };
        let pipeline = Pipeline::with_backbone(ckpt, backbone, spec.precision)?;
        let usage = pipeline.backbone.mesh().usage();
        tracing::info!(
            worker = i,
            ms = t0.elapsed().as_millis() as u64,
            from_cache = cache.is_some(),
            device_mib = usage
                .as_ref()
                .map(|u| u.bytes_per_device.iter().sum::<u64>() >> 20),
            "weights placed"
        );
        let plan = *plan.get_or_insert_with(|| {
            plan_prefix_cache(&spec.prefix_cache, spec.rule, spec.workers, |p| {
                pipeline.prefix_slot_bytes(p)
            })
        });
        pipelines.push(
            pipeline
                .with_prefix_cache(plan.config, stats.clone())
                .with_media_limits(spec.media_limits.clone()),
        );
    }
    let prefix_cache = plan.ok_or(ServingError::Setting("no workers".into()))?;
    tracing::info!(
        slots = prefix_cache.config.slots,
        slot_mib = prefix_cache.slot_bytes >> 20,
        planner = prefix_cache.config.planner,
        "prefix cache"
    );
    Ok(Workers {
        pipelines,
        prefix_cache,
    })
}

/// The tensor cache kept under `root` (`--tensor-cache-root`, tt-model's `TT_CACHE_PATH`) for
/// this backend, mesh and profile: opened when it matches the checkpoint, else converted from
/// it on `mesh` first (the first start, or a changed checkpoint or profile). `None` when it
/// can be neither read nor written (a read-only mount): the weights then load from the
/// checkpoint, as without a cache.
fn managed_cache<B: MeshOps>(
    root: &Path,
    ckpt: &Checkpoint,
    mesh: &B,
    spec: &WorkerSpec,
    progress: &dyn LoadProgress,
) -> Option<TensorCache> {
    let backend = mesh.backend_name();
    let shape = spec.shape.to_string();
    let profile = &spec.precision.name;
    let dir = root
        .join("clef-tt")
        .join(format!("{backend}-{shape}-{profile}"));
    let open = || TensorCache::open(&dir, ckpt, backend, &shape, spec.precision);
    match open() {
        Ok(cache) => return Some(cache),
        Err(e) => {
            let why = match e {
                CacheError::Stale(why, _) => why,
                other => other.to_string(),
            };
            tracing::info!(why, "converting the weights into the tensor cache");
        }
    }
    let t0 = Instant::now();
    let converted = {
        let report = progress.stage("converting");
        crate::tensor_cache::convert(ckpt, mesh, spec.precision, &dir, &report)
    };
    match converted.and_then(|_| open()) {
        Ok(cache) => {
            tracing::info!(dir = %dir.display(), ms = t0.elapsed().as_millis() as u64, "tensor cache written");
            Some(cache)
        }
        Err(e) => {
            tracing::warn!(root = %root.display(), "the tensor cache cannot be written ({e}): loading from the checkpoint");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_shrink_to_fit_the_byte_cap_of_all_workers() {
        let rule = LengthRule::Server {
            max_state: 16384,
            max_tail: 4096,
            truncate: false,
        };
        let asked = |slots, max_bytes| PrefixCacheOptions {
            slots,
            max_bytes,
            planner: false,
        };
        // A slot at the longest state piece (16,384 tokens) holds 16,384 bytes here.
        let per_token = |p: usize| p;
        let plan = plan_prefix_cache(&asked(4, Some(100_000)), rule, 2, per_token);
        assert_eq!(plan.slot_bytes, 16384);
        assert_eq!(plan.config.slots, 3); // 100,000 / 2 workers / 16,384
        assert_eq!(plan.config.max_bytes, Some(50_000));
        let roomy = plan_prefix_cache(&asked(4, Some(1 << 30)), rule, 1, per_token);
        assert_eq!(roomy.config.slots, 4);
        let off = plan_prefix_cache(&asked(0, Some(1 << 30)), rule, 1, per_token);
        assert_eq!(off.config.slots, 0);
    }

    #[test]
    fn packing_is_on_by_default_only_on_tenstorrent() {
        let cpu = packing(None, Duration::ZERO, &Backend::Cpu);
        assert_eq!(cpu, Packing::OFF);
        let asked = packing(Some(2048), Duration::from_millis(5), &Backend::Cpu);
        assert_eq!(asked.tokens, 2048);
        assert_eq!(asked.max_jobs, PACK_MAX_REQUESTS);
        assert_eq!(asked.wait, Duration::from_millis(5));
        assert_eq!(
            packing(Some(0), Duration::ZERO, &Backend::Cpu),
            Packing::OFF
        );
    }

    #[test]
    fn a_device_timeout_of_zero_is_none_and_a_negative_one_is_refused() {
        assert_eq!(device_timeout(Some(0.0), &Backend::Cpu).unwrap(), None);
        assert_eq!(
            device_timeout(Some(1.5), &Backend::Cpu).unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(device_timeout(None, &Backend::Cpu).unwrap(), None);
        assert!(device_timeout(Some(-1.0), &Backend::Cpu).is_err());
    }
}
