//! clef-tt: a server for Cloudflare's Clef decision models.
//!
//! The host side lives here, one module per concern, in the order a request flows:
//! `api` takes requests over HTTP (and Workers AI's hosted route) into the request model of
//! `request` (parsing, validation, questions, answers, refusals; below everything that uses
//! it), `encode` renders them into token ids and spans,
//! `engine` runs a request through the `backbone` (the Qwen3.5 prefill over a `clef-device`
//! mesh, following a tensor-parallel plan) and the `head` (the joint schema head and answer
//! shaping). `checkpoint` reads a Hugging Face snapshot; `precision` resolves the weight formats
//! and device numerics of a profile; `tensor_cache` stores weights already packed for a mesh;
//! `random` writes benchmark checkpoints; `perf_model` predicts a mesh's memory and chunk time
//! from the plans; `bench` holds the measurements behind `clef-tt bench`;
//! `compare` checks a device layer by layer against the CPU (`clef-tt compare-layers`).
//!
//! The `server` feature (default) holds every module but `request`, `encode` and
//! `checkpoint`, with the dependencies only they need (HTTP, TLS, images, the CLI); the fuzz
//! targets build without it.

#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
pub mod backbone;
#[cfg(feature = "server")]
pub mod bench;
pub mod checkpoint;
#[cfg(feature = "server")]
pub mod compare;
pub mod encode;
#[cfg(feature = "server")]
pub mod engine;
#[cfg(feature = "server")]
pub mod head;
#[cfg(feature = "server")]
pub mod media;
#[cfg(feature = "server")]
pub mod perf_model;
#[cfg(feature = "server")]
pub mod precision;
#[cfg(feature = "server")]
pub mod random;
pub mod request;
#[cfg(feature = "server")]
pub mod tensor_cache;
