//! The request model: a decision request as the model code sees it, below HTTP. A body is
//! parsed as Python's `json.loads` sees it and validated in the reference's order into a
//! [`SystemOneRequest`] of [`Question`]s (`body`); a refusal is a [`RequestError`] (`error`);
//! the answer is a [`DecisionBody`] of [`Answer`]s (`answer`). `encode`, `media`, `head` and
//! `engine` build on these; `api` carries them over HTTP (wire encoding, the hosted route's
//! rules, the OpenAPI document).

mod answer;
mod body;
mod error;

pub use answer::{Answer, ChoiceAnswer, DecisionBody, NoulAnswer, ScoreAnswer, Usage};
pub use body::{
    option_count, parse_body, truthy, validate, HostLimits, Question, QuestionType,
    SystemOneRequest, IMAGE_CONTENT_TYPES,
};
pub use error::RequestError;
