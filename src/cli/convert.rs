//! `clef-tt convert`: write a tensor cache of the text weights as a mesh of the chosen device
//! holds them (split per device, packed in the profile's formats; the backend's name goes into
//! the manifest, so a cache is only ever read by the backend it was written for).

use clef_device::MeshOps;
use clef_tt::checkpoint::Checkpoint;
use clef_tt::precision::Precision;
use std::path::Path;

pub fn run<B: MeshOps>(
    ckpt: &Checkpoint,
    mesh: &B,
    precision: &Precision,
    out: &Path,
) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let (pb, report) = super::progress::bar("converting");
    let manifest = clef_tt::tensor_cache::convert(ckpt, mesh, precision, out, &report)?;
    pb.finish_and_clear();
    let bytes: u64 = manifest.entries.iter().map(|e| e.bytes).sum();
    eprintln!(
        "wrote {} for the {} backend ({} entries, {:.1} MiB) in {:.1} s",
        out.display(),
        manifest.backend,
        manifest.entries.len(),
        bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
