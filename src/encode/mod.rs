//! Turning a request into model input: Python-compatible JSON rendering (`json`), the
//! reference's record layout, spans and length rules (`record`), and the routing key of the
//! state piece (`state_key`).

pub mod json;
pub mod record;
pub mod state_key;

pub use record::{encode, render, EncodeError, EncodedQuestion, EncodedRecord, LengthRule};
