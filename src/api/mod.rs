//! The API surface: the wire types (`contract`) and the OpenAPI document built from them
//! (`openapi`); request parsing and validation and error bodies (`request`, `error`: usable
//! without HTTP); and over HTTP, a request off the wire (`intake`), the shared state and the
//! queue (`state`), the axum routes (`server`, the demo page in `demo`), Workers AI's hosted
//! route (`workers_ai`) and the metrics.

pub mod contract;
pub mod demo;
mod error;
mod intake;
pub mod metrics;
pub mod openapi;
pub mod request;
pub mod server;
mod state;
pub mod workers_ai;

pub use error::ApiError;
pub use request::{parse_body, validate, HostLimits, Question, QuestionType, SystemOneRequest};
