//! Writing run-directory files so that a crash leaves the old content or the new, never half.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes a run-directory file with [`ember_data::io::write_atomic`] (a temporary file named
/// with the pid, flushed with its directory, then renamed), naming the path on failure.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    ember_data::io::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}
