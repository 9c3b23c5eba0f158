//! Lines for the user on stdout and stderr that never panic.
//!
//! `println!` panics when its write fails, and a reader that went away makes it fail:
//! `ember train cfg | head -3` would kill the run at the fourth log line, losing every step since
//! its last checkpoint, and `ember bench cfg | head` died with a backtrace. A write through
//! [`say!`](crate::say) or [`tell!`](crate::tell) never panics:
//!
//! - a reader that went away (a broken pipe) is nobody's error: nothing more is written, training
//!   goes on as if `--quiet` (its product is the run directory, not the log), and `ember` ends
//!   with its usual status. `translate`, which writes line by line with `?`, stops at once.
//! - any other failed write (a full disk, an I/O error) is remembered, nothing more is written,
//!   and `ember` ends with an error saying so ([`write_error`]): `ember bleu --json > scores.json`
//!   on a full disk must not look like success.

use std::fmt::Arguments;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set by the first write to stdout that failed: nothing more is written.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// That write's error, unless it was a broken pipe.
static WRITE_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Writes one line to stdout, unless an earlier write failed (then nothing).
pub fn out(line: Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != io::ErrorKind::BrokenPipe {
            let mut first = WRITE_ERROR.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

/// The error of a write to stdout that failed for another reason than a reader going away:
/// the output is incomplete, and the command must not end as if it were not.
pub fn write_error() -> Option<String> {
    WRITE_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Writes one line to stderr; a failed write is ignored (there is nowhere left to say it).
pub fn err(line: Arguments<'_>) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_fmt(line).and_then(|()| stderr.write_all(b"\n"));
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
