//! The API surface without HTTP: request parsing and validation, errors, and (with the server
//! issue) the routes.

mod error;
pub mod request;

pub use error::ApiError;
pub use request::{parse_body, validate, HostLimits, Question, QuestionType, SystemOneRequest};
