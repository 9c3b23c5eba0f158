//! Opening the lock files ember writes its pid into (a run directory's, its `checkpoints/`
//! folder's, a sweep's) without ever writing through something that is not one: a link, a
//! device, a FIFO, a folder or a second name of another file.
//!
//! A lock taken on one ([`LockFile`]) is released by an explicit unlock when it is dropped, not
//! left to the close: a child process started by another thread shares the open file until it
//! execs, and a lock released only by the close outlived its drop by that window (a second
//! acquire in the same process was refused; CI saw it).

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use anyhow::{Context, Result};

/// Opens (creating it if missing) a lock file that ember writes into, without following a
/// symbolic link: a `.lock` that is a link, a device, a FIFO, a folder or a second name of
/// another file (a hard link) is refused, because writing the holder's pid into it would
/// overwrite whatever it points at.
pub fn open_lock_file(path: &Path) -> Result<LockFile> {
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |what: String| -> anyhow::Error {
        // A folder is removed with rmdir (if empty: what it holds is the user's to look at).
        let remove = if what == "a folder" { "rmdir" } else { "rm" };
        anyhow::anyhow!(
            "{} is {what}, not the lock file ember keeps there (a regular file of its own), so \
             ember does not write into it; remove it (`{remove} {}`: only the name is removed) \
             and try again. Nothing was changed.",
            path.display(),
            path.display()
        )
    };
    if let Ok(meta) = fs::symlink_metadata(path) {
        if let Some(what) = not_a_lock_file(&meta, path) {
            return Err(refuse(what));
        }
    }
    // O_NOFOLLOW: a link created between the check above and this open is refused too; a FIFO
    // opened for reading and writing does not block, and is caught by the check below.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("a symbolic link".into()),
            _ => anyhow::Error::new(e).context(format!("opening the lock file {}", path.display())),
        })?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading the lock file {}", path.display()))?;
    if let Some(what) = not_a_lock_file(&meta, path) {
        return Err(refuse(what));
    }
    Ok(LockFile(file))
}

/// An open lock file (the file itself through `Deref`); whatever lock this process took on it
/// is released when it is dropped.
#[derive(Debug)]
pub struct LockFile(File);

impl std::ops::Deref for LockFile {
    type Target = File;
    fn deref(&self) -> &File {
        &self.0
    }
}

impl std::ops::DerefMut for LockFile {
    fn deref_mut(&mut self) -> &mut File {
        &mut self.0
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Unlocking a file this process holds no lock on does nothing.
        let _ = fs4::fs_std::FileExt::unlock(&self.0);
    }
}

/// Why `meta` (of `path`, not followed) cannot be a lock file ember writes, if it cannot.
pub(crate) fn not_a_lock_file(meta: &fs::Metadata, path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Some(match fs::read_link(path) {
            Ok(target) => format!("a symbolic link to {}", target.display()),
            Err(_) => "a symbolic link".into(),
        });
    }
    if kind.is_dir() {
        return Some("a folder".into());
    }
    if !kind.is_file() {
        return Some("a special file (a device, FIFO or socket)".into());
    }
    if meta.nlink() > 1 {
        return Some(format!(
            "a second name of another file ({} hard links to it)",
            meta.nlink()
        ));
    }
    None
}
