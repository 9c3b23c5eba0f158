//! One writer per directory: an advisory lock held for as long as a run (or a sweep) writes
//! into its directory.
//!
//! The lock is `flock(2)` on `DIR/.lock` (through `fs4`). The kernel releases it when the
//! holder exits for any reason, `kill -9` included, so a stale lock file never blocks anyone:
//! only a live process holds the lock. The file also records who holds it (pid, start time,
//! command line), which is what a second writer is told when it is refused. Nothing else
//! reads that text; the lock itself is the kernel's.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use fs4::fs_std::FileExt;

use crate::run_dir::LOCK_FILE;

// The one public path of the lock-file opener, which `checkpoint` uses too.
pub use crate::run::lock_file::{open_lock_file, LockFile};

/// The held lock of a directory; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    // Kept open: dropping it releases the lock.
    file: LockFile,
}

impl DirLock {
    /// Takes the lock of `dir` (created if missing) without waiting. `what` names the writer
    /// in the refusal a second one gets, e.g. "training run" or "ablation sweep".
    pub fn acquire(dir: &Path, what: &str) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = open_lock_file(&path)?;
        let acquired =
            FileExt::try_lock_exclusive(&*file).with_context(|| format!("locking {}", path.display()))?;
        if !acquired {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            bail!(
                "{} is in use: another {what} is writing into it ({}). Two writers in one \
                 directory would corrupt each other's checkpoints, so this one stops here and \
                 nothing was changed. Wait for it to finish, stop it (kill -INT PID saves a \
                 checkpoint first), or choose another directory.",
                dir.display(),
                describe_holder(&holder)
            );
        }
        // Ours now: say who holds it, for the next writer's refusal.
        let info = format!(
            "pid {}\nstarted {}\ncommand {}\n",
            std::process::id(),
            unix_time(),
            std::env::args().collect::<Vec<_>>().join(" ")
        );
        // Held from here on, so that an error below releases it too.
        let mut lock = Self { path, file };
        lock.file
            .set_len(0)
            .and_then(|_| lock.file.seek(SeekFrom::Start(0)))
            .and_then(|_| lock.file.write_all(info.as_bytes()))
            .with_context(|| format!("writing {}", lock.path.display()))?;
        Ok(lock)
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who holds `dir`'s lock now (`pid 1234, started 5 s ago: `ember train …``), or `None` when
/// no process holds it. Reads the lock file only; creates nothing.
pub fn holder(dir: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(LOCK_FILE);
    if !fs::symlink_metadata(&path).ok()?.is_file() {
        return None;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    match FileExt::try_lock_shared(&file) {
        Ok(true) => {
            let _ = FileExt::unlock(&file);
            None
        }
        _ => {
            let mut text = String::new();
            let _ = (&mut file).take(4096).read_to_string(&mut text);
            Some(describe_holder(&text))
        }
    }
}

/// `pid 1234, started 2025-01-31 12:00:00 UTC: ember train ...` from the lock file's text.
fn describe_holder(text: &str) -> String {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .filter(|v| !v.is_empty())
    };
    match field("pid ") {
        Some(pid) => {
            let mut s = format!("pid {pid}");
            if let Some(started) = field("started ").and_then(|t| t.parse::<u64>().ok()) {
                let age = unix_time().saturating_sub(started);
                s.push_str(&format!(", started {age} s ago"));
            }
            if let Some(cmd) = field("command ") {
                s.push_str(&format!(": `{cmd}`"));
            }
            s
        }
        None => "a process that has not written its pid yet".into(),
    }
}

fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "training run").unwrap();
        let err = DirLock::acquire(dir.path(), "training run")
            .unwrap_err()
            .to_string();
        assert!(err.contains("is in use"), "{err}");
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(first);
        DirLock::acquire(dir.path(), "training run").expect("released on drop");
    }

    #[test]
    fn a_drop_releases_the_lock_even_while_child_processes_are_being_started() {
        // A child shares this process's open files between its fork and its exec; the lock
        // must not ride along in that window.
        let starting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let spawner = {
            let starting = starting.clone();
            std::thread::spawn(move || {
                while starting.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        };
        let dir = tempfile::tempdir().unwrap();
        // Counted, not unwrapped, so that the spawner is stopped whatever happens.
        let refused = (0..2000)
            .filter(|_| {
                let first = DirLock::acquire(dir.path(), "training run");
                drop(first);
                DirLock::acquire(dir.path(), "training run").is_err()
            })
            .count();
        starting.store(false, std::sync::atomic::Ordering::Relaxed);
        spawner.join().unwrap();
        assert_eq!(refused, 0, "acquisitions refused right after a drop");
    }

    #[test]
    fn a_lock_path_that_is_a_link_or_a_special_file_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious.txt");
        fs::write(&precious, "keep me").unwrap();
        let run = dir.path().join("run");
        fs::create_dir(&run).unwrap();
        // A symbolic link to another file.
        std::os::unix::fs::symlink(&precious, run.join(LOCK_FILE)).unwrap();
        let err = DirLock::acquire(&run, "training run").unwrap_err().to_string();
        assert!(err.contains("symbolic link") && err.contains(".lock"), "{err}");
        assert_eq!(fs::read_to_string(&precious).unwrap(), "keep me");
        // A second name (hard link) of another file.
        fs::remove_file(run.join(LOCK_FILE)).unwrap();
        fs::hard_link(&precious, run.join(LOCK_FILE)).unwrap();
        let err = DirLock::acquire(&run, "training run").unwrap_err().to_string();
        assert!(err.contains("hard link"), "{err}");
        assert_eq!(fs::read_to_string(&precious).unwrap(), "keep me");
        // A folder.
        fs::remove_file(run.join(LOCK_FILE)).unwrap();
        fs::create_dir(run.join(LOCK_FILE)).unwrap();
        let err = DirLock::acquire(&run, "training run").unwrap_err().to_string();
        assert!(err.contains("a folder"), "{err}");
        // Removed, it is created again as a regular file.
        fs::remove_dir(run.join(LOCK_FILE)).unwrap();
        DirLock::acquire(&run, "training run").expect("a fresh lock file");
    }
}
