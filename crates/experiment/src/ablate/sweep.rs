//! A local sweep, start to end: plan it, refuse another config's runs, settle the runs that need
//! no training, train the others `jobs` at a time (each recorded in `status.json` as it goes),
//! then write the report.

use std::collections::VecDeque;
use std::fs;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, Result};
use ember_trainer::interrupt::StopRequest;
use ember_trainer::run_lock::{holder, DirLock};

use super::execute::execute;
use super::existing_runs::{next, refuse_other_configs, Next};
use super::grid::plan;
use super::print::{describe, header, say, summary_table};
use super::status::{outcome, record, running_record};
use super::{AblateOptions, AblateOutcome, RunAction, RunOutcome, RunStatus, SweepInterrupted};
use crate::layout::{
    read_status, utc_now, write_json, write_plan, Invocation, Plan, SweepStatus, REPORT_MD, RUNS, STATUS,
};
use crate::report;

/// Runs (or resumes, or skips) every run of the grid, then writes the report.
pub fn ablate(opts: &AblateOptions) -> Result<AblateOutcome> {
    let started = Instant::now();
    super::refuse_foreign_launcher(|k| std::env::var(k).ok())?;
    if let Some(stop) = &opts.stop {
        stop.set_phase("stopping the planning of the sweep (nothing has been written yet)");
    }
    let plan = plan(opts)?;
    crate::layout::check_out_dir(&plan.out)?;
    // One sweep per output directory: two would train the same runs into the same directories.
    let _lock = DirLock::acquire(&plan.out, "ablation sweep")?;
    refuse_other_configs(&plan)?;
    if let Some(stop) = &opts.stop {
        stop.set_phase(
            "passing it on to the running run(s), which stop after their current step with a \
             checkpoint; no further run starts",
        );
    }
    crate::layout::warn_of_unit_change(&plan);
    fs::create_dir_all(plan.out.join(RUNS))
        .with_context(|| format!("creating {}", plan.out.join(RUNS).display()))?;
    let mut plan = plan;
    write_plan(&mut plan)?;
    say(opts.quiet, header(&plan));
    let sweep = Sweep::start(&plan, opts, started)?;
    let queue = sweep.settle_or_queue()?;
    sweep.train_queued(queue);
    let runs = sweep.finish()?;
    say(opts.quiet, summary_table(&runs, started.elapsed().as_secs_f64()));
    if let Some(signal) = opts.stop.as_ref().and_then(StopRequest::requested) {
        let interrupted = runs
            .iter()
            .filter(|r| matches!(r.status, RunStatus::Interrupted { .. }))
            .count();
        return Err(SweepInterrupted {
            signal,
            interrupted,
            not_started: plan.runs.len() - runs.len(),
        }
        .into());
    }
    let report = report::report(&plan.out)
        .context("writing the report (the runs are saved; `ember report` retries)")?;
    say(
        opts.quiet,
        format!("report: {}", plan.out.join(REPORT_MD).display()),
    );
    Ok(AblateOutcome {
        plan,
        runs,
        report,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

/// One invocation in progress: what its runs share.
struct Sweep<'a> {
    plan: &'a Plan,
    opts: &'a AblateOptions,
    started: Instant,
    status_path: PathBuf,
    /// `status.json` as it stands, and each planned run's outcome once known.
    state: Mutex<(SweepStatus, Vec<Option<RunOutcome>>)>,
}

impl<'a> Sweep<'a> {
    /// Reads `status.json` (or starts one) and records this invocation in it.
    fn start(plan: &'a Plan, opts: &'a AblateOptions, started: Instant) -> Result<Self> {
        let status_path = plan.out.join(STATUS);
        let mut status = read_status(&plan.out);
        status.invocations.push(Invocation {
            started: utc_now(),
            wall_secs: 0.0,
            jobs: plan.jobs,
            threads: plan.threads,
            hardware: plan.hardware.clone(),
            executed: 0,
            skipped: 0,
        });
        write_json(&status_path, &status)?;
        Ok(Self {
            plan,
            opts,
            started,
            status_path,
            state: Mutex::new((status, vec![None; plan.runs.len()])),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (SweepStatus, Vec<Option<RunOutcome>>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `[ 3/12]`: run `i`'s place in the plan, for progress lines.
    fn tag(&self, i: usize) -> String {
        let total = self.plan.runs.len();
        format!("[{:>w$}/{total}]", i + 1, w = total.to_string().len())
    }

    /// Records the runs that need no training (skipped, refused) and returns the others, each
    /// with the step to resume from.
    fn settle_or_queue(&self) -> Result<VecDeque<(usize, Option<u64>)>> {
        let mut queue = VecDeque::new();
        for (i, run) in self.plan.runs.iter().enumerate() {
            match next(self.plan, run) {
                Next::Settled(action, status) => {
                    let outcome = outcome(run, action, status, 0.0);
                    say(self.opts.quiet, format!("{} {}", self.tag(i), describe(&outcome)));
                    let mut guard = self.lock();
                    record(&mut guard.0, &outcome, self.started);
                    guard.1[i] = Some(outcome);
                }
                Next::Train { resume_from } => queue.push_back((i, resume_from)),
            }
        }
        let mut guard = self.lock();
        let skipped = guard
            .1
            .iter()
            .flatten()
            .filter(|o| o.action == RunAction::Skipped)
            .count();
        if let Some(inv) = guard.0.invocations.last_mut() {
            inv.executed = queue.len();
            inv.skipped = skipped;
        }
        write_json(&self.status_path, &guard.0)?;
        Ok(queue)
    }

    /// Trains the queued runs, `jobs` at a time.
    fn train_queued(&self, queue: VecDeque<(usize, Option<u64>)>) {
        let queue = Mutex::new(queue);
        let worker = || loop {
            if self.stop_requested() {
                break; // the runs still queued stay as they are: the next invocation starts them
            }
            let Some((i, resume_from)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                break;
            };
            self.train(i, resume_from);
        };
        std::thread::scope(|s| {
            for _ in 0..self.plan.jobs.min(self.plan.runs.len().max(1)) {
                s.spawn(worker);
            }
        });
    }

    fn stop_requested(&self) -> bool {
        self.opts.stop.as_ref().is_some_and(|s| s.requested().is_some())
    }

    /// Trains run `i`, recorded as running in `status.json` until its outcome replaces that.
    fn train(&self, i: usize, resume_from: Option<u64>) {
        let run = &self.plan.runs[i];
        let tag = self.tag(i);
        // Another process (`ember train`, `ember ablate --cell`) trains it now: leave it, its
        // logs and its record alone.
        if let Some(holder) = holder(&run.dir) {
            let o = outcome(
                run,
                RunAction::Refused,
                RunStatus::Failed {
                    error: format!(
                        "{} is being trained by another process ({holder}); left alone (re-run the \
                         sweep once it has finished)",
                        run.dir.display()
                    ),
                    stderr_tail: String::new(),
                },
                0.0,
            );
            say(self.opts.quiet, format!("{tag} {}", describe(&o)));
            self.lock().1[i] = Some(o);
            return;
        }
        say(
            self.opts.quiet,
            match resume_from {
                Some(step) => format!("{tag} resume   {} (from step {step})", run.name),
                None => format!("{tag} start    {}", run.name),
            },
        );
        {
            let mut guard = self.lock();
            guard.0.runs.insert(run.name.clone(), running_record(resume_from));
            let _ = write_json(&self.status_path, &guard.0);
        }
        let t0 = Instant::now();
        let st = execute(
            self.plan,
            run,
            &self.opts.runner,
            resume_from.is_some(),
            self.opts.stop.as_ref(),
        );
        let action = match resume_from {
            Some(from_step) => RunAction::Resumed { from_step },
            None => RunAction::Started,
        };
        let outcome = outcome(run, action, st, t0.elapsed().as_secs_f64());
        say(self.opts.quiet, format!("{tag} {}", describe(&outcome)));
        let mut guard = self.lock();
        record(&mut guard.0, &outcome, self.started);
        let _ = write_json(&self.status_path, &guard.0);
        guard.1[i] = Some(outcome);
    }

    /// Writes the invocation's wall time and returns the outcomes in plan order.
    fn finish(self) -> Result<Vec<RunOutcome>> {
        let (mut status, outcomes) = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(inv) = status.invocations.last_mut() {
            inv.wall_secs = self.started.elapsed().as_secs_f64();
        }
        write_json(&self.status_path, &status)?;
        Ok(outcomes.into_iter().flatten().collect())
    }
}
