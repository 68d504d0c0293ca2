//! Placing the checkpoint's text weights on a mesh as the plan says: each device weight is
//! assembled from row blocks of checkpoint tensors, then uploaded in the profile's format.

use super::plan::{MixerPlan, TpPlan, WeightPlan};
use crate::checkpoint::{CheckpointError, StoredDtype, TensorStore, TEXT_PREFIX};
pub use crate::precision::WeightFormats;
use clef_device::plan::{PlaceError, WeightSource};
use clef_device::{HostWeight, MeshOps, WeightFormat};

/// Errors while placing weights.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Plan(#[from] super::plan::PlanError),
    #[error("placing {tensor}: {source}")]
    Device {
        tensor: String,
        source: clef_device::DeviceError,
    },
    /// A walk over the weights stopped by its visitor (which keeps the reason).
    #[error("stopped: {0}")]
    Stopped(&'static str),
}

impl From<PlaceError<CheckpointError>> for LoadError {
    fn from(e: PlaceError<CheckpointError>) -> Self {
        match e {
            PlaceError::Source(e) => LoadError::Checkpoint(e),
            PlaceError::Device { tensor, source } => LoadError::Device { tensor, source },
        }
    }
}

/// A layer's weights on the mesh.
pub struct LayerWeights<W> {
    pub input_norm: W,
    pub mixer: MixerWeights<W>,
    pub post_norm: W,
    pub gate_up: W,
    pub down: W,
}

pub enum MixerWeights<W> {
    Attention {
        qkv: W,
        q_norm: W,
        k_norm: W,
        o_proj: W,
    },
    DeltaNet {
        in_proj: W,
        conv: W,
        a_log: W,
        dt_bias: W,
        norm: W,
        out_proj: W,
    },
}

impl<W> MixerWeights<W> {
    /// An attention mixer's qkv|gate, q_norm, k_norm and o_proj.
    pub(super) fn attention(&self) -> Option<(&W, &W, &W, &W)> {
        match self {
            MixerWeights::Attention {
                qkv,
                q_norm,
                k_norm,
                o_proj,
            } => Some((qkv, q_norm, k_norm, o_proj)),
            MixerWeights::DeltaNet { .. } => None,
        }
    }

    /// A DeltaNet mixer's in_proj, conv, A_log, dt_bias, gated norm and out_proj.
    pub(super) fn delta_net(&self) -> Option<(&W, &W, &W, &W, &W, &W)> {
        match self {
            MixerWeights::DeltaNet {
                in_proj,
                conv,
                a_log,
                dt_bias,
                norm,
                out_proj,
            } => Some((in_proj, conv, a_log, dt_bias, norm, out_proj)),
            MixerWeights::Attention { .. } => None,
        }
    }
}

/// The checkpoint's tensors under one name prefix (the text model's, the vision tower's), as
/// a source of planned weights.
pub struct CheckpointSource<'a> {
    pub store: &'a TensorStore,
    pub prefix: &'static str,
}

impl WeightSource for CheckpointSource<'_> {
    type Error = CheckpointError;

    /// Rows of a tensor viewed as `[out, rest]`.
    fn rows(
        &self,
        name: &str,
        rows: std::ops::Range<usize>,
        matrix: bool,
    ) -> Result<HostWeight, CheckpointError> {
        let store = self.store;
        let full = format!("{}{name}", self.prefix);
        let info = store.info(&full).ok_or_else(|| CheckpointError::Tensor {
            file: store
                .files()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            tensor: full.clone(),
            msg: "missing".into(),
        })?;
        let out = info.shape.first().copied().unwrap_or(1);
        let cols = if info.shape.len() > 1 {
            info.shape[1..].iter().product()
        } else {
            1
        };
        let (start, end) = (rows.start, rows.end);
        if end > out || start > end {
            return Err(CheckpointError::Tensor {
                file: store.file_path(info.file).display().to_string(),
                tensor: full,
                msg: format!("rows {start}..{end} requested from shape {:?}", info.shape),
            });
        }
        let (a, b) = (start * cols, end * cols);
        Ok(if matrix && info.dtype != StoredDtype::F32 {
            HostWeight::bf16(end - start, cols, store.read_bf16(info, a, b))
        } else {
            HostWeight::f32(end - start, cols, store.read_f32(info, a, b))
        })
    }
}

/// The per-device parts of one planned weight of the text model.
pub fn device_parts(
    store: &TensorStore,
    plan: &WeightPlan,
    devices: usize,
) -> Result<Vec<HostWeight>, CheckpointError> {
    let source = CheckpointSource {
        store,
        prefix: TEXT_PREFIX,
    };
    plan.device_parts(&source, devices)
}

fn place<B: MeshOps>(
    mesh: &B,
    store: &TensorStore,
    plan: &WeightPlan,
    format: WeightFormat,
) -> Result<B::Weight, LoadError> {
    let source = CheckpointSource {
        store,
        prefix: TEXT_PREFIX,
    };
    Ok(plan.place(mesh, &source, format)?)
}

/// Every layer's weights and the final norm, on the mesh.
pub type PlacedWeights<W> = (Vec<LayerWeights<W>>, W);

/// Place every layer's weights and the final norm from the checkpoint.
/// `progress(done, total)` follows the weights.
pub fn load_layers<B: MeshOps>(
    mesh: &B,
    store: &TensorStore,
    plan: &TpPlan,
    formats: &WeightFormats,
    progress: &dyn Fn(usize, usize),
) -> Result<PlacedWeights<B::Weight>, LoadError> {
    let total = count_weights(plan);
    let mut done = 0;
    visit_weights(plan, formats, |w, format| {
        let placed = place(mesh, store, w, format)?;
        done += 1;
        progress(done, total);
        Ok(placed)
    })
}

/// Weights in the plan's walk.
pub fn count_weights(plan: &TpPlan) -> usize {
    let mut count = 0usize;
    let _ = visit_weights(plan, &WeightFormats::uniform(WeightFormat::F32), |_, _| {
        count += 1;
        Ok(())
    });
    count
}

/// Every weight of the plan in a fixed order (per layer: input norm, mixer, post norm, MLP;
/// then the final norm), each with the format it is held in (vectors: f32), through `place`.
/// Loading, converting to a tensor cache and loading from one all walk the plan this way.
pub fn visit_weights<W>(
    plan: &TpPlan,
    formats: &WeightFormats,
    mut place: impl FnMut(&WeightPlan, WeightFormat) -> Result<W, LoadError>,
) -> Result<PlacedWeights<W>, LoadError> {
    let f = formats;
    let place = std::cell::RefCell::new(&mut place);
    // Vectors ignore the format; f32 is passed for them.
    let p = |w: &WeightPlan| (place.borrow_mut())(w, WeightFormat::F32);
    let m = |w: &WeightPlan, format: WeightFormat| (place.borrow_mut())(w, format);
    let mut layers = Vec::with_capacity(plan.layers.len());
    for l in &plan.layers {
        let mixer = match &l.mixer {
            MixerPlan::Attention {
                qkv,
                q_norm,
                k_norm,
                o_proj,
            } => MixerWeights::Attention {
                qkv: m(qkv, f.attention)?,
                q_norm: p(q_norm)?,
                k_norm: p(k_norm)?,
                o_proj: m(o_proj, f.attention)?,
            },
            MixerPlan::DeltaNet {
                in_proj,
                conv,
                a_log,
                dt_bias,
                norm,
                out_proj,
            } => MixerWeights::DeltaNet {
                in_proj: m(in_proj, f.deltanet)?,
                conv: p(conv)?,
                a_log: p(a_log)?,
                dt_bias: p(dt_bias)?,
                norm: p(norm)?,
                out_proj: m(out_proj, f.deltanet)?,
            },
        };
        layers.push(LayerWeights {
            input_norm: p(&l.input_norm)?,
            mixer,
            post_norm: p(&l.post_norm)?,
            gate_up: m(&l.gate_up, f.mlp_gate_up)?,
            down: m(&l.down, f.mlp_down)?,
        });
    }
    Ok((layers, p(&plan.final_norm)?))
}
