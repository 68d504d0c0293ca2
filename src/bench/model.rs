//! `clef-tt bench prefill`: prefill tokens per second on a checkpoint, for each precision
//! profile (weight formats, bf16 activations, fidelity, as served) and mesh shape asked for.
//! Timings are wall clock of whole prefills (embedding to final norm), the median of the
//! repeats after one warm-up.

use crate::backbone::{Backbone, WeightFormats};
use crate::checkpoint::Checkpoint;
use crate::engine::serving::OpenError;
use crate::precision::Precision;
use clef_device::{MeshOps, MeshShape, WeightFormat};
use std::time::Instant;

/// One measured configuration.
pub struct PrefillRow {
    pub profile: String,
    pub mesh: MeshShape,
    pub tokens: usize,
    pub seconds: f64,
    /// 2 × non-embedding matrix parameters × tokens / seconds.
    pub gflops: f64,
}

/// The median of measurements (the mean of the middle two of an even count; NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Deterministic token ids inside the base vocabulary (no special tokens).
fn bench_ids(n: usize) -> Vec<u32> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 200_000) as u32 + 100
        })
        .collect()
}

/// A prefill benchmark: every profile and length on one mesh at a time.
pub struct PrefillRun<'a> {
    pub ckpt: &'a Checkpoint,
    pub profiles: &'a [Precision],
    pub lengths: &'a [usize],
    pub repeats: usize,
}

/// Seconds, wall time and calls per op of a profiling mesh.
pub type OpReport<B> = dyn Fn(&B) -> Vec<(&'static str, f64, u64)>;

impl PrefillRun<'_> {
    /// Matrix parameters of the backbone (embeddings and LM head excluded), from its plan.
    fn params(&self) -> usize {
        let cfg = &self.ckpt.config.text;
        match crate::backbone::TpPlan::new(cfg, 1) {
            Ok(plan) => crate::perf_model::text_matrices(
                cfg,
                &plan,
                &WeightFormats::uniform(WeightFormat::F32),
            )
            .iter()
            .map(|m| m.params())
            .sum(),
            Err(_) => 0,
        }
    }

    /// Measures every profile and length on a fresh `open(profile)` mesh of `shape` each
    /// (the mesh computes with the profile's numerics); `report` gives the per-op times of a
    /// profiling mesh (empty otherwise).
    pub fn on<B: MeshOps>(
        &self,
        shape: MeshShape,
        open: &dyn Fn(&Precision) -> Result<B, OpenError>,
        report: &OpReport<B>,
    ) -> super::Result<Vec<PrefillRow>> {
        let mut rows = Vec::new();
        for profile in self.profiles {
            let mesh = open(profile).map_err(super::BenchError::Failed)?;
            let backend = mesh.backend_name();
            let bb = Backbone::load_with(self.ckpt, mesh, profile)?;
            eprintln!(
                "loaded the {} profile's weights on a {shape} {backend} mesh: {:.1} MiB",
                profile.name,
                bb.weight_bytes() as f64 / (1 << 20) as f64
            );
            for &n in self.lengths {
                let ids = bench_ids(n);
                bb.prefill(&ids, None)?; // warm-up
                let mut times = Vec::with_capacity(self.repeats);
                for _ in 0..self.repeats.max(1) {
                    let t0 = Instant::now();
                    bb.prefill(&ids, None)?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                let seconds = median(times);
                eprintln!(
                    "  {n} tokens: {seconds:.3} s ({:.1} tokens/s)",
                    n as f64 / seconds
                );
                rows.push(PrefillRow {
                    profile: profile.name.clone(),
                    mesh: shape,
                    tokens: n,
                    seconds,
                    gflops: 2.0 * self.params() as f64 * n as f64 / seconds / 1e9,
                });
                let runs = (self.repeats.max(1) + 1) as f64;
                for (op, secs, calls) in report(bb.mesh()) {
                    eprintln!(
                        "    {op:20} {:8.3} s per prefill ({} calls)",
                        secs / runs,
                        calls as f64 / runs
                    );
                }
            }
        }
        Ok(rows)
    }
}

/// `WIDTHxHEIGHT` in multiples of 32.
pub fn image_size(s: &str) -> super::Result<(usize, usize)> {
    s.split_once('x')
        .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
        .filter(|&(w, h): &(usize, usize)| w % 32 == 0 && h % 32 == 0 && w > 0 && h > 0)
        .ok_or_else(|| {
            super::BenchError::Refused(format!("{s:?} is not WIDTHxHEIGHT in multiples of 32"))
        })
}

/// Peak resident memory of this process so far (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The rows as a markdown table; `peak` is the machine's measured FMA peak (GFLOP/s).
pub fn table(rows: &[PrefillRow], peak: Option<f64>) -> String {
    let mut s = String::from(
        "| profile | mesh | tokens | seconds | tokens/s | GFLOP/s | of FMA peak |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let share = peak.map_or("-".to_string(), |p| format!("{:.0}%", 100.0 * r.gflops / p));
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.1} | {:.0} | {share} |\n",
            r.profile,
            r.mesh,
            r.tokens,
            r.seconds,
            r.tokens as f64 / r.seconds,
            r.gflops,
        ));
    }
    s
}

/// One head timing.
pub struct HeadRow {
    pub rows: usize,
    pub memory_ms: f64,
    pub total_ms: f64,
}

/// The joint head at Clef-27B width (hidden 5120, width 1024, 16 heads, feedforward 4096) with
/// random weights, 6 questions of 2..5 options, over each row count; median of `repeats`.
pub fn head(rows: &[usize], repeats: usize) -> super::Result<Vec<HeadRow>> {
    use crate::checkpoint::{JointHeadConfig, JointHeadFiles};
    use crate::head::{HeadQuestion, JointHead};
    let cfg = JointHeadConfig::release(5120);
    let dir = std::env::temp_dir().join(format!("clef-tt-bench-head-{}", std::process::id()));
    crate::random::write_random_head(&cfg, &dir, 7)?;
    let head = JointHead::load(&JointHeadFiles::open(&dir, cfg.hidden_size)?)?;
    let _ = std::fs::remove_dir_all(&dir);
    let h = cfg.hidden_size;
    let mut out = Vec::new();
    for &t in rows {
        let hidden: Vec<f32> = (0..t * h)
            .map(|i| ((i * 2_654_435_761usize) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        // Six questions near the end of the prompt, as a schema sits after the state.
        let mut at = t.saturating_sub(6 * 40);
        let mut questions = Vec::new();
        let mut lexical = Vec::new();
        for q in 0..6 {
            let options = 2 + q % 4;
            let span = (at, at + 8);
            at += 8;
            let mut option_spans = Vec::new();
            for _ in 0..options {
                option_spans.push((at, at + 5));
                lexical.push(
                    (0..h)
                        .map(|i| ((i * 31 + at) % 97) as f32 / 97.0 - 0.5)
                        .collect(),
                );
                at += 5;
            }
            questions.push(HeadQuestion {
                type_index: q % 3,
                span,
                option_spans,
            });
        }
        let mut mem_times = Vec::new();
        let mut times = Vec::new();
        for _ in 0..repeats.max(1) + 1 {
            let t0 = Instant::now();
            let memory = head.memory(&hidden, t);
            let t1 = Instant::now();
            let logits = head.logits(&hidden, 0, &memory, &questions, &lexical);
            let t2 = Instant::now();
            if !logits.iter().flatten().all(|l| l.is_finite()) {
                refuse!("non-finite logits");
            }
            mem_times.push((t1 - t0).as_secs_f64() * 1e3);
            times.push((t2 - t0).as_secs_f64() * 1e3);
        }
        // Drop the warm-up, take medians.
        mem_times.remove(0);
        times.remove(0);
        let row = HeadRow {
            rows: t,
            memory_ms: median(mem_times),
            total_ms: median(times),
        };
        eprintln!(
            "  {t} rows: {:.1} ms (memory projection {:.1} ms)",
            row.total_ms, row.memory_ms
        );
        out.push(row);
    }
    Ok(out)
}

/// Flops of the memory projection over `rows` rows at Clef-27B width (rows × 5120 × 1024 × 2).
fn projection_gflop(rows: usize) -> f64 {
    (rows * 5120 * 1024 * 2) as f64 / 1e9
}

/// The head table, with the memory projection's rate against the machine's measured FMA peak
/// (`peak_gflops`, when the CPU has AVX-512) and the floor that peak sets.
pub fn head_table(rows: &[HeadRow], peak_gflops: Option<f64>) -> String {
    let mut s = String::from(
        "| rows | head total ms | of which memory projection ms | projection GFLOP/s | of FMA peak |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let rate = projection_gflop(r.rows) / (r.memory_ms / 1e3);
        let share = peak_gflops.map_or("–".to_string(), |p| format!("{:.0}%", 100.0 * rate / p));
        s.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.0} | {} |\n",
            r.rows, r.total_ms, r.memory_ms, rate, share
        ));
    }
    if let (Some(peak), Some(last)) = (peak_gflops, rows.last()) {
        s.push_str(&format!(
            "\nFMA peak of this machine (measured, all threads): {peak:.0} GFLOP/s; the memory \
             projection alone over {} rows needs {:.0} ms at that peak.\n",
            last.rows,
            projection_gflop(last.rows) / peak * 1e3
        ));
    }
    s
}

/// One vision tower timing.
pub struct VisionRow {
    pub mesh: MeshShape,
    pub format: WeightFormat,
    pub width: usize,
    pub height: usize,
    pub patches: usize,
    pub tokens: usize,
    pub ms: f64,
}

/// The Clef-27B vision tower (random weights, matrices in `format`) on `mesh`, one image of
/// each `sizes` (width x height, multiples of 32); median of `repeats` after a warm-up.
pub fn vision(
    mesh: &clef_device::cpu::CpuMesh,
    format: WeightFormat,
    sizes: &[(usize, usize)],
    repeats: usize,
) -> super::Result<Vec<VisionRow>> {
    let t0 = Instant::now();
    let source = crate::random::RandomVisionWeights {
        shape: crate::checkpoint::shapes::CLEF_27B_VISION,
        seed: 11,
    };
    let tower = clef_vision::VisionTower::load(mesh, source.shape, format, &source)?;
    eprintln!(
        "  random tower on the {} mesh in {:.1} s",
        mesh.mesh(),
        t0.elapsed().as_secs_f64()
    );
    sizes
        .iter()
        .map(|&(width, height)| {
            let grid = clef_vision::Grid {
                t: 1,
                h: height / clef_vision::PATCH,
                w: width / clef_vision::PATCH,
            };
            let rows: Vec<f32> = (0..grid.patches() * clef_vision::ROW_VALUES)
                .map(|i| ((i * 2_654_435_761usize) % 255) as f32 / 127.5 - 1.0)
                .collect();
            let mut times = Vec::new();
            for _ in 0..repeats.max(1) + 1 {
                let t = Instant::now();
                let embeds = tower.embed(mesh, &rows, &[grid])?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(embeds);
            }
            times.remove(0);
            let row = VisionRow {
                mesh: mesh.mesh(),
                format,
                width,
                height,
                patches: grid.patches(),
                tokens: grid.tokens(),
                ms: median(times),
            };
            eprintln!("  {width}x{height}: {:.0} ms", row.ms);
            Ok(row)
        })
        .collect()
}

pub fn vision_table(rows: &[VisionRow]) -> String {
    let mut s = String::from(
        "| mesh | matrices | image | patches | tokens | vision tower ms |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {}x{} | {} | {} | {:.0} |\n",
            r.mesh,
            r.format.name(),
            r.width,
            r.height,
            r.patches,
            r.tokens,
            r.ms
        ));
    }
    s
}

/// What `bench prefill` measures on a checkpoint: each profile and length on each mesh.
pub struct PrefillBench<'a> {
    pub ckpt: &'a Checkpoint,
    pub profiles: &'a [Precision],
    pub meshes: &'a [MeshShape],
    pub lengths: &'a [usize],
    pub repeats: usize,
    /// Time each op of the CPU mesh too (`--op-times`).
    pub per_op: bool,
}

/// Runs `b` on `backend`, then writes the table (against the machine's FMA peak, measured
/// before and after) and the run's peak resident memory to `out`.
pub fn prefill(
    backend: &clef_device::select::Backend,
    b: &PrefillBench,
    out: &mut dyn std::io::Write,
) -> super::Result<()> {
    use clef_device::cpu::CpuMesh;
    use clef_device::select::{Backend, MeshLayout};
    if b.per_op && !matches!(backend, Backend::Cpu) {
        refuse!("--op-times times the CPU mesh's ops; it does not apply to --device tt");
    }
    let peak_before = clef_device::cpu::fma_peak_gflops();
    let mut rows = Vec::new();
    for &shape in b.meshes {
        for p in b.profiles {
            let run = PrefillRun {
                ckpt: b.ckpt,
                profiles: std::slice::from_ref(p),
                lengths: b.lengths,
                repeats: b.repeats,
            };
            let numerics = p.numerics();
            rows.extend(match backend {
                Backend::Cpu if b.per_op => {
                    let open =
                        |_: &Precision| Ok(CpuMesh::with_profile(shape).with_numerics(numerics));
                    run.on(shape, &open, &|m| m.profile_report())?
                }
                Backend::Cpu => {
                    let open = |_: &Precision| Ok(CpuMesh::new(shape).with_numerics(numerics));
                    run.on(shape, &open, &|_| Vec::new())?
                }
                Backend::Tt(shim) => {
                    let layout = MeshLayout::single(shape);
                    let open = |_: &Precision| Ok(layout.open_tt(shim, 0, numerics)?);
                    run.on(shape, &open, &|_| Vec::new())?
                }
            });
        }
    }
    let peak_after = clef_device::cpu::fma_peak_gflops();
    let peak = match (peak_before, peak_after) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    if let (Some(a), Some(b)) = (peak_before, peak_after) {
        writeln!(
            out,
            "FMA peak, all threads: {a:.0} GFLOP/s before, {b:.0} after (the higher is used)\n"
        )?;
    }
    write!(out, "{}", table(&rows, peak))?;
    if let Some(mib) = peak_rss_mib() {
        writeln!(out, "peak resident memory of the run: {mib:.0} MiB")?;
    }
    Ok(())
}
