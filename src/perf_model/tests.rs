//! The model's totals against independent counts from the configuration.

use super::*;
use crate::checkpoint::shapes::{shape_configs, Shape, CLEF_27B_VISION};
use crate::checkpoint::LayerKind;
use crate::precision::Precision;

fn clef_27b() -> TextConfig {
    shape_configs(Shape::Clef27b).0
}

/// Matrix parameters of the whole model, counted from the config alone.
fn independent_params(c: &TextConfig) -> usize {
    let h = c.hidden_size;
    let attention = h
        * (2 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim)
        + c.num_attention_heads * c.head_dim * h;
    let deltanet = h * (2 * c.key_dim() + 2 * c.value_dim() + 2 * c.linear_num_value_heads)
        + c.value_dim() * h;
    let mlp = 3 * h * c.intermediate_size;
    c.count(LayerKind::Attention) * attention
        + c.count(LayerKind::DeltaNet) * deltanet
        + c.layers.len() * mlp
}

#[test]
fn placed_parameters_and_bytes_equal_an_independent_count() {
    let cfg = clef_27b();
    for devices in [1, 2] {
        let plan = TpPlan::new(&cfg, devices).unwrap();
        let p = Precision::resolve("selected", |_| None).unwrap();
        let m = text_matrices(&cfg, &plan, &p.weight_formats());
        let params: usize = m.iter().map(|x| x.params()).sum();
        assert_eq!(
            params * devices,
            independent_params(&cfg),
            "{devices} devices"
        );
        for (class, format, params, bytes) in bytes_by_class(&m) {
            let per = match format {
                WeightFormat::F32 => 4.0,
                WeightFormat::Bf16 => 2.0,
                WeightFormat::Bfp8 => 1088.0 / 1024.0,
                WeightFormat::Bfp4 => 576.0 / 1024.0,
            };
            let want = params as f64 * per;
            // Tile padding only ever adds (the fused DeltaNet block is not tile-aligned).
            assert!(
                bytes as f64 >= want && (bytes as f64) < want * 1.01,
                "{class}: {bytes} vs {want}"
            );
        }
    }
    // The spec's estimate for the port (§6): MLP 64 x (94.7 MB bfp8 gate/up + 89.1 MB bf16 down).
    let plan = TpPlan::new(&cfg, 2).unwrap();
    let p = Precision::resolve("selected", |_| None).unwrap();
    let by = bytes_by_class(&text_matrices(&cfg, &plan, &p.weight_formats()));
    let mb = |class: &str| by.iter().find(|r| r.0 == class).unwrap().3 as f64 / 64.0 / 1e6;
    assert!(
        (mb("mlp_gate_up") - 94.7).abs() < 0.1,
        "{}",
        mb("mlp_gate_up")
    );
    assert!((mb("mlp_down") - 89.1).abs() < 0.1, "{}", mb("mlp_down"));
}

#[test]
fn chunk_flops_are_twice_params_times_tokens_plus_attention() {
    let cfg = clef_27b();
    let t = 1024;
    for devices in [1, 2] {
        let plan = TpPlan::new(&cfg, devices).unwrap();
        let p = Precision::resolve("selected", |_| None).unwrap();
        let ops = chunk_ops(&cfg, &plan, &p.weight_formats(), t, 0);
        let matmul: f64 = ops
            .iter()
            .filter(|o| o.name.ends_with("matmul"))
            .map(|o| o.flops)
            .sum();
        assert_eq!(
            matmul * devices as f64,
            2.0 * independent_params(&cfg) as f64 * t as f64
        );
        let sdpa = ops
            .iter()
            .find(|o| o.name.starts_with("chunked SDPA"))
            .unwrap();
        let want = 4.0
            * cfg.head_dim as f64
            * cfg.num_attention_heads as f64
            * (t * (t + 1) / 2) as f64
            * cfg.count(LayerKind::Attention) as f64;
        assert_eq!(sdpa.flops * devices as f64, want);
        assert_eq!(sdpa.count, cfg.count(LayerKind::Attention));
        let collectives = ops
            .iter()
            .filter(|o| o.name.starts_with("all_reduce"))
            .map(|o| o.count)
            .sum::<usize>();
        assert_eq!(
            collectives,
            if devices == 1 {
                0
            } else {
                2 * cfg.layers.len()
            }
        );
    }
}

#[test]
fn the_vision_tower_flops_are_twice_params_times_patches_plus_attention() {
    let v = CLEF_27B_VISION;
    let patches = 1024;
    let plan = clef_vision::tower::plan::VisionPlan::new(&v, 2).unwrap();
    let ops = vision_ops(&v, &plan, WeightFormat::Bf16, patches);
    let (h, i, m) = (v.hidden, v.intermediate, v.merged());
    let params = h * v.patch_values + v.depth * (4 * h * h + 2 * h * i) + m * m + m * v.out_hidden;
    let matmul: f64 = ops
        .iter()
        .filter(|o| o.name.ends_with("matmul"))
        .map(|o| o.flops)
        .sum();
    assert_eq!(matmul * 2.0, 2.0 * params as f64 * patches as f64);
    let attention = ops
        .iter()
        .find(|o| o.name == "block segment attention")
        .unwrap();
    assert_eq!(
        attention.flops * 2.0,
        (4 * v.head_dim() * v.heads * patches * patches * v.depth) as f64
    );
}

#[test]
fn the_report_predicts_a_chunk_and_names_the_port() {
    let cfg = clef_27b();
    let p = Precision::resolve("selected", |_| None).unwrap();
    let text = report::render(&report::PlanQuestion {
        name: "clef-27b",
        text: &cfg,
        vision: Some(CLEF_27B_VISION),
        devices: 2,
        precision: &p,
        tokens: 1024,
        start: 0,
        patches: 1024,
    })
    .unwrap();
    assert!(text.contains("338 ms"), "{text}");
    assert!(text.contains("| mlp_gate_up | bfp8_b |"), "{text}");
    assert!(
        text.contains("## Vision tower: one image of 1024 patches"),
        "{text}"
    );
}
