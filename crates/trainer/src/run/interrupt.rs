//! Stopping a run gracefully: a stop signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1) becomes a request that
//! the training loop honours at the next step boundary — finish the step, write a checkpoint and
//! a summary marked interrupted, and tell the user how to resume. A second signal aborts at once
//! (checkpoints are written to a temporary directory and renamed, so an abort mid-save leaves
//! the previous checkpoint intact).
//!
//! A stop request is acknowledged at once, on stderr, with what happens next ("stopping after
//! this step…", "…once the data is ready"): the code that owns the process says what it is doing
//! ([`StopRequest::set_phase`]), so a user who pressed Ctrl-C during a long evaluation or while
//! a tokenizer is trained knows it was heard and does not press it again.
//!
//! Repeats within [`GRACE`] of the first signal count as the same request, not as "abort now":
//! a child of `ember ablate` whose parent is killed receives its parent-death signal once per
//! thread of the parent (Linux re-parents it to each surviving thread in turn), all within
//! microseconds, and must still stop with a checkpoint.
//!
//! The signals are received on a thread of their own (`signal_hook::iterator`), not in a signal
//! handler, so nothing here has to be async-signal-safe. SIGUSR1 is the warning a Slurm job
//! asks for before its time limit or a pre-emption (`#SBATCH --signal=B:USR1@120`): it stops
//! the run the same way, and the exit status (138) tells the job script to requeue the cell.

use crate::tell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// What a stop request does now, in words (see [`StopRequest::set_phase`]).
    phase: Mutex<Option<String>>,
}

/// Repeated stop signals within this time of the first are the same request (see the module
/// docs); a later one aborts (`ember train`).
pub const GRACE: Duration = Duration::from_secs(2);

/// What a stop request does while nothing more specific was said.
const DEFAULT_PHASE: &str = "stopping at the next step boundary, with a checkpoint";

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

    /// Says what a stop request does from now on, e.g. "stopping once the data is ready
    /// (nothing has been trained yet, so nothing is saved)": printed the moment a signal
    /// arrives.
    pub fn set_phase(&self, what: impl Into<String>) {
        *self.inner.phase.lock().unwrap_or_else(|e| e.into_inner()) = Some(what.into());
    }

    /// What a stop request does now, in words.
    pub fn phase(&self) -> String {
        self.inner
            .phase
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| DEFAULT_PHASE.to_string())
    }
}

/// The line that acknowledges the first stop signal.
pub fn acknowledgement(signal: i32, phase: &str, on_repeat: OnRepeat) -> String {
    match on_repeat {
        OnRepeat::Abort => format!(
            "\n{} received: {phase}. Send it again (after {} s) to abort at once without saving.",
            signal_name(signal),
            GRACE.as_secs()
        ),
        OnRepeat::Count => format!("\n{} received: {phase}.", signal_name(signal)),
    }
}

/// Whether a repeated signal, `since_first` after the first, aborts (`ember train`).
pub fn repeat_aborts(on_repeat: OnRepeat, since_first: Duration) -> bool {
    on_repeat == OnRepeat::Abort && since_first >= GRACE
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
            let mut first: Option<Instant> = None;
            for signal in signals.forever() {
                seen.request(signal);
                match first {
                    None => {
                        first = Some(Instant::now());
                        tell!("{}", acknowledgement(signal, &seen.phase(), on_repeat));
                    }
                    Some(t) if repeat_aborts(on_repeat, t.elapsed()) => {
                        tell!(
                            "\n{} again: aborting now without saving; the newest checkpoint on disk is intact",
                            signal_name(signal)
                        );
                        signal_hook::low_level::exit(i32::from(exit_status(signal)));
                    }
                    // Within the grace period (or counted for the caller): the same request.
                    Some(_) => {}
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

    #[test]
    fn a_repeat_within_the_grace_period_is_the_same_request_and_a_later_one_aborts() {
        assert!(!repeat_aborts(OnRepeat::Abort, Duration::ZERO));
        assert!(!repeat_aborts(OnRepeat::Abort, GRACE - Duration::from_millis(1)));
        assert!(repeat_aborts(OnRepeat::Abort, GRACE));
        assert!(!repeat_aborts(OnRepeat::Count, GRACE * 10), "ablate only counts");
    }

    #[test]
    fn the_acknowledgement_says_what_happens_next() {
        let r = StopRequest::new();
        assert!(r.phase().contains("checkpoint"), "{}", r.phase());
        r.set_phase("stopping once the data is ready");
        let line = acknowledgement(SIGINT, &r.phase(), OnRepeat::Abort);
        assert!(
            line.contains("SIGINT received: stopping once the data is ready"),
            "{line}"
        );
        assert!(
            line.contains("again") && line.contains("without saving"),
            "{line}"
        );
        let line = acknowledgement(SIGTERM, "passing it on", OnRepeat::Count);
        assert!(!line.contains("abort"), "{line}");
    }
}
