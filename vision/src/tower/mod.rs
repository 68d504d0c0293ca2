//! The Qwen3.5 vision tower on a `clef-device` mesh (spec qwen35-backbone.md §11), written once
//! against [`MeshOps`] like the text backbone: the patch embedding (the Conv3d as a linear map
//! of the 1536 values of a patch row), the learned 2-D positions resampled to each grid, pre-LN
//! blocks with 2-D rotary attention restricted to each image or frame pair and a tanh-GELU
//! MLP, then the merger (LayerNorm, 2x2 patches side by side, fc1, erf-GELU, fc2) giving one
//! text-space embedding per merged token. The weights are laid over the devices by the
//! [`VisionPlan`]; what depends only on the grids (positions, rotary tables, segments) is
//! computed on the host (`inputs`).

pub mod inputs;
pub mod plan;

use crate::preprocess::{Grid, MERGE};
use clef_device::fine_call::list_u32;
use clef_device::plan::{Collective, PlaceError, PlanError, SplitError, WeightPlan, WeightSource};
use clef_device::{DeviceError, GatherAxis, Gelu, HostTensor, MeshOps, WeightFormat};
pub use inputs::TowerInputs;
pub use plan::{VisionPlan, VisionShape};

/// LayerNorm eps of the tower.
const NORM_EPS: f32 = 1e-6;

/// Errors while placing the tower's weights.
#[derive(Debug, thiserror::Error)]
pub enum LoadError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Place(#[from] PlaceError<E>),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// `y = x·Wᵀ + b` on the mesh.
struct Linear<W> {
    weight: W,
    bias: W,
}

/// LayerNorm on the mesh.
struct Norm<W> {
    weight: W,
    bias: W,
}

struct Block<W> {
    norm1: Norm<W>,
    qkv: Linear<W>,
    proj: Linear<W>,
    norm2: Norm<W>,
    fc1: Linear<W>,
    fc2: Linear<W>,
}

/// Receives a vision block's index and its output (`VisionTower::hidden_probed`).
pub type BlockProbe<'a, T> = dyn FnMut(usize, &T) -> Result<(), DeviceError> + 'a;

/// The tower placed on a mesh; the forward pass takes the mesh it was placed on.
pub struct VisionTower<B: MeshOps> {
    shape: VisionShape,
    plan: VisionPlan,
    patch_embed: Linear<B::Weight>,
    /// The learned position table `[side², hidden]`, on the host (resampled per grid).
    position_table: Vec<f32>,
    blocks: Vec<Block<B::Weight>>,
    merger_norm: Norm<B::Weight>,
    merger_fc1: Linear<B::Weight>,
    merger_fc2: Linear<B::Weight>,
    weight_bytes: usize,
}

/// Places planned weights, counting their bytes.
struct Placer<'a, B: MeshOps, S> {
    mesh: &'a B,
    source: &'a S,
    format: WeightFormat,
    bytes: usize,
}

impl<B: MeshOps, S: WeightSource> Placer<'_, B, S>
where
    S::Error: std::error::Error + 'static,
{
    fn place(&mut self, plan: &WeightPlan) -> Result<B::Weight, LoadError<S::Error>> {
        let w = plan.place(self.mesh, self.source, self.format)?;
        self.bytes += self.mesh.weight_bytes(&w);
        Ok(w)
    }

    fn linear(&mut self, p: &plan::LinearPlan) -> Result<Linear<B::Weight>, LoadError<S::Error>> {
        Ok(Linear {
            weight: self.place(&p.weight)?,
            bias: self.place(&p.bias)?,
        })
    }

    fn norm(&mut self, p: &plan::NormPlan) -> Result<Norm<B::Weight>, LoadError<S::Error>> {
        Ok(Norm {
            weight: self.place(&p.weight)?,
            bias: self.place(&p.bias)?,
        })
    }
}

impl<B: MeshOps> VisionTower<B> {
    /// Place the tower's weights from `source` (tensor names relative to the tower, e.g.
    /// `blocks.0.attn.qkv.weight`) with matrices held in `format`.
    pub fn load<S: WeightSource>(
        mesh: &B,
        shape: VisionShape,
        format: WeightFormat,
        source: &S,
    ) -> Result<Self, LoadError<S::Error>>
    where
        S::Error: std::error::Error + 'static,
    {
        let plan = VisionPlan::new(&shape, mesh.mesh().devices())?;
        let table = source
            .rows("pos_embed.weight", 0..shape.positions, false)
            .map_err(PlaceError::Source)?;
        if table.cols != shape.hidden {
            let e = SplitError {
                tensor: "pos_embed.weight".into(),
                msg: format!("{} columns for hidden size {}", table.cols, shape.hidden),
            };
            return Err(PlaceError::Source(e.into()).into());
        }
        let position_table = table.to_f32();
        let mut p = Placer {
            mesh,
            source,
            format,
            bytes: position_table.len() * 4,
        };
        let patch_embed = p.linear(&plan.patch_embed)?;
        let blocks = plan
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    norm1: p.norm(&b.norm1)?,
                    qkv: p.linear(&b.qkv)?,
                    proj: p.linear(&b.proj)?,
                    norm2: p.norm(&b.norm2)?,
                    fc1: p.linear(&b.fc1)?,
                    fc2: p.linear(&b.fc2)?,
                })
            })
            .collect::<Result<Vec<_>, LoadError<S::Error>>>()?;
        let merger_norm = p.norm(&plan.merger_norm)?;
        let merger_fc1 = p.linear(&plan.merger_fc1)?;
        let merger_fc2 = p.linear(&plan.merger_fc2)?;
        Ok(VisionTower {
            shape,
            weight_bytes: p.bytes,
            plan,
            patch_embed,
            position_table,
            blocks,
            merger_norm,
            merger_fc1,
            merger_fc2,
        })
    }

    pub fn shape(&self) -> &VisionShape {
        &self.shape
    }

    pub fn plan(&self) -> &VisionPlan {
        &self.plan
    }

    /// Bytes of the tower's weights on the mesh (all devices) plus its host position table.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// A row-parallel projection: partial sums completed by the plan's collective, then the
    /// bias added once.
    fn row_parallel(
        &self,
        mesh: &B,
        x: &B::Tensor,
        l: &Linear<B::Weight>,
    ) -> Result<B::Tensor, DeviceError> {
        let y = mesh.linear(x, &l.weight)?;
        let y = match self.plan.reduce {
            Collective::None => y,
            Collective::AllReduce => mesh.all_reduce(&y)?,
        };
        mesh.add_bias(&y, &l.bias)
    }

    /// A column-parallel projection with its (split) bias.
    fn column_parallel(
        &self,
        mesh: &B,
        x: &B::Tensor,
        l: &Linear<B::Weight>,
    ) -> Result<B::Tensor, DeviceError> {
        mesh.add_bias(&mesh.linear(x, &l.weight)?, &l.bias)
    }

    /// The output of the last block (before the merger), `[patches, hidden]` replicated, for
    /// the patch rows of media with `grids` (concatenated in that order).
    pub fn hidden(
        &self,
        mesh: &B,
        pixel_rows: &[f32],
        grids: &[Grid],
    ) -> Result<B::Tensor, DeviceError> {
        self.hidden_probed(mesh, pixel_rows, grids, &mut |_, _| Ok(()))
    }

    /// [`VisionTower::hidden`], calling `probe(j, x)` with block `j`'s output.
    pub fn hidden_probed(
        &self,
        mesh: &B,
        pixel_rows: &[f32],
        grids: &[Grid],
        probe: &mut BlockProbe<'_, B::Tensor>,
    ) -> Result<B::Tensor, DeviceError> {
        let s = &self.shape;
        let patches: usize = grids.iter().map(Grid::patches).sum();
        if pixel_rows.len() != patches * s.patch_values
            || grids.iter().any(|g| g.h % MERGE != 0 || g.w % MERGE != 0)
        {
            return Err(DeviceError::Shape {
                op: "vision tower",
                detail: format!(
                    "{} pixel values for grids {grids:?} of {} values per patch",
                    pixel_rows.len(),
                    s.patch_values
                ),
            });
        }
        let devices = mesh.mesh().devices();
        let head_dim = s.head_dim();
        let heads = s.heads / devices;
        // Patch embedding, row-parallel over the pixel values: each device gets its block of
        // every patch row.
        let pixels = if devices == 1 {
            mesh.replicate(&HostTensor::new(
                patches,
                s.patch_values,
                pixel_rows.to_vec(),
            ))?
        } else {
            let block = s.patch_values / devices;
            mesh.shard(
                (0..devices)
                    .map(|d| {
                        let data = pixel_rows
                            .chunks_exact(s.patch_values)
                            .flat_map(|row| &row[d * block..(d + 1) * block])
                            .copied()
                            .collect();
                        HostTensor::new(patches, block, data)
                    })
                    .collect(),
            )?
        };
        let mut x = self.row_parallel(mesh, &pixels, &self.patch_embed)?;
        let inputs = TowerInputs::new(&self.position_table, s.hidden, head_dim, grids);
        x = mesh.add(
            &x,
            &mesh.replicate(&HostTensor::new(patches, s.hidden, inputs.positions))?,
        )?;
        let cos = mesh.replicate(&HostTensor::new(patches, head_dim, inputs.cos))?;
        let sin = mesh.replicate(&HostTensor::new(patches, head_dim, inputs.sin))?;
        let width = heads * head_dim;
        let qkv_widths = list_u32("split_cols", "width", [width; 3])?;
        let bounds = inputs.segments.iter().flat_map(|s| [s.start, s.end]);
        let segment_bounds = list_u32("segment_attention", "segment bound", bounds)?;
        for (j, b) in self.blocks.iter().enumerate() {
            let h = mesh.layer_norm(&x, &b.norm1.weight, &b.norm1.bias, NORM_EPS)?;
            let qkv = self.column_parallel(mesh, &h, &b.qkv)?;
            let [q, k, v]: [B::Tensor; 3] = mesh
                .split_cols(&qkv, &qkv_widths)?
                .try_into()
                .map_err(|_| DeviceError::Shape {
                    op: "vision tower",
                    detail: "qkv did not split in three".into(),
                })?;
            let q = mesh.rotary(&q, &cos, &sin, heads, head_dim)?;
            let k = mesh.rotary(&k, &cos, &sin, heads, head_dim)?;
            let attended = mesh.segment_attention(&q, &k, &v, heads, head_dim, &segment_bounds)?;
            x = mesh.add(&x, &self.row_parallel(mesh, &attended, &b.proj)?)?;
            let h = mesh.layer_norm(&x, &b.norm2.weight, &b.norm2.bias, NORM_EPS)?;
            let up = mesh.gelu(&self.column_parallel(mesh, &h, &b.fc1)?, Gelu::Tanh)?;
            x = mesh.add(&x, &self.row_parallel(mesh, &up, &b.fc2)?)?;
            probe(j, &x)?;
        }
        Ok(x)
    }

    /// The merger: one embedding of the text model's width per 2x2 block of `hidden`,
    /// `[patches / 4, out_hidden]` on the host.
    pub fn merge(&self, mesh: &B, hidden: &B::Tensor) -> Result<Vec<f32>, DeviceError> {
        let n = &self.merger_norm;
        let normed = mesh.layer_norm(hidden, &n.weight, &n.bias, NORM_EPS)?;
        let folded = mesh.fold_rows(&normed, MERGE * MERGE)?;
        let up = mesh.gelu(
            &self.column_parallel(mesh, &folded, &self.merger_fc1)?,
            Gelu::Erf,
        )?;
        let out = self.row_parallel(mesh, &up, &self.merger_fc2)?;
        Ok(mesh.gather(&out, GatherAxis::Cols)?.data)
    }

    /// `merge(hidden(..))`: the rows spliced at the pad positions.
    pub fn embed(
        &self,
        mesh: &B,
        pixel_rows: &[f32],
        grids: &[Grid],
    ) -> Result<Vec<f32>, DeviceError> {
        let hidden = self.hidden(mesh, pixel_rows, grids)?;
        self.merge(mesh, &hidden)
    }
}
