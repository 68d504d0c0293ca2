//! Memory-mapped safetensors: one file or shards with `model.safetensors.index.json`.
//!
//! Headers are parsed once; tensor bytes stay in the page cache until a loader reads them.
//! Every failure names the file and the tensor.

use super::CheckpointError;
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Element type of a stored tensor that clef-tt can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    Bf16,
    F16,
    F32,
}

impl StoredDtype {
    pub fn size(&self) -> usize {
        match self {
            StoredDtype::Bf16 | StoredDtype::F16 => 2,
            StoredDtype::F32 => 4,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            StoredDtype::Bf16 => "bf16",
            StoredDtype::F16 => "f16",
            StoredDtype::F32 => "f32",
        }
    }
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub file: usize,
    pub dtype: StoredDtype,
    pub shape: Vec<usize>,
    /// Byte range inside the mapped file.
    pub start: usize,
    pub end: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.end - self.start
    }
}

/// A set of memory-mapped safetensors files and the tensors they hold.
pub struct TensorStore {
    files: Vec<(PathBuf, Mmap)>,
    /// The open files behind the maps, for positioned reads after loading ([`super::RowTable`]).
    handles: Vec<Arc<File>>,
    tensors: BTreeMap<String, TensorInfo>,
    /// `mtp.*` tensors present in the files and skipped (multi-token prediction is unused).
    skipped: usize,
}

impl TensorStore {
    /// Open `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    pub fn open_model(dir: &Path) -> Result<Self, CheckpointError> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let text =
                std::fs::read_to_string(&index).map_err(|e| CheckpointError::io(&index, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| CheckpointError::Config {
                    file: index.display().to_string(),
                    msg: format!("not valid JSON: {e}"),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| CheckpointError::Config {
                    file: index.display().to_string(),
                    msg: "no weight_map object".into(),
                })?;
            let mut shards: Vec<String> = Vec::new();
            for v in map.values() {
                let name = v.as_str().ok_or_else(|| CheckpointError::Config {
                    file: index.display().to_string(),
                    msg: "weight_map values must be file names".into(),
                })?;
                if !shards.iter().any(|s| s == name) {
                    shards.push(name.to_string());
                }
            }
            shards.sort();
            let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
            let store = Self::open_files(&paths)?;
            // Every tensor the index names must be in the shard it names.
            for (tensor, file) in map {
                let file = file.as_str().unwrap_or_default();
                match store.tensors.get(tensor) {
                    Some(info) if store.files[info.file].0.ends_with(file) => {}
                    Some(info) => {
                        return Err(CheckpointError::Tensor {
                            file: store.files[info.file].0.display().to_string(),
                            tensor: tensor.clone(),
                            msg: format!("the index places it in {file}"),
                        })
                    }
                    None => {
                        return Err(CheckpointError::Tensor {
                            file: dir.join(file).display().to_string(),
                            tensor: tensor.clone(),
                            msg:
                                "listed in model.safetensors.index.json but missing from the shard"
                                    .into(),
                        })
                    }
                }
            }
            Ok(store)
        } else {
            Self::open_files(&[dir.join("model.safetensors")])
        }
    }

    /// The mapped files: path and bytes.
    pub fn file_data(&self) -> impl Iterator<Item = (&Path, &[u8])> {
        self.files.iter().map(|(p, m)| (p.as_path(), &m[..]))
    }

    /// Map and index the given files.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, CheckpointError> {
        let mut files = Vec::new();
        let mut handles = Vec::new();
        let mut tensors = BTreeMap::new();
        let mut skipped = 0;
        for (i, path) in paths.iter().enumerate() {
            let file = File::open(path).map_err(|e| CheckpointError::io(path, e))?;
            // SAFETY: the mapping is read-only and only read while loading: the loaders copy
            // what they keep, and the row tables read after loading through `handles` with
            // positioned reads, so a file changed under a running server cannot fault it.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
            let bad = |msg: String| CheckpointError::File {
                file: path.display().to_string(),
                msg,
            };
            let (header_len, meta) = SafeTensors::read_metadata(&mmap[..])
                .map_err(|e| bad(format!("not a valid safetensors file ({e})")))?;
            let data_start = 8 + header_len;
            let data_len = mmap.len() - data_start.min(mmap.len());
            for (name, info) in meta.tensors() {
                if name.starts_with("mtp.") {
                    skipped += 1;
                    continue;
                }
                let dtype = match info.dtype {
                    Dtype::BF16 => StoredDtype::Bf16,
                    Dtype::F16 => StoredDtype::F16,
                    Dtype::F32 => StoredDtype::F32,
                    other => {
                        return Err(CheckpointError::Tensor {
                            file: path.display().to_string(),
                            tensor: name,
                            msg: format!("dtype {other:?}, expected bf16, f16 or f32"),
                        })
                    }
                };
                let (a, b) = info.data_offsets;
                if b > data_len {
                    return Err(CheckpointError::Tensor {
                        file: path.display().to_string(),
                        tensor: name,
                        msg: format!(
                            "truncated file: the tensor ends at byte {} but the file has {}",
                            data_start + b,
                            mmap.len()
                        ),
                    });
                }
                let elements: usize = info.shape.iter().product();
                if elements * dtype.size() != b - a {
                    return Err(CheckpointError::Tensor {
                        file: path.display().to_string(),
                        tensor: name,
                        msg: format!("{} bytes for shape {:?}", b - a, info.shape),
                    });
                }
                let entry = TensorInfo {
                    file: i,
                    dtype,
                    shape: info.shape.clone(),
                    start: data_start + a,
                    end: data_start + b,
                };
                if tensors.insert(name.clone(), entry).is_some() {
                    return Err(CheckpointError::Tensor {
                        file: path.display().to_string(),
                        tensor: name,
                        msg: "stored in two files".into(),
                    });
                }
            }
            files.push((path.clone(), mmap));
            handles.push(Arc::new(file));
        }
        Ok(TensorStore {
            files,
            handles,
            tensors,
            skipped,
        })
    }

    /// How many `mtp.*` tensors were skipped.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &TensorInfo)> {
        self.tensors.iter()
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn file_path(&self, index: usize) -> &Path {
        &self.files[index].0
    }

    /// The open file of index `index` (the one mapped, whatever its path points to now).
    pub fn file_handle(&self, index: usize) -> Arc<File> {
        self.handles[index].clone()
    }

    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// The tensor, checked against an expected shape.
    pub fn expect(&self, name: &str, shape: &[usize]) -> Result<&TensorInfo, CheckpointError> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::Tensor {
                file: self.describe_files(),
                tensor: name.to_string(),
                msg: format!("missing (expected shape {shape:?})"),
            })?;
        if info.shape != shape {
            return Err(CheckpointError::Tensor {
                file: self.file_path(info.file).display().to_string(),
                tensor: name.to_string(),
                msg: format!("shape {:?}, expected {shape:?}", info.shape),
            });
        }
        Ok(info)
    }

    fn describe_files(&self) -> String {
        self.files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The raw bytes of a tensor.
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.files[info.file].1[info.start..info.end]
    }

    /// Elements `[start, end)` (flat index) as bf16 (f32 and f16 are rounded to nearest even).
    pub fn read_bf16(&self, info: &TensorInfo, start: usize, end: usize) -> Vec<bf16> {
        let b = &self.bytes(info)[start * info.dtype.size()..end * info.dtype.size()];
        match info.dtype {
            StoredDtype::Bf16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            StoredDtype::F16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_f32(f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()))
                .collect(),
            StoredDtype::F32 => b
                .chunks_exact(4)
                .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        }
    }

    /// Elements `[start, end)` (flat index) widened to f32.
    pub fn read_f32(&self, info: &TensorInfo, start: usize, end: usize) -> Vec<f32> {
        let size = info.dtype.size();
        widen_f32(info.dtype, &self.bytes(info)[start * size..end * size])
    }
}

/// Little-endian stored elements widened to f32.
pub fn widen_f32(dtype: StoredDtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        StoredDtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        StoredDtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        StoredDtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}
