//! Media in the prompt (goldens-media README §3.6, §3.8): the media block of token ids that goes
//! right after `STATE:\n`, its token types (1 on image pads, 2 on video pads, 0 elsewhere), and
//! the 3-D M-RoPE positions the text model receives for the whole prompt.

use crate::preprocess::MERGE;
use crate::Grid;

/// The special tokens of the block (looked up in the tokenizer by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaTokens {
    pub vision_start: u32,
    pub vision_end: u32,
    pub image_pad: u32,
    pub video_pad: u32,
    /// The ids of `"\n"`, which ends the block.
    pub newline: Vec<u32>,
}

/// Token type of a text token, an image pad and a video pad.
pub const TEXT: u8 = 0;
pub const IMAGE: u8 = 1;
pub const VIDEO: u8 = 2;

/// One video of the request: its grid and the ids of each frame pair's timestamp text.
#[derive(Clone, Debug)]
pub struct VideoTokens {
    pub grid: Grid,
    pub timestamps: Vec<Vec<u32>>,
}

/// The block's ids and their token types.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MediaBlock {
    pub ids: Vec<u32>,
    pub types: Vec<u8>,
}

impl MediaBlock {
    fn push(&mut self, id: u32, kind: u8) {
        self.ids.push(id);
        self.types.push(kind);
    }

    fn text(&mut self, ids: &[u32]) {
        for &id in ids {
            self.push(id, TEXT);
        }
    }
}

/// All images (in order), then all videos, then `"\n"`:
/// `<vs> pads <ve>` per image; per video `<vs>` (`timestamp <vs> pads <ve>` per frame pair) `<ve>`.
pub fn media_block(tokens: &MediaTokens, images: &[Grid], videos: &[VideoTokens]) -> MediaBlock {
    let mut block = MediaBlock::default();
    for grid in images {
        block.push(tokens.vision_start, TEXT);
        (0..grid.tokens()).for_each(|_| block.push(tokens.image_pad, IMAGE));
        block.push(tokens.vision_end, TEXT);
    }
    for video in videos {
        block.push(tokens.vision_start, TEXT);
        let per_pair = video.grid.h * video.grid.w / (MERGE * MERGE);
        for stamp in &video.timestamps {
            block.text(stamp);
            block.push(tokens.vision_start, TEXT);
            (0..per_pair).for_each(|_| block.push(tokens.video_pad, VIDEO));
            block.push(tokens.vision_end, TEXT);
        }
        block.push(tokens.vision_end, TEXT);
    }
    block.text(&tokens.newline);
    block
}

/// Pads that do not match the media (e.g. `<|image_pad|>` typed in the state): `kind` is
/// [`IMAGE`] or [`VIDEO`]. Displays as the reference's own message.
#[derive(Debug, PartialEq, Eq)]
pub struct PositionError {
    pub kind: u8,
    pub tokens: usize,
    pub features: usize,
}

impl std::fmt::Display for PositionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (upper, lower) = if self.kind == IMAGE {
            ("Image", "image")
        } else {
            ("Video", "video")
        };
        write!(
            f,
            "{upper} features and {lower} tokens do not match, tokens: {}, features: {}",
            self.tokens, self.features
        )
    }
}

impl std::error::Error for PositionError {}

/// M-RoPE positions `(t, h, w)` of a whole prompt whose token types are `types`: a text token
/// advances all three by one; each run of pads is one image or one frame pair of a video (in
/// the order of `images`, then each video's frame pairs), laid out as its merged grid at
/// `(p, p + row, p + col)`, after which `p` advances by the grid's longer side.
pub fn mrope_positions(
    types: &[u8],
    images: &[Grid],
    videos: &[Grid],
) -> Result<[Vec<u32>; 3], PositionError> {
    for (kind, grids) in [(IMAGE, images), (VIDEO, videos)] {
        let tokens = types.iter().filter(|&&t| t == kind).count();
        let features: usize = grids.iter().map(Grid::tokens).sum();
        if tokens != features {
            return Err(PositionError {
                kind,
                tokens,
                features,
            });
        }
    }
    // One merged grid per pad run: images, then every frame pair of every video.
    let runs_of = |kind: u8| -> Vec<(usize, usize)> {
        let grids: Vec<&Grid> = if kind == IMAGE {
            images.iter().collect()
        } else {
            videos.iter().collect()
        };
        grids
            .into_iter()
            .flat_map(|g| std::iter::repeat_n((g.h / MERGE, g.w / MERGE), g.t))
            .collect()
    };
    let mut image_runs = runs_of(IMAGE).into_iter();
    let mut video_runs = runs_of(VIDEO).into_iter();
    let mut out = [
        Vec::with_capacity(types.len()),
        Vec::with_capacity(types.len()),
        Vec::with_capacity(types.len()),
    ];
    let mut p = 0u32;
    let mut at = 0;
    while at < types.len() {
        let kind = types[at];
        if kind == TEXT {
            out.iter_mut().for_each(|axis| axis.push(p));
            p += 1;
            at += 1;
            continue;
        }
        let run = types[at..].iter().take_while(|&&t| t == kind).count();
        let next = if kind == IMAGE {
            image_runs.next()
        } else {
            video_runs.next()
        };
        let (hh, ww) = next.unwrap_or((0, 0));
        // A run of pads is one grid (runs are separated by vision start/end tokens); a run that
        // does not fill its grid exactly cannot come from the media block.
        if hh * ww != run {
            return Err(PositionError {
                kind,
                tokens: run,
                features: hh * ww,
            });
        }
        for r in 0..hh as u32 {
            for c in 0..ww as u32 {
                out[0].push(p);
                out[1].push(p + r);
                out[2].push(p + c);
            }
        }
        p += hh.max(ww) as u32;
        at += run;
    }
    Ok(out)
}
