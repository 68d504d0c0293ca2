//! Subcommands of the `clef-tt` binary that are more than a call into the library.
pub mod bench;
pub mod decide;
pub mod inspect;
pub mod serve;
