//! Preprocessing against goldens-media (what the reference's processor produced): for every
//! image and video of every case — decoded RGB equal to the stored one (PNG exactly, JPEG within
//! a few levels: decoders differ), target sizes, grids, sampled frames and timestamps exact, the
//! resize bit for bit (run on the stored RGB, so a JPEG decoder difference cannot hide a resize
//! one), and `pixel_values` equal by SHA-256 (and in full where stored).

use clef_vision::{
    decode_image, decode_media_string, patch_rows, resize, sample_frames, smart_resize, timestamps,
    RgbImage, ROW_VALUES,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;

fn media_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-clef/goldens-media")
}

/// (dtype, shape, raw bytes) of every tensor of the media file.
fn tensors() -> HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(media_dir().join("tensors_media.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn jsonl(name: &str) -> Vec<Value> {
    std::fs::read_to_string(media_dir().join(name))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sha256_f32(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// An `[..., H, W, 3]` uint8 tensor's frames.
fn frames_of(shape: &[usize], data: &[u8]) -> Vec<RgbImage> {
    let (h, w) = (shape[shape.len() - 3], shape[shape.len() - 2]);
    data.chunks_exact(h * w * 3)
        .map(|f| RgbImage {
            width: w,
            height: h,
            data: f.to_vec(),
        })
        .collect()
}

fn decode(s: &Value) -> RgbImage {
    let bytes = decode_media_string(s.as_str().unwrap()).unwrap();
    decode_image(&bytes, 1 << 26).unwrap()
}

/// JPEG decoders differ (IDCT, 4:2:0 chroma upsampling): the `image` crate's against Pillow's
/// libjpeg-turbo here is exact on 73% of the values, ±1 on 17%, ±2 on 10%, and ±3 or ±4 on
/// 0.05%. Allowed: at most 4 levels, and more than 2 on at most 0.1% of the values.
fn assert_jpeg_close(ours: &RgbImage, reference: &RgbImage, what: &str) {
    let d: Vec<u8> = ours
        .data
        .iter()
        .zip(&reference.data)
        .map(|(x, y)| x.abs_diff(*y))
        .collect();
    let far = d.iter().filter(|&&v| v > 2).count();
    let max = d.iter().copied().max().unwrap_or(0);
    assert!(
        max <= 4 && far * 1000 <= d.len(),
        "{what}: max {max}, {far} of {} above 2",
        d.len()
    );
}

fn max_level_diff(a: &RgbImage, b: &RgbImage) -> u8 {
    assert_eq!((a.width, a.height), (b.width, b.height));
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn grid_of(v: &Value) -> [usize; 3] {
    let g: Vec<usize> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    [g[0], g[1], g[2]]
}

#[test]
fn images_decode_resize_and_patch_as_the_reference() {
    let tensors = tensors();
    let requests = jsonl("requests.jsonl");
    let mut checked = 0;
    for expected in jsonl("expected_f32.jsonl") {
        let id = expected["id"].as_str().unwrap();
        let Some(images) = expected["media"]["images"].as_array() else {
            continue;
        };
        let request = requests.iter().find(|r| r["id"] == id).unwrap();
        let body: Value = serde_json::from_str(request["body"].as_str().unwrap()).unwrap();
        for (i, want) in images.iter().enumerate() {
            let ours = decode(&body["images"][i]);
            let jpeg = want["format"] == "JPEG";
            let stored_rgb = tensors
                .get(&format!("{id}.image{i}.rgb"))
                .map(|(_, shape, data)| frames_of(shape, data).remove(0));
            if let Some(rgb) = &stored_rgb {
                if jpeg {
                    assert_jpeg_close(&ours, rgb, &format!("{id} image {i}"));
                } else {
                    assert_eq!(max_level_diff(&ours, rgb), 0, "{id} image {i}: decoded RGB");
                }
            }
            let size = smart_resize(ours.height, ours.width, None);
            assert_eq!(
                size,
                (
                    want["resized_height"].as_u64().unwrap() as usize,
                    want["resized_width"].as_u64().unwrap() as usize
                ),
                "{id} image {i}"
            );
            // The resize on the reference's own RGB (PNG: ours is the same) must be exact.
            let source = stored_rgb.clone().unwrap_or_else(|| ours.clone());
            let resized = resize(&source, size.1, size.0);
            if let Some((_, shape, data)) = tensors.get(&format!("{id}.image{i}.resized")) {
                let stored = frames_of(shape, data).remove(0);
                assert_eq!(
                    max_level_diff(&resized, &stored),
                    0,
                    "{id} image {i}: resize"
                );
            }
            let (rows, grid) = patch_rows(&[&resized, &resized]);
            assert_eq!(
                [grid.t, grid.h, grid.w],
                grid_of(&want["grid_thw"]),
                "{id} image {i}"
            );
            assert_eq!(grid.tokens() as u64, want["tokens"].as_u64().unwrap());
            assert_eq!(
                sha256_f32(&rows),
                want["pixel_values_sha256"].as_str().unwrap(),
                "{id} image {i}: pixel_values"
            );
            if id == "img_tiny_20x20" {
                let (_, _, data) = &tensors["img_tiny_20x20.pixel_values"];
                let stored: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                assert_eq!(rows, stored);
                assert_eq!(rows.len(), 256 * ROW_VALUES);
            }
            checked += 1;
        }
    }
    assert!(checked >= 14, "only {checked} images checked");
}

#[test]
fn videos_sample_resize_and_patch_as_the_reference() {
    let tensors = tensors();
    let requests = jsonl("requests.jsonl");
    let mut checked = 0;
    for expected in jsonl("expected_f32.jsonl") {
        let id = expected["id"].as_str().unwrap();
        let Some(videos) = expected["media"]["videos"].as_array() else {
            continue;
        };
        let request = requests.iter().find(|r| r["id"] == id).unwrap();
        let body: Value = serde_json::from_str(request["body"].as_str().unwrap()).unwrap();
        for (j, want) in videos.iter().enumerate() {
            let frames = body["videos"][j].as_array().unwrap();
            assert_eq!(frames.len() as u64, want["frames_in"].as_u64().unwrap());
            let indices = sample_frames(frames.len());
            let want_indices: Vec<usize> = want["sampled_frame_indices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(indices, want_indices, "{id} video {j}");
            let want_stamps: Vec<String> = want["timestamps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            assert_eq!(timestamps(&indices), want_stamps, "{id} video {j}");
            let decoded: Vec<RgbImage> = indices.iter().map(|&k| decode(&frames[k])).collect();
            let stored_rgb = tensors
                .get(&format!("{id}.video{j}.rgb"))
                .map(|(_, shape, data)| frames_of(shape, data));
            if let Some(rgb) = &stored_rgb {
                for (k, (a, b)) in decoded.iter().zip(rgb).enumerate() {
                    assert_jpeg_close(a, b, &format!("{id} video {j} frame {k}"));
                }
            }
            let size = smart_resize(decoded[0].height, decoded[0].width, Some(indices.len()));
            assert_eq!(
                size,
                (
                    want["resized_height"].as_u64().unwrap() as usize,
                    want["resized_width"].as_u64().unwrap() as usize
                ),
                "{id} video {j}"
            );
            let sources = stored_rgb.unwrap_or(decoded);
            let mut resized: Vec<RgbImage> =
                sources.iter().map(|f| resize(f, size.1, size.0)).collect();
            if let Some((_, shape, data)) = tensors.get(&format!("{id}.video{j}.resized")) {
                for (k, (a, b)) in resized.iter().zip(frames_of(shape, data)).enumerate() {
                    assert_eq!(max_level_diff(a, &b), 0, "{id} video {j} frame {k}: resize");
                }
            }
            if resized.len() % 2 == 1 {
                resized.push(resized[resized.len() - 1].clone());
                assert_eq!(want["temporal_padding"], 1);
            }
            let refs: Vec<&RgbImage> = resized.iter().collect();
            let (rows, grid) = patch_rows(&refs);
            assert_eq!(
                [grid.t, grid.h, grid.w],
                grid_of(&want["grid_thw"]),
                "{id} video {j}"
            );
            assert_eq!(
                sha256_f32(&rows),
                want["pixel_values_sha256"].as_str().unwrap(),
                "{id} video {j}: pixel_values"
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} videos checked");
}
