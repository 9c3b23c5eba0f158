//! Stopping a run gracefully: a stop signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1) becomes a request that
//! the training loop honours at the next step boundary — finish the step, write a checkpoint and
//! a summary marked interrupted, and tell the user how to resume. A second signal aborts at once
//! (checkpoints are written to a temporary directory and renamed, so an abort mid-save leaves
//! the previous checkpoint intact).
//!
//! The signals are received on a thread of their own (`signal_hook::iterator`), not in a signal
//! handler, so nothing here has to be async-signal-safe. SIGUSR1 is the warning a Slurm job
//! asks for before its time limit or a pre-emption (`#SBATCH --signal=B:USR1@120`): it stops
//! the run the same way, and the exit status (138) tells the job script to requeue the cell.

use crate::tell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// The signals that ask a run to stop, with their names.
pub const STOP_SIGNALS: &[(i32, &str)] = &[
    (SIGINT, "SIGINT"),
    (SIGTERM, "SIGTERM"),
    (SIGHUP, "SIGHUP"),
    (SIGUSR1, "SIGUSR1"),
];

/// The name of a stop signal (`SIGINT`), or `signal N`.
pub fn signal_name(signal: i32) -> String {
    STOP_SIGNALS
        .iter()
        .find(|(s, _)| *s == signal)
        .map_or_else(|| format!("signal {signal}"), |(_, n)| n.to_string())
}

/// The exit status of a process stopped by `signal`, as shells report it: 128 + the number
/// (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP, 138 for SIGUSR1).
pub fn exit_status(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

/// What a repeated stop signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRepeat {
    /// Exit at once with the signal's status (`ember train`: the user insists).
    Abort,
    /// Only count it ([`StopRequest::count`]): the caller decides (`ember ablate` forwards each
    /// one to its children).
    Count,
}

/// Whether, and by which signal, a stop has been asked for. Cheap to clone and to poll.
#[derive(Debug, Clone, Default)]
pub struct StopRequest {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    count: AtomicUsize,
    first: AtomicI32,
}

impl StopRequest {
    /// A request no signal is connected to (tests and embedding call [`Self::request`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for a stop, as receiving `signal` does.
    pub fn request(&self, signal: i32) {
        let _ = self
            .inner
            .first
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        self.inner.count.fetch_add(1, Ordering::SeqCst);
    }

    /// The first stop signal received, if any.
    pub fn requested(&self) -> Option<i32> {
        match self.inner.first.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Stop signals received so far.
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }
}

/// Routes [`STOP_SIGNALS`] to the returned request for the rest of the process's life. Call
/// once, from the command that owns the process (the CLI), never from library code.
pub fn install(on_repeat: OnRepeat) -> Result<StopRequest> {
    let numbers: Vec<i32> = STOP_SIGNALS.iter().map(|(s, _)| *s).collect();
    let mut signals =
        Signals::new(&numbers).context("installing the SIGINT/SIGTERM/SIGHUP/SIGUSR1 handlers")?;
    let request = StopRequest::new();
    let seen = request.clone();
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                seen.request(signal);
                if on_repeat == OnRepeat::Abort && seen.count() >= 2 {
                    tell!(
                        "\n{} again: aborting now without saving; the newest checkpoint on disk is intact",
                        signal_name(signal)
                    );
                    signal_hook::low_level::exit(i32::from(exit_status(signal)));
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(request)
}

/// The error a run stopped by a signal ends with: the CLI prints it with the command that
/// resumes the run and exits with [`exit_status`] of the signal.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "interrupted by {} at step {step}; {}",
    signal_name(*signal),
    match checkpoint {
        Some(c) => format!("saved checkpoint {}", c.display()),
        None => "no step had been trained, so there was nothing to save".into(),
    }
)]
pub struct Interrupted {
    pub signal: i32,
    /// Steps completed, all of them in the checkpoint.
    pub step: u64,
    /// The checkpoint that holds the run's state (`None` if it stopped before its first step).
    pub checkpoint: Option<std::path::PathBuf>,
    pub run_dir: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signal_is_remembered_and_later_ones_counted() {
        let r = StopRequest::new();
        assert_eq!(r.requested(), None);
        r.request(SIGTERM);
        r.request(SIGINT);
        assert_eq!(r.requested(), Some(SIGTERM));
        assert_eq!(r.count(), 2);
        assert_eq!(exit_status(SIGINT), 130);
        assert_eq!(exit_status(SIGTERM), 143);
        assert_eq!(signal_name(SIGHUP), "SIGHUP");
        assert_eq!(exit_status(SIGUSR1), 138);
        assert_eq!(signal_name(SIGUSR1), "SIGUSR1");
    }
}
