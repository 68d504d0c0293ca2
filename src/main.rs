//! The `clef-tt` binary: everything is in `cli` (the command line) and the library.

mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
