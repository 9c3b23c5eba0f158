//! `ember ablate CONFIG --launcher slurm`: the sweep as a Slurm job array, one task per cell,
//! plus a report job that waits for the whole array.
//!
//! Ember writes the plan (`OUT/grid.json`, as a local sweep does) and two batch scripts, and
//! either prints the `sbatch` commands or runs them (`--submit`). Slurm does all the
//! scheduling; nothing here talks to Slurm except through `sbatch`.
//!
//! ```text
//! OUT/slurm/cells.sbatch     the job array: task I runs `ember ablate OUT --cell I`
//! OUT/slurm/report.sbatch    `ember ablate OUT --status`, then `ember report OUT`
//! OUT/slurm/logs/            cell-<I>.out (every attempt of a cell, appended), report-<job>.out
//! ```
//!
//! **Pre-emption.** The array asks for `--signal=B:USR1@<warn>`: that many seconds before the
//! time limit, Slurm sends SIGUSR1 to the batch shell, which passes it to `ember ablate --cell`
//! and on to `ember train`. Training stops at its next step boundary with a checkpoint (the
//! trainer's graceful stop; USR1 is one of its stop signals), the cell exits 138, and the script
//! requeues its own task with `scontrol requeue` (or, if that is refused, exits 85, which a
//! `RequeueExit=85` in slurm.conf turns into a requeue). The requeued task resumes from the
//! checkpoint, and since training is deterministic, ends bit-identical to an uninterrupted run.
//! A pre-emption by Slurm itself (SIGTERM, then a requeue Slurm does) takes the same path
//! without the script's help.
//!
//! **Failures.** A cell that crashes is recorded in `status.json` as failed (with its stderr
//! tail) and its task exits 1; the report job depends on the array with `afterany`, so it runs
//! whatever the cells did, and the report lists the failed cell.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use ember_trainer::run_lock::DirLock;

use crate::ablate::{plan, AblateOptions};
use crate::layout::{disk_state, write_plan, DiskState, Plan, GRID, RUNS};
use crate::shell::shell_word;

/// The folder of the batch scripts and logs, in the output directory.
pub const SLURM_DIR: &str = "slurm";
pub const CELLS_SCRIPT: &str = "cells.sbatch";
pub const REPORT_SCRIPT: &str = "report.sbatch";
pub const LOGS: &str = "logs";
/// Seconds before the time limit at which the array asks for its warning signal.
pub const DEFAULT_WARNING_SECS: u64 = 120;
/// The exit status of a cell stopped by SIGUSR1 (128 + 10), which the script requeues.
pub const WARNED_EXIT: i32 = 138;

/// What `--launcher slurm` is told besides the grid.
#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time` of each cell (Slurm's formats: `MM`, `HH:MM:SS`, `D-HH`...).
    pub time: Option<String>,
    /// CPUs per cell; each run gets as many `train.threads` (default 1).
    pub cpus_per_task: Option<usize>,
    pub gpus_per_task: Option<usize>,
    /// Cells running at once (`--array=...%M`); unlimited when `None`.
    pub max_parallel: Option<usize>,
    /// More `#SBATCH` options for both jobs, e.g. `--account=proj` or `--mem=4G`.
    pub sbatch_args: Vec<String>,
    /// Seconds before the time limit for the warning signal (default 120).
    pub warning_secs: Option<u64>,
}

/// A sweep planned for Slurm: the plan, the cells left to run and the scripts written.
#[derive(Debug, Clone)]
pub struct SlurmPlan {
    pub plan: Plan,
    /// Indices (in grid.json) of the cells not finished or diverged: the array's task ids.
    pub cells: Vec<usize>,
    /// `0-3,5` for `--array`.
    pub array: String,
    pub cells_script: PathBuf,
    pub report_script: PathBuf,
}

impl SlurmPlan {
    /// The commands that submit the sweep, as a user would type them (`$ARRAY` is the array's
    /// job id that the first prints).
    pub fn commands(&self) -> Vec<String> {
        let mut c = vec![];
        if !self.cells.is_empty() {
            c.push(format!(
                "ARRAY=$(sbatch --parsable {})",
                shell_word(&self.cells_script.display().to_string())
            ));
            c.push(format!(
                "sbatch --dependency=afterany:${{ARRAY%%;*}} {}",
                shell_word(&self.report_script.display().to_string())
            ));
        }
        c
    }
}

/// The job ids [`submit`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub array_job: String,
    pub report_job: String,
}

/// Plans the sweep into its output directory and writes the two batch scripts. `exe` is the
/// `ember` the jobs run (the CLI passes its own path); the jobs start in the current directory,
/// so relative paths in the plan mean what they mean here.
pub fn prepare(opts: &AblateOptions, slurm: &SlurmOptions, exe: &Path) -> Result<SlurmPlan> {
    check(slurm)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let cpus = slurm.cpus_per_task.unwrap_or(1);
    let mut opts = opts.clone();
    opts.threads = Some(cpus);
    let mut plan = plan(&opts)?;
    // Cells at once, as the plan records it: Slurm decides, within --max-parallel.
    plan.jobs = slurm.max_parallel.unwrap_or(plan.runs.len()).max(1);
    // Both paths end up on #SBATCH lines: refuse what no such line can hold before writing.
    for (what, path) in [("--out", &plan.out), ("the current directory", &cwd)] {
        let text = path.display().to_string();
        if text.chars().any(|c| c.is_control()) {
            bail!(
                "{what} {}: a path with a line break or other control character cannot be written \
                 on an #SBATCH line; choose another",
                shell_word(&text).escape_debug()
            );
        }
    }
    crate::layout::check_out_dir(&plan.out)?;
    // No local sweep may be writing into the directory while it is planned for the cluster.
    let _lock = DirLock::acquire(&plan.out, "ablation sweep")?;
    crate::layout::warn_of_unit_change(&plan);
    let dir = plan.out.join(SLURM_DIR);
    fs::create_dir_all(dir.join(LOGS)).with_context(|| format!("creating {}", dir.join(LOGS).display()))?;
    fs::create_dir_all(plan.out.join(RUNS))
        .with_context(|| format!("creating {}", plan.out.join(RUNS).display()))?;
    write_plan(&mut plan)?;
    let cells: Vec<usize> = plan
        .runs
        .iter()
        .enumerate()
        .filter(|(_, r)| !matches!(disk_state(&r.dir), DiskState::Finished | DiskState::Diverged(_)))
        .map(|(i, _)| i)
        .collect();
    let array = array_spec(&cells);
    let cells_script = dir.join(CELLS_SCRIPT);
    let report_script = dir.join(REPORT_SCRIPT);
    write_script(
        &cells_script,
        &cells_script_text(&plan, slurm, &array, cpus, exe, &cwd),
    )?;
    write_script(&report_script, &report_script_text(&plan, slurm, exe, &cwd))?;
    Ok(SlurmPlan {
        plan,
        cells,
        array,
        cells_script,
        report_script,
    })
}

/// Runs `sbatch` for the array, then for the report job with `afterany` on it.
pub fn submit(sp: &SlurmPlan) -> Result<Submitted> {
    if sp.cells.is_empty() {
        bail!(
            "every cell of {} is finished: nothing to submit",
            sp.plan.out.display()
        );
    }
    let array_job = sbatch(&[sp.cells_script.display().to_string()])?;
    let report_job = sbatch(&[
        format!("--dependency=afterany:{array_job}"),
        sp.report_script.display().to_string(),
    ])
    .with_context(|| {
        format!("the array is submitted as job {array_job}, but its report job is not; run `ember report` when it ends")
    })?;
    Ok(Submitted {
        array_job,
        report_job,
    })
}

/// `sbatch --parsable ARGS`, returning the job id.
fn sbatch(args: &[String]) -> Result<String> {
    let out = Command::new("sbatch")
        .arg("--parsable")
        .args(args)
        .output()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run sbatch ({e}): --submit needs Slurm's commands on PATH (a cluster's login \
                 node, or scripts/slurm-local.sh up on this machine); without --submit, ember \
                 prints the commands to run where Slurm is"
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "sbatch {} refused the job ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `--parsable` prints `ID` or `ID;CLUSTER`.
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        bail!("sbatch printed {:?} instead of a job id", stdout.trim());
    }
    Ok(id)
}

/// Every option is checked before anything is written: each ends up on an `#SBATCH` line.
fn check(s: &SlurmOptions) -> Result<()> {
    let word = |flag: &str, v: &Option<String>| -> Result<()> {
        if let Some(v) = v {
            if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                bail!(
                    "{flag} {v:?}: give one word without spaces, e.g. {flag} {}",
                    example(flag)
                );
            }
        }
        Ok(())
    };
    word("--partition", &s.partition)?;
    word("--time", &s.time)?;
    if let Some(n) = s
        .cpus_per_task
        .filter(|&n| n > ember_trainer::config::MAX_THREADS)
    {
        bail!(
            "--cpus-per-task {n}: at most {} (each cell trains with as many threads)",
            ember_trainer::config::MAX_THREADS
        );
    }
    for (flag, v) in [
        ("--cpus-per-task", s.cpus_per_task),
        ("--gpus-per-task", s.gpus_per_task),
        ("--max-parallel", s.max_parallel),
    ] {
        if v == Some(0) {
            bail!("{flag} must be at least 1");
        }
    }
    if s.warning_secs == Some(0) {
        bail!("--warning-secs must be at least 1 (Slurm's warning comes that many seconds before the time limit)");
    }
    for a in &s.sbatch_args {
        if !a.starts_with('-') || a.chars().any(|c| c == '\n' || c == '\r') {
            bail!(
                "--sbatch-arg {a:?}: give one sbatch option per flag, starting with '-', e.g. \
                 --sbatch-arg=--account=myproject"
            );
        }
    }
    Ok(())
}

fn example(flag: &str) -> &'static str {
    match flag {
        "--time" => "2:00:00",
        _ => "gpu",
    }
}

/// `0-3,5,7-8`: the array's task ids.
pub fn array_spec(cells: &[usize]) -> String {
    let mut parts: Vec<String> = vec![];
    let mut i = 0;
    while i < cells.len() {
        let mut j = i;
        while j + 1 < cells.len() && cells[j + 1] == cells[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cells[i], cells[j])
        } else {
            cells[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The `#SBATCH` lines both jobs share.
fn common_lines(s: &mut String, slurm: &SlurmOptions, cwd: &Path) {
    let _ = writeln!(s, "#SBATCH --chdir={}", sbatch_word(&cwd.display().to_string()));
    if let Some(p) = &slurm.partition {
        let _ = writeln!(s, "#SBATCH --partition={p}");
    }
    for a in &slurm.sbatch_args {
        let _ = writeln!(s, "#SBATCH {}", sbatch_word(a));
    }
}

fn job_name(plan: &Plan) -> String {
    let base = plan
        .out
        .file_name()
        .map_or("sweep".into(), |n| n.to_string_lossy().to_string());
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("ember-{clean}")
}

fn cells_script_text(
    plan: &Plan,
    slurm: &SlurmOptions,
    array: &str,
    cpus: usize,
    exe: &Path,
    cwd: &Path,
) -> String {
    let out = shell_word(&plan.out.display().to_string());
    let exe = shell_word(&exe.display().to_string());
    let logs = plan.out.join(SLURM_DIR).join(LOGS);
    let mut s = String::from("#!/bin/bash\n");
    let _ = writeln!(
        s,
        "# Written by `ember ablate --launcher slurm`: task I of this array trains cell I of\n\
         # {} (`ember ablate {out} --status` lists the cells). Submitting it again\n\
         # is safe (finished cells are skipped), but re-planning leaves them out of the array.",
        plan.out.join(GRID).display(),
    );
    let _ = writeln!(s, "#SBATCH --job-name={}", job_name(plan));
    let _ = writeln!(
        s,
        "#SBATCH --array={array}{}",
        slurm.max_parallel.map_or(String::new(), |m| format!("%{m}"))
    );
    let _ = writeln!(s, "#SBATCH --ntasks=1");
    let _ = writeln!(s, "#SBATCH --cpus-per-task={cpus}");
    if let Some(g) = slurm.gpus_per_task {
        let _ = writeln!(s, "#SBATCH --gpus-per-task={g}");
    }
    if let Some(t) = &slurm.time {
        let _ = writeln!(s, "#SBATCH --time={t}");
    }
    let _ = writeln!(
        s,
        "# The warning before the time limit (or a pre-emption), sent to this shell (B:), which\n\
         # passes it on; --requeue lets the task be queued again; append keeps every attempt's log.\n\
         #SBATCH --signal=B:USR1@{}\n\
         #SBATCH --requeue\n\
         #SBATCH --open-mode=append\n\
         #SBATCH --output={}",
        slurm.warning_secs.unwrap_or(DEFAULT_WARNING_SECS),
        sbatch_word(&format!("{}/cell-%a.out", output_pattern(&logs)))
    );
    common_lines(&mut s, slurm, cwd);
    let _ = write!(
        s,
        r#"
echo "== $(date -u +%FT%TZ) cell $SLURM_ARRAY_TASK_ID: job $SLURM_JOB_ID (array $SLURM_ARRAY_JOB_ID), attempt $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) on $(hostname), batch shell pid $$"
{exe} ablate {out} --cell "$SLURM_ARRAY_TASK_ID" &
child=$!
# Slurm's warning (USR1) and a cancel (TERM) reach this shell: pass them on. ember finishes its
# step, saves a checkpoint and exits 128 + the signal.
trap 'kill -USR1 $child 2>/dev/null' USR1
trap 'kill -TERM $child 2>/dev/null' TERM
trap 'kill -INT $child 2>/dev/null' INT
# `wait` returns early when a trap runs: wait again until the child has really ended.
while :; do
    wait "$child"; rc=$?
    kill -0 "$child" 2>/dev/null || {{ wait "$child"; rc=$?; break; }}
done
echo "== $(date -u +%FT%TZ) cell $SLURM_ARRAY_TASK_ID: ember exited $rc"
if [ "$rc" -eq {WARNED_EXIT} ]; then
    echo "== stopped by the warning signal with a checkpoint: requeueing; the next attempt resumes it"
    scontrol requeue "$SLURM_JOB_ID"
    # Only reached if scontrol may not requeue here: 85 requeues where slurm.conf has RequeueExit=85.
    exit 85
fi
exit "$rc"
"#
    );
    s
}

fn report_script_text(plan: &Plan, slurm: &SlurmOptions, exe: &Path, cwd: &Path) -> String {
    let out = shell_word(&plan.out.display().to_string());
    let exe = shell_word(&exe.display().to_string());
    let mut s = String::from("#!/bin/bash\n");
    let _ = writeln!(
        s,
        "# Written by `ember ablate --launcher slurm`: the report of the sweep in {}, submitted\n\
         # with --dependency=afterany:<the array's job id>, so it runs whatever the cells did.",
        plan.out.display()
    );
    let _ = writeln!(s, "#SBATCH --job-name={}-report", job_name(plan));
    let _ = writeln!(s, "#SBATCH --ntasks=1");
    let _ = writeln!(s, "#SBATCH --cpus-per-task=1");
    let _ = writeln!(
        s,
        "#SBATCH --output={}",
        sbatch_word(&format!(
            "{}/report-%j.out",
            output_pattern(&plan.out.join(SLURM_DIR).join(LOGS))
        ))
    );
    common_lines(&mut s, slurm, cwd);
    let _ = write!(s, "\n{exe} ablate {out} --status\nexec {exe} report {out}\n");
    s
}

fn write_script(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    ember_data::io::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

/// A value on an `#SBATCH` line as sbatch reads it back: sbatch splits those lines at
/// whitespace outside quotes and takes a backslash as an escape, so a value holding either (or
/// a quote, or `#`) goes in double quotes, with `"` and `\` escaped.
pub fn sbatch_word(value: &str) -> String {
    if !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%~".contains(c))
    {
        return value.to_string();
    }
    let mut out = String::from("\"");
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A folder in an `--output` file pattern: Slurm expands `%` there (`%a`, `%j`), and `%%` is
/// a literal `%`.
fn output_pattern(dir: &Path) -> String {
    dir.display().to_string().replace('%', "%%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_specs_join_consecutive_cells_into_ranges() {
        assert_eq!(array_spec(&[0, 1, 2, 3]), "0-3");
        assert_eq!(array_spec(&[0, 2, 3, 5, 7, 8, 9]), "0,2-3,5,7-9");
        assert_eq!(array_spec(&[4]), "4");
        assert_eq!(array_spec(&[]), "");
    }

    /// sbatch's reading of one `#SBATCH` argument (`_get_argument` in Slurm's sbatch/opt.c):
    /// quotes group, a backslash escapes the next character.
    fn sbatch_reads(word: &str) -> (String, usize) {
        let (mut out, mut quoted, mut escape, mut end) = (String::new(), None, false, word.len());
        for (i, c) in word.char_indices() {
            if escape {
                escape = false;
                out.push(c);
            } else if c == '\\' {
                escape = true;
            } else if let Some(q) = quoted {
                if c == q {
                    quoted = None;
                } else {
                    out.push(c);
                }
            } else if c == '"' || c == '\'' {
                quoted = Some(c);
            } else if c.is_whitespace() {
                end = i;
                break;
            } else {
                out.push(c);
            }
        }
        (out, end)
    }

    proptest::proptest! {
        /// Whatever a path holds (but control characters, refused before), sbatch reads back
        /// exactly the path from the line, as one argument.
        #[test]
        fn sbatch_reads_back_every_quoted_value_whole(value in "[^\\p{Cc}]{1,40}") {
            let word = sbatch_word(&value);
            let (read, end) = sbatch_reads(&word);
            proptest::prop_assert_eq!(read, value);
            proptest::prop_assert_eq!(end, word.len());
        }
    }

    #[test]
    fn a_path_with_spaces_quotes_and_percent_signs_survives_the_sbatch_line() {
        assert_eq!(sbatch_word("runs/sweep"), "runs/sweep");
        assert_eq!(sbatch_word("my runs/a\"b"), "\"my runs/a\\\"b\"");
        assert_eq!(output_pattern(Path::new("100% runs")), "100%% runs");
    }

    #[test]
    fn options_that_would_break_an_sbatch_line_are_refused_naming_the_flag() {
        let err = |s: SlurmOptions| check(&s).unwrap_err().to_string();
        let e = err(SlurmOptions {
            time: Some("2 hours".into()),
            ..Default::default()
        });
        assert!(e.contains("--time") && e.contains("2:00:00"), "{e}");
        let e = err(SlurmOptions {
            max_parallel: Some(0),
            ..Default::default()
        });
        assert!(e.contains("--max-parallel must be at least 1"), "{e}");
        let e = err(SlurmOptions {
            sbatch_args: vec!["account=x".into()],
            ..Default::default()
        });
        assert!(e.contains("--sbatch-arg") && e.contains("'-'"), "{e}");
        assert!(check(&SlurmOptions {
            partition: Some("gpu".into()),
            time: Some("1-00:00:00".into()),
            sbatch_args: vec!["--mem=4G".into()],
            ..Default::default()
        })
        .is_ok());
    }
}
