//! `clef-tt serve`: bind the port, load the model once per worker, start the queue and the HTTP
//! server, warm up (announcing readiness with `--ready-message`), serve until SIGTERM/Ctrl-C,
//! then finish the requests in flight (for at most `--shutdown-timeout` seconds) and exit 0. A
//! stop asked for before the server is up ends the process at once (see
//! [`stop_while_starting`]).

use super::args::ServeArgs;
use super::device::on_device;
use anyhow::Context;
use clef_device::select::{Backend, MeshLayout};
use clef_device::MeshOps;
use clef_tt::api::config::ServeOptions;
use clef_tt::api::server::{router, AppState};
use clef_tt::checkpoint::Checkpoint;
use clef_tt::engine::prefix_cache::PREFIX_ALIGN;
use clef_tt::engine::serving::{self, LoadProgress, PrefixCacheOptions, WeightSource, WorkerSpec};
use clef_tt::engine::worker::Engine;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The exit status after a missed device deadline (EX_TEMPFAIL: restart me).
pub const EXIT_DEVICE_HUNG: i32 = 75;

/// The options `serve` (and `openapi`) run with, from the parsed flags.
pub fn options(a: ServeArgs) -> anyhow::Result<ServeOptions> {
    let is_default_model = super::requested_model(a.model.model.clone()).is_none();
    let model_dir = super::resolve(a.model.model.clone(), a.model.revision.as_deref())?;
    let device = a.model.device.resolve_for_serving()?;
    let device_timeout = serving::device_timeout(a.device_timeout, &device)?;
    let packing = serving::packing(
        a.pack_tokens,
        Duration::from_millis(a.pack_wait_ms),
        &device,
    );
    Ok(ServeOptions {
        model_dir,
        is_default_model,
        revision: a.model.revision.clone(),
        host: a.host,
        port: a.port,
        workers: a.workers,
        layout: MeshLayout {
            shape: a.model.mesh,
            parent: a.parent_mesh,
            first_offset: a.submesh_offset,
            workers: a.workers.max(1),
        },
        precision: super::device::precision(&device, a.model.precision.as_deref())?,
        device,
        max_queue: a.max_queue,
        rule: a.limits.rule(),
        api_key: a.api_key,
        account_id: a.account_id,
        model_names: a
            .model_names
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
        warmup: a.warmup,
        strict: a.strict,
        max_body_bytes: a.max_body_bytes,
        refused_body_drain: clef_tt::api::DrainBounds {
            max_bytes: a
                .drain_max_bytes
                .unwrap_or(clef_tt::api::DrainBounds::for_limit(a.max_body_bytes).max_bytes),
            max_time: Duration::try_from_secs_f64(a.drain_secs)
                .map_err(|_| anyhow::anyhow!("--drain-secs must be a number of seconds >= 0"))?,
        },
        demo: a.demo,
        media_limits: a.media.limits(),
        tensor_cache: a.tensor_cache,
        tensor_cache_root: a.tensor_cache_root.filter(|p| !p.as_os_str().is_empty()),
        ready_message: a.ready_message.filter(|m| !m.is_empty()),
        shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
        device_timeout,
        packing,
        prefix_cache: PrefixCacheOptions {
            slots: a.prefix_cache,
            max_bytes: a.prefix_cache_bytes,
            planner: a.planner,
        },
    })
}

/// `clef-tt openapi`: the document `serve` with the same flags would publish, without loading
/// weights or starting a server.
pub fn print_openapi(o: &ServeOptions) -> anyhow::Result<()> {
    let ckpt = Checkpoint::open(&o.model_dir)
        .with_context(|| format!("opening {}", o.model_dir.display()))?;
    let settings = o.settings(&ckpt, o.rule, o.host_limits(), json!({}));
    let doc = clef_tt::api::openapi::document(&settings);
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// `clef-tt serve`.
pub fn run(o: ServeOptions) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    let stop = Stop::watch(&runtime, matches!(o.device, Backend::Tt(_)))?;
    // Bound before the weights load, so a port that is taken fails the start at once (and not
    // after minutes of loading); connections wait in the backlog until the server serves.
    let addr = format!("{}:{}", o.host, o.port);
    let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
    listener.set_nonblocking(true)?;
    let served = on_device!(&o.device, o.layout, o.precision.numerics(), |open| {
        run_on(&o, &open, &runtime, listener, &stop)
    });
    // Requests still running after the deadline are dropped with their tasks.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// The stop signals (SIGTERM, SIGINT), watched from the start of `serve`.
struct Stop {
    /// Becomes `true` on the first signal once the server is up.
    asked: tokio::sync::watch::Receiver<bool>,
    /// Set when the server starts serving; before that a signal ends the process.
    serving: Arc<AtomicBool>,
}

impl Stop {
    fn watch(runtime: &tokio::runtime::Runtime, tt: bool) -> anyhow::Result<Stop> {
        let signals = {
            let _entered = runtime.enter();
            Signals::register()?
        };
        let (tx, asked) = tokio::sync::watch::channel(false);
        let serving = Arc::new(AtomicBool::new(false));
        let up = serving.clone();
        runtime.spawn(async move {
            signals.first().await;
            if !up.load(Ordering::SeqCst) {
                stop_while_starting(tt);
            }
            tracing::info!("shutting down: finishing requests in flight");
            let _ = tx.send(true);
        });
        Ok(Stop { asked, serving })
    }
}

/// A stop asked for while the weights load or the mesh opens: loading cannot be interrupted
/// and a supervisor (tt-model: `docker stop --timeout 120`) would only wait and then kill, so
/// the process ends now. On the CPU that is a clean exit (0). On Tenstorrent the mesh is left
/// mid-transfer exactly as by SIGKILL, so the process ends by SIGKILL (status 137), which is
/// what makes tt-model reset the chips after an unclean stop.
fn stop_while_starting(tt: bool) -> ! {
    if tt {
        tracing::warn!("stopped while starting: ending as killed (137) so the chips get reset");
        #[cfg(unix)]
        {
            extern "C" {
                fn kill(pid: i32, sig: i32) -> i32;
            }
            const SIGKILL: i32 = 9;
            // SAFETY: kill(2) on this process's own id; it does not return once delivered.
            unsafe {
                kill(std::process::id() as i32, SIGKILL);
            }
        }
        std::process::exit(137);
    }
    tracing::info!("stopped while starting");
    std::process::exit(0)
}

/// Load one pipeline per worker on meshes `open(i)` gives, then serve on `listener`.
fn run_on<B>(
    o: &ServeOptions,
    open: &dyn Fn(usize) -> anyhow::Result<B>,
    runtime: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    stop: &Stop,
) -> anyhow::Result<()>
where
    B: MeshOps + Clone + Send + 'static,
    B::Tensor: Send,
{
    let ckpt = Checkpoint::open(&o.model_dir)
        .with_context(|| format!("opening {}", o.model_dir.display()))?;
    if o.is_default_model {
        tracing::warn!("serving the built-in DEMO model (tiny, random weights): its answers mean nothing; pass --model for a real checkpoint");
    }
    tracing::info!(device = %o.device.describe(), "device");
    let weights = match (&o.tensor_cache, &o.tensor_cache_root) {
        (Some(dir), _) => WeightSource::Cache(dir),
        (None, Some(root)) => WeightSource::ManagedCache(root),
        (None, None) => WeightSource::Checkpoint,
    };
    let spec = WorkerSpec {
        precision: &o.precision,
        workers: o.workers,
        shape: o.layout.shape,
        weights,
        media_limits: &o.media_limits,
        prefix_cache: o.prefix_cache,
        rule: o.rule,
    };
    let workers = serving::load_workers(&ckpt, &spec, &|i| Ok(open(i)?), &Bars)?;
    let rule = o.rule;
    let limits = o.host_limits();
    let warmup = o.warmup.then(|| serving::warmup(rule)).transpose()?;
    let engine = Engine::start(
        workers.pipelines,
        o.max_queue,
        warmup,
        o.device_timeout,
        o.packing,
    );
    if matches!(o.device, Backend::Tt(_))
        && engine.packing.tokens > 0
        && workers.prefix_cache.config.slots > 0
    {
        tracing::info!(
            "packing runs batches on this device: new states (those of {PREFIX_ALIGN} tokens \
             or more keep their prefix for the prefix cache) as one, then the hits of each \
             cached state as one; hits of different states do not share a batch \
             (docs/packing.md)"
        );
    }
    let card = o.card(&ckpt, &limits, &workers.prefix_cache, &engine.packing);
    let settings = o.settings(&ckpt, rule, limits, card);
    let state = AppState::new(engine, settings);
    stop.serving.store(true, Ordering::SeqCst);
    let ready_message = o.ready_message.clone();
    let deadline = o.shutdown_timeout;
    let asked = stop.asked.clone();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        let watched = state.clone();
        tokio::spawn(async move {
            while !watched.engine.is_ready() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tracing::info!("ready: every worker warmed up");
            if let Some(line) = ready_message {
                eprintln!("{line}");
            }
        });
        let hung_engine = state.engine.deadline.clone();
        tokio::spawn(async move {
            // A missed device deadline: /health is 503 and every decision gets a 503 from now
            // on; after the drain window the process ends without running destructors (a
            // thread is stuck in the device runtime, whose own teardown could wait on it too).
            while hung_engine.hung().is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tracing::error!(
                seconds = deadline.as_secs(),
                "a device stopped answering: draining, then exiting with status {EXIT_DEVICE_HUNG} for a restart (reset the chips: tt-smi -r)"
            );
            tokio::time::sleep(deadline).await;
            tracing::error!("exiting: the device stopped answering");
            exit_now(EXIT_DEVICE_HUNG);
        });
        let mut graceful = asked.clone();
        let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
            let _ = graceful.wait_for(|asked| *asked).await;
        });
        let mut late = asked;
        let overdue = async move {
            let _ = late.wait_for(|asked| *asked).await;
            tokio::time::sleep(deadline).await;
        };
        tokio::select! {
            served = server => {
                served?;
                tracing::info!("stopped");
            }
            _ = overdue => tracing::warn!(
                seconds = deadline.as_secs(),
                "requests were still running at the shutdown deadline: stopped without them"
            ),
        }
        anyhow::Ok(())
    })
}

/// Ends the process at once with `status`: no destructors, no atexit handlers (`_exit(2)`).
fn exit_now(status: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    // SAFETY: _exit only ends the process.
    unsafe { _exit(status) }
}

/// SIGTERM and SIGINT, registered together before anything loads (as PID 1 in a container a
/// signal without a handler would be ignored).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Needs a runtime context.
    fn register() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate()).context("handling SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("handling SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The first of them.
    async fn first(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Progress bars on stderr for the loads of [`serving::load_workers`].
struct Bars;

impl LoadProgress for Bars {
    fn stage(&self, label: &str) -> Box<dyn Fn(usize, usize) + '_> {
        let (bar, report) = super::progress::bar(label);
        let cleared = super::progress::Cleared(bar);
        Box::new(move |done, total| {
            let _ = &cleared;
            report(done, total)
        })
    }
}
