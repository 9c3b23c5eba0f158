//! What a sweep prints: its progress lines and the table at its end.

use super::{RunAction, RunOutcome, RunStatus};
use crate::layout::Plan;

/// Prints a progress line unless quiet; a closed stdout (`| head`) must not stop the sweep.
pub(super) fn say(quiet: bool, line: String) {
    if !quiet {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{line}");
    }
}

/// The first progress line: what runs, where, and how many at a time.
pub(super) fn header(plan: &Plan) -> String {
    format!(
        "ablation: {} runs ({} variants × {} seeds × {} learning rates{}) of {} into {}; {} at a time{}",
        plan.runs.len(),
        plan.variants.len(),
        plan.seeds.len(),
        plan.lrs.len(),
        plan.axes
            .iter()
            .map(|a| format!(" × {} {}", a.values.len(), a.label(&plan.axes)))
            .collect::<String>(),
        plan.config_source.as_ref().unwrap_or(&plan.config).display(),
        plan.out.display(),
        plan.jobs,
        plan.threads.map_or(String::new(), |t| format!(
            ", {t} thread{} each",
            if t == 1 { "" } else { "s" }
        )),
    )
}

/// A run's outcome in a progress line: what happened to it and its validation loss or error.
pub(super) fn describe(o: &RunOutcome) -> String {
    let skipped = o.action == RunAction::Skipped;
    match &o.status {
        RunStatus::Ok => format!(
            "{:<8} {}: {}val loss {}{}",
            if skipped { "skipped" } else { "ok" },
            o.name,
            if skipped { "finished earlier; " } else { "" },
            o.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
            if skipped {
                String::new()
            } else {
                format!(", {:.1} s", o.wall_secs)
            }
        ),
        RunStatus::Interrupted { signal } => format!(
            "{:<8} {}: stopped by {signal} with a checkpoint; the next invocation resumes it",
            "stopped", o.name
        ),
        RunStatus::Diverged { reason } => format!(
            "{:<8} {}: {}{reason}",
            "diverged",
            o.name,
            if skipped { "(recorded earlier) " } else { "" }
        ),
        RunStatus::Failed { error, stderr_tail } => {
            let last = stderr_tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            format!(
                "{:<8} {}: {error}{}",
                "FAILED",
                o.name,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" — {last}")
                }
            )
        }
    }
}

/// The table printed at the end of a sweep.
pub fn summary_table(runs: &[RunOutcome], wall_secs: f64) -> String {
    let w = runs.iter().map(|r| r.name.len()).max().unwrap_or(3).max(3);
    let mut s = format!(
        "\n{:<w$}  {:<9} {:>9}  {:>10}  {:>9}\n",
        "run", "status", "steps", "val loss", "wall"
    );
    for r in runs {
        let status = match (&r.status, &r.action) {
            (RunStatus::Ok, RunAction::Skipped) => "ok (done)",
            (RunStatus::Ok, RunAction::Resumed { .. }) => "ok (res.)",
            (st, _) => st.label(),
        };
        let steps = match (r.steps, r.total_steps) {
            (Some(a), Some(b)) => format!("{a}/{b}"),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "{:<w$}  {:<9} {:>9}  {:>10}  {:>9}\n",
            r.name,
            status,
            steps,
            r.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
            if r.action == RunAction::Skipped {
                "-".into()
            } else {
                format!("{:.1}s", r.wall_secs)
            }
        ));
    }
    let count = |f: &dyn Fn(&RunOutcome) -> bool| runs.iter().filter(|r| f(r)).count();
    s.push_str(&format!(
        "{} runs: {} ok ({} skipped as done, {} resumed), {} diverged, {} failed; {:.1}s",
        runs.len(),
        count(&|r| r.status == RunStatus::Ok),
        count(&|r| r.status == RunStatus::Ok && r.action == RunAction::Skipped),
        count(&|r| matches!(r.action, RunAction::Resumed { .. }) && r.status == RunStatus::Ok),
        count(&|r| matches!(r.status, RunStatus::Diverged { .. })),
        count(&|r| matches!(r.status, RunStatus::Failed { .. })),
        wall_secs
    ));
    s
}
