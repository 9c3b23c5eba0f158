//! `kind: hf_dataset`: a Hugging Face dataset's parquet files as a corpus.
//!
//! The files come from a local folder (`path`) or from the Hugging Face cache (`repo`), where
//! the Python tools and hf-hub keep them (`datasets--owner--name/snapshots/<commit>/`). Finding
//! them in the cache needs no network, so a run with a warm cache works offline; a build with
//! the `hf-hub` feature fetches a missing dataset there first through candle-datasets (see
//! `crate::hub`). From then on the files are read like local ones: the rows become a
//! [`RawCorpus`] and go through Ember's own tokenisation, token cache and seeded batchers, so a
//! run on a Hub dataset resumes exactly like one on text files.

use std::path::{Path, PathBuf};

use crate::config::{HfColumns, HfDatasetConfig};
use crate::error::{DataError, Result};
use crate::parquet::read_text_columns;
use crate::raw::{RawCorpus, RawPairs, RawText};

/// The branch of a Hub dataset that holds its parquet conversion (what candle-datasets fetches).
pub const PARQUET_REVISION: &str = "refs/convert/parquet";

/// Reads every split `cfg` names.
pub fn load(cfg: &HfDatasetConfig) -> Result<RawCorpus> {
    let root = dataset_root(cfg)?;
    let files = parquet_files(&root)?;
    let (root, files) = select_config(&root, files, cfg.config.as_deref())?;
    let split = |name: &str, key: &str| -> Result<Vec<PathBuf>> {
        let found: Vec<PathBuf> = files
            .iter()
            .filter(|f| belongs_to_split(f, name))
            .cloned()
            .collect();
        check_split(&root, &files, found, name, key, cfg.config.is_some())
    };
    let source = cfg.repo.clone().unwrap_or_else(|| root.display().to_string());
    let cols = &cfg.columns;
    if cols.is_translation() {
        Ok(RawCorpus::Translation {
            train: read_pairs(&root, &split(&cfg.splits.train, "splits.train")?, cols)?,
            valid: read_pairs(&root, &split(&cfg.splits.valid, "splits.valid")?, cols)?,
            test: cfg
                .splits
                .test
                .as_deref()
                .map(|t| read_pairs(&root, &split(t, "splits.test")?, cols))
                .transpose()?,
        })
    } else {
        let text = |name: &str, key: &str| -> Result<Vec<RawText>> {
            Ok(vec![read_text(
                &root,
                &split(name, key)?,
                cols,
                &format!("{source}:{name}"),
            )?])
        };
        Ok(RawCorpus::Text {
            train: text(&cfg.splits.train, "splits.train")?,
            valid: text(&cfg.splits.valid, "splits.valid")?,
        })
    }
}

/// The folder the dataset's parquet files are under: `path`, or the cached snapshot of `repo`.
fn dataset_root(cfg: &HfDatasetConfig) -> Result<PathBuf> {
    if let Some(path) = &cfg.path {
        if !path.is_dir() {
            return Err(DataError::config(
                "data.corpus.path",
                format!(
                    "{} is not a folder; point path at the folder holding the dataset's parquet files",
                    path.display()
                ),
            ));
        }
        return Ok(path.clone());
    }
    let repo = cfg.repo.as_deref().unwrap_or_default();
    let revision = cfg.revision.as_deref().unwrap_or(PARQUET_REVISION);
    let cache = hub_cache_dir();
    if let Some(snapshot) = cached_snapshot(&cache, repo, revision) {
        return Ok(snapshot);
    }
    // candle-datasets' `from_hub` fetches the parquet conversion only.
    #[cfg(feature = "hf-hub")]
    if revision == PARQUET_REVISION {
        crate::hub::fetch(repo)?;
        if let Some(snapshot) = cached_snapshot(&cache, repo, revision) {
            return Ok(snapshot);
        }
        return Err(DataError::config(
            "data.corpus.repo",
            format!(
                "fetched {repo}, but its parquet files are not where they were expected in the \
                 Hugging Face cache {}",
                cache.display()
            ),
        ));
    }
    let key = if cfg.revision.is_some() {
        "data.corpus.revision"
    } else {
        "data.corpus.repo"
    };
    Err(DataError::config(
        key,
        format!(
            "{repo} at revision {revision} is not in the Hugging Face cache {} and this build does \
             not fetch it. Fetch it with `huggingface-cli download --repo-type dataset {repo} \
             --revision {revision}`{}, or download its parquet files and set data.corpus.path to \
             their folder",
            cache.display(),
            if cfg!(feature = "hf-hub") || revision != PARQUET_REVISION {
                ""
            } else {
                " (or rebuild with `cargo build --release --features hf-hub`)"
            }
        ),
    ))
}

/// The Hugging Face hub cache, resolved as hf-hub and huggingface_hub do: `HF_HUB_CACHE`, then
/// `HUGGINGFACE_HUB_CACHE`, then `$HF_HOME/hub`, then `$XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return p;
    }
    let home = var("HF_HOME").unwrap_or_else(|| {
        var("XDG_CACHE_HOME")
            .unwrap_or_else(|| var("HOME").unwrap_or_default().join(".cache"))
            .join("huggingface")
    });
    home.join("hub")
}

/// `<cache>/datasets--owner--name/snapshots/<commit>` for `revision`: the commit its ref
/// (`refs/<revision>`, for a branch or tag) points at, or the revision itself when it is a
/// commit hash with a snapshot; `None` when that snapshot is not there.
pub fn cached_snapshot(cache: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let repo_dir = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    let commit = crate::io::read_small_text(&repo_dir.join("refs").join(revision), 4096)
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    if commit.is_empty() || commit.contains(['/', '\\']) || commit.starts_with('.') {
        return None;
    }
    let snapshot = repo_dir.join("snapshots").join(commit);
    snapshot.is_dir().then_some(snapshot)
}

/// Every `*.parquet` file under `root`, as paths relative to it, sorted.
fn parquet_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries = std::fs::read_dir(&dir).map_err(|e| DataError::Io {
            path: dir.clone(),
            key: Some("data.corpus.path".into()),
            source: e,
            hint: "check that the folder is readable".into(),
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            // Hidden folders (.cache, .git, .huggingface) hold no dataset files.
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let full = entry.path();
            if full.is_dir() {
                stack.push(rel.join(&name));
            } else if full.extension().is_some_and(|e| e == "parquet") {
                out.push(rel.join(&name));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(DataError::config(
            "data.corpus.path",
            format!("{} holds no .parquet file", root.display()),
        ));
    }
    Ok(out)
}

/// Narrows the files to those of the dataset config `config` (a top-level folder), when given.
fn select_config(root: &Path, files: Vec<PathBuf>, config: Option<&str>) -> Result<(PathBuf, Vec<PathBuf>)> {
    let Some(name) = config else {
        return Ok((root.to_path_buf(), files));
    };
    let inside: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.strip_prefix(name).ok().map(Path::to_path_buf))
        .collect();
    if inside.is_empty() {
        return Err(DataError::config(
            "data.corpus.config",
            format!(
                "{} has no folder {name:?} with parquet files (its folders: {})",
                root.display(),
                top_folders(&files).join(", ")
            ),
        ));
    }
    Ok((root.join(name), inside))
}

/// The distinct top-level folders of relative paths (files at the top level count as `.`).
fn top_folders(files: &[PathBuf]) -> Vec<String> {
    let mut tops: Vec<String> = files
        .iter()
        .map(|f| match f.components().count() {
            1 => ".".to_string(),
            _ => f
                .components()
                .next()
                .map_or_else(String::new, |c| c.as_os_str().to_string_lossy().into_owned()),
        })
        .collect();
    tops.sort();
    tops.dedup();
    tops
}

/// Whether a file (relative path) belongs to split `name`: its folder is `name` or
/// `partial-name` (the Hub's parquet conversion), or its file name is `name` or starts with
/// `name-` (`data/train-00000-of-00001.parquet`, as `datasets.push_to_hub` writes).
fn belongs_to_split(file: &Path, name: &str) -> bool {
    let folder = file
        .parent()
        .and_then(Path::file_name)
        .map(|f| f.to_string_lossy().into_owned());
    if let Some(folder) = folder {
        if folder == name || folder.strip_prefix("partial-") == Some(name) {
            return true;
        }
    }
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem == name || stem.strip_prefix(name).is_some_and(|rest| rest.starts_with('-'))
}

/// The files of one split, as full paths; an error when there are none, or when (without
/// `data.corpus.config`) they come from several configs of the dataset.
fn check_split(
    root: &Path,
    all: &[PathBuf],
    found: Vec<PathBuf>,
    name: &str,
    key: &str,
    config_chosen: bool,
) -> Result<Vec<PathBuf>> {
    if found.is_empty() {
        let listed: Vec<String> = all.iter().take(12).map(|f| f.display().to_string()).collect();
        return Err(DataError::config(
            format!("data.corpus.{key}"),
            format!(
                "no parquet file of split {name:?} in {} (a split's files sit in a folder named \
                 after it or start with its name; the files there: {}{})",
                root.display(),
                listed.join(", "),
                if all.len() > listed.len() { ", ..." } else { "" }
            ),
        ));
    }
    let tops = top_folders(&found);
    if !config_chosen && tops.len() > 1 {
        return Err(DataError::config(
            "data.corpus.config",
            format!(
                "split {name:?} has files in several folders of {} ({}): the dataset has several \
                 configs; choose one with data.corpus.config",
                root.display(),
                tops.join(", ")
            ),
        ));
    }
    Ok(found.into_iter().map(|f| root.join(f)).collect())
}

fn read_pairs(root: &Path, files: &[PathBuf], cols: &HfColumns) -> Result<RawPairs> {
    let (src, tgt) = (
        cols.source.as_deref().unwrap_or_default(),
        cols.target.as_deref().unwrap_or_default(),
    );
    let mut out = RawPairs::default();
    for file in files {
        for row in read_text_columns(file, &[("columns.source", src), ("columns.target", tgt)])? {
            match (&row[0], &row[1]) {
                (Some(s), Some(t)) if !s.trim().is_empty() && !t.trim().is_empty() => {
                    out.sources.push(s.trim().to_string());
                    out.targets.push(t.trim().to_string());
                }
                _ => out.dropped_empty += 1,
            }
        }
    }
    if out.sources.is_empty() {
        return Err(DataError::config(
            "data.corpus.columns",
            format!(
                "{} has no row with text in both {src:?} and {tgt:?}",
                files_label(root, files)
            ),
        ));
    }
    Ok(out)
}

/// One split's rows joined by newlines: the text a file with one row per line would hold.
fn read_text(root: &Path, files: &[PathBuf], cols: &HfColumns, name: &str) -> Result<RawText> {
    let column = cols.text.as_deref().unwrap_or_default();
    let mut text = String::new();
    for file in files {
        for row in read_text_columns(file, &[("columns.text", column)])? {
            if let Some(t) = &row[0] {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
        }
    }
    if text.trim().is_empty() {
        return Err(DataError::config(
            "data.corpus.columns.text",
            format!("column {column:?} of {} holds no text", files_label(root, files)),
        ));
    }
    Ok(RawText::plain_newlines(name.to_string(), text))
}

fn files_label(root: &Path, files: &[PathBuf]) -> String {
    match files {
        [one] => one.display().to_string(),
        _ => format!("the {} parquet files of {}", files.len(), root.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_membership_follows_the_hub_layouts() {
        for (file, split) in [
            ("default/train/0000.parquet", "train"),
            ("default/partial-train/0000.parquet", "train"),
            ("data/train-00000-of-00002.parquet", "train"),
            ("data/validation-00000-of-00001.parquet", "validation"),
            ("test.parquet", "test"),
        ] {
            assert!(belongs_to_split(Path::new(file), split), "{file} is in {split}");
        }
        for (file, split) in [
            ("default/train/0000.parquet", "test"),
            ("data/trainer-0.parquet", "train"),
            ("data/validation-00000-of-00001.parquet", "valid"),
        ] {
            assert!(
                !belongs_to_split(Path::new(file), split),
                "{file} is not in {split}"
            );
        }
    }

    #[test]
    fn cache_snapshot_follows_the_parquet_ref() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("datasets--someone--corpus");
        assert_eq!(
            cached_snapshot(dir.path(), "someone/corpus", PARQUET_REVISION),
            None
        );
        std::fs::create_dir_all(repo.join("refs/refs/convert")).unwrap();
        std::fs::write(repo.join("refs/refs/convert/parquet"), "abc123\n").unwrap();
        assert_eq!(
            cached_snapshot(dir.path(), "someone/corpus", PARQUET_REVISION),
            None,
            "no snapshot yet"
        );
        std::fs::create_dir_all(repo.join("snapshots/abc123/default/train")).unwrap();
        assert_eq!(
            cached_snapshot(dir.path(), "someone/corpus", PARQUET_REVISION),
            Some(repo.join("snapshots/abc123"))
        );
        // A commit hash names its snapshot directly; another branch needs its own ref.
        assert_eq!(
            cached_snapshot(dir.path(), "someone/corpus", "abc123"),
            Some(repo.join("snapshots/abc123"))
        );
        assert_eq!(cached_snapshot(dir.path(), "someone/corpus", "main"), None);
        assert_eq!(cached_snapshot(dir.path(), "someone/corpus", "../abc123"), None);
    }
}
