//! The vision tower's ops for one image of `patches` patches (one segment), from its TP plan.

use super::ops::{OpCost, OpKind};
use super::{device_inputs, device_rows, PlacedMatrix};
use clef_device::plan::WeightPlan;
use clef_device::WeightFormat;
use clef_vision::tower::plan::VisionPlan;
use clef_vision::VisionShape;

/// Every matrix of the tower's plan as one device holds it.
pub fn vision_matrices(
    shape: &VisionShape,
    plan: &VisionPlan,
    format: WeightFormat,
) -> Vec<PlacedMatrix> {
    let n = plan.devices;
    let m = |name: &str, w: &WeightPlan, full_in: usize| PlacedMatrix {
        class: "vision",
        name: name.to_string(),
        inputs: device_inputs(w, full_in, n),
        outputs: device_rows(w, n),
        format,
        row_parallel: w.split == clef_device::plan::Split::Rows && n > 1,
    };
    let h = shape.hidden;
    let mut out = vec![m(
        "patch_embed",
        &plan.patch_embed.weight,
        shape.patch_values,
    )];
    for b in &plan.blocks {
        out.push(m("qkv", &b.qkv.weight, h));
        out.push(m("proj", &b.proj.weight, h));
        out.push(m("fc1", &b.fc1.weight, h));
        out.push(m("fc2", &b.fc2.weight, shape.intermediate));
    }
    out.push(m("merger fc1", &plan.merger_fc1.weight, shape.merged()));
    out.push(m("merger fc2", &plan.merger_fc2.weight, shape.merged()));
    out
}

/// The tower's ops for one image of `patches` patches, per device, grouped over blocks.
pub fn vision_ops(
    shape: &VisionShape,
    plan: &VisionPlan,
    format: WeightFormat,
    patches: usize,
) -> Vec<OpCost> {
    let n = plan.devices;
    let p = patches as f64;
    let h = shape.hidden as f64;
    let mut ops: Vec<OpCost> = Vec::new();
    let mut add = |name: &str, kind: OpKind, flops: f64, dram: f64, link: f64| match ops
        .iter_mut()
        .find(|o| o.name == name)
    {
        Some(o) => {
            o.count += 1;
            o.flops += flops;
            o.dram_bytes += dram;
            o.link_bytes += link;
        }
        None => ops.push(OpCost {
            name: name.into(),
            kind,
            count: 1,
            flops,
            dram_bytes: dram,
            link_bytes: link,
            programs: 1,
            movement: None,
        }),
    };
    let matmul = |m: &PlacedMatrix| {
        let out = if m.row_parallel { 4.0 } else { 2.0 };
        (
            2.0 * p * m.params() as f64,
            m.bytes() as f64 + p * (2.0 * m.inputs as f64 + out * m.outputs as f64),
        )
    };
    let reduce = |width: f64| {
        let nf = n as f64;
        (
            2.0 * (nf - 1.0) / nf * p * width * 4.0,
            2.0 * p * width * 4.0,
        )
    };
    for m in vision_matrices(shape, plan, format) {
        let (flops, dram) = matmul(&m);
        let name = match m.name.as_str() {
            "qkv" | "proj" | "fc1" | "fc2" => format!("block {} matmul", m.name),
            other => format!("{other} matmul"),
        };
        add(&name, OpKind::Compute, flops, dram, 0.0);
        if m.row_parallel {
            let (link, dram) = reduce(m.outputs as f64);
            add(
                "all_reduce (row-parallel projections)",
                OpKind::Collective,
                0.0,
                dram,
                link,
            );
        }
    }
    let (heads, d) = ((shape.heads / n) as f64, shape.head_dim() as f64);
    for _ in &plan.blocks {
        add(
            "block LayerNorm x2 + bias + residual",
            OpKind::Memory,
            16.0 * p * h,
            2.0 * 8.0 * p * h,
            0.0,
        );
        add(
            "block 2-D rotary (q, k)",
            OpKind::Memory,
            6.0 * p * 2.0 * heads * d,
            2.0 * 4.0 * p * heads * d,
            0.0,
        );
        // Bidirectional attention over the image's patches.
        add(
            "block segment attention",
            OpKind::Compute,
            4.0 * d * heads * p * p,
            2.0 * 4.0 * p * heads * d,
            0.0,
        );
        let inter = (shape.intermediate / n) as f64;
        add(
            "block GELU (tanh)",
            OpKind::Memory,
            8.0 * p * inter,
            2.0 * 2.0 * p * inter,
            0.0,
        );
    }
    ops
}
