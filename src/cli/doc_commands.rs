//! Docs that cannot drift: every `clef-tt …` command line the README and `docs/` show (in a
//! code block, or a code span that starts with `clef-tt `) parses with the CLI's own argument
//! parser, so a renamed or removed subcommand or flag fails this test.
//!
//! A command is read as a reader would type it: optional parts in `[...]` are left out, and it
//! ends at a comment (`#`), a redirect or pipe, or an ellipsis (`…`, `...` alone). Placeholders
//! in capitals (`DIR`, `FILE`) stand for values. A command named without its required
//! arguments (`clef-tt convert` in a sentence) passes; an unknown subcommand, flag or value
//! fails.

use super::args::Cli;
use clap::Parser;
use std::path::Path;

/// The `clef-tt` command lines of a markdown text.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if (fenced || line.starts_with("    ")) && t.starts_with("clef-tt ") {
            out.push(t.to_string());
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && span.starts_with("clef-tt ") {
                out.push(span.to_string());
            }
        }
    }
    out
}

/// A command line's words as the parser gets them (see the module header).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut optional = 0usize;
    for w in command.split_whitespace() {
        if w.starts_with('#') || [">", ">>", "|", "2>&1", "…", "...", "&&", ";"].contains(&w) {
            break;
        }
        let opens = w.matches('[').count();
        let closes = w.matches(']').count();
        if optional == 0 && opens == 0 {
            out.push(w.trim_end_matches([',', '.', ';', ':']).to_string());
        }
        optional = (optional + opens).saturating_sub(closes);
    }
    out
}

fn markdown_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn every_documented_command_line_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut checked, mut wrong) = (0, Vec::new());
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for command in commands(&text) {
            let args = words(&command);
            checked += 1;
            if let Err(e) = Cli::try_parse_from(&args) {
                use clap::error::ErrorKind::*;
                // A command named in prose (`clef-tt convert`), or a span the text wraps after
                // a flag, leaves arguments out; an unknown command, flag or value is wrong.
                let ends_at_a_flag = args.last().is_some_and(|w| w.starts_with("--"));
                let partial = match e.kind() {
                    DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand => true,
                    MissingRequiredArgument | MissingSubcommand => true,
                    InvalidValue => ends_at_a_flag,
                    _ => false,
                };
                if !partial {
                    let first = e.to_string().lines().next().unwrap_or("").to_string();
                    wrong.push(format!("{}: `{command}`: {first}", file.display()));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} command lines found");
    assert!(
        wrong.is_empty(),
        "documented commands the CLI refuses:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn command_words_leave_out_options_comments_and_redirects() {
    assert_eq!(
        words("clef-tt decide [--model DIR] FILE  # one answer"),
        ["clef-tt", "decide", "FILE"]
    );
    assert_eq!(
        words("clef-tt openapi --strict 1 > openapi.json"),
        ["clef-tt", "openapi", "--strict", "1"]
    );
    assert_eq!(words("clef-tt convert …"), ["clef-tt", "convert"]);
    assert_eq!(
        commands("text `clef-tt plan` and\n    clef-tt serve --port 1\n"),
        ["clef-tt plan", "clef-tt serve --port 1"]
    );
}
