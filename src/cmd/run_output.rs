//! Output files of commands that read a trained run (`eval --output`, `export
//! --reference-logits`): checked by the one rule of [`ember_trainer::protected`], so none
//! replaces one of the run's own files, a checkpoint's, or goes into a model folder.

use std::path::Path;

use anyhow::Result;
use ember_trainer::protected::{check, Output};

/// Refuses an output file that is one of the run's own files (by any name), a device, a folder
/// or a link, or that lies in a checkpoint, a model folder or a Hugging Face model folder.
pub(super) fn check_run_output(output: &Path, run: &Path, flag: &str) -> Result<()> {
    check(output, flag, Output::File, &[run], &[])
}
