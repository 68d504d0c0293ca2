//! Host-side tensors: what goes onto the mesh and what comes back.

use half::bf16;

/// A dense row-major 2-D f32 matrix in host memory (rows are tokens for activations).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        debug_assert_eq!(rows * cols, data.len());
        HostTensor { rows, cols, data }
    }

    pub fn zeros(rows: usize, cols: usize) -> Self {
        HostTensor::new(rows, cols, vec![0.0; rows * cols])
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// How a weight matrix is held on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    Bf16,
    /// ttnn's bfp8_b: blocks of 16 values with a shared exponent and 7-bit magnitudes.
    Bfp8,
    /// ttnn's bfp4_b: the same blocks with 3-bit magnitudes.
    Bfp4,
}

impl WeightFormat {
    pub fn name(&self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Bfp8 => "bfp8_b",
            WeightFormat::Bfp4 => "bfp4_b",
        }
    }

    /// By name: `f32`, `bf16`, `bfp8` / `bfp8_b`, `bfp4` / `bfp4_b`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(WeightFormat::F32),
            "bf16" | "bfloat16" => Some(WeightFormat::Bf16),
            "bfp8" | "bfp8_b" => Some(WeightFormat::Bfp8),
            "bfp4" | "bfp4_b" => Some(WeightFormat::Bfp4),
            _ => None,
        }
    }
}

/// What a weight is used for, which decides how a backend stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// The right-hand side of a `linear` (packed in tiles or panels, in the profile's format).
    Matrix,
    /// Per-channel values read elementwise (norm weights, gates, conv taps); always f32.
    Vector,
}

/// The elements of a host weight.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

/// A weight matrix in the PyTorch layout `[out, in]` (a vector is `[n, 1]`).
#[derive(Clone, Debug, PartialEq)]
pub struct HostWeight {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
}

impl HostWeight {
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        debug_assert_eq!(rows * cols, data.len());
        HostWeight {
            rows,
            cols,
            data: WeightData::F32(data),
        }
    }

    pub fn bf16(rows: usize, cols: usize, data: Vec<bf16>) -> Self {
        debug_assert_eq!(rows * cols, data.len());
        HostWeight {
            rows,
            cols,
            data: WeightData::Bf16(data),
        }
    }

    /// Every element widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            WeightData::F32(v) => v.clone(),
            WeightData::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }

    /// Columns `[start, end)` (input channels).
    pub fn col_range(&self, start: usize, end: usize) -> HostWeight {
        fn take<T: Copy>(v: &[T], cols: usize, start: usize, end: usize) -> Vec<T> {
            v.chunks(cols)
                .flat_map(|r| r[start..end].iter().copied())
                .collect()
        }
        let data = match &self.data {
            WeightData::F32(v) => WeightData::F32(take(v, self.cols, start, end)),
            WeightData::Bf16(v) => WeightData::Bf16(take(v, self.cols, start, end)),
        };
        HostWeight {
            rows: self.rows,
            cols: end - start,
            data,
        }
    }

    /// Stack weights with the same column count along the output dimension.
    pub fn concat_rows(parts: &[HostWeight]) -> Option<HostWeight> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.cols != first.cols) {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let all_bf16 = parts.iter().all(|p| matches!(p.data, WeightData::Bf16(_)));
        let data = if all_bf16 {
            let mut v = Vec::with_capacity(rows * first.cols);
            for p in parts {
                if let WeightData::Bf16(d) = &p.data {
                    v.extend_from_slice(d);
                }
            }
            WeightData::Bf16(v)
        } else {
            WeightData::F32(parts.iter().flat_map(|p| p.to_f32()).collect())
        };
        Some(HostWeight {
            rows,
            cols: first.cols,
            data,
        })
    }
}

/// One device's part of a placed weight as bytes, in the backend's own layout (what a tensor
/// cache stores so a later start skips splitting, converting and packing).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightBytes {
    pub kind: WeightKind,
    pub format: WeightFormat,
    /// Output channels (`[out, in]` rows) of a matrix; values of a vector.
    pub rows: usize,
    /// Input channels of a matrix; 1 for a vector.
    pub cols: usize,
    pub data: SharedBytes,
}

/// Bytes that may be a window of a larger owner (a memory-mapped tensor cache), shared
/// without copying, or owned.
#[derive(Clone)]
pub struct SharedBytes {
    owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// `owner[start..start + len]`, or `None` when that is out of bounds.
    pub fn window(
        owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<Self> {
        let end = start.checked_add(len)?;
        ((*owner).as_ref().len() >= end).then_some(SharedBytes { owner, start, len })
    }

    pub fn owned(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        SharedBytes {
            owner: std::sync::Arc::new(bytes),
            start: 0,
            len,
        }
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len)
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
