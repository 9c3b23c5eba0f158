//! Writing run-directory files so that a crash leaves the old content or the new, never half.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// Writes a run-directory file through a temporary file and a rename, naming the path on failure.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = fs::write(&tmp, bytes)
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display())));
    if written.is_err() {
        // A partial file would only take the space a full disk lacks.
        let _ = fs::remove_file(&tmp);
    }
    written
}
