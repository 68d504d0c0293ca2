//! `clef-tt bench prefill`: prefill tokens per second on a checkpoint, for each weight format
//! and mesh shape asked for. Timings are wall clock of whole prefills (embedding to final
//! norm), the median of the repeats after one warm-up.

use clef_device::cpu::CpuMesh;
use clef_device::{MeshShape, WeightFormat};
use clef_tt::backbone::Backbone;
use clef_tt::checkpoint::Checkpoint;
use std::time::Instant;

/// One measured configuration.
pub struct PrefillRow {
    pub format: WeightFormat,
    pub mesh: MeshShape,
    pub tokens: usize,
    pub seconds: f64,
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

pub fn prefill(
    ckpt: &Checkpoint,
    formats: &[WeightFormat],
    meshes: &[MeshShape],
    lengths: &[usize],
    repeats: usize,
    profile: bool,
) -> anyhow::Result<Vec<PrefillRow>> {
    let mut rows = Vec::new();
    for &format in formats {
        for &mesh in meshes {
            let cpu = if profile {
                CpuMesh::with_profile(mesh)
            } else {
                CpuMesh::new(mesh)
            };
            let bb = Backbone::load(ckpt, cpu, format)?;
            eprintln!(
                "loaded {} weights on a {mesh} CPU mesh: {:.1} MiB",
                format.name(),
                bb.weight_bytes() as f64 / (1 << 20) as f64
            );
            for &n in lengths {
                let ids = bench_ids(n);
                bb.prefill(&ids, None)?; // warm-up
                let mut times = Vec::with_capacity(repeats);
                for _ in 0..repeats.max(1) {
                    let t0 = Instant::now();
                    bb.prefill(&ids, None)?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                times.sort_by(|a, b| a.total_cmp(b));
                let seconds = times[times.len() / 2];
                eprintln!(
                    "  {n} tokens: {seconds:.3} s ({:.1} tokens/s)",
                    n as f64 / seconds
                );
                rows.push(PrefillRow {
                    format,
                    mesh,
                    tokens: n,
                    seconds,
                });
                if profile {
                    let runs = (repeats.max(1) + 1) as f64;
                    for (op, secs, calls) in bb.mesh().profile_report() {
                        eprintln!(
                            "    {op:20} {:8.3} s per prefill ({} calls)",
                            secs / runs,
                            calls as f64 / runs
                        );
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn table(rows: &[PrefillRow]) -> String {
    let mut s =
        String::from("| weights | mesh | tokens | seconds | tokens/s |\n|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.1} |\n",
            r.format.name(),
            r.mesh,
            r.tokens,
            r.seconds,
            r.tokens as f64 / r.seconds
        ));
    }
    s
}
