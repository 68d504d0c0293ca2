//! The vision tower's tensor-parallel plan as data, like the text backbone's (spec
//! qwen35-backbone.md §11, Tenstorrent's documentation): every block's fused `qkv` and `fc1` are
//! column-parallel (each device owns whole attention heads and a block of MLP channels), `proj`
//! and `fc2` row-parallel with an f32 all-reduce; the patch embedding is row-parallel over the
//! pixel values (the host uploads each device its block of them); the merger's `fc1` is
//! column-parallel and its `fc2` row-parallel. LayerNorms, the biases of row-parallel
//! projections (added once, after the reduction) and the position table are whole everywhere.

use clef_device::plan::{Collective, Part, PlanError, Split, WeightPlan};

/// The shape of a vision tower (`vision_config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionShape {
    pub depth: usize,
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    /// Width of the merged embeddings (the text model's hidden size).
    pub out_hidden: usize,
    /// Rows of the learned position table (a square grid).
    pub positions: usize,
    /// Values of one patch row (`3 × temporal_patch × patch²`).
    pub patch_values: usize,
}

impl VisionShape {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// The merger's width: a 2x2 block of patches side by side.
    pub fn merged(&self) -> usize {
        self.hidden * crate::preprocess::MERGE * crate::preprocess::MERGE
    }
}

/// `y = x·Wᵀ + b`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearPlan {
    pub weight: WeightPlan,
    pub bias: WeightPlan,
}

/// LayerNorm weight and bias, whole on every device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NormPlan {
    pub weight: WeightPlan,
    pub bias: WeightPlan,
}

/// One pre-LN block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    pub norm1: NormPlan,
    /// `[q, k, v]` per device, each a block of whole heads.
    pub qkv: LinearPlan,
    pub proj: LinearPlan,
    pub norm2: NormPlan,
    pub fc1: LinearPlan,
    pub fc2: LinearPlan,
}

/// The whole tower for one mesh size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisionPlan {
    pub devices: usize,
    pub patch_embed: LinearPlan,
    pub blocks: Vec<BlockPlan>,
    pub merger_norm: NormPlan,
    pub merger_fc1: LinearPlan,
    pub merger_fc2: LinearPlan,
    /// After every row-parallel projection.
    pub reduce: Collective,
}

fn norm(name: &str, n: usize) -> NormPlan {
    NormPlan {
        weight: WeightPlan::replicated_vector(format!("{name}.weight"), n),
        bias: WeightPlan::replicated_vector(format!("{name}.bias"), n),
    }
}

/// Output channels split: consecutive row blocks of `name.weight` / `name.bias` of the given
/// heights (e.g. q, k, v), each cut per device.
fn columns(name: &str, blocks: &[usize]) -> LinearPlan {
    let of = |tensor: String| {
        let mut start = 0;
        blocks
            .iter()
            .map(|&n| {
                start += n;
                Part {
                    tensor: tensor.clone(),
                    rows: start - n..start,
                }
            })
            .collect()
    };
    LinearPlan {
        weight: WeightPlan::new(of(format!("{name}.weight")), Split::Columns, true),
        bias: WeightPlan::new(of(format!("{name}.bias")), Split::Columns, false),
    }
}

/// Input channels split; the bias is added whole after the reduction.
fn rows(name: &str, outputs: usize) -> LinearPlan {
    LinearPlan {
        weight: WeightPlan::new(
            vec![Part::whole(format!("{name}.weight"), outputs)],
            Split::Rows,
            true,
        ),
        bias: WeightPlan::replicated_vector(format!("{name}.bias"), outputs),
    }
}

impl VisionPlan {
    pub fn new(shape: &VisionShape, devices: usize) -> Result<Self, PlanError> {
        const PART: &str = "the vision tower";
        let check = |n: usize, what: &str| PlanError::check_divisible(PART, devices, n, what);
        check(shape.heads, "num_heads")?;
        check(shape.intermediate, "intermediate_size")?;
        check(shape.merged(), "the merger width")?;
        check(shape.patch_values, "the patch row width")?;
        let bad = |what: String| {
            Err(PlanError {
                part: PART,
                devices,
                what,
            })
        };
        if shape.heads == 0 || !shape.hidden.is_multiple_of(shape.heads) {
            return bad(format!(
                "hidden size {} over {} heads",
                shape.hidden, shape.heads
            ));
        }
        if shape.head_dim() == 0 || !shape.head_dim().is_multiple_of(4) {
            return bad(format!(
                "head size {} is not a multiple of 4 (2-D rotary halves per axis)",
                shape.head_dim()
            ));
        }
        let side = (shape.positions as f64).sqrt() as usize;
        if shape.positions == 0 || side * side != shape.positions {
            return bad(format!(
                "num_position_embeddings ({}) is not a square grid",
                shape.positions
            ));
        }
        let h = shape.hidden;
        let blocks = (0..shape.depth)
            .map(|i| {
                let b = format!("blocks.{i}");
                BlockPlan {
                    norm1: norm(&format!("{b}.norm1"), h),
                    qkv: columns(&format!("{b}.attn.qkv"), &[h, h, h]),
                    proj: rows(&format!("{b}.attn.proj"), h),
                    norm2: norm(&format!("{b}.norm2"), h),
                    fc1: columns(&format!("{b}.mlp.linear_fc1"), &[shape.intermediate]),
                    fc2: rows(&format!("{b}.mlp.linear_fc2"), h),
                }
            })
            .collect();
        Ok(VisionPlan {
            devices,
            // The Conv3d kernel [hidden, 3, 2, 16, 16] flattened is the patch row layout.
            patch_embed: rows("patch_embed.proj", h),
            blocks,
            merger_norm: norm("merger.norm", h),
            merger_fc1: columns("merger.linear_fc1", &[shape.merged()]),
            merger_fc2: rows("merger.linear_fc2", shape.out_hidden),
            reduce: Collective::for_devices(devices),
        })
    }

    /// Every weight of the plan, in load order.
    pub fn weights(&self) -> Vec<&WeightPlan> {
        fn linear(l: &LinearPlan) -> [&WeightPlan; 2] {
            [&l.weight, &l.bias]
        }
        let mut out: Vec<&WeightPlan> = linear(&self.patch_embed).to_vec();
        fn norm(n: &NormPlan) -> [&WeightPlan; 2] {
            [&n.weight, &n.bias]
        }
        for b in &self.blocks {
            out.extend(norm(&b.norm1));
            out.extend(linear(&b.qkv));
            out.extend(linear(&b.proj));
            out.extend(norm(&b.norm2));
            out.extend(linear(&b.fc1));
            out.extend(linear(&b.fc2));
        }
        out.extend(norm(&self.merger_norm));
        out.extend(linear(&self.merger_fc1));
        out.extend(linear(&self.merger_fc2));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: VisionShape = VisionShape {
        depth: 2,
        hidden: 32,
        heads: 2,
        intermediate: 64,
        out_hidden: 64,
        positions: 64,
        patch_values: 1536,
    };

    #[test]
    fn two_devices_own_whole_heads_and_reduce_after_row_parallel_projections() {
        let plan = VisionPlan::new(&TINY, 2).unwrap();
        assert_eq!(plan.reduce, Collective::AllReduce);
        let qkv = &plan.blocks[0].qkv;
        assert_eq!(qkv.weight.split, Split::Columns);
        let rows: Vec<_> = qkv.weight.parts.iter().map(|p| p.rows.clone()).collect();
        assert_eq!(rows, vec![0..32, 32..64, 64..96]);
        assert_eq!(qkv.bias.parts.len(), 3);
        assert_eq!(plan.blocks[1].proj.weight.split, Split::Rows);
        assert_eq!(plan.blocks[1].proj.bias.split, Split::Replicated);
        assert_eq!(plan.patch_embed.weight.split, Split::Rows);
        assert_eq!(plan.merger_fc1.weight.split, Split::Columns);
        assert_eq!(plan.merger_fc2.weight.parts[0].rows, 0..64);
        // 2 for the patch embedding, 12 per block, 6 for the merger.
        assert_eq!(plan.weights().len(), 2 + 2 * 12 + 6);
        assert_eq!(VisionPlan::new(&TINY, 1).unwrap().reduce, Collective::None);
    }

    #[test]
    fn shapes_the_tower_cannot_run_are_refused() {
        let odd = VisionShape { heads: 3, ..TINY };
        let e = VisionPlan::new(&odd, 2).unwrap_err();
        assert!(e.to_string().contains("num_heads (3)"), "{e}");
        let narrow = VisionShape {
            hidden: 12,
            heads: 2,
            ..TINY
        };
        assert!(VisionPlan::new(&narrow, 1)
            .unwrap_err()
            .to_string()
            .contains("multiple of 4"));
        let table = VisionShape {
            positions: 60,
            ..TINY
        };
        assert!(VisionPlan::new(&table, 1)
            .unwrap_err()
            .to_string()
            .contains("square"));
    }
}
