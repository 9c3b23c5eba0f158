//! A run trained as a child `ember train` process: its output goes to the run's log files, and
//! every stop signal the sweep receives is passed on to it, so that it stops with a checkpoint.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};

use ember_trainer::interrupt::StopRequest;

use crate::layout::{PlannedRun, STDERR_LOG, STDOUT_LOG};

/// Lines of stderr kept in a failed run's record.
const TAIL_LINES: usize = 20;

/// Trains `run` as `EXE train ...` (its planned command, with `--resume` when resuming), its
/// output in the run's log files. Returns what to record should the run directory show no
/// result: the exit status (or why it could not start) and the tail of its stderr.
pub(super) fn train_in_child(
    exe: &Path,
    run: &PlannedRun,
    resume: bool,
    stop: Option<&StopRequest>,
) -> (String, String) {
    let mut args: Vec<String> = run.command[1..].to_vec();
    if resume {
        args.push("--resume".into());
    }
    let files =
        create_log(&run.dir.join(STDOUT_LOG)).and_then(|o| Ok((o, create_log(&run.dir.join(STDERR_LOG))?)));
    let result = files.and_then(|(out, err)| {
        let mut command = Command::new(exe);
        command.args(&args).stdin(Stdio::null()).stdout(out).stderr(err);
        run_child(command, stop)
    });
    let tail = tail_lines(&run.dir.join(STDERR_LOG), TAIL_LINES);
    match result {
        Ok(s) if s.success() => (
            "exited successfully without a finished summary.json".to_string(),
            tail,
        ),
        Ok(s) => (
            match s.code() {
                Some(c) => format!("exit status {c}"),
                None => format!("killed ({s})"),
            },
            tail,
        ),
        Err(e) => (format!("cannot run {}: {e}", exe.display()), tail),
    }
}

/// Runs a child `ember train` to its end, forwarding every stop signal this process receives to
/// it. The child runs in a process group of its own, so a Ctrl-C at the terminal reaches only
/// the sweep, which passes it on once: the child then stops at its next step boundary with a
/// checkpoint (a second Ctrl-C, passed on again, makes it abort).
fn run_child(mut command: Command, stop: Option<&StopRequest>) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    // If the sweep itself dies without forwarding (kill -9), its children get SIGTERM and
    // stop with a checkpoint instead of training on as orphans. The worker thread that spawns
    // a child waits for it, so the thread's end (which is what PDEATHSIG watches) is the
    // sweep's death.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches only the child's own attributes.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let mut forwarded = 0;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if let Some(stop) = stop {
            let (count, signal) = (stop.count(), stop.requested());
            if let (true, Some(signal)) = (count > forwarded, signal) {
                // SAFETY: kill(2) on our own child's pid, which try_wait has not reaped yet.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, signal);
                }
                forwarded = count;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The last `n` lines of a text file (reads at most its last 64 KiB).
fn tail_lines(path: &Path, n: usize) -> String {
    let Ok(mut f) = ember_data::io::open_own(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = vec![];
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Creates (or truncates) a log file of a run, replacing a link put in its place rather than
/// writing into whatever it points at.
fn create_log(path: &Path) -> std::io::Result<fs::File> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(path)?;
    }
    fs::File::create(path)
}
