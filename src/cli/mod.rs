//! The `clef-tt` command line: `args` defines it, `main` dispatches each subcommand to its
//! module (`serve`, `convert`) or to the library (`decide`: `api::lines`; `inspect`, `eval`,
//! `plan`, `bench`; `devices`: `clef_device::select`); `device` picks the CPU mesh or a
//! Tenstorrent mesh for the commands that run the model.

pub mod args;
pub mod convert;
pub mod device;
#[cfg(test)]
mod doc_commands;
pub mod progress;
pub mod serve;
mod settings;

use anyhow::{bail, Context};
use args::{BenchCommand, Cli, Command};
use clap::Parser;
use clef_device::select::{Backend, MeshLayout};
use clef_device::{MeshOps, WeightFormat};
use clef_tt::api::client::Client;
use clef_tt::bench;
use clef_tt::checkpoint::{default_model_dir, resolve_model_dir, Checkpoint};
use clef_tt::encode::LengthRule;
use clef_tt::engine::Pipeline;
use clef_tt::precision::Precision;
use clef_tt::random::make_random;
use device::on_device;
use std::path::PathBuf;

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

/// A pipeline on `mesh` under precision profile `profile` (the mesh carries its numerics).
fn pipeline<B: MeshOps>(
    ckpt: &Checkpoint,
    mesh: B,
    profile: &Precision,
) -> anyhow::Result<Pipeline<B>> {
    Ok(Pipeline::load(ckpt, mesh, profile)?)
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

impl args::ProfileArgs {
    /// The checkpoint, the device, the profile (the device's default when none is asked)
    /// and the one mesh.
    fn resolve(&self) -> anyhow::Result<(Checkpoint, Backend, Precision, MeshLayout)> {
        let ckpt = open(self.model.clone(), None)?;
        let device = self.device.resolve()?;
        let precision = device::precision(&device, self.profile.as_deref())?;
        Ok((ckpt, device, precision, MeshLayout::single(self.mesh)))
    }
}

/// `compare-layers`: the reports printed; the first quantity outside its tolerance, if any.
fn compare_layers(
    placed: &args::ProfileArgs,
    rule: LengthRule,
    file: &std::path::Path,
) -> anyhow::Result<Option<String>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let (ckpt, device, precision, layout) = placed.resolve()?;
    let numerics = precision.numerics();
    let cpu = clef_device::cpu::CpuMesh::new(layout.shape).with_numerics(numerics);
    let reference = pipeline(&ckpt, cpu, &precision)?;
    let stdout = std::io::stdout();
    let reports = on_device!(&device, layout, numerics, |open| {
        let tested = pipeline(&ckpt, open(0)?, &precision)?;
        clef_tt::compare::run(
            &reference,
            &tested,
            &text,
            rule,
            &precision.name,
            &mut stdout.lock(),
        )?
    });
    let first = reports.iter().find_map(|r| {
        r.first_failure().map(|row| {
            format!(
                "line {}: {} (rel error {:.2e}, tolerance {:.0e}; worst {:.2e}, tolerance {:.0e})",
                r.line, row.name, row.rel, row.tol.rel, row.worst, row.tol.worst
            )
        })
    });
    let within = reports
        .iter()
        .filter(|r| r.first_failure().is_none())
        .count();
    eprintln!("{within} of {} requests within tolerance", reports.len());
    Ok(first)
}

/// The binary's entry point.
pub fn main() -> anyhow::Result<()> {
    tune_allocator();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CLEF_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    settings::apply_settings_file()?;
    match Cli::parse().command {
        Command::Serve(a) => serve::run(serve::options(a)?),
        Command::Openapi(a) => serve::print_openapi(&serve::options(a)?),
        Command::Inspect { model, revision } => {
            let ckpt = open(model, revision.as_deref())?;
            let (text, problems) = clef_tt::checkpoint::inspect::report(&ckpt)?;
            print!("{text}");
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("inconsistent: {p}");
                }
                bail!("{} inconsistencies", problems.len());
            }
            println!("ok");
            Ok(())
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
            let stdout = std::io::stdout();
            let n = match url {
                Some(url) => {
                    let client = Client::new(&url, api_key(), HTTP_TIMEOUT);
                    clef_tt::api::lines::run_remote(&client, &text, &mut stdout.lock())?
                }
                None => {
                    let ckpt = open(model.model.clone(), model.revision.as_deref())?;
                    let device = model.device.resolve()?;
                    let precision = device::precision(&device, model.precision.as_deref())?;
                    let rule = match max_length {
                        Some(max_length) => LengthRule::Reference { max_length },
                        None => limits.rule(),
                    };
                    let layout = MeshLayout::single(model.mesh);
                    on_device!(&device, layout, precision.numerics(), |open| {
                        let p = pipeline(&ckpt, open(0)?, &precision)?;
                        clef_tt::api::lines::run(&p, &text, rule, &mut stdout.lock())?
                    })
                }
            };
            eprintln!("answered {n} requests");
            Ok(())
        }
        Command::Eval { placed, goldens } => {
            let (ckpt, device, precision, layout) = placed.resolve()?;
            let report = on_device!(&device, layout, precision.numerics(), |open| {
                clef_tt::engine::eval::run(&pipeline(&ckpt, open(0)?, &precision)?, &goldens)?
            });
            for (id, err) in &report.failures {
                eprintln!("{id}: {err}");
            }
            eprintln!("{} records scored", report.records);
            println!(
                "{}",
                clef_tt::engine::eval::summary(&precision.name, &report)
            );
            Ok(())
        }
        Command::CompareLayers {
            placed,
            limits,
            file,
        } => match compare_layers(&placed, limits.rule(), &file) {
            Ok(None) => Ok(()),
            Ok(Some(first)) => {
                eprintln!("outside tolerance: {first}");
                std::process::exit(1)
            }
            Err(e) => {
                eprintln!("Error: {e:#}");
                std::process::exit(2)
            }
        },
        Command::Convert { placed, out } => {
            let (ckpt, device, precision, layout) = placed.resolve()?;
            on_device!(&device, layout, precision.numerics(), |open| {
                convert::run(&ckpt, &open(0)?, &precision, &out)?
            });
            Ok(())
        }
        Command::MakeRandom { shape, out, seed } => {
            make_random(shape, &out, seed, &default_model_dir())?;
            let ckpt = Checkpoint::open(&out)?;
            eprintln!(
                "wrote {} ({} text tensors)",
                out.display(),
                ckpt.tensors.iter().count()
            );
            Ok(())
        }
        Command::Plan {
            shape,
            mesh,
            profile,
            tokens,
            start,
            patches,
            on_device,
            tt_shim,
            slots,
            slot_tokens,
        } => {
            let (text, _) = clef_tt::checkpoint::shapes::shape_configs(shape);
            let vision = matches!(shape, clef_tt::checkpoint::shapes::Shape::Clef27b)
                .then_some(clef_tt::checkpoint::shapes::CLEF_27B_VISION);
            let shape_name = clap::ValueEnum::to_possible_value(&shape)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default();
            let mesh_shape = mesh;
            let precision = Precision::from_env(&profile)?;
            let question = clef_tt::perf_model::report::PlanQuestion {
                name: &shape_name,
                text: &text,
                vision,
                devices: mesh_shape.devices(),
                precision: &precision,
                tokens,
                start,
                patches,
            };
            print!("{}", clef_tt::perf_model::report::render(&question)?);
            if on_device {
                let shim = clef_device::tt::Shim::load(tt_shim.as_deref())?;
                let placed = clef_tt::perf_model::placement::on_device(
                    &shim,
                    &question,
                    mesh_shape,
                    slots,
                    slot_tokens,
                )?;
                print!("{placed}");
            }
            Ok(())
        }
        Command::Devices { device, check } => {
            let backend = device.resolve()?;
            if check {
                print!("{}", clef_device::select::check(&backend)?);
                return Ok(());
            }
            let report = clef_device::select::report(&backend)?;
            print!("{}", report.text);
            if !report.failed.is_empty() {
                bail!("the {} cannot be opened", report.failed.join(" and "));
            }
            Ok(())
        }
        Command::Bench { what } => run_bench(what),
    }
}

/// The named precision profiles (no environment overrides: a benchmark names what it runs).
fn profiles(names: &[String]) -> anyhow::Result<Vec<Precision>> {
    Ok(names
        .iter()
        .map(|name| Precision::resolve(name, |_| None))
        .collect::<Result<_, _>>()?)
}

fn run_bench(what: BenchCommand) -> anyhow::Result<()> {
    println!(
        "CPU kernels: {} ({} threads)\n",
        clef_device::cpu::isa::isa().name(),
        rayon::current_num_threads()
    );
    match what {
        BenchCommand::Prefill {
            model,
            tokens,
            precision,
            mesh,
            repeat,
            op_times,
            shape: Some(shape),
            start,
            max_device_ops,
            device,
        } => {
            if model.is_some() || op_times {
                bail!("--shape measures synthetic weights: drop --model and --op-times");
            }
            let Backend::Tt(shim) = device.resolve()? else {
                bail!("--shape measures the Tenstorrent device path: pass --device tt");
            };
            let tokens = if tokens.is_empty() {
                vec![128, 512, 1024]
            } else {
                tokens
            };
            let names = if precision.is_empty() {
                vec!["selected".to_string()]
            } else {
                precision
            };
            let bench = bench::chunk::ShapeBench {
                shape,
                profiles: &profiles(&names)?,
                meshes: &mesh,
                tokens: &tokens,
                start: &start,
                repeats: repeat,
                max_device_ops,
            };
            bench::chunk::run(&shim, &bench, &mut std::io::stdout())?;
        }
        BenchCommand::Prefill {
            model,
            tokens,
            precision,
            mesh,
            repeat,
            op_times,
            shape: None,
            start: _,
            max_device_ops: _,
            device,
        } => {
            let tokens = if tokens.is_empty() {
                vec![512, 2048]
            } else {
                tokens
            };
            let precision = if precision.is_empty() {
                vec!["f32".to_string(), "bf16".to_string()]
            } else {
                precision
            };
            let bench = bench::model::PrefillBench {
                ckpt: &open(model, None)?,
                profiles: &profiles(&precision)?,
                meshes: &mesh,
                lengths: &tokens,
                repeats: repeat,
                per_op: op_times,
            };
            bench::model::prefill(&device.resolve()?, &bench, &mut std::io::stdout())?;
        }
        BenchCommand::Http { url, options, json } => {
            let client = Client::new(&url, api_key(), HTTP_TIMEOUT);
            let compare = options
                .compare
                .as_ref()
                .map(|other| Client::new(other, api_key(), HTTP_TIMEOUT));
            let report = bench::http::run(&client, &url, &options, compare.as_ref())?;
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            print!("{}", bench::http::markdown(&report));
        }
        BenchCommand::Vision {
            sizes,
            mesh,
            format,
            op_times,
            repeat,
        } => {
            let sizes = sizes
                .iter()
                .map(|s| bench::model::image_size(s))
                .collect::<Result<Vec<_>, _>>()?;
            let format = weight_format(&format)?;
            let mut rows = Vec::new();
            for &shape in &mesh {
                let mesh = if op_times {
                    clef_device::cpu::CpuMesh::with_profile(shape)
                } else {
                    clef_device::cpu::CpuMesh::new(shape)
                };
                rows.extend(bench::model::vision(&mesh, format, &sizes, repeat)?);
                for (op, seconds, calls) in mesh.profile_report() {
                    eprintln!("  {shape} {op:>20}: {seconds:8.2} s in {calls} calls");
                }
            }
            print!("{}", bench::model::vision_table(&rows));
        }
        BenchCommand::Head { rows, repeat } => {
            let rows = bench::model::head(&rows, repeat)?;
            let peak = clef_device::cpu::fma_peak_gflops();
            print!("{}", bench::model::head_table(&rows, peak));
        }
    }
    Ok(())
}
