//! The tensor cache: a checkpoint's text weights already split per device, assembled and packed
//! for one backend, mesh and precision profile, so a start maps them instead of converting.
//!
//! A cache directory holds `weights.bin` (every device part of every weight, in the plan's
//! order, 64-byte aligned) and `manifest.json` (format version, backend, mesh, profile and its
//! weight formats, the source files with their sizes and SHA-256, and per entry its tensor,
//! device, shape, format, offset, length and CRC-32). Opening checks the manifest against the
//! checkpoint and the asked mesh and profile — a stale or mismatched cache is refused with the
//! command that rebuilds it — and every entry's checksum as it is read. A cache is written into
//! a temporary directory and renamed into place, so a failed conversion leaves nothing.

use crate::backbone::{
    count_weights, device_parts, visit_weights, Backbone, LoadError, PlacedWeights, TpPlan,
    WeightFormats,
};
use crate::checkpoint::Checkpoint;
use crate::precision::Precision;
use clef_device::{MeshOps, SharedBytes, WeightBytes, WeightFormat, WeightKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bumped whenever the layout of `weights.bin` or of a backend's packed weights changes.
pub const FORMAT_VERSION: u32 = 2;
const ALIGN: u64 = 64;
/// Bytes at each end of a source file that the quick fingerprint reads.
const FINGERPRINT_SPAN: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}; rebuild it with `{1}`")]
    Stale(String, String),
    #[error("{path}: {msg}")]
    Corrupt { path: String, msg: String },
    #[error(transparent)]
    Load(#[from] LoadError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
    /// SHA-256 of the size and the first and last MiB: what a start compares.
    pub fingerprint: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub tensor: String,
    pub device: usize,
    pub kind: String,
    pub format: String,
    pub rows: usize,
    pub cols: usize,
    pub offset: u64,
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub backend: String,
    pub mesh: String,
    pub profile: String,
    pub weight_formats: [String; 4],
    pub source: Vec<SourceFile>,
    pub entries: Vec<Entry>,
}

fn formats_names(f: &WeightFormats) -> [String; 4] {
    [f.attention, f.deltanet, f.mlp_gate_up, f.mlp_down].map(|x| x.name().to_string())
}

fn fingerprint(data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update((data.len() as u64).to_le_bytes());
    h.update(&data[..data.len().min(FINGERPRINT_SPAN)]);
    h.update(&data[data.len().saturating_sub(FINGERPRINT_SPAN)..]);
    format!("{:x}", h.finalize())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The command that rebuilds a cache for a mesh of `backend` (`cpu` or `tt`).
fn rebuild_hint(model: &Path, backend: &str, profile: &str, mesh: &str, out: &Path) -> String {
    let device = if backend == "cpu" {
        String::new()
    } else {
        format!(" --device {backend}")
    };
    format!(
        "clef-tt convert --model {} --precision {profile} --mesh {mesh}{device} --out {}",
        model.display(),
        out.display()
    )
}

/// Convert `ckpt`'s text weights for `mesh` in `precision`'s weight formats into a cache at
/// `out`, calling `progress(done, total)` after every weight.
pub fn convert<B: MeshOps>(
    ckpt: &Checkpoint,
    mesh: &B,
    precision: &Precision,
    out: &Path,
    progress: &dyn Fn(usize, usize),
) -> Result<Manifest, CacheError> {
    let (profile, formats) = (precision.name.as_str(), &precision.weight_formats());
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = write_cache(ckpt, mesh, profile, formats, &tmp, progress);
    let manifest = match result {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(io(out))?;
    }
    std::fs::rename(&tmp, out).map_err(io(out))?;
    Ok(manifest)
}

fn write_cache<B: MeshOps>(
    ckpt: &Checkpoint,
    mesh: &B,
    profile: &str,
    formats: &WeightFormats,
    dir: &Path,
    progress: &dyn Fn(usize, usize),
) -> Result<Manifest, CacheError> {
    let devices = mesh.mesh().devices();
    let plan = TpPlan::new(&ckpt.config.text, devices).map_err(LoadError::from)?;
    let bin = dir.join("weights.bin");
    let file = std::fs::File::create(&bin).map_err(io(&bin))?;
    let mut w = std::io::BufWriter::new(file);
    let mut entries = Vec::new();
    let mut offset = 0u64;
    let mut write_error = None;
    let total = count_weights(&plan);
    let mut seen = 0usize;
    visit_weights(&plan, formats, |wp, format| {
        let kind = if wp.matrix {
            WeightKind::Matrix
        } else {
            WeightKind::Vector
        };
        let parts = device_parts(&ckpt.tensors, wp, devices)?;
        let placed =
            mesh.upload_weight(parts, format, kind)
                .map_err(|source| LoadError::Device {
                    tensor: wp.parts[0].tensor.clone(),
                    source,
                })?;
        let bytes = mesh
            .export_weight(&placed)
            .map_err(|source| LoadError::Device {
                tensor: wp.parts[0].tensor.clone(),
                source,
            })?;
        for (device, part) in bytes.into_iter().enumerate() {
            let pad = offset.next_multiple_of(ALIGN) - offset;
            let written = w
                .write_all(&vec![0u8; pad as usize])
                .and_then(|_| w.write_all(&part.data));
            if let Err(e) = written {
                write_error.get_or_insert(e);
            }
            offset += pad;
            entries.push(Entry {
                tensor: wp.parts[0].tensor.clone(),
                device,
                kind: format!("{:?}", part.kind).to_lowercase(),
                format: part.format.name().to_string(),
                rows: part.rows,
                cols: part.cols,
                offset,
                bytes: part.data.len() as u64,
                crc32: crc32fast::hash(&part.data),
            });
            offset += part.data.len() as u64;
        }
        seen += 1;
        progress(seen, total);
        Ok(())
    })?;
    if let Some(e) = write_error {
        return Err(io(&bin)(e));
    }
    w.flush().map_err(io(&bin))?;
    let source = ckpt
        .tensors
        .file_data()
        .map(|(path, data)| SourceFile {
            name: file_name(path),
            bytes: data.len() as u64,
            sha256: format!("{:x}", Sha256::digest(data)),
            fingerprint: fingerprint(data),
        })
        .collect();
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        backend: mesh.backend_name().to_string(),
        mesh: mesh.mesh().to_string(),
        profile: profile.to_string(),
        weight_formats: formats_names(formats),
        source,
        entries,
    };
    let path = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| CacheError::Corrupt {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    std::fs::write(&path, text).map_err(io(&path))?;
    Ok(manifest)
}

/// An opened, checked cache.
pub struct TensorCache {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// `weights.bin`, mapped; placed weights keep windows of it instead of copies.
    data: std::sync::Arc<memmap2::Mmap>,
}

impl TensorCache {
    /// Open the cache at `dir` for `ckpt` on a `mesh` mesh of backend `backend` with
    /// `precision` (its profile and weight formats); refuse it when anything differs.
    pub fn open(
        dir: &Path,
        ckpt: &Checkpoint,
        backend: &str,
        mesh: &str,
        precision: &Precision,
    ) -> Result<Self, CacheError> {
        let (profile, formats) = (precision.name.as_str(), &precision.weight_formats());
        let hint = rebuild_hint(&ckpt.dir, backend, profile, mesh, dir);
        let stale = |msg: String| {
            CacheError::Stale(
                format!("tensor cache {}: {msg}", dir.display()),
                hint.clone(),
            )
        };
        let path = dir.join("manifest.json");
        let text =
            std::fs::read_to_string(&path).map_err(|e| stale(format!("no manifest ({e})")))?;
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| stale(format!("unreadable manifest ({e})")))?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(stale(format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                manifest.format_version
            )));
        }
        let checks = [
            ("backend", manifest.backend.as_str(), backend),
            ("mesh", manifest.mesh.as_str(), mesh),
            ("profile", manifest.profile.as_str(), profile),
        ];
        for (what, have, want) in checks {
            if have != want {
                return Err(stale(format!("built for {what} {have}, asked for {want}")));
            }
        }
        if manifest.weight_formats != formats_names(formats) {
            return Err(stale(format!(
                "built with weight formats {:?}, asked for {:?} (an override changed the profile)",
                manifest.weight_formats,
                formats_names(formats)
            )));
        }
        let current: Vec<(String, u64, String)> = ckpt
            .tensors
            .file_data()
            .map(|(p, d)| (file_name(p), d.len() as u64, fingerprint(d)))
            .collect();
        let recorded: Vec<(String, u64, String)> = manifest
            .source
            .iter()
            .map(|s| (s.name.clone(), s.bytes, s.fingerprint.clone()))
            .collect();
        if current != recorded {
            return Err(stale(format!(
                "the checkpoint's safetensors files changed since it was built ({} now, {} then)",
                current.len(),
                recorded.len()
            )));
        }
        let bin = dir.join("weights.bin");
        let file = std::fs::File::open(&bin).map_err(io(&bin))?;
        // SAFETY: the cache is read-only input; a concurrent writer would be caught by the
        // entry checksums.
        let data = unsafe { memmap2::Mmap::map(&file) }.map_err(io(&bin))?;
        let end = manifest
            .entries
            .iter()
            .map(|e| e.offset + e.bytes)
            .max()
            .unwrap_or(0);
        if (data.len() as u64) < end {
            return Err(CacheError::Corrupt {
                path: bin.display().to_string(),
                msg: format!(
                    "{} bytes, the manifest needs {end}: truncated; {hint}",
                    data.len()
                ),
            });
        }
        Ok(TensorCache {
            dir: dir.to_path_buf(),
            manifest,
            data: std::sync::Arc::new(data),
        })
    }

    /// The text backbone of `ckpt` on `mesh` with its weights from this cache (made for this
    /// mesh and `precision`'s formats); `progress(done, total)` follows the entries.
    pub fn load_backbone<B: MeshOps>(
        &self,
        ckpt: &Checkpoint,
        mesh: B,
        precision: &Precision,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Backbone<B>, CacheError> {
        let plan =
            TpPlan::new(&ckpt.config.text, mesh.mesh().devices()).map_err(LoadError::from)?;
        let t0 = std::time::Instant::now();
        let placed = self.place(&mesh, &plan, &precision.weight_formats(), progress)?;
        Ok(Backbone::from_placed(
            ckpt,
            mesh,
            plan,
            placed,
            precision.bf16_embeddings(),
            t0,
            "tensor cache",
        )?)
    }

    /// Place every weight of `plan` on `mesh` from the cache, checking each entry.
    pub fn place<B: MeshOps>(
        &self,
        mesh: &B,
        plan: &TpPlan,
        formats: &WeightFormats,
        progress: &dyn Fn(usize, usize),
    ) -> Result<PlacedWeights<B::Weight>, CacheError> {
        let devices = mesh.mesh().devices();
        let mut next = self.manifest.entries.iter();
        let bin = self.dir.join("weights.bin");
        let corrupt = |msg: String| CacheError::Corrupt {
            path: bin.display().to_string(),
            msg,
        };
        let mut failure: Option<CacheError> = None;
        let total = self.manifest.entries.len();
        let mut done = 0usize;
        let placed = visit_weights(plan, formats, |wp, _| {
            let mut parts = Vec::with_capacity(devices);
            for d in 0..devices {
                let Some(e) = next.next() else {
                    failure.get_or_insert(corrupt("fewer entries than weights".into()));
                    return Err(LoadError::Stopped("tensor cache"));
                };
                let want = &wp.parts[0].tensor;
                if &e.tensor != want || e.device != d {
                    failure.get_or_insert(corrupt(format!(
                        "entry {} of device {} where {want} of device {d} belongs",
                        e.tensor, e.device
                    )));
                    return Err(LoadError::Stopped("tensor cache"));
                }
                let bytes = &self.data[e.offset as usize..(e.offset + e.bytes) as usize];
                if crc32fast::hash(bytes) != e.crc32 {
                    failure.get_or_insert(corrupt(format!(
                        "checksum mismatch in {} (device {}): the file is corrupted",
                        e.tensor, e.device
                    )));
                    return Err(LoadError::Stopped("tensor cache"));
                }
                let (kind, format) = match (e.kind.as_str(), WeightFormat::parse(&e.format)) {
                    ("matrix", Some(f)) => (WeightKind::Matrix, f),
                    ("vector", Some(f)) => (WeightKind::Vector, f),
                    _ => {
                        failure.get_or_insert(corrupt(format!(
                            "bad entry kind/format in {}",
                            e.tensor
                        )));
                        return Err(LoadError::Stopped("tensor cache"));
                    }
                };
                let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = self.data.clone();
                let Some(data) = SharedBytes::window(owner, e.offset as usize, e.bytes as usize)
                else {
                    failure.get_or_insert(corrupt(format!("{} lies outside the file", e.tensor)));
                    return Err(LoadError::Stopped("tensor cache"));
                };
                parts.push(WeightBytes {
                    kind,
                    format,
                    rows: e.rows,
                    cols: e.cols,
                    data,
                });
            }
            done += devices;
            progress(done, total);
            mesh.import_weight(parts)
                .map_err(|source| LoadError::Device {
                    tensor: wp.parts[0].tensor.clone(),
                    source,
                })
        });
        match (placed, failure) {
            (_, Some(f)) => Err(f),
            (Ok(p), None) => {
                if next.next().is_some() {
                    return Err(corrupt("more entries than weights".into()));
                }
                Ok(p)
            }
            (Err(e), None) => Err(e.into()),
        }
    }
}
