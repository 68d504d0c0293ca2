//! The clef-tt command line: `inspect` a checkpoint, `decide` requests from a file,
//! `make-random` a benchmark checkpoint, `bench prefill` / `bench head`.

mod cli;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::checkpoint::{default_model_dir, resolve_model_dir, Checkpoint};
use clef_tt::encode::LengthRule;
use clef_tt::engine::Pipeline;
use clef_tt::precision::{parse_flag, Precision};
use clef_tt::random::{make_random, Shape};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "clef-tt",
    version,
    about = "Cloudflare Clef decision models on Tenstorrent and CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (POST /v1/systemone, GET /v1/models, /health, /metrics).
    Serve(ServeArgs),
    /// Print a checkpoint's configuration, tensor groups, head and tokenizer; exit non-zero on
    /// any inconsistency.
    Inspect {
        /// Snapshot directory or hub id in the local Hugging Face cache (default: the built-in
        /// tiny demo model).
        #[arg(long, env = "CLEF_MODEL")]
        model: Option<String>,
        /// Revision of a hub id.
        #[arg(long, env = "CLEF_REVISION")]
        revision: Option<String>,
    },
    /// Answer the requests of FILE (one JSON value, or one per line) with a local model; one
    /// result line per request on stdout.
    Decide {
        #[command(flatten)]
        model: ModelArgs,
        /// The reference's single token budget instead of the server's limits.
        #[arg(long)]
        max_length: Option<usize>,
        #[command(flatten)]
        limits: LengthArgs,
        /// Send the requests to a running server instead (e.g. http://127.0.0.1:8008), with
        /// `CLEF_API_KEY` when set; the lines are the same as the local mode's.
        #[arg(long, conflicts_with = "max_length")]
        url: Option<String>,
        file: PathBuf,
    },
    /// Score a precision profile against a goldens directory's f32 reference answers.
    Eval {
        #[arg(long, env = "CLEF_MODEL")]
        model: Option<String>,
        /// A goldens directory (requests.jsonl + expected_f32.jsonl), e.g.
        /// tests/fixtures/tiny-clef/goldens.
        #[arg(long)]
        goldens: PathBuf,
        /// Precision profile (f32, bf16, selected, stage1, fast).
        #[arg(long, env = "CLEF_PRECISION", default_value = "f32")]
        profile: String,
        #[arg(long, env = "CLEF_MESH_SHAPE", default_value = "1x1")]
        mesh: String,
    },
    /// Write a tensor cache: the text weights split per device and packed for a mesh and a
    /// precision profile, for `serve --tensor-cache`.
    Convert {
        #[arg(long, env = "CLEF_MODEL")]
        model: Option<String>,
        #[arg(long, env = "CLEF_PRECISION", default_value = "f32")]
        profile: String,
        #[arg(long, env = "CLEF_MESH_SHAPE", default_value = "1x1")]
        mesh: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a complete random-weight checkpoint for benchmarks.
    MakeRandom {
        #[arg(long, value_enum, default_value = "0.8b")]
        shape: Shape,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 20261129)]
        seed: u64,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

/// The model and how it is placed.
#[derive(clap::Args)]
struct ModelArgs {
    /// Snapshot directory or hub id in the local HF cache (default: the built-in demo model).
    #[arg(long, env = "CLEF_MODEL")]
    model: Option<String>,
    /// Revision of a hub id.
    #[arg(long, env = "CLEF_REVISION")]
    revision: Option<String>,
    /// Mesh shape of each worker's (CPU) device.
    #[arg(long, env = "CLEF_MESH_SHAPE", default_value = "1x1")]
    mesh: String,
    /// Precision profile (profiles/*.json): f32 (the reference's numbers), bf16, selected,
    /// stage1 or fast; knobs can be overridden by environment variables (README).
    #[arg(long, env = "CLEF_PRECISION", default_value = "f32")]
    precision: String,
}

/// The server's prompt length limits.
#[derive(clap::Args)]
struct LengthArgs {
    /// Token limit of the state piece (system prompt, media, state).
    #[arg(long, env = "CLEF_MAX_STATE", default_value_t = 16384)]
    max_state: usize,
    /// Token limit of the tail (schema and suffix).
    #[arg(long, env = "CLEF_MAX_TAIL", default_value_t = 4096)]
    max_tail: usize,
    /// Keep the first state tokens when the state piece is too long.
    #[arg(long, env = "CLEF_TRUNCATE_STATES", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    truncate_states: bool,
}

impl LengthArgs {
    fn rule(&self) -> LengthRule {
        LengthRule::Server {
            max_state: self.max_state,
            max_tail: self.max_tail,
            truncate: self.truncate_states,
        }
    }
}

/// Bounds on images and videos (README, "Configuration").
#[derive(clap::Args)]
struct MediaArgs {
    /// Images per request.
    #[arg(long, env = "CLEF_MAX_IMAGES", default_value_t = 4)]
    max_images: usize,
    /// Base64-decoded bytes of one image or video frame (e.g. 4MiB).
    #[arg(long, env = "CLEF_MAX_IMAGE_BYTES", value_parser = parse_bytes, default_value = "4MiB")]
    max_image_bytes: usize,
    /// Pixels of one decoded image or frame.
    #[arg(long, env = "CLEF_MAX_IMAGE_PIXELS", default_value_t = 16 << 20)]
    max_image_pixels: u64,
    /// Base64-decoded bytes of all images and frames of a request.
    #[arg(long, env = "CLEF_MAX_MEDIA_BYTES", value_parser = parse_bytes, default_value = "8MiB")]
    max_media_bytes: usize,
    /// Videos per request.
    #[arg(long, env = "CLEF_MAX_VIDEOS", default_value_t = 4)]
    max_videos: usize,
    /// Frames per video.
    #[arg(long, env = "CLEF_MAX_VIDEO_FRAMES", default_value_t = 32)]
    max_video_frames: usize,
    /// Fetch `http(s)://` images (public addresses only, 3 redirects, 10 s).
    #[arg(long, env = "CLEF_ALLOW_REMOTE_IMAGES", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    allow_remote_images: bool,
}

impl MediaArgs {
    fn limits(&self) -> clef_tt::media::MediaLimits {
        clef_tt::media::MediaLimits {
            max_images: self.max_images,
            max_image_bytes: self.max_image_bytes,
            max_image_pixels: self.max_image_pixels,
            max_total_bytes: self.max_media_bytes,
            max_videos: self.max_videos,
            max_frames: self.max_video_frames,
            remote: clef_tt::media::remote::RemoteImages {
                enabled: self.allow_remote_images,
                allow: Vec::new(),
            },
        }
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, env = "CLEF_HOST", default_value = "127.0.0.1")]
    host: String,
    #[arg(long, env = "CLEF_PORT", default_value_t = 8008)]
    port: u16,
    /// Workers (one mesh each).
    #[arg(long, env = "CLEF_WORKERS", default_value_t = 1)]
    workers: usize,
    /// Requests that may wait for a worker; more get 429.
    #[arg(long, env = "CLEF_MAX_QUEUE", default_value_t = 64)]
    max_queue: usize,
    #[command(flatten)]
    limits: LengthArgs,
    #[command(flatten)]
    media: MediaArgs,
    /// Require `Authorization: Bearer <key>` on everything but /health.
    #[arg(long, env = "CLEF_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Comma-separated model names to serve; unset accepts and echoes any name.
    #[arg(long, env = "CLEF_MODEL_NAMES", value_delimiter = ',')]
    model_names: Vec<String>,
    /// Answer one request per worker before reporting ready.
    #[arg(long, env = "CLEF_WARMUP", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "1")]
    warmup: bool,
    /// Add the hosted API's rules (instructions required, id pattern, 2+ options and levels).
    #[arg(long, env = "CLEF_STRICT", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    strict: bool,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "CLEF_MAX_BODY_BYTES", default_value_t = 13 << 20)]
    max_body_bytes: usize,
    /// Serve the browser demo page at `/` (0 turns it off).
    #[arg(long, env = "CLEF_DEMO", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "1")]
    demo: bool,
    /// A serve profile (profiles/p150x2.toml, p150x4.toml): its `port` and `[env]` settings
    /// apply where neither a flag nor the environment sets them.
    #[arg(long)]
    settings: Option<PathBuf>,
    /// Load the weights from a tensor cache written by `clef-tt convert` for the same model,
    /// mesh and profile (refused, with the command to rebuild it, when anything differs).
    #[arg(long, env = "CLEF_TENSOR_CACHE")]
    tensor_cache: Option<PathBuf>,
    /// State prefixes each worker keeps (0 disables the prefix cache).
    #[arg(long, env = "CLEF_PREFIX_CACHE", default_value_t = 4)]
    prefix_cache: usize,
    /// Bytes all prefix cache slots may hold together (e.g. 2GiB); unset: half the memory
    /// available at start.
    #[arg(long, env = "CLEF_PREFIX_CACHE_BYTES", value_parser = parse_bytes)]
    prefix_cache_bytes: Option<usize>,
    /// Cache prefixes at whole prefill passes (see README, "Prefix cache").
    #[arg(long, env = "CLEF_PLANNER", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    planner: bool,
}

/// A byte count: digits with an optional `KiB`/`MiB`/`GiB` (or `K`/`M`/`G`) suffix.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 2147483648 or 2GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        other => return Err(format!("unknown byte unit {other:?} (KiB, MiB, GiB)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill tokens/s for each weight format, mesh and length.
    Prefill {
        #[arg(long, env = "CLEF_MODEL")]
        model: Option<String>,
        /// Prompt lengths in tokens.
        #[arg(long, value_delimiter = ',', default_value = "512,2048")]
        tokens: Vec<usize>,
        /// Weight formats (f32, bf16).
        #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
        weights: Vec<String>,
        /// Mesh shapes.
        #[arg(long, value_delimiter = ',', default_value = "1x1,1x2")]
        mesh: Vec<String>,
        /// Timed runs per configuration (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Print the wall time of every device op (per prefill, warm-up included).
        #[arg(long)]
        profile: bool,
    },
    /// Latency (new / repeated state) and requests per second of a running server.
    Http {
        #[arg(long, default_value = "http://127.0.0.1:8008")]
        url: String,
        /// Measured requests per latency case (medians are reported; the package's protocol:
        /// 20).
        #[arg(long, default_value_t = 6)]
        samples: usize,
        /// Unmeasured requests before each latency case (the package's: 2).
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// State tokens of the long-state case.
        #[arg(long, default_value_t = 2200)]
        long_tokens: usize,
        /// Samples of the case at the server's state limit (0 skips it; the package's protocol
        /// is 3 after 1 warm-up).
        #[arg(long, default_value_t = 0)]
        limit_samples: usize,
        #[arg(long, default_value_t = 1)]
        limit_warmup: usize,
        /// Concurrent clients of the throughput runs (empty skips them).
        #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
        clients: Vec<usize>,
        /// Requests per throughput pass (the package's protocol: 256).
        #[arg(long, default_value_t = 12)]
        requests: usize,
        /// Distinct states the throughput requests cycle through (the package's: 64).
        #[arg(long, default_value_t = 6)]
        states: usize,
        /// Stop taking new samples after this many seconds.
        #[arg(long, default_value_t = 900.0)]
        max_seconds: f64,
        /// Also write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The Clef-27B vision tower (random weights) per image on CPU meshes.
    Vision {
        /// Image sizes, width x height (multiples of 32).
        #[arg(long, value_delimiter = ',', default_value = "448x448,1344x1344")]
        sizes: Vec<String>,
        /// Mesh shapes to run the tower on (its TP=2 plan on 1x2).
        #[arg(long, value_delimiter = ',', default_value = "1x1")]
        mesh: Vec<String>,
        /// Format of the tower's matrices (f32, bf16, bfp8_b, bfp4_b).
        #[arg(long, default_value = "f32")]
        format: String,
        /// Also print the time spent in each mesh op.
        #[arg(long)]
        profile: bool,
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Joint head time at Clef-27B width (random weights), 6 questions of 2-5 options.
    Head {
        /// Memory rows (prompt tokens).
        #[arg(long, value_delimiter = ',', default_value = "300,2200,16384")]
        rows: Vec<usize>,
        #[arg(long, default_value_t = 3)]
        repeat: usize,
    },
}

/// How long a client waits for one reply (a 16k-token miss on the CPU takes minutes).
const HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

/// `CLEF_API_KEY`, for the HTTP client commands.
fn api_key() -> Option<String> {
    std::env::var("CLEF_API_KEY").ok().filter(|k| !k.is_empty())
}

fn weight_format(name: &str) -> anyhow::Result<WeightFormat> {
    WeightFormat::parse(name).ok_or_else(|| {
        anyhow::anyhow!("unknown weight format {name:?} (f32, bf16, bfp8_b, bfp4_b)")
    })
}

/// A serve profile file (`serve --settings FILE`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    port: Option<u16>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

/// The environment variables `serve` reads (from its flags' definitions).
fn serve_env_names() -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut names: Vec<String> = cmd
        .find_subcommand("serve")
        .map(|s| {
            s.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.push("HF_MODEL".into());
    names
}

/// For `serve --settings FILE`: set the file's variables that the environment does not set
/// yet, before the flags are parsed, so flags > environment > file > defaults.
fn apply_settings_file() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("serve") {
        return Ok(());
    }
    let path = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--settings=")
            .map(str::to_string)
            .or_else(|| {
                (a == "--settings")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
    });
    let Some(path) = path else { return Ok(()) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let file: SettingsFile = toml::from_str(&text).with_context(|| format!("parsing {path}"))?;
    let known = serve_env_names();
    let mut env = file.env;
    if let Some(port) = file.port {
        env.entry("CLEF_PORT".into()).or_insert(port.to_string());
    }
    for (key, value) in env {
        if !known.contains(&key) {
            bail!("{path}: {key} is not a setting of clef-tt serve");
        }
        if std::env::var_os(&key).is_none() {
            std::env::set_var(&key, value);
        }
    }
    Ok(())
}

/// A pipeline on the CPU mesh `shape` under precision profile `profile`.
fn cpu_pipeline(
    ckpt: &Checkpoint,
    shape: MeshShape,
    profile: &Precision,
) -> anyhow::Result<Pipeline<CpuMesh>> {
    let mesh = CpuMesh::new(shape).with_numerics(profile.numerics());
    Ok(Pipeline::load(
        ckpt,
        mesh,
        &profile.weight_formats(),
        profile.bf16_embeddings(),
    )?)
}

/// `--model` / `CLEF_MODEL`, else `HF_MODEL` (what tt-model launchers set), else `None` for the
/// built-in model.
fn requested_model(model: Option<String>) -> Option<String> {
    model.or_else(|| std::env::var("HF_MODEL").ok().filter(|m| !m.is_empty()))
}

fn resolve(model: Option<String>, revision: Option<&str>) -> anyhow::Result<PathBuf> {
    Ok(match requested_model(model) {
        Some(name) => resolve_model_dir(&name, revision)?,
        None => default_model_dir(),
    })
}

fn open(model: Option<String>, revision: Option<&str>) -> anyhow::Result<Checkpoint> {
    let dir = resolve(model, revision)?;
    Checkpoint::open(&dir).with_context(|| format!("opening {}", dir.display()))
}

/// Keep freed activation buffers in the heap instead of returning them to the kernel: a
/// prefill allocates and frees tens of megabytes per op, and with glibc's defaults every such
/// buffer is a fresh mmap whose page faults and unmap IPIs cost more than the op itself.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes glibc malloc's tunables; called before any other thread.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CLEF_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    apply_settings_file()?;
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => {
            let is_default_model = requested_model(a.model.model.clone()).is_none();
            let model_dir = resolve(a.model.model.clone(), a.model.revision.as_deref())?;
            cli::serve::run(cli::serve::ServeOptions {
                model_dir,
                is_default_model,
                revision: a.model.revision.clone(),
                host: a.host,
                port: a.port,
                workers: a.workers,
                mesh: a.model.mesh.parse()?,
                precision: Precision::from_env(&a.model.precision)?,
                max_queue: a.max_queue,
                rule: a.limits.rule(),
                api_key: a.api_key,
                model_names: a
                    .model_names
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect(),
                warmup: a.warmup,
                strict: a.strict,
                max_body_bytes: a.max_body_bytes,
                demo: a.demo,
                media_limits: a.media.limits(),
                tensor_cache: a.tensor_cache,
                prefix_cache: cli::serve::PrefixCacheOptions {
                    slots: a.prefix_cache,
                    max_bytes: a.prefix_cache_bytes,
                    planner: a.planner,
                },
            })?;
        }
        Command::Inspect { model, revision } => {
            let ckpt = open(model, revision.as_deref())?;
            let (text, problems) = cli::inspect::report(&ckpt)?;
            print!("{text}");
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("inconsistent: {p}");
                }
                bail!("{} inconsistencies", problems.len());
            }
            println!("ok");
        }
        Command::Decide {
            model,
            max_length,
            limits,
            url,
            file,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            if let Some(url) = url {
                let client = cli::http_client::Client::new(&url, api_key(), HTTP_TIMEOUT);
                let stdout = std::io::stdout();
                let n = cli::decide::run_remote(&client, &text, &mut stdout.lock())?;
                eprintln!("answered {n} requests");
                return Ok(());
            }
            let ckpt = open(model.model.clone(), model.revision.as_deref())?;
            let mesh: MeshShape = model.mesh.parse()?;
            let pipeline = cpu_pipeline(&ckpt, mesh, &Precision::from_env(&model.precision)?)?;
            let rule = match max_length {
                Some(max_length) => LengthRule::Reference { max_length },
                None => limits.rule(),
            };
            let stdout = std::io::stdout();
            let n = cli::decide::run(&pipeline, &text, rule, &mut stdout.lock())?;
            eprintln!("answered {n} requests");
        }
        Command::Eval {
            model,
            goldens,
            profile,
            mesh,
        } => {
            let ckpt = open(model, None)?;
            let precision = Precision::from_env(&profile)?;
            let pipeline = cpu_pipeline(&ckpt, mesh.parse()?, &precision)?;
            let report = cli::eval::run(&pipeline, &goldens)?;
            for (id, err) in &report.failures {
                eprintln!("{id}: {err}");
            }
            eprintln!("{} records scored", report.records);
            println!("{}", cli::eval::summary(&precision.name, &report));
        }
        Command::Convert {
            model,
            profile,
            mesh,
            out,
        } => {
            let ckpt = open(model, None)?;
            let precision = Precision::from_env(&profile)?;
            let shape: MeshShape = mesh.parse()?;
            let mesh = CpuMesh::new(shape);
            let t0 = std::time::Instant::now();
            let (pb, report) = cli::progress::bar("converting");
            let manifest = clef_tt::tensor_cache::convert(
                &ckpt,
                &mesh,
                &precision.name,
                &precision.weight_formats(),
                &out,
                &report,
            )?;
            pb.finish_and_clear();
            let bytes: u64 = manifest.entries.iter().map(|e| e.bytes).sum();
            eprintln!(
                "wrote {} ({} entries, {:.1} MiB) in {:.1} s",
                out.display(),
                manifest.entries.len(),
                bytes as f64 / (1 << 20) as f64,
                t0.elapsed().as_secs_f64()
            );
        }
        Command::MakeRandom { shape, out, seed } => {
            make_random(shape, &out, seed, &default_model_dir())?;
            let ckpt = Checkpoint::open(&out)?;
            eprintln!(
                "wrote {} ({} text tensors)",
                out.display(),
                ckpt.tensors.iter().count()
            );
        }
        Command::Bench { what } => match what {
            BenchCommand::Prefill {
                model,
                tokens,
                weights,
                mesh,
                repeat,
                profile,
            } => {
                let ckpt = open(model, None)?;
                let formats = weights
                    .iter()
                    .map(|w| weight_format(w))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let meshes = mesh
                    .iter()
                    .map(|m| m.parse::<MeshShape>())
                    .collect::<Result<Vec<_>, _>>()?;
                let rows = cli::bench::prefill(&ckpt, &formats, &meshes, &tokens, repeat, profile)?;
                print!("{}", cli::bench::table(&rows));
                if let Some(mib) = cli::bench::peak_rss_mib() {
                    println!("peak resident memory of the run: {mib:.0} MiB");
                }
            }
            BenchCommand::Http {
                url,
                samples,
                warmup,
                long_tokens,
                limit_samples,
                limit_warmup,
                clients,
                requests,
                states,
                max_seconds,
                json,
            } => {
                let client = cli::http_client::Client::new(&url, api_key(), HTTP_TIMEOUT);
                let options = cli::bench_http::HttpBenchOptions {
                    samples,
                    warmup,
                    long_tokens,
                    limit_samples,
                    limit_warmup,
                    clients,
                    requests,
                    states,
                    max_seconds,
                };
                let report = cli::bench_http::run(&client, &url, &options)?;
                if let Some(path) = json {
                    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                print!("{}", cli::bench_http::markdown(&report));
            }
            BenchCommand::Vision {
                sizes,
                mesh,
                format,
                profile,
                repeat,
            } => {
                let sizes = sizes
                    .iter()
                    .map(|s| {
                        let (w, h) = s
                            .split_once('x')
                            .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
                            .filter(|&(w, h): &(usize, usize)| {
                                w % 32 == 0 && h % 32 == 0 && w > 0 && h > 0
                            })
                            .ok_or_else(|| {
                                anyhow::anyhow!("{s:?} is not WIDTHxHEIGHT in multiples of 32")
                            })?;
                        Ok((w, h))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let format = weight_format(&format)?;
                let mut rows = Vec::new();
                for shape in &mesh {
                    let shape = shape.parse()?;
                    let mesh = if profile {
                        CpuMesh::with_profile(shape)
                    } else {
                        CpuMesh::new(shape)
                    };
                    rows.extend(cli::bench::vision(&mesh, format, &sizes, repeat)?);
                    for (op, seconds, calls) in mesh.profile_report() {
                        eprintln!("  {shape} {op:>20}: {seconds:8.2} s in {calls} calls");
                    }
                }
                print!("{}", cli::bench::vision_table(&rows));
            }
            BenchCommand::Head { rows, repeat } => {
                let rows = cli::bench::head(&rows, repeat)?;
                let peak = clef_device::cpu::fma_peak_gflops();
                print!("{}", cli::bench::head_table(&rows, peak));
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn the_serve_profiles_set_only_variables_serve_reads() {
        let known = super::serve_env_names();
        assert!(known.contains(&"CLEF_PREFIX_CACHE".to_string()));
        for name in ["p150x2", "p150x4"] {
            let path = format!("{}/profiles/{name}.toml", env!("CARGO_MANIFEST_DIR"));
            let file: super::SettingsFile =
                toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(file.port, Some(8008));
            for key in file.env.keys() {
                assert!(known.contains(key), "{name}: {key}");
            }
        }
    }

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1k"), Ok(1024));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }
}
