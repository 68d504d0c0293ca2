//! Turning a request into model input: Python-compatible JSON rendering (`json`) and the
//! reference's record layout, spans and length rules (`record`).

pub mod json;
pub mod record;

pub use record::{encode, render, EncodeError, EncodedQuestion, EncodedRecord, LengthRule};
