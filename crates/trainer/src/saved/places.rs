//! What a folder is to Ember, judged from the files in it: a run directory, one of its
//! checkpoints or its `checkpoints/` folder, a model folder (`ember package`), a Hugging Face
//! model folder (what `model.init_from` reads and `ember export` writes), a sweep's output.
//!
//! Commands use it to say what they were given when it is not what they take ("rel is a model
//! folder, not a run"), and [`crate::protected`] to refuse writing into the folders that hold
//! what a run reads. Folders are recognised by what they hold and compared as files on the disk
//! (device and inode), never by how their path is spelled: `run/CHECKPOINTS` on a
//! case-insensitive disk is the run's `checkpoints/`, and a link to it is too.

use std::path::{Path, PathBuf};

use ember_data::{TOKENIZER_FILE, TOKEN_CACHE_FILE};

use crate::run_dir::{CHECKPOINTS, LOCK_FILE, METRICS, MODEL, RUN_CONFIG, STATE};

/// What a folder holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A checkpoint (it holds `state.json`), in the run `run` when it sits in a run's
    /// `checkpoints/`.
    Checkpoint { run: Option<PathBuf> },
    /// The `checkpoints/` folder of the run `run`.
    Checkpoints { run: PathBuf },
    /// A model folder: `model.json` with the weights, config and tokenizer it lists. `manifest`
    /// is false for a folder holding those three without its `model.json`.
    ModelFolder { manifest: bool },
    /// A training run's directory.
    Run,
    /// A Hugging Face model folder: `config.json` and weights (or a tokenizer).
    HfFolder,
    /// The output directory of a sweep (`grid.json`).
    Sweep,
    /// None of these (an empty folder, a folder of the user's).
    Other,
}

/// The manifest of a model folder (its one definition is `model_dir::MANIFEST`).
const MANIFEST: &str = crate::model_dir::MANIFEST;
/// A sweep's plan (`ember_experiment::layout::GRID`, which this crate cannot name).
pub(crate) const SWEEP_PLAN: &str = "grid.json";
/// A Hugging Face model's config and the files of its weights, any of which makes a folder
/// with the config one.
const HF_CONFIG: &str = ember_import::CONFIG_FILE;
const HF_WEIGHTS: [&str; 5] = [
    ember_import::SINGLE_FILE,
    ember_import::INDEX_FILE,
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    TOKENIZER_FILE,
];

/// The names a run directory gives its own files and folders (`run_dir`'s table, the data's
/// tokenizer and token cache, TensorBoard's event files): compared without regard to case, as a
/// case-insensitive disk would.
pub(crate) fn is_run_file_name(name: &str) -> bool {
    let own = [
        RUN_CONFIG,
        crate::run_dir::CONFIG_HISTORY,
        TOKENIZER_FILE,
        ember_data::TOKENIZER_CONFIG_FILE,
        TOKEN_CACHE_FILE,
        METRICS,
        crate::run_dir::METRICS_CSV,
        crate::run_dir::SUMMARY,
        CHECKPOINTS,
        LOCK_FILE,
    ];
    own.iter().any(|o| o.eq_ignore_ascii_case(name))
        || name
            .to_ascii_lowercase()
            .starts_with(ember_tensorboard::FILE_PREFIX)
}

/// Whether `path` names anything at all (a dangling link, a FIFO and a device count).
fn present(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Whether `a` and `b` are the same file or folder on the disk (both followed through links).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `dir` is a training run's directory: its config beside what training leaves (a
/// lock, a metrics log or a checkpoint), so that a project folder that merely holds a
/// `config.yaml` is not taken for one.
pub fn is_run(dir: &Path) -> bool {
    dir.join(RUN_CONFIG).is_file()
        && (present(&dir.join(LOCK_FILE))
            || present(&dir.join(METRICS))
            || !crate::checkpoint::list(dir).is_empty())
}

/// What `dir` is. A path that is no folder is [`Place::Other`].
pub fn of(dir: &Path) -> Place {
    if !dir.is_dir() {
        return Place::Other;
    }
    if present(&dir.join(STATE)) {
        let run = dir.parent().and_then(|c| match of_checkpoints(c) {
            Some(Place::Checkpoints { run }) => Some(run),
            _ => None,
        });
        return Place::Checkpoint { run };
    }
    if let Some(place) = of_checkpoints(dir) {
        return place;
    }
    if present(&dir.join(MANIFEST)) {
        return Place::ModelFolder { manifest: true };
    }
    if is_run(dir) {
        return Place::Run;
    }
    let unpackaged = [MODEL, RUN_CONFIG, TOKENIZER_FILE]
        .iter()
        .all(|f| present(&dir.join(f)));
    if unpackaged {
        return Place::ModelFolder { manifest: false };
    }
    if present(&dir.join(HF_CONFIG)) && HF_WEIGHTS.iter().any(|w| present(&dir.join(w))) {
        return Place::HfFolder;
    }
    if present(&dir.join(SWEEP_PLAN)) {
        return Place::Sweep;
    }
    Place::Other
}

/// `Some(Checkpoints)` when `dir` is the `checkpoints/` folder of a run (by identity: any
/// spelling of it).
fn of_checkpoints(dir: &Path) -> Option<Place> {
    let run = dir.parent()?;
    let run = if run.as_os_str().is_empty() {
        Path::new(".")
    } else {
        run
    };
    (same_file(dir, &run.join(CHECKPOINTS)) && is_run(run)).then(|| Place::Checkpoints {
        run: run.to_path_buf(),
    })
}

impl Place {
    /// The place in words, naming `dir` (and its run), e.g. "runs/a/checkpoints/step-00000010, a
    /// checkpoint of the run runs/a".
    pub fn describe(&self, dir: &Path) -> String {
        let d = dir.display();
        match self {
            Place::Checkpoint { run: Some(run) } => {
                format!("{d}, a checkpoint of the run {}", run.display())
            }
            Place::Checkpoint { run: None } => format!("{d}, a checkpoint (it holds {STATE})"),
            Place::Checkpoints { run } => format!("the checkpoints of the run {}", run.display()),
            Place::ModelFolder { manifest: true } => {
                format!("the model folder {d} (it holds {MANIFEST}, written by `ember package`)")
            }
            Place::ModelFolder { manifest: false } => format!(
                "a model folder without its {MANIFEST} ({d} holds {MODEL}, {RUN_CONFIG} and \
                 {TOKENIZER_FILE}, but not the manifest `ember package` writes)"
            ),
            Place::Run => {
                format!(
                    "the run directory {d} of a training run (it holds {RUN_CONFIG} and what training left)"
                )
            }
            Place::HfFolder => {
                format!("the Hugging Face model folder {d} (it holds {HF_CONFIG} and weights or a tokenizer)")
            }
            Place::Sweep => format!("the output directory of a sweep {d} (it holds {SWEEP_PLAN})"),
            Place::Other => d.to_string(),
        }
    }

    /// Whether a run reads what this place holds, so that nothing may be written into it: a
    /// checkpoint, a run's checkpoints, a model folder, a Hugging Face model folder.
    pub fn is_read_by_runs(&self) -> bool {
        matches!(
            self,
            Place::Checkpoint { .. }
                | Place::Checkpoints { .. }
                | Place::ModelFolder { .. }
                | Place::HfFolder
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_recognised_by_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let run = p.join("run");
        let step = run.join("checkpoints/step-00000002");
        std::fs::create_dir_all(&step).unwrap();
        std::fs::write(run.join(RUN_CONFIG), "").unwrap();
        std::fs::write(step.join(STATE), "{}").unwrap();
        assert_eq!(of(&run), Place::Run);
        assert_eq!(
            of(&run.join("checkpoints")),
            Place::Checkpoints { run: run.clone() }
        );
        assert_eq!(
            of(&step),
            Place::Checkpoint {
                run: Some(run.clone())
            }
        );
        // Another spelling of the checkpoints folder (as a case-insensitive disk would allow).
        std::os::unix::fs::symlink("checkpoints", run.join("CHECKPOINTS")).unwrap();
        assert_eq!(
            of(&run.join("CHECKPOINTS")),
            Place::Checkpoints { run: run.clone() }
        );
        // A project folder with a config and a checkpoints folder of its own is no run.
        std::fs::create_dir_all(p.join("project/checkpoints")).unwrap();
        std::fs::write(p.join("project").join(RUN_CONFIG), "").unwrap();
        assert_eq!(of(&p.join("project")), Place::Other);
        assert_eq!(of(&p.join("project/checkpoints")), Place::Other);
        let hf = p.join("hf");
        std::fs::create_dir(&hf).unwrap();
        std::fs::write(hf.join(HF_CONFIG), "{}").unwrap();
        assert_eq!(of(&hf), Place::Other, "a config alone is not a model");
        std::fs::write(hf.join(ember_import::SINGLE_FILE), "").unwrap();
        assert_eq!(of(&hf), Place::HfFolder);
        assert!(is_run_file_name("Config.YAML") && is_run_file_name("events.out.tfevents.1.h.2"));
        assert!(!is_run_file_name("eval.json"));
    }
}
