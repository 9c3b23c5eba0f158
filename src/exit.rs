//! How `ember` ends: the exit status and message of a command's result (the same for every
//! command), of a usage error, and of a rank of a data-parallel job. Every message that
//! reaches the screen is bounded: an error names what it refuses, it does not repeat it.

use std::process::ExitCode;

use anyhow::{bail, Result};
use ember_distributed::World;
use ember_experiment::ablate::{PlanningInterrupted, SweepInterrupted};
use ember_trainer::interrupt::{exit_status, Interrupted};
use ember_trainer::tell;
use ember_trainer::RankFailed;

/// The exit status of a command's result, after printing its error (if any) to stderr.
pub(crate) fn exit_code(result: Result<()>) -> ExitCode {
    // Output that could not be written (a full disk under `> file`) is an error of its own.
    let result = result.and_then(|()| match ember_trainer::console::write_error() {
        Some(e) => Err(anyhow::anyhow!(
            "writing to stdout failed ({e}): the output above is incomplete (files the command \
             wrote, such as a run directory, are not affected)"
        )),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`ember translate < in | head`): nothing is wrong,
        // and nothing more is wanted.
        Err(e) if ember_trainer::console::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(quiet) = e.downcast_ref::<QuietExit>() {
                return ExitCode::from(quiet.0);
            }
            if let Some(stop) = e.downcast_ref::<Interrupted>() {
                // The outermost message only: it already says what the Interrupted below it says,
                // followed by the command that resumes the run.
                tell!("{e}");
                return ExitCode::from(exit_status(stop.signal));
            }
            if let Some(code) = e
                .downcast_ref::<SweepInterrupted>()
                .map(|s| exit_status(s.signal))
                .or_else(|| {
                    e.downcast_ref::<PlanningInterrupted>()
                        .map(|s| exit_status(s.signal))
                })
            {
                tell!("{}", user_message(&e));
                return ExitCode::from(code);
            }
            tell!("error: {}", user_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The exit status of arguments clap refused, after printing why. `--help` and `--version`
/// print as clap writes them; a usage error is bounded like every other error (clap echoes
/// the value it refused, however long).
pub(crate) fn usage_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit()
    }
    if e.kind() == clap::error::ErrorKind::InvalidUtf8 {
        tell!("error: {}", bounded(&not_utf8_argument()));
        return ExitCode::from(2);
    }
    tell!("{}", bounded(e.render().to_string().trim_end()));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// An exit status whose reason was already printed (or is printed by another rank). Returned,
/// not `process::exit`ed, so that MPI shuts down cleanly on every rank first.
#[derive(Debug)]
pub(crate) struct QuietExit(pub(crate) u8);

impl std::fmt::Display for QuietExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for QuietExit {}

/// How a rank of a job ends on an error. An error the ranks agreed on (a stop signal, a failed
/// set-up) ends each rank quietly with the same status, rank 0 saying `on_stop` of a stop; any
/// other error happened on this rank alone, and the others would wait for it in their next
/// collective, so it ends the whole job (MPI_Abort) after saying which rank failed and why.
pub(crate) fn end_rank(
    world: &World,
    e: anyhow::Error,
    on_stop: impl FnOnce(&Interrupted) -> String,
) -> Result<()> {
    let rank = world.rank();
    if let Some(stop) = e.downcast_ref::<Interrupted>() {
        if world.is_leader() {
            tell!("{}", on_stop(stop));
        }
        bail!(QuietExit(exit_status(stop.signal)));
    }
    if let Some(RankFailed(failed)) = e.downcast_ref::<RankFailed>() {
        // Agreed by every rank, so no abort: the failing rank says why, the others nothing.
        if *failed == rank {
            tell!("rank {rank} of {}: error: {}", world.size(), user_message(&e));
        }
        bail!(QuietExit(1));
    }
    tell!("rank {rank} of {}: error: {}", world.size(), user_message(&e));
    world.abort(1)
}

/// An error as a user reads it: the message and each cause below it once (a cause whose words
/// the message already holds, such as an OS error a library repeats, is not said twice), and
/// no backtrace a library captured (candle does, under `RUST_BACKTRACE=1`).
fn user_message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = without_backtrace(&cause.to_string());
        let said = said.trim_end();
        if said.is_empty() || text.contains(said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(said);
    }
    bounded(&text)
}

/// Which argument is not UTF-8 (clap says only that one is), and the flag it belongs to.
fn not_utf8_argument() -> String {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let Some(i) = args.iter().position(|a| a.to_str().is_none()) else {
        return "an argument is not valid UTF-8 text; ember's options take UTF-8 text".into();
    };
    let shown = args[i].to_string_lossy();
    let flag = args[..i]
        .last()
        .and_then(|a| a.to_str())
        .filter(|a| a.starts_with('-'))
        .map_or(String::new(), |f| format!(" (the value of {f})"));
    format!(
        "argument {i}{flag}, shown here as {shown:?}, is not valid UTF-8 text: options such as \
         --set, --prompt or --grid take UTF-8 text (paths may be any bytes); re-encode it as UTF-8"
    )
}

/// The longest word (a run without spaces) an error message shows whole.
const MAX_WORD: usize = 200;
/// The longest error message shown whole.
const MAX_MESSAGE: usize = 6000;

/// `text` with every overlong word (an input echoed back: a 100 kB `--set` value, a key, a
/// path) shortened to its start and end, and the whole cut at [`MAX_MESSAGE`] characters:
/// an error names what it refuses, it does not repeat it.
fn bounded(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_MESSAGE + 100));
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let n = word.chars().count();
        if n > MAX_WORD {
            out.extend(word.chars().take(80));
            out.push('…');
            out.extend(word.chars().skip(n - 40));
            out.push_str(&format!(" ({n} characters)"));
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_whitespace() {
            flush(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    let n = out.chars().count();
    if n > MAX_MESSAGE {
        let mut cut: String = out.chars().take(MAX_MESSAGE).collect();
        cut.push_str(&format!("… ({} more characters left out)", n - MAX_MESSAGE));
        return cut;
    }
    out
}

/// `text` without the frames of a captured backtrace (`   0: name` and `      at file.rs:1:2`).
fn without_backtrace(text: &str) -> String {
    let frame = |line: &str| {
        let t = line.trim_start();
        let indented = t.len() < line.len();
        let numbered = t
            .split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        indented && (numbered || (t.starts_with("at ") && t.contains(".rs:")))
    };
    text.lines().filter(|l| !frame(l)).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever an error echoes, what reaches the screen is bounded: no word longer than
        /// [`MAX_WORD`] (plus its count), no message longer than [`MAX_MESSAGE`] (plus a note).
        #[test]
        fn every_error_message_is_bounded(
            words in prop::collection::vec("[a-z=./\\-]{0,400}|\\PC{0,30}", 0..60),
            seps in prop::collection::vec(prop::sample::select(vec![" ", "\n", ": ", "\t"]), 60),
        ) {
            let text: String = words
                .iter()
                .zip(&seps)
                .flat_map(|(w, s)| [w.as_str(), *s])
                .collect();
            let out = bounded(&text);
            prop_assert!(out.chars().count() <= MAX_MESSAGE + 50);
            for word in out.split_whitespace() {
                prop_assert!(word.chars().count() <= MAX_WORD, "{}", word);
            }
            let short = text.split_whitespace().all(|w| w.chars().count() <= MAX_WORD);
            if short && text.chars().count() <= MAX_MESSAGE {
                prop_assert_eq!(out, text, "a message within the bounds is shown whole");
            }
        }
    }

    #[test]
    fn a_long_value_is_named_by_its_start_end_and_length() {
        let value = format!("{}end", "a".repeat(100_000));
        let out = bounded(&format!("lm.yaml: --set \"train.lr={value}\" is not a number"));
        assert!(out.starts_with("lm.yaml: --set \"train.lr=aaa"), "{out}");
        assert!(
            out.contains("aaend\" (100014 characters) is not a number"),
            "{out}"
        );
        assert!(out.len() < 300, "{out}");
    }
}
