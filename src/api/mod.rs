//! The API over HTTP: the wire types (`contract`) and the OpenAPI document built from them
//! (`openapi`); a request off the wire (`intake`), refused bodies read before the answer so every client sees it (`drain`),
//! the error body (`error`), the shared state,
//! request ids and the queue (`state`), the axum routes (`server`, the demo page in `demo`),
//! Workers AI's hosted route and its rules (`workers_ai`) and the metrics; a server's options
//! and model card (`config`), a client of a running server (`client`) and request lines
//! answered locally or through it (`lines`, what `clef-tt decide` runs). The request model
//! itself (parsing, validation, questions, answers, refusals) is `crate::request`'s.

pub mod client;
pub mod config;
pub mod contract;
pub mod demo;
mod drain;
mod error;
mod intake;
pub mod lines;
pub mod metrics;
pub mod openapi;
pub mod server;
mod state;
pub mod workers_ai;

pub use drain::DrainBounds;
pub use error::error_body;
