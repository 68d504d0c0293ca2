//! Subcommands of the `clef-tt` binary that are more than a call into the library.
pub mod bench;
pub mod bench_http;
pub mod decide;
pub mod eval;
pub mod http_client;
pub mod inspect;
pub mod progress;
pub mod serve;
