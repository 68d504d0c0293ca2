//! Tensor-parallel placement as data: which rows of which checkpoint tensors make one device
//! weight, and how it is split over the devices of a mesh. The text backbone's plan and the
//! vision tower's plan are both lists of [`WeightPlan`]s; [`WeightPlan::device_parts`] turns
//! one into a host part per device, reading rows through a [`WeightSource`].

use crate::{DeviceError, HostWeight, MeshOps, WeightFormat, WeightKind};
use std::ops::Range;

/// How a weight is laid over the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every device holds the whole tensor.
    Replicated,
    /// Output channels: every part is cut into `devices` equal row blocks, and device `d`
    /// holds the concatenation of the `d`-th block of each part.
    Columns,
    /// Input channels: device `d` holds the `d`-th block of columns (partial sums follow).
    Rows,
}

/// A run of output rows of one checkpoint tensor (`[out, ...]`, trailing dims flattened).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub tensor: String,
    pub rows: Range<usize>,
}

impl Part {
    /// All `rows` rows of `tensor`.
    pub fn whole(tensor: String, rows: usize) -> Part {
        Part {
            tensor,
            rows: 0..rows,
        }
    }
}

/// One device weight of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlan {
    pub parts: Vec<Part>,
    pub split: Split,
    /// Matrices take the profile's weight format; vectors (norms, biases, gates, conv taps)
    /// stay f32.
    pub matrix: bool,
}

/// What completes a row-parallel projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Nothing: a single device already holds the full sum.
    None,
    /// Reduce-scatter then all-gather of the f32 partial sums.
    AllReduce,
}

impl Collective {
    /// The collective a row-parallel projection needs on `devices` devices.
    pub fn for_devices(devices: usize) -> Self {
        if devices == 1 {
            Collective::None
        } else {
            Collective::AllReduce
        }
    }
}

/// A model (or part of one) that cannot be laid over this many devices.
#[derive(Debug, thiserror::Error)]
#[error("cannot split {part} over {devices} devices: {what}")]
pub struct PlanError {
    /// What was being split ("the model", "the vision tower").
    pub part: &'static str,
    pub devices: usize,
    pub what: String,
}

impl PlanError {
    /// `Ok` when `n` (a head or channel count named `what`) splits evenly over `devices`.
    pub fn check_divisible(
        part: &'static str,
        devices: usize,
        n: usize,
        what: &str,
    ) -> Result<(), PlanError> {
        if devices == 0 || !n.is_multiple_of(devices) {
            return Err(PlanError {
                part,
                devices,
                what: format!("{what} ({n}) is not a multiple of the device count"),
            });
        }
        Ok(())
    }
}

/// A planned weight whose rows do not split evenly over the devices.
#[derive(Debug, thiserror::Error)]
#[error("{tensor}: {msg}")]
pub struct SplitError {
    pub tensor: String,
    pub msg: String,
}

/// Why a planned weight could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError<E: std::error::Error + 'static> {
    /// Reading or splitting it.
    #[error(transparent)]
    Source(E),
    #[error("placing {tensor}: {source}")]
    Device { tensor: String, source: DeviceError },
}

/// Where planned weights are read from (a checkpoint under some tensor-name prefix).
pub trait WeightSource {
    type Error: From<SplitError>;
    /// Rows `rows` of `tensor` viewed as `[out, rest]`; a matrix may come back in bf16, a
    /// vector always in f32.
    fn rows(
        &self,
        tensor: &str,
        rows: Range<usize>,
        matrix: bool,
    ) -> Result<HostWeight, Self::Error>;
}

impl WeightPlan {
    pub fn new(parts: Vec<Part>, split: Split, matrix: bool) -> Self {
        WeightPlan {
            parts,
            split,
            matrix,
        }
    }

    /// A vector held whole by every device.
    pub fn replicated_vector(tensor: String, len: usize) -> Self {
        WeightPlan::new(vec![Part::whole(tensor, len)], Split::Replicated, false)
    }

    /// Read, split and upload the weight to `mesh`: a matrix in `format`, a vector in f32.
    pub fn place<B: MeshOps, S: WeightSource>(
        &self,
        mesh: &B,
        source: &S,
        format: WeightFormat,
    ) -> Result<B::Weight, PlaceError<S::Error>>
    where
        S::Error: std::error::Error + 'static,
    {
        let parts = self
            .device_parts(source, mesh.mesh().devices())
            .map_err(PlaceError::Source)?;
        let (kind, format) = if self.matrix {
            (WeightKind::Matrix, format)
        } else {
            (WeightKind::Vector, WeightFormat::F32)
        };
        mesh.upload_weight(parts, format, kind)
            .map_err(|source| PlaceError::Device {
                tensor: self
                    .parts
                    .first()
                    .map(|p| p.tensor.clone())
                    .unwrap_or_default(),
                source,
            })
    }

    /// The part each of `devices` devices holds.
    pub fn device_parts<S: WeightSource>(
        &self,
        source: &S,
        devices: usize,
    ) -> Result<Vec<HostWeight>, S::Error> {
        let bad = |tensor: &str, msg: String| SplitError {
            tensor: tensor.to_string(),
            msg,
        };
        let first = self.parts.first().map(|p| p.tensor.as_str()).unwrap_or("");
        let concat = |parts: Vec<HostWeight>| {
            HostWeight::concat_rows(&parts)
                .ok_or_else(|| bad(first, "parts of different widths".into()))
        };
        match self.split {
            Split::Replicated => {
                let mut parts = Vec::new();
                for p in &self.parts {
                    parts.push(source.rows(&p.tensor, p.rows.clone(), self.matrix)?);
                }
                Ok(vec![concat(parts)?; devices])
            }
            Split::Columns => (0..devices)
                .map(|d| {
                    let mut parts = Vec::new();
                    for p in &self.parts {
                        let len = p.rows.len();
                        if devices == 0 || !len.is_multiple_of(devices) {
                            return Err(bad(
                                &p.tensor,
                                format!("{len} rows do not split over {devices} devices"),
                            )
                            .into());
                        }
                        let block = len / devices;
                        let s = p.rows.start + d * block;
                        parts.push(source.rows(&p.tensor, s..s + block, self.matrix)?);
                    }
                    Ok(concat(parts)?)
                })
                .collect(),
            Split::Rows => {
                let [p] = self.parts.as_slice() else {
                    return Err(bad(first, "a row split takes exactly one part".into()).into());
                };
                let w = source.rows(&p.tensor, p.rows.clone(), self.matrix)?;
                if devices == 0 || !w.cols.is_multiple_of(devices) {
                    return Err(bad(
                        &p.tensor,
                        format!("{} columns do not split over {devices} devices", w.cols),
                    )
                    .into());
                }
                let block = w.cols / devices;
                Ok((0..devices)
                    .map(|d| w.col_range(d * block, (d + 1) * block))
                    .collect())
            }
        }
    }
}
