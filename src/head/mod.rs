//! The joint schema head and answer shaping: final hidden rows → per-option logits →
//! probabilities → the reference's response JSON.

pub mod answer;
pub mod model;
mod ops;

pub use model::{HeadMemory, HeadQuestion, JointHead};
