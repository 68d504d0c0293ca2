//! The tensor-parallel plan as data: for every weight of the prefill, which checkpoint rows it
//! is assembled from, how it is split over the devices of the mesh, and which collective
//! follows the projections whose outputs are partial sums.
//!
//! It follows the Tenstorrent port (Tenstorrent's documentation): fused column-parallel projections
//! (attention `[q|gate, k, v]`, DeltaNet `[q, k, v, z, b, a]`, MLP `[gate, up]`) assembled per
//! device, row-parallel `o_proj` / `out_proj` / `down_proj` followed by a reduction in f32;
//! each device owns whole KV heads and whole DeltaNet value heads, so nothing crosses devices
//! inside attention or the delta rule.

use crate::checkpoint::{LayerKind, TextConfig};

pub use clef_device::plan::{Collective, Part, PlanError, Split, WeightPlan};

/// The mixer half of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MixerPlan {
    Attention {
        /// `[q|gate (per head), k, v]` per device.
        qkv: WeightPlan,
        q_norm: WeightPlan,
        k_norm: WeightPlan,
        o_proj: WeightPlan,
    },
    DeltaNet {
        /// `[q, k, v, z, b, a]` per device.
        in_proj: WeightPlan,
        /// Conv taps `[channels, kernel]` in the device order of `[q, k, v]`.
        conv: WeightPlan,
        a_log: WeightPlan,
        dt_bias: WeightPlan,
        norm: WeightPlan,
        out_proj: WeightPlan,
    },
}

/// One decoder layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    pub input_norm: WeightPlan,
    pub mixer: MixerPlan,
    pub post_norm: WeightPlan,
    /// `[gate, up]` per device.
    pub gate_up: WeightPlan,
    pub down: WeightPlan,
    /// After `o_proj` / `out_proj` and after `down_proj`.
    pub reduce: Collective,
}

/// The whole plan for one mesh size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpPlan {
    pub devices: usize,
    pub layers: Vec<LayerPlan>,
    pub final_norm: WeightPlan,
}

impl TpPlan {
    /// The plan for `devices` devices (1 or 2 on a line mesh; any count that divides the
    /// heads works).
    pub fn new(cfg: &TextConfig, devices: usize) -> Result<Self, PlanError> {
        let check =
            |n: usize, what: &str| PlanError::check_divisible("the model", devices, n, what);
        check(cfg.intermediate_size, "intermediate_size")?;
        if cfg.count(LayerKind::Attention) > 0 {
            check(cfg.num_key_value_heads, "num_key_value_heads")?;
            check(cfg.num_attention_heads, "num_attention_heads")?;
        }
        if cfg.count(LayerKind::DeltaNet) > 0 {
            check(cfg.linear_num_key_heads, "linear_num_key_heads")?;
            check(cfg.linear_num_value_heads, "linear_num_value_heads")?;
        }
        let h = cfg.hidden_size;
        let reduce = Collective::for_devices(devices);
        let vector = WeightPlan::replicated_vector;
        let layers = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let l = format!("layers.{i}");
                let mixer = match kind {
                    LayerKind::Attention => {
                        let a = format!("{l}.self_attn");
                        let (nh, nkv, d) = (
                            cfg.num_attention_heads,
                            cfg.num_key_value_heads,
                            cfg.head_dim,
                        );
                        MixerPlan::Attention {
                            qkv: WeightPlan::new(
                                vec![
                                    Part::whole(format!("{a}.q_proj.weight"), nh * 2 * d),
                                    Part::whole(format!("{a}.k_proj.weight"), nkv * d),
                                    Part::whole(format!("{a}.v_proj.weight"), nkv * d),
                                ],
                                Split::Columns,
                                true,
                            ),
                            q_norm: vector(format!("{a}.q_norm.weight"), d),
                            k_norm: vector(format!("{a}.k_norm.weight"), d),
                            o_proj: WeightPlan::new(
                                vec![Part::whole(format!("{a}.o_proj.weight"), h)],
                                Split::Rows,
                                true,
                            ),
                        }
                    }
                    LayerKind::DeltaNet => {
                        let a = format!("{l}.linear_attn");
                        let (kd, vd, nv) =
                            (cfg.key_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
                        let qkv = format!("{a}.in_proj_qkv.weight");
                        let conv = format!("{a}.conv1d.weight");
                        let segments = |t: &str| {
                            vec![
                                Part {
                                    tensor: t.to_string(),
                                    rows: 0..kd,
                                },
                                Part {
                                    tensor: t.to_string(),
                                    rows: kd..2 * kd,
                                },
                                Part {
                                    tensor: t.to_string(),
                                    rows: 2 * kd..2 * kd + vd,
                                },
                            ]
                        };
                        let mut in_parts = segments(&qkv);
                        in_parts.push(Part::whole(format!("{a}.in_proj_z.weight"), vd));
                        in_parts.push(Part::whole(format!("{a}.in_proj_b.weight"), nv));
                        in_parts.push(Part::whole(format!("{a}.in_proj_a.weight"), nv));
                        MixerPlan::DeltaNet {
                            in_proj: WeightPlan::new(in_parts, Split::Columns, true),
                            conv: WeightPlan::new(segments(&conv), Split::Columns, false),
                            a_log: WeightPlan::new(
                                vec![Part::whole(format!("{a}.A_log"), nv)],
                                Split::Columns,
                                false,
                            ),
                            dt_bias: WeightPlan::new(
                                vec![Part::whole(format!("{a}.dt_bias"), nv)],
                                Split::Columns,
                                false,
                            ),
                            norm: vector(format!("{a}.norm.weight"), cfg.linear_value_head_dim),
                            out_proj: WeightPlan::new(
                                vec![Part::whole(format!("{a}.out_proj.weight"), h)],
                                Split::Rows,
                                true,
                            ),
                        }
                    }
                };
                let inter = cfg.intermediate_size;
                LayerPlan {
                    input_norm: vector(format!("{l}.input_layernorm.weight"), h),
                    mixer,
                    post_norm: vector(format!("{l}.post_attention_layernorm.weight"), h),
                    gate_up: WeightPlan::new(
                        vec![
                            Part::whole(format!("{l}.mlp.gate_proj.weight"), inter),
                            Part::whole(format!("{l}.mlp.up_proj.weight"), inter),
                        ],
                        Split::Columns,
                        true,
                    ),
                    down: WeightPlan::new(
                        vec![Part::whole(format!("{l}.mlp.down_proj.weight"), h)],
                        Split::Rows,
                        true,
                    ),
                    reduce,
                }
            })
            .collect();
        Ok(TpPlan {
            devices,
            layers,
            final_norm: vector("norm.weight".into(), h),
        })
    }
}
