//! clef-tt: a server for Cloudflare's Clef decision models.
//!
//! The host side lives here, one module per concern: `checkpoint` reads a Hugging Face
//! snapshot, `backbone` runs the Qwen3.5 prefill over a `clef-device` mesh following a
//! tensor-parallel plan, `random` writes the random benchmark checkpoints.

pub mod backbone;
pub mod checkpoint;
pub mod random;
