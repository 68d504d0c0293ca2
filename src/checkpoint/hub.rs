//! Resolving `--model`: a snapshot directory, or a hub id found in the local Hugging Face cache
//! (`$HF_HOME/hub/models--{org}--{name}/snapshots/{revision}`). Never downloads.

use super::CheckpointError;
use std::path::{Path, PathBuf};

/// A directory as is; otherwise `org/name` looked up in the cache at `revision` (a commit hash
/// or a ref such as `main`; `CLEF_REVISION` when `None`, else `main`).
pub fn resolve_model_dir(model: &str, revision: Option<&str>) -> Result<PathBuf, CheckpointError> {
    let env_rev = std::env::var("CLEF_REVISION").ok();
    resolve_in_cache(model, revision.or(env_rev.as_deref()), &hub_cache_dir())
}

/// [`resolve_model_dir`] against an explicit hub cache directory (`revision` `None` = `main`).
pub fn resolve_in_cache(
    model: &str,
    revision: Option<&str>,
    cache: &Path,
) -> Result<PathBuf, CheckpointError> {
    let as_path = Path::new(model);
    if as_path.is_dir() {
        return Ok(as_path.to_path_buf());
    }
    let err = |msg: String| CheckpointError::Resolve {
        model: model.to_string(),
        msg,
    };
    let Some((org, name)) = model.split_once('/') else {
        return Err(err(
            "not a directory and not a hub id of the form org/name".into()
        ));
    };
    if org.is_empty() || name.is_empty() || name.contains('/') || model.starts_with('.') {
        return Err(err(
            "not a directory and not a hub id of the form org/name".into()
        ));
    }
    let revision = revision.unwrap_or("main").to_string();
    let repo = cache.join(format!("models--{org}--{name}"));
    if !repo.is_dir() {
        return Err(err(format!(
            "not a directory, and not in the local Hugging Face cache ({} is missing); \
             clef-tt never downloads weights",
            repo.display()
        )));
    }
    // A ref name maps to a commit through refs/<name>.
    let ref_file = repo.join("refs").join(&revision);
    let commit = match std::fs::read_to_string(&ref_file) {
        Ok(c) => c.trim().to_string(),
        Err(_) => revision.clone(),
    };
    let snapshot = repo.join("snapshots").join(&commit);
    if !snapshot.is_dir() {
        return Err(err(format!(
            "revision {revision} is not in the local cache ({} is missing)",
            snapshot.display()
        )));
    }
    Ok(snapshot)
}

/// The commit a resolved model directory is when it is a snapshot in a Hugging Face cache
/// (`…/models--{org}--{name}/snapshots/{commit}`): the revision actually opened, whatever ref
/// was asked for. `None` for any other directory.
pub fn snapshot_commit(dir: &Path) -> Option<String> {
    let parent = dir.parent()?;
    let repo = parent.parent()?;
    let is_snapshot = parent.file_name()? == "snapshots"
        && repo
            .file_name()?
            .to_str()
            .is_some_and(|n| n.starts_with("models--"));
    is_snapshot.then(|| dir.file_name()?.to_str().map(str::to_string))?
}

/// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
fn hub_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}
