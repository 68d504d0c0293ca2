//! The command line's shape: every subcommand, flag and `CLEF_*` variable (clap derive).

use clap::{Parser, Subcommand};
use clef_device::MeshShape;
use clef_tt::checkpoint::shapes::Shape;
use clef_tt::encode::LengthRule;
use clef_tt::precision::parse_flag;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "clef-tt",
    version,
    about = "Cloudflare Clef decision models on Tenstorrent and CPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve the HTTP API (POST /v1/systemone, GET /v1/models, /health, /metrics).
    Serve(ServeArgs),
    /// Print the OpenAPI 3.1 document `serve` with the same flags would publish at
    /// /openapi.json (no weights loaded, no server started).
    Openapi(ServeArgs),
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
        #[command(flatten)]
        placed: ProfileArgs,
        /// A goldens directory (requests.jsonl + expected_f32.jsonl), e.g.
        /// tests/fixtures/tiny-clef/goldens.
        #[arg(long)]
        goldens: PathBuf,
    },
    /// Compare a device with the CPU layer by layer: every request of FILE (a request body
    /// per line) runs on both under the profile, and every layer's outputs are compared
    /// (docs/tenstorrent.md, "The layer trace"). Exit 0: all within tolerance; 1: something
    /// is outside (the first layer and quantity named); 2: any other error.
    CompareLayers {
        #[command(flatten)]
        placed: ProfileArgs,
        #[command(flatten)]
        limits: LengthArgs,
        file: PathBuf,
    },
    /// Write a tensor cache: the text weights split per device and packed for a mesh, a
    /// precision profile and a device backend, for `serve --tensor-cache`.
    Convert {
        #[command(flatten)]
        placed: ProfileArgs,
        #[arg(long)]
        out: PathBuf,
    },
    /// Which device backend is available: the CPU, or the Tenstorrent shim (path, ABI version,
    /// backend, devices visible, whether a 1x1 and a 1x2 mesh open); exits non-zero with the
    /// reason when the asked device cannot be used.
    Devices {
        #[command(flatten)]
        device: DeviceArgs,
        /// Load the device's backend and stop before any device is touched: for `tt`, the shim,
        /// its embedded CPython (the version it was built for), `import ttnn` and the op
        /// package's ttnn version check. What an image build can check without chips.
        #[arg(long)]
        check: bool,
    },
    /// The device performance model: weights per device, and FLOPs, DRAM and link bytes and a
    /// predicted time of every op of one prefill chunk (and of the vision tower) at the p150's
    /// ceilings, computed from the TP plans.
    Plan {
        #[arg(long, value_enum, default_value = "clef-27b")]
        shape: Shape,
        #[arg(long, default_value = "1x2")]
        mesh: MeshShape,
        /// Precision profile (its weight formats and fidelity).
        #[arg(long = "precision", default_value = "selected")]
        profile: String,
        /// Tokens of the modelled chunk (the port caps chunks at 1,024).
        #[arg(long, default_value_t = 1024)]
        tokens: usize,
        /// Position the chunk starts at (its queries see the keys before it).
        #[arg(long, default_value_t = 0)]
        start: usize,
        /// Patches of the modelled image (Clef-27B's tower).
        #[arg(long, default_value_t = 1024)]
        patches: usize,
        /// Also place the plan on a Tenstorrent mesh through the shim, without host data:
        /// every weight, the prefix cache's slots and one chunk's working set, with the bytes
        /// the device's allocator holds per class (fails naming a class that does not fit).
        #[arg(long)]
        on_device: bool,
        /// The shim for --on-device (default: as --device tt finds it).
        #[arg(long, env = "CLEF_TT_SHIM")]
        tt_shim: Option<PathBuf>,
        /// Prefix-cache slots placed with --on-device.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Tokens of each placed slot.
        #[arg(long, default_value_t = 16384)]
        slot_tokens: usize,
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
pub struct ModelArgs {
    /// Snapshot directory or hub id in the local HF cache (default: the built-in demo model).
    #[arg(long, env = "CLEF_MODEL")]
    pub model: Option<String>,
    /// Revision of a hub id.
    #[arg(long, env = "CLEF_REVISION")]
    pub revision: Option<String>,
    /// Mesh shape of each worker's device (1x1, 1x2).
    #[arg(long, env = "CLEF_MESH_SHAPE", default_value = "1x1")]
    pub mesh: MeshShape,
    /// Precision profile (profiles/*.json): f32 (the reference's numbers), bf16, selected,
    /// stage1 or fast; knobs can be overridden by environment variables (README). Default:
    /// f32 on the CPU, selected on Tenstorrent.
    #[arg(long, env = "CLEF_PRECISION")]
    pub precision: Option<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// A model placed on one mesh under a precision profile (`eval`, `convert`).
#[derive(clap::Args)]
pub struct ProfileArgs {
    #[arg(long, env = "CLEF_MODEL")]
    pub model: Option<String>,
    /// Precision profile (f32, bf16, selected, stage1, fast; default: f32 on the CPU,
    /// selected on Tenstorrent).
    #[arg(long = "precision", env = "CLEF_PRECISION")]
    pub profile: Option<String>,
    #[arg(long, env = "CLEF_MESH_SHAPE", default_value = "1x1")]
    pub mesh: MeshShape,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// The device a command runs on.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// `cpu` (the reference CPU mesh) or `tt` (a Tenstorrent mesh through the shim library).
    #[arg(long, env = "CLEF_DEVICE", default_value = "cpu", value_parser = ["cpu", "tt"])]
    pub device: String,
    /// The shim library for `--device tt` (default: libclef_tt.so, then libclef_tt_host.so
    /// next to the binary, then the host shim this build made).
    #[arg(long, env = "CLEF_TT_SHIM")]
    pub tt_shim: Option<PathBuf>,
}

/// The server's prompt length limits.
#[derive(clap::Args)]
pub struct LengthArgs {
    /// Token limit of the state piece (system prompt, media, state).
    #[arg(long, env = "CLEF_MAX_STATE", default_value_t = 16384)]
    pub max_state: usize,
    /// Token limit of the tail (schema and suffix).
    #[arg(long, env = "CLEF_MAX_TAIL", default_value_t = 4096)]
    pub max_tail: usize,
    /// Keep the first state tokens when the state piece is too long.
    #[arg(long, env = "CLEF_TRUNCATE_STATES", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    pub truncate_states: bool,
}

impl LengthArgs {
    pub fn rule(&self) -> LengthRule {
        LengthRule::Server {
            max_state: self.max_state,
            max_tail: self.max_tail,
            truncate: self.truncate_states,
        }
    }
}

/// Bounds on images and videos (docs/serving.md, "Configuration").
#[derive(clap::Args)]
pub struct MediaArgs {
    /// Images per request.
    #[arg(long, env = "CLEF_MAX_IMAGES", default_value_t = 4)]
    pub max_images: usize,
    /// Base64-decoded bytes of one image or video frame (e.g. 4MiB).
    #[arg(long, env = "CLEF_MAX_IMAGE_BYTES", value_parser = parse_bytes, default_value = "4MiB")]
    pub max_image_bytes: usize,
    /// Pixels of one decoded image or frame.
    #[arg(long, env = "CLEF_MAX_IMAGE_PIXELS", default_value_t = 16 << 20)]
    pub max_image_pixels: u64,
    /// Base64-decoded bytes of all images and frames of a request.
    #[arg(long, env = "CLEF_MAX_MEDIA_BYTES", value_parser = parse_bytes, default_value = "8MiB")]
    pub max_media_bytes: usize,
    /// Videos per request.
    #[arg(long, env = "CLEF_MAX_VIDEOS", default_value_t = 4)]
    pub max_videos: usize,
    /// Frames per video.
    #[arg(long, env = "CLEF_MAX_VIDEO_FRAMES", default_value_t = 32)]
    pub max_video_frames: usize,
    /// Fetch `http(s)://` images (public addresses only, 3 redirects, 10 s).
    #[arg(long, env = "CLEF_ALLOW_REMOTE_IMAGES", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    pub allow_remote_images: bool,
}

impl MediaArgs {
    pub fn limits(&self) -> clef_tt::media::MediaLimits {
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
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, env = "CLEF_HOST", default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, env = "CLEF_PORT", default_value_t = 8008)]
    pub port: u16,
    /// Workers (one mesh each).
    #[arg(long, env = "CLEF_WORKERS", default_value_t = 1)]
    pub workers: usize,
    /// Tenstorrent: open this parent mesh (e.g. 1x4) and give each worker a submesh of it
    /// (default with several workers: a parent as wide as all of them).
    #[arg(long, env = "CLEF_PARENT_MESH")]
    pub parent_mesh: Option<MeshShape>,
    /// Tenstorrent: the parent column of the first worker's submesh (worker i: + i x cols).
    #[arg(long, env = "CLEF_SUBMESH_OFFSET", default_value_t = 0)]
    pub submesh_offset: usize,
    /// Requests that may wait for a worker; more get 429.
    #[arg(long, env = "CLEF_MAX_QUEUE", default_value_t = 64)]
    pub max_queue: usize,
    #[command(flatten)]
    pub limits: LengthArgs,
    #[command(flatten)]
    pub media: MediaArgs,
    /// Require `Authorization: Bearer <key>` on everything but /health.
    #[arg(long, env = "CLEF_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The account id the Workers AI route (`/client/v4/accounts/{id}/ai/run/...`) accepts;
    /// unset accepts any.
    #[arg(long, env = "CLEF_ACCOUNT_ID")]
    pub account_id: Option<String>,
    /// Comma-separated model names to serve; unset accepts and echoes any name.
    #[arg(long, env = "CLEF_MODEL_NAMES", value_delimiter = ',')]
    pub model_names: Vec<String>,
    /// Answer one request per worker before reporting ready.
    #[arg(long, env = "CLEF_WARMUP", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "1")]
    pub warmup: bool,
    /// Add the hosted API's rules (instructions required, id pattern, 2+ options and levels).
    #[arg(long, env = "CLEF_STRICT", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    pub strict: bool,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "CLEF_MAX_BODY_BYTES", default_value_t = 13 << 20)]
    pub max_body_bytes: usize,
    /// A body refused before it was read (413, 401, 415) is read and discarded up to this many
    /// bytes before the answer, so clients that send it all first read the answer; past it the
    /// connection is cut. Default: the larger of 4x --max-body-bytes and 128 MiB.
    #[arg(long, env = "CLEF_DRAIN_MAX_BYTES")]
    pub drain_max_bytes: Option<u64>,
    /// The time bound of that draining, in seconds.
    #[arg(long, env = "CLEF_DRAIN_SECS", default_value_t = 5.0)]
    pub drain_secs: f64,
    /// Serve the browser demo page at `/` (0 turns it off).
    #[arg(long, env = "CLEF_DEMO", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "1")]
    pub demo: bool,
    /// A serve profile: a file (profiles/p150x2.toml) or a built-in one by name (p150x2,
    /// p150x4); its `port` and `[env]` settings apply where neither a flag nor the environment
    /// sets them.
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// Load the weights from a tensor cache written by `clef-tt convert` for the same model,
    /// mesh and profile (refused, with the command to rebuild it, when anything differs).
    #[arg(long, env = "CLEF_TENSOR_CACHE")]
    pub tensor_cache: Option<PathBuf>,
    /// Keep converted weights under DIR (tt-model mounts one there): the first start converts
    /// the checkpoint into DIR/clef-tt/<backend>-<mesh>-<profile>/, later starts load it (a
    /// stale one is converted again). `--tensor-cache` takes precedence.
    #[arg(long, env = "TT_CACHE_PATH", value_name = "DIR")]
    pub tensor_cache_root: Option<PathBuf>,
    /// A line written to stderr once the server is ready (listening, every worker warmed up),
    /// for a supervisor that watches the log (the tt-model launcher sets tt-model's ready line).
    #[arg(long, env = "CLEF_READY_MESSAGE")]
    pub ready_message: Option<String>,
    /// Seconds the requests in flight get after SIGTERM before the server stops anyway
    /// (tt-model kills a container 120 s after SIGTERM).
    #[arg(long, env = "CLEF_SHUTDOWN_TIMEOUT", default_value_t = 90)]
    pub shutdown_timeout: u64,
    /// The device deadline, in seconds: a worker whose device makes no progress (a request's
    /// start, each prefill chunk) for this long turns /health to 503, every decision gets a
    /// 503, and the server exits with status 75 after its shutdown timeout, for its
    /// supervisor to reset the chips and restart it. Default: 300 on `tt`
    /// (docs/reliability.md, "A hung device"), none on the CPU; 0 turns it off.
    #[arg(long, env = "CLEF_DEVICE_TIMEOUT", value_name = "SECONDS")]
    pub device_timeout: Option<f64>,
    /// Prompt tokens of one packed prefill pass: a worker packs the short requests queued
    /// together into one pass of at most this many tokens (0 turns packing off). Default:
    /// 1024 (one prefill chunk) on `tt`, 0 on the CPU (where it measured no gain).
    #[arg(long, env = "CLEF_PACK_TOKENS", value_name = "TOKENS")]
    pub pack_tokens: Option<usize>,
    /// Milliseconds a worker that took a request waits for more to pack with it (0: it packs
    /// what is queued and waits for no one).
    #[arg(long, env = "CLEF_PACK_WAIT_MS", default_value_t = 0)]
    pub pack_wait_ms: u64,
    /// State prefixes each worker keeps (0 disables the prefix cache).
    #[arg(long, env = "CLEF_PREFIX_CACHE", default_value_t = 4)]
    pub prefix_cache: usize,
    /// Bytes all prefix cache slots may hold together (e.g. 2GiB); unset: half the memory
    /// available at start.
    #[arg(long, env = "CLEF_PREFIX_CACHE_BYTES", value_parser = parse_bytes)]
    pub prefix_cache_bytes: Option<usize>,
    /// Cache prefixes at whole prefill passes (see docs/prefix-cache.md, "Prefix cache").
    #[arg(long, env = "CLEF_PLANNER", value_parser = parse_flag, action = clap::ArgAction::Set, default_value = "0")]
    pub planner: bool,
}

/// A byte count: digits with an optional `KiB`/`MiB`/`GiB` (or `K`/`M`/`G`) suffix.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
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
pub enum BenchCommand {
    /// Prefill tokens/s for each weight format, mesh and length.
    Prefill {
        #[arg(long, env = "CLEF_MODEL")]
        model: Option<String>,
        /// Prompt lengths in tokens (with --shape: chunk lengths; default 128,512,1024).
        #[arg(long, value_delimiter = ',')]
        tokens: Vec<usize>,
        /// Precision profiles (f32, bf16, selected, stage1, fast): weight formats and the
        /// numerics they are served with (bf16 activations under bf16, for example). Default
        /// f32,bf16; with --shape, selected.
        #[arg(long, value_delimiter = ',')]
        precision: Vec<String>,
        /// Measure one prefill chunk of this model shape instead of a checkpoint (`--device tt`
        /// only): synthetic weights allocated on the devices, never uploaded; device ops (ttnn's
        /// graph capture), ttnn and ABI calls, host ms and data movement per chunk.
        #[arg(long, value_enum)]
        shape: Option<clef_tt::checkpoint::shapes::Shape>,
        /// With --shape: positions the measured chunks start at (reached by prefilling first).
        #[arg(long, value_delimiter = ',', default_value = "0,15360")]
        start: Vec<usize>,
        /// With --shape: fail when a chunk takes more device ops than this (a count, not a
        /// timing: CI holds Clef 27B's 128-token chunk to 1,800 this way).
        #[arg(long)]
        max_device_ops: Option<u64>,
        /// Mesh shapes.
        #[arg(long, value_delimiter = ',', default_value = "1x1,1x2")]
        mesh: Vec<MeshShape>,
        /// Timed runs per configuration (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Print the wall time of every device op (per prefill, warm-up included; CPU only).
        #[arg(long)]
        op_times: bool,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Latency (new / repeated state) and requests per second of a running server.
    Http {
        #[arg(long, default_value = "http://127.0.0.1:8008")]
        url: String,
        #[command(flatten)]
        options: clef_tt::bench::http::HttpBenchOptions,
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
        mesh: Vec<MeshShape>,
        /// Format of the tower's matrices (f32, bf16, bfp8_b, bfp4_b).
        #[arg(long, default_value = "f32")]
        format: String,
        /// Also print the time spent in each mesh op.
        #[arg(long)]
        op_times: bool,
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

#[cfg(test)]
mod tests {
    use super::parse_bytes;

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
