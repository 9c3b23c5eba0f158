//! Output files of commands that read a trained run (`eval --output`, `export
//! --reference-logits`): refused when they would replace one of the run's own files.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// The files of a run that Ember wrote (its config, tokenizer, token cache, metrics, summary,
/// events and lock, and every file of the checkpoint a command uses): an output path must be
/// none of them.
fn run_files(run: &Path) -> Vec<PathBuf> {
    let Ok((run_dir, ckpt)) = ember_trainer::checkpoint::run_and_checkpoint(run) else {
        return vec![];
    };
    let own = [
        ember_trainer::run_dir::RUN_CONFIG,
        ember_data::TOKENIZER_FILE,
        ember_data::TOKEN_CACHE_FILE,
        ember_trainer::run_dir::SUMMARY,
        ember_trainer::run_dir::METRICS,
        ember_trainer::run_dir::METRICS_CSV,
        ember_trainer::run_dir::LOCK_FILE,
    ];
    let top = std::fs::read_dir(&run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| own.contains(&n) || n.starts_with("events.out.tfevents"))
        });
    let checkpoint = std::fs::read_dir(&ckpt)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    top.chain(checkpoint).filter(|p| p.is_file()).collect()
}

/// Refuses an output file that is one of the run's own files (or a device, or a folder).
pub(super) fn check_run_output(output: &Path, run: &Path, flag: &str) -> Result<()> {
    let files = run_files(run);
    let inputs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    Ok(ember_data::io::check_output(output, &inputs, flag)?)
}
