//! Lines for the user on stdout and stderr that never panic.
//!
//! `println!` panics when its write fails, and a reader that went away makes it fail:
//! `ember train cfg | head -3` would kill the run at the fourth log line, losing every step since
//! its last checkpoint, and `ember bench cfg | head` died with a backtrace. A write through
//! [`say!`](crate::say) or [`tell!`](crate::tell) instead ignores a stream that is gone, and
//! training goes on as if it were `--quiet` (its product is the run directory, not the log). A
//! command whose product *is* its output (`translate`, `generate`) writes with `?`, so its own
//! broken pipe ends it; `ember`'s `main` then exits quietly, as `head`'s writer would expect.

use std::fmt::Arguments;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Writes one line to stdout, unless its reader went away (then nothing, now and from now on).
pub fn out(line: Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            STDOUT_GONE.store(true, Ordering::Relaxed);
        }
    }
}

/// Writes one line to stderr; a failed write is ignored (there is nowhere left to say it).
pub fn err(line: Arguments<'_>) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_fmt(line).and_then(|()| stderr.write_all(b"\n"));
}

/// Whether a write to stdout found its reader gone.
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(Ordering::Relaxed)
}

/// Whether `e` is, at bottom, a write to a pipe whose reader went away.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that never panics: see [`console`](crate::console).
#[macro_export]
macro_rules! say {
    () => { $crate::console::out(format_args!("")) };
    ($($arg:tt)*) => { $crate::console::out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics: see [`console`](crate::console).
#[macro_export]
macro_rules! tell {
    () => { $crate::console::err(format_args!("")) };
    ($($arg:tt)*) => { $crate::console::err(format_args!($($arg)*)) };
}
