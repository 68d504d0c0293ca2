//! Media strings to RGB pixels (goldens-media README §2 and §3.1): a `data:` prefix is dropped up
//! to its first comma, the rest is standard base64; PNG, JPEG or WebP bytes are decoded as they
//! are stored (no EXIF rotation), and anything with transparency (an alpha band, or a PNG tRNS
//! palette entry or colour key, which the decoder turns into alpha) is composited onto opaque
//! white with the reference's 8-bit rounding. Grey images are replicated to three channels.

use base64::Engine;
use image::{DynamicImage, ImageReader};
use std::io::Cursor;

/// An 8-bit RGB image, row-major HWC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Why a media string is not an image.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not valid base64 ({0})")]
    Base64(String),
    #[error("not a PNG, JPEG or WebP image ({0})")]
    Image(String),
    #[error("the image has {pixels} pixels; at most {max} are allowed")]
    TooManyPixels { pixels: u64, max: u64 },
}

/// The bytes a media string carries: `data:...,` dropped, then standard base64 with padding.
pub fn decode_media_string(s: &str) -> Result<Vec<u8>, DecodeError> {
    let payload = match s.strip_prefix("data:") {
        Some(rest) => rest.split_once(',').map_or("", |(_, b64)| b64),
        None => s,
    };
    base64::engine::general_purpose::STANDARD
        .decode(payload)
        .map_err(|e| DecodeError::Base64(e.to_string()))
}

/// Decode image bytes to RGB, refusing more than `max_pixels` before any pixel is allocated.
pub fn decode_image(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, DecodeError> {
    let bad = |e: image::ImageError| DecodeError::Image(e.to_string());
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| DecodeError::Image(e.to_string()))?;
    let (w, h) = reader.into_dimensions().map_err(bad)?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels > max_pixels {
        return Err(DecodeError::TooManyPixels {
            pixels,
            max: max_pixels,
        });
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| DecodeError::Image(e.to_string()))?;
    let decoded = reader.decode().map_err(bad)?;
    Ok(to_rgb(decoded))
}

/// `floor((c·a + 255·(255 − a)) / 255 + 1/2)` in integers.
fn over_white(c: u8, a: u8) -> u8 {
    let n = u32::from(c) * u32::from(a) + 255 * (255 - u32::from(a));
    ((2 * n + 255) / 510) as u8
}

fn to_rgb(image: DynamicImage) -> RgbImage {
    let (width, height) = (image.width() as usize, image.height() as usize);
    let data = match image {
        DynamicImage::ImageRgb8(rgb) => rgb.into_raw(),
        DynamicImage::ImageLuma8(grey) => grey.into_raw().iter().flat_map(|&v| [v, v, v]).collect(),
        DynamicImage::ImageLumaA8(grey) => grey
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let v = over_white(p[0], p[1]);
                [v, v, v]
            })
            .collect(),
        other if other.color().has_alpha() => other
            .to_rgba8()
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| {
                [
                    over_white(p[0], p[3]),
                    over_white(p[1], p[3]),
                    over_white(p[2], p[3]),
                ]
            })
            .collect(),
        other => other.to_rgb8().into_raw(),
    };
    RgbImage {
        width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compositing_matches_the_reference_rule() {
        assert_eq!(over_white(0, 0), 255);
        assert_eq!(over_white(10, 255), 10);
        // 255·127 / 255 + 1/2 = 127.5, floored.
        assert_eq!(over_white(0, 128), 127);
        assert_eq!(
            over_white(200, 60),
            ((200.0 * 60.0 + 255.0 * 195.0) / 255.0 + 0.5f64).floor() as u8
        );
    }

    #[test]
    fn data_urls_and_bad_base64_are_told_apart() {
        assert_eq!(
            decode_media_string("data:image/png;base64,aGk=").unwrap(),
            b"hi"
        );
        assert_eq!(decode_media_string("aGk=").unwrap(), b"hi");
        assert!(matches!(
            decode_media_string("not base64!"),
            Err(DecodeError::Base64(_))
        ));
        assert!(matches!(
            decode_image(b"hello", 1 << 24),
            Err(DecodeError::Image(_))
        ));
    }
}
