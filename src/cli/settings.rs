//! `serve --settings FILE|NAME`: a serve profile (`profiles/p150x2.toml`, `p150x4.toml`, or
//! one of them by name, embedded in the binary) whose `port` and `[env]` settings apply where
//! neither a flag nor the environment sets them.

use super::args::Cli;
use anyhow::{bail, Context};

/// The serve profiles shipped in the binary, for `--settings NAME` (an installed clef-tt has no
/// `profiles/` folder beside it).
pub const PROFILES: [(&str, &str); 2] = [
    ("p150x2", include_str!("../../profiles/p150x2.toml")),
    ("p150x4", include_str!("../../profiles/p150x4.toml")),
];

/// The text of `--settings VALUE`: the file at VALUE, else the built-in profile named VALUE.
fn settings_text(value: &str) -> anyhow::Result<String> {
    match std::fs::read_to_string(value) {
        Ok(text) => Ok(text),
        Err(e) => match PROFILES.iter().find(|(name, _)| *name == value) {
            Some((_, text)) => Ok(text.to_string()),
            None => Err(e).with_context(|| {
                let names: Vec<&str> = PROFILES.iter().map(|(n, _)| *n).collect();
                format!(
                    "reading {value} (neither a file nor a built-in profile: {})",
                    names.join(", ")
                )
            }),
        },
    }
}

/// A serve profile file (`serve --settings FILE`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    port: Option<u16>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

/// The environment variables `serve` reads (from its flags' definitions).
fn serve_env_names() -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut names: Vec<String> = cmd
        .find_subcommand("serve")
        .map(|s| {
            s.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.push("HF_MODEL".into());
    names
}

/// For `serve --settings FILE`: set the file's variables that the environment does not set
/// yet, before the flags are parsed, so flags > environment > file > defaults.
pub fn apply_settings_file() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("serve") {
        return Ok(());
    }
    let path = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--settings=")
            .map(str::to_string)
            .or_else(|| {
                (a == "--settings")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
    });
    let Some(path) = path else { return Ok(()) };
    let text = settings_text(&path)?;
    let file: SettingsFile = toml::from_str(&text).with_context(|| format!("parsing {path}"))?;
    let known = serve_env_names();
    let mut env = file.env;
    if let Some(port) = file.port {
        env.entry("CLEF_PORT".into()).or_insert(port.to_string());
    }
    for (key, value) in env {
        if !known.contains(&key) {
            bail!("{path}: {key} is not a setting of clef-tt serve");
        }
        if std::env::var_os(&key).is_none() {
            std::env::set_var(&key, value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_built_in_profiles_are_the_files_and_files_win_over_names() {
        for (name, text) in super::PROFILES {
            let path = format!("{}/profiles/{name}.toml", env!("CARGO_MANIFEST_DIR"));
            assert_eq!(super::settings_text(name).unwrap(), text);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
            assert_eq!(super::settings_text(&path).unwrap(), text);
        }
        let err = super::settings_text("p150x3").unwrap_err();
        assert!(format!("{err:#}").contains("p150x2, p150x4"), "{err:#}");
    }

    #[test]
    fn the_serve_profiles_set_only_variables_serve_reads() {
        let known = super::serve_env_names();
        assert!(known.contains(&"CLEF_PREFIX_CACHE".to_string()));
        for name in ["p150x2", "p150x4"] {
            let path = format!("{}/profiles/{name}.toml", env!("CARGO_MANIFEST_DIR"));
            let file: super::SettingsFile =
                toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(file.port, Some(8008));
            for key in file.env.keys() {
                assert!(known.contains(key), "{name}: {key}");
            }
        }
    }
}
