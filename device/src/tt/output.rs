//! Where tt-metal's output goes when a command loads a Tenstorrent shim: never into the
//! command's stdout, never into the user's working directory.
//!
//! tt-metal's logger writes to stdout unless `TT_LOGGER_FILE` names a file (which it opens
//! truncating: never `/dev/stderr`), so `decide --device tt` would mix its log lines into its
//! JSON lines; and tt-metal writes `generated/` (fabric maps, watcher lists) under
//! `TT_METAL_LOGS_PATH`, else the working directory. Both are set here, each only when the user
//! has not set it: the log to `<state>/tt-metal/<pid>.log` (the path is printed on stderr; the
//! newest [`KEPT_LOGS`] are kept), `generated/` under `<state>`, where `<state>` is clef-tt's
//! state directory ([`state_dir`]). `serve` keeps tt-metal's log where tt-metal puts it (a
//! container's log, beside clef-tt's own lines on stderr) and moves only `generated/`.

use std::path::{Path, PathBuf};

/// tt-metal's per-run logs kept in the state directory.
const KEPT_LOGS: usize = 16;

/// clef-tt's state directory: `$XDG_STATE_HOME/clef-tt`, else `$HOME/.local/state/clef-tt`,
/// else `clef-tt` in the temporary directory.
pub fn state_dir() -> PathBuf {
    let nonempty = |v: &str| {
        std::env::var_os(v)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    };
    if let Some(state) = nonempty("XDG_STATE_HOME") {
        return state.join("clef-tt");
    }
    match nonempty("HOME") {
        Some(home) => home.join(".local/state/clef-tt"),
        None => std::env::temp_dir().join("clef-tt"),
    }
}

/// Places tt-metal's output (module docstring): `generated/` always, the log when
/// `log_to_file`. Call before the shim loads, while the process has one thread (it sets
/// environment variables). Where the state directory cannot be made, tt-metal's defaults stay
/// and a warning says why.
pub fn place(log_to_file: bool) {
    let state = state_dir();
    let logs = state.join("tt-metal");
    if let Err(e) = std::fs::create_dir_all(&logs) {
        tracing::warn!(
            "cannot make {} ({e}): tt-metal keeps its own output places",
            logs.display()
        );
        return;
    }
    if std::env::var_os("TT_METAL_LOGS_PATH").is_none() {
        std::env::set_var("TT_METAL_LOGS_PATH", &state);
    }
    if log_to_file && std::env::var_os("TT_LOGGER_FILE").is_none() {
        prune_logs(&logs, KEPT_LOGS - 1);
        let log = logs.join(format!("{}.log", std::process::id()));
        std::env::set_var("TT_LOGGER_FILE", &log);
        eprintln!("tt-metal's log: {}", log.display());
    }
}

/// Removes all but the `keep` newest `*.log` files of `dir` (best effort).
fn prune_logs(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    logs.sort_by_key(|l| std::cmp::Reverse(l.0));
    for (_, old) in logs.into_iter().skip(keep) {
        let _ = std::fs::remove_file(old);
    }
}
