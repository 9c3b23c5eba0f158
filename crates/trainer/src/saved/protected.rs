//! The one rule for every path a command writes that the user names (`--run-dir`, `--out`,
//! `OUT`, `OUTPUT`, `--output`, `--reference-logits`): no command writes
//!
//! - into a run's `checkpoints/` (training replaces and prunes what is there: a folder put
//!   inside would go with the checkpoint it sits in),
//! - into a model folder (`ember package`), or a Hugging Face model folder (what a run reads
//!   with `model.init_from`: its weights, config and tokenizer) — the one a run the command
//!   reads starts from is named as such, even if it no longer looks like one,
//! - over a file it reads itself, or over a run's own files (its config, tokenizer, metrics),
//!
//! whatever the spelling of the path: folders are compared as the disk has them (device and
//! inode), after the part of the path that exists is resolved with its links and `..`, so a
//! link, `a/../b` or another case on a case-insensitive disk leads to the same refusal. Each
//! refusal names the protected thing. The check reads only the folders on the path, so a
//! command runs it before it reads or computes anything and a refusal leaves nothing behind.
//!
//! A folder a command makes (`package`, `export`) is then written whole into a temporary sibling
//! and renamed into place in one step ([`write_folder`]): it is complete or absent.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::run_dir::RUN_CONFIG;
use crate::saved::places::{self, is_run_file_name, same_file, Place};

/// What a command writes at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A file, written whole (a temporary file renamed over it): it may replace a regular file of
    /// the user's, but not a folder, a device, a link, an input or a run's own file.
    File,
    /// A folder written whole ([`write_folder`]): the path must be new (or an empty folder).
    Folder,
    /// A run directory (`ember train --run-dir`): new, empty, or a run to resume.
    RunDir,
    /// A sweep's output directory (`ember ablate --out`): new, empty, or that sweep's.
    SweepDir,
}

/// Refuses `path` as what `flag` writes (`kind`) when it would write where the rule above says
/// no command writes. `reads` are what the command reads: files (compared by identity) and
/// runs, checkpoints or model folders (their own files, and the folder their `model.init_from`
/// names). `config_reads` are the folders the command's own config reads a model or tokenizer
/// from (`ember train`'s `model.init_from`, a pretrained `data.tokenizer.path`), each with its
/// key.
pub fn check(
    path: &Path,
    flag: &str,
    kind: Output,
    reads: &[&Path],
    config_reads: &[(&Path, &'static str)],
) -> Result<()> {
    let refuse = |what: String| -> Result<()> { Err(refusal(flag, path, &what)) };
    if let Ok(target) = std::fs::read_link(path) {
        match kind {
            Output::File => return Ok(ember_data::io::refuse_link(path, flag)?),
            Output::Folder => bail!(
                "{flag} {} already exists, as a symbolic link (to {}); a folder is written whole, \
                 never through a link: give a new folder. Nothing was written.",
                path.display(),
                target.display()
            ),
            Output::RunDir | Output::SweepDir => {}
        }
    }
    let protected = Protected::of(reads, config_reads);
    let (existing, rest) = resolve(path)?;
    // The path itself when it exists, then every folder above it, deepest first: none may be
    // what runs read.
    for folder in existing.ancestors() {
        if let Some(what) = protected.holds(folder) {
            let inside = if rest.is_empty() && folder == existing {
                ""
            } else {
                "inside "
            };
            return refuse(format!("{inside}{what}"));
        }
    }
    let deepest = (!rest.is_empty()).then_some(existing.as_path());
    if let (Some(dir), Some(first)) = (deepest, rest.first()) {
        if !dir.is_dir() {
            return refuse(format!(
                "under {}, which is not a folder, so nothing can be made there",
                dir.display()
            ));
        }
        // The first new name under a run: a file or folder the run makes itself.
        if places::is_run(dir) && is_run_file_name(&first.to_string_lossy()) {
            let inside = if rest.len() > 1 { "inside " } else { "" };
            return refuse(format!("{inside}{}", run_file(dir, &first.to_string_lossy())));
        }
        return Ok(());
    }
    check_existing(path, &existing, flag, kind, &protected)
}

/// The refusal of `path` as what `flag` writes, because it is `what`.
fn refusal(flag: &str, path: &Path, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{flag} {} is {what}. Choose another path. Nothing was written.",
        path.display()
    )
}

/// `path`, which exists (as `target`, resolved), must suit what `flag` writes there (`kind`).
fn check_existing(path: &Path, target: &Path, flag: &str, kind: Output, protected: &Protected) -> Result<()> {
    let refuse = |what: String| -> Result<()> { Err(refusal(flag, path, &what)) };
    if kind != Output::File && !target.is_dir() {
        return refuse(format!(
            "{} (it exists and is not a folder)",
            if target.is_file() {
                "a file"
            } else {
                "a special file (a device, FIFO or socket)"
            }
        ));
    }
    match kind {
        Output::File => check_existing_file(path, target, flag, protected),
        Output::Folder => {
            let empty = std::fs::read_dir(target).is_ok_and(|mut d| d.next().is_none());
            if !empty {
                let what = match places::of(target) {
                    Place::Other => format!(" (it holds {})", some_entries(path)),
                    place => format!(": it is {}", place.describe(target)),
                };
                bail!(
                    "{flag} {} already exists{what}; give a new folder (it is written whole or not \
                     at all, so an existing one is never written into). Nothing was written.",
                    path.display()
                );
            }
            Ok(())
        }
        Output::RunDir => match places::of(target) {
            Place::Sweep => refuse(
                "the output directory of a sweep (it holds grid.json); a training run there would mix \
                 its files with the sweep's"
                    .into(),
            ),
            _ if protected.reads(target) => refuse("a file or folder this command reads".into()),
            _ => Ok(()),
        },
        Output::SweepDir => match places::of(target) {
            Place::Run => refuse(
                "a training run's directory (it holds config.yaml and checkpoints/); a sweep there \
                 would mix its files with the run's"
                    .into(),
            ),
            _ if protected.reads(target) => refuse("a file or folder this command reads".into()),
            _ => Ok(()),
        },
    }
}

/// A few entries of the folder `dir`, in words (a link with its target), for saying what an
/// existing folder holds.
fn some_entries(dir: &Path) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    let more = names.len().saturating_sub(3);
    let mut shown: Vec<String> = names
        .iter()
        .take(3)
        .map(|p| match std::fs::read_link(p) {
            Ok(target) => format!("{}, a symbolic link to {}", p.display(), target.display()),
            Err(_) => p.display().to_string(),
        })
        .collect();
    if more > 0 {
        shown.push(format!("{more} more"));
    }
    shown.join("; ")
}

/// An existing file about to be replaced: a regular file, not one the command reads and not
/// one of a run's own.
fn check_existing_file(path: &Path, target: &Path, flag: &str, protected: &Protected) -> Result<()> {
    let inputs: Vec<&Path> = protected.files.iter().map(PathBuf::as_path).collect();
    ember_data::io::check_output(path, &inputs, flag)?;
    if let (Some(dir), Some(name)) = (target.parent(), target.file_name()) {
        if places::is_run(dir) && is_run_file_name(&name.to_string_lossy()) {
            return Err(refusal(flag, path, &run_file(dir, &name.to_string_lossy())));
        }
    }
    Ok(())
}

/// A name in the run directory `run` that the run keeps for itself, in words.
fn run_file(run: &Path, name: &str) -> String {
    format!(
        "{}, a name the run {} keeps for its own files (its config, tokenizer, metrics and \
         checkpoints; compared regardless of case)",
        run.join(name).display(),
        run.display()
    )
}

/// The key of the folder a run starts from.
const INIT_FROM: &str = "model.init_from";

/// What the command reads, as the rule needs it.
struct Protected {
    /// Files read (and the own files of the runs read), compared by identity.
    files: Vec<PathBuf>,
    /// Folders read (runs, checkpoints, model folders), compared by identity.
    folders: Vec<PathBuf>,
    /// Folders a run reads a model or tokenizer from: (folder, whose run, the key naming it).
    model_folders: Vec<(PathBuf, String, &'static str)>,
}

impl Protected {
    fn of(reads: &[&Path], config_reads: &[(&Path, &'static str)]) -> Self {
        let mut p = Protected {
            files: vec![],
            folders: vec![],
            model_folders: config_reads
                .iter()
                .map(|(d, key)| (d.to_path_buf(), "this run".to_string(), *key))
                .collect(),
        };
        for read in reads {
            if !read.is_dir() {
                p.files.push(read.to_path_buf());
                continue;
            }
            p.folders.push(read.to_path_buf());
            let (run_dir, ckpt) = match crate::checkpoint::run_and_checkpoint(read) {
                Ok((r, c)) => (Some(r), Some(c)),
                Err(_) => (None, None),
            };
            for dir in [Some(read.to_path_buf()), run_dir.clone(), ckpt]
                .into_iter()
                .flatten()
            {
                p.files.extend(own_files(&dir));
                if let Some(hf) = init_from_of(&dir) {
                    let whose = format!("the run {}", run_dir.as_deref().unwrap_or(read).display());
                    p.model_folders.push((hf, whose, INIT_FROM));
                }
            }
        }
        p
    }

    /// Why nothing may be written into `folder` (`None` when it may be).
    fn holds(&self, folder: &Path) -> Option<String> {
        let read = self.model_folders.iter().find(|(dir, ..)| same_file(dir, folder));
        if let Some((dir, whose, key)) = read {
            let what = match *key {
                INIT_FROM => format!(
                    "the Hugging Face model folder {} that {whose} starts from (its {INIT_FROM})",
                    dir.display()
                ),
                key => format!("the folder {} that {whose} reads with its {key}", dir.display()),
            };
            return Some(format!(
                "{what}: writing there would replace the weights, config or tokenizer it reads"
            ));
        }
        let place = places::of(folder);
        place.is_read_by_runs().then(|| {
            let why = match place {
                Place::Checkpoint { .. } | Place::Checkpoints { .. } => {
                    "training replaces and prunes what is in a run's checkpoints/, and no command \
                     writes there"
                }
                Place::HfFolder => "a run may read it with model.init_from, and no command writes there",
                _ => "no command writes into a model folder, whose files its manifest checks",
            };
            format!("{}: {why}", place.describe(folder))
        })
    }

    /// Whether `path` is something the command reads.
    fn reads(&self, path: &Path) -> bool {
        self.files.iter().chain(&self.folders).any(|r| same_file(r, path))
    }
}

/// The files of a run directory, checkpoint or model folder that are its own (every regular
/// file directly in it), which an output file must not be, by any name.
fn own_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect()
}

/// The `model.init_from` of the `config.yaml` in `dir`, if it names one (read loosely: a
/// config that does not parse protects nothing more).
fn init_from_of(dir: &Path) -> Option<PathBuf> {
    let text = ember_data::io::read_own_to_string(dir.join(RUN_CONFIG)).ok()?;
    if text.len() > crate::config::MAX_CONFIG_BYTES {
        return None;
    }
    let tree: Value = serde_saphyr::from_str(&text).ok()?;
    tree.get("model")?.get("init_from")?.as_str().map(PathBuf::from)
}

/// `path` as the disk resolves it: the deepest part that exists, with its links and `..`
/// resolved, and the names below it that do not exist yet (their `..` taken as written, which
/// is what creating them does).
fn resolve(path: &Path) -> Result<(PathBuf, Vec<OsString>)> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let full = cwd.join(path);
    let (existing, below) = full
        .ancestors()
        .find_map(|a| {
            a.canonicalize()
                .ok()
                .map(|c| (c, full.strip_prefix(a).unwrap_or(Path::new(""))))
        })
        .unwrap_or_else(|| (PathBuf::from("/"), Path::new("")));
    let (mut existing, mut rest) = (existing, Vec::<OsString>::new());
    for part in below.components() {
        match part {
            Component::Normal(name) => rest.push(name.to_os_string()),
            Component::ParentDir => {
                // `..` takes back the last name still to be made, or else climbs out of `existing`.
                let nothing_to_take_back = rest.pop().is_none();
                if nothing_to_take_back {
                    existing.pop();
                }
            }
            _ => {}
        }
    }
    Ok((existing, rest))
}

/// Writes the folder `out` whole: `fill` writes its files into a temporary sibling
/// (`.NAME.tmp-PID`), which is then renamed to `out` in one step, so `out` is complete or
/// absent; on any failure the temporary folder is removed. `out` must have been [`check`]ed as
/// an [`Output::Folder`].
pub fn write_folder<T>(out: &Path, fill: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .with_context(|| format!("{} names no folder", out.display()))?
        .to_string_lossy()
        .to_string();
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let filled = std::fs::create_dir(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))
        .and_then(|()| fill(&tmp))
        .and_then(|value| {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("moving the finished folder to {}", out.display()))?;
            Ok(value)
        });
    if filled.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let _ = ember_data::io::sync_parent(out);
    filled
}
