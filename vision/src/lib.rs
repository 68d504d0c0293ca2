//! `clef-vision`: what happens to an image or a video between the request body and the vision
//! tower, exactly as the Clef reference's processor does it (tests/fixtures/tiny-clef/
//! goldens-media/README.md §2–§3):
//!
//! - `decode`: a `data:` URL prefix dropped, base64 decoded, PNG / JPEG / WebP decoded, any
//!   transparency composited onto white, RGB out;
//! - `resize`: torchvision's antialiased uint8 bicubic (separable, fixed-point, bit for bit);
//! - `preprocess`: the target size rule (`smart_resize`), rescale and normalise, patch rows in
//!   the processor's order, grids;
//! - `video`: frame sampling, temporal padding and the timestamp text;
//! - `prompt`: the media block of token ids and the 3-D M-RoPE positions.
//!
//! - `tower`: the vision tower on a `clef-device` mesh with its tensor-parallel plan.

pub mod decode;
pub mod preprocess;
pub mod prompt;
pub mod resize;
pub mod tower;
pub mod video;

pub use decode::{decode_image, decode_media_string, DecodeError, RgbImage};
pub use preprocess::{
    patch_rows, smart_resize, Grid, SizeRule, IMAGE_RULE, PATCH, ROW_VALUES, VIDEO_RULE,
};
pub use prompt::{
    media_block, mrope_positions, MediaBlock, MediaTokens, PositionError, VideoTokens,
};
pub use resize::resize;
pub use tower::{VisionShape, VisionTower};
pub use video::{sample_frames, timestamps};
