//! A request's images and videos turned into what the model needs (goldens-media README §2–§3,
//! via `clef-vision`): decoded and checked against the host's media limits (every bad image a
//! 422 naming its index), resized and cut into patch rows, and the media block of token ids with
//! its grids. `positions` gives the 3-D M-RoPE positions of the whole prompt once it is encoded.
//! `load_tower` places the vision tower on a mesh by its tensor-parallel plan. `remote` fetches
//! `http(s)://` images behind an SSRF guard when allowed. The pipeline (`engine`) runs the tower
//! on its mesh and splices its rows at the pads.

pub mod remote;

use crate::backbone::{CheckpointSource, LoadError};
use crate::checkpoint::{Checkpoint, CheckpointError, VISION_PREFIX};
use crate::request::RequestError;
use clef_device::{MeshOps, WeightFormat};
use clef_vision::preprocess::{MERGE, TEMPORAL};
use clef_vision::tower::{LoadError as TowerLoadError, VisionShape, VisionTower};
use clef_vision::{
    decode_image, decode_media_string, media_block, mrope_positions, patch_rows, resize,
    sample_frames, smart_resize, timestamps, Grid, MediaBlock, MediaTokens, RgbImage, VideoTokens,
    PATCH, ROW_VALUES,
};
use remote::RemoteImages;
use serde_json::Value;
use tokenizers::Tokenizer;

/// Bounds on media that protect the host (docs/serving.md, "Configuration").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaLimits {
    pub max_images: usize,
    /// Base64-decoded bytes of one image or frame.
    pub max_image_bytes: usize,
    /// Pixels of one decoded image or frame.
    pub max_image_pixels: u64,
    /// Base64-decoded bytes of all images and frames of a request.
    pub max_total_bytes: usize,
    pub max_videos: usize,
    pub max_frames: usize,
    /// `http(s)://` images (`CLEF_ALLOW_REMOTE_IMAGES`); off by default.
    pub remote: RemoteImages,
}

impl Default for MediaLimits {
    fn default() -> Self {
        MediaLimits {
            max_images: 4,
            max_image_bytes: 4 << 20,
            max_image_pixels: 16 << 20,
            max_total_bytes: 8 << 20,
            max_videos: 4,
            max_frames: 32,
            remote: RemoteImages::default(),
        }
    }
}

/// A request's media, ready for the vision tower and the encoder.
#[derive(Clone, Debug)]
pub struct PreparedMedia {
    /// The ids that go right after `STATE:\n`, and their token types.
    pub block: MediaBlock,
    pub image_grids: Vec<Grid>,
    pub video_grids: Vec<Grid>,
    /// `[patches, 1536]` rows of all images, then of all videos.
    pub pixel_values: Vec<f32>,
    pub pixel_values_videos: Vec<f32>,
}

fn at(path: &[Value], msg: impl Into<String>) -> RequestError {
    let mut loc = vec![Value::from("body")];
    loc.extend(path.iter().cloned());
    RequestError {
        status: 422,
        loc,
        msg: msg.into(),
        kind: "value_error".into(),
    }
}

/// The media tokens of `tokenizer` (Qwen3.5's vision specials and `"\n"`).
pub fn media_tokens(tokenizer: &Tokenizer) -> Result<MediaTokens, RequestError> {
    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| RequestError::internal(format!("the tokenizer has no {t} token")))
    };
    let newline = tokenizer
        .encode("\n", false)
        .map_err(|e| RequestError::internal(format!("tokenizer: {e}")))?
        .get_ids()
        .to_vec();
    Ok(MediaTokens {
        vision_start: id("<|vision_start|>")?,
        vision_end: id("<|vision_end|>")?,
        image_pad: id("<|image_pad|>")?,
        video_pad: id("<|video_pad|>")?,
        newline,
    })
}

/// Decode one media string under the limits, counting its bytes into `total`.
fn decode_one(
    s: &str,
    path: &[Value],
    limits: &MediaLimits,
    total: &mut usize,
) -> Result<RgbImage, RequestError> {
    let bytes = if s.starts_with("http://") || s.starts_with("https://") {
        remote::fetch(s, &limits.remote, limits.max_image_bytes)
            .map_err(|e| at(path, e.to_string()))?
    } else {
        decode_media_string(s).map_err(|e| at(path, e.to_string()))?
    };
    if bytes.len() > limits.max_image_bytes {
        return Err(at(
            path,
            format!(
                "the image has {} bytes; at most {} are allowed",
                bytes.len(),
                limits.max_image_bytes
            ),
        ));
    }
    *total += bytes.len();
    if *total > limits.max_total_bytes {
        return Err(at(
            path,
            format!(
                "the request's images and frames exceed {} bytes",
                limits.max_total_bytes
            ),
        ));
    }
    decode_image(&bytes, limits.max_image_pixels).map_err(|e| at(path, e.to_string()))
}

/// Decode, check, resize and patch every image and video of a request.
pub fn prepare(
    tokenizer: &Tokenizer,
    tokens: &MediaTokens,
    images: &[String],
    videos: &[Vec<String>],
    limits: &MediaLimits,
) -> Result<PreparedMedia, RequestError> {
    for (field, count, max) in [
        ("images", images.len(), limits.max_images),
        ("videos", videos.len(), limits.max_videos),
    ] {
        if count > max {
            return Err(at(
                &[field.into()],
                format!("{count} {field}; at most {max} are allowed"),
            ));
        }
    }
    let mut total = 0;
    let mut image_grids = Vec::new();
    let mut pixel_values = Vec::new();
    for (i, s) in images.iter().enumerate() {
        let image = decode_one(s, &["images".into(), i.into()], limits, &mut total)?;
        let (h, w) = smart_resize(image.height, image.width, None);
        let resized = resize(&image, w, h);
        let (rows, grid) = patch_rows(&[&resized, &resized]);
        pixel_values.extend(rows);
        image_grids.push(grid);
    }
    let mut video_grids = Vec::new();
    let mut video_tokens = Vec::new();
    let mut pixel_values_videos = Vec::new();
    for (v, frames) in videos.iter().enumerate() {
        let path = |k: usize| -> Vec<Value> { vec!["videos".into(), v.into(), k.into()] };
        if frames.is_empty() || frames.len() > limits.max_frames {
            return Err(at(
                &["videos".into(), v.into()],
                format!(
                    "a video needs 1 to {} frames; this one has {}",
                    limits.max_frames,
                    frames.len()
                ),
            ));
        }
        // Every frame is decoded (and checked), the sampled ones are used.
        let mut decoded = Vec::with_capacity(frames.len());
        for (k, s) in frames.iter().enumerate() {
            let frame = decode_one(s, &path(k), limits, &mut total)?;
            if let Some(first) = decoded.first() {
                let first: &RgbImage = first;
                if (frame.width, frame.height) != (first.width, first.height) {
                    return Err(at(
                        &path(k),
                        format!(
                            "frame {k} is {}x{}; the video's frames are {}x{}",
                            frame.width, frame.height, first.width, first.height
                        ),
                    ));
                }
            }
            decoded.push(frame);
        }
        let indices = sample_frames(decoded.len());
        let (h, w) = smart_resize(decoded[0].height, decoded[0].width, Some(indices.len()));
        let mut resized: Vec<RgbImage> =
            indices.iter().map(|&k| resize(&decoded[k], w, h)).collect();
        if resized.len() % 2 == 1 {
            resized.extend(resized.last().cloned());
        }
        let refs: Vec<&RgbImage> = resized.iter().collect();
        let (rows, grid) = patch_rows(&refs);
        pixel_values_videos.extend(rows);
        let stamps = timestamps(&indices)
            .iter()
            .map(|t| {
                tokenizer
                    .encode(t.as_str(), false)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| RequestError::internal(format!("tokenizer: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        video_grids.push(grid);
        video_tokens.push(VideoTokens {
            grid,
            timestamps: stamps,
        });
    }
    Ok(PreparedMedia {
        block: media_block(tokens, &image_grids, &video_tokens),
        image_grids,
        video_grids,
        pixel_values,
        pixel_values_videos,
    })
}

/// M-RoPE positions `(t, h, w)` of an encoded prompt `ids` with `media`: pads are the ids equal
/// to the image or video pad token anywhere in the prompt (so pads typed in the state count, and
/// fail as the reference fails: 422 with its message).
pub fn positions(
    ids: &[u32],
    tokens: &MediaTokens,
    media: &PreparedMedia,
) -> Result<[Vec<u32>; 3], RequestError> {
    let types: Vec<u8> = ids
        .iter()
        .map(|&id| match id {
            id if id == tokens.image_pad => clef_vision::prompt::IMAGE,
            id if id == tokens.video_pad => clef_vision::prompt::VIDEO,
            _ => clef_vision::prompt::TEXT,
        })
        .collect();
    mrope_positions(&types, &media.image_grids, &media.video_grids)
        .map_err(|e| at(&["state".into()], e.to_string()))
}

/// The shape of the checkpoint's vision tower, or `None` when it has none.
pub fn tower_shape(ckpt: &Checkpoint) -> Result<Option<VisionShape>, CheckpointError> {
    let Some(c) = &ckpt.config.vision else {
        return Ok(None);
    };
    let config_error = |msg: String| CheckpointError::Config {
        file: ckpt.dir.join("config.json").display().to_string(),
        msg,
    };
    let (patch, temporal, merge) = (c.patch_size, c.temporal_patch_size, c.spatial_merge_size);
    if (c.in_channels, patch, temporal, merge) != (3, PATCH, TEMPORAL, MERGE) {
        return Err(config_error(format!(
            "vision_config: {} channels, {patch}-pixel patches of {temporal} frames merged \
             {merge}x{merge} are not supported (the processor makes RGB {PATCH}-pixel patches of \
             {TEMPORAL} frames merged {MERGE}x{MERGE})",
            c.in_channels
        )));
    }
    let text_hidden = ckpt.config.text.hidden_size;
    let out_hidden = c.out_hidden_size.unwrap_or(text_hidden);
    if out_hidden != text_hidden {
        return Err(config_error(format!(
            "vision_config.out_hidden_size {out_hidden} differs from the text model's hidden \
             size {text_hidden}"
        )));
    }
    Ok(Some(VisionShape {
        depth: c.depth,
        hidden: c.hidden_size,
        heads: c.num_heads,
        intermediate: c.intermediate_size,
        out_hidden,
        positions: c.num_position_embeddings,
        patch_values: ROW_VALUES,
    }))
}

/// The checkpoint's vision tower placed on `mesh` by its tensor-parallel plan with matrices
/// in `format`, or `None` when it has none.
pub fn load_tower<B: MeshOps>(
    ckpt: &Checkpoint,
    mesh: &B,
    format: WeightFormat,
) -> Result<Option<VisionTower<B>>, LoadError> {
    let Some(shape) = tower_shape(ckpt)? else {
        return Ok(None);
    };
    let source = CheckpointSource {
        store: &ckpt.tensors,
        prefix: VISION_PREFIX,
    };
    let t0 = std::time::Instant::now();
    let tower = VisionTower::load(mesh, shape, format, &source).map_err(|e| match e {
        TowerLoadError::Place(e) => LoadError::from(e),
        TowerLoadError::Plan(e) => LoadError::Plan(e),
    })?;
    tracing::info!(
        ms = t0.elapsed().as_millis() as u64,
        bytes = tower.weight_bytes(),
        "vision tower placed on the mesh"
    );
    Ok(Some(tower))
}
