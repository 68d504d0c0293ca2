//! The API surface: the wire types (`contract`) and the OpenAPI document built from them
//! (`openapi`), request parsing and validation and error bodies (usable without HTTP), and the
//! axum routes with their metrics.

pub mod contract;
pub mod demo;
mod error;
mod intake;
pub mod metrics;
pub mod openapi;
pub mod request;
pub mod server;
pub mod workers_ai;

pub use error::ApiError;
pub use request::{parse_body, validate, HostLimits, Question, QuestionType, SystemOneRequest};
