//! `ember ablate`: plans the QK-norm sweep of a config and trains its cells — as child processes
//! here, one cell (`--cell`, what each Slurm array task runs), or as a Slurm job array — and
//! `--status` of a planned sweep. The sweep itself lives in the experiment crate.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ember_experiment::shell::shell_word;
use ember_trainer::interrupt::{self, OnRepeat};
use ember_trainer::say;

use super::print_result;

#[derive(Args)]
#[command(
    group(clap::ArgGroup::new("grid").multiple(true)
        .args(["set", "variants", "seeds", "lrs", "grid_axes", "jobs", "threads", "out", "launcher"])),
    group(clap::ArgGroup::new("slurm").multiple(true)
        .args(["partition", "time", "cpus_per_task", "gpus_per_task", "max_parallel", "sbatch_args",
               "warning_secs", "submit"])),
)]
pub(crate) struct AblateArgs {
    /// The base YAML config (its `ablation:` section gives defaults for the flags below); with
    /// --cell or --status, the output directory of a planned sweep.
    config: PathBuf,
    /// Train only this cell of the sweep planned in the directory given (its number in
    /// grid.json, or its run name), resuming it from a checkpoint if it has one: what each task
    /// of a Slurm job array runs.
    #[arg(long, value_name = "I", conflicts_with_all = ["grid", "slurm", "status"])]
    cell: Option<String>,
    /// Show which cells of the sweep planned in the directory given are done, running,
    /// interrupted, failed or pending.
    #[arg(long, conflicts_with_all = ["grid", "slurm"])]
    status: bool,
    /// Where the runs go: `local` (child processes on this machine) or `slurm` (a job array
    /// with one task per cell, and a report job after it).
    #[arg(long, value_enum, default_value_t = Launcher::Local)]
    launcher: Launcher,
    /// Slurm: the partition of both jobs.
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    partition: Option<String>,
    /// Slurm: the time limit of each cell, e.g. 2:00:00 (the cell is warned, saves a checkpoint
    /// and is requeued before it).
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    time: Option<String>,
    /// Slurm: CPUs per cell; each run trains with as many threads (default 1).
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    cpus_per_task: Option<usize>,
    /// Slurm: GPUs per cell.
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    gpus_per_task: Option<usize>,
    /// Slurm: cells running at once (default: no limit).
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    max_parallel: Option<usize>,
    /// Slurm: one more sbatch option for both jobs, e.g. --sbatch-arg=--account=proj (repeatable).
    #[arg(
        long = "sbatch-arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        help_heading = "Slurm (--launcher slurm)"
    )]
    sbatch_args: Vec<String>,
    /// Slurm: seconds before the time limit at which a cell is told to checkpoint and requeue
    /// (default 120; longer than a step and a checkpoint take).
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    warning_secs: Option<u64>,
    /// Slurm: submit the jobs with sbatch (without it, the commands are printed).
    #[arg(long, help_heading = "Slurm (--launcher slurm)")]
    submit: bool,
    /// Override a config key for every run, e.g. `--set train.steps=2000` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// QK-norm variants, comma-separated: none,layernorm,rmsnorm,l2 (default: all four).
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// Seeds per cell: seeds 1..=N (default 3).
    #[arg(long)]
    seeds: Option<usize>,
    /// Peak learning rates, comma-separated, e.g. 1e-3,3e-3,1e-2 (default: train.lr).
    #[arg(long, value_delimiter = ',')]
    lrs: Option<Vec<f64>>,
    /// A factorial axis: a config key and its values, e.g. `--grid model.positions=rope,learned`
    /// (repeatable; every combination is crossed with the variants, learning rates and seeds,
    /// and the report gives the QK-norm effect per level). Replaces the config's `ablation.grid`.
    #[arg(long = "grid", value_name = "KEY=V1,V2")]
    grid_axes: Vec<String>,
    /// Runs at a time, each a separate `ember train` process (default 1).
    #[arg(long)]
    jobs: Option<usize>,
    /// CPU threads per run (default: cores / jobs).
    #[arg(long)]
    threads: Option<usize>,
    /// Output directory (default: `runs/<config name>-ablation`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print only errors.
    #[arg(long)]
    quiet: bool,
    /// Print the outcome (every run and the report) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Launcher {
    Local,
    Slurm,
}

pub(crate) fn run(args: AblateArgs) -> Result<()> {
    use ember_experiment::ablate::{parse_variant, AblateOptions, Runner};
    if let Some(cell) = &args.cell {
        return ablate_cell(&args, cell);
    }
    if args.status {
        return ablate_status(&args);
    }
    let slurm_flag_given = args.partition.is_some()
        || args.time.is_some()
        || args.cpus_per_task.is_some()
        || args.gpus_per_task.is_some()
        || args.max_parallel.is_some()
        || !args.sbatch_args.is_empty()
        || args.warning_secs.is_some()
        || args.submit;
    if args.launcher == Launcher::Local && slurm_flag_given {
        bail!(
            "--partition, --time, --cpus-per-task, --gpus-per-task, --max-parallel, --sbatch-arg, \
             --warning-secs and --submit are for a Slurm sweep: add --launcher slurm"
        );
    }
    if args.launcher == Launcher::Slurm && (args.jobs.is_some() || args.threads.is_some()) {
        bail!(
            "--jobs and --threads are for a local sweep; on Slurm, --max-parallel limits the cells \
             running at once and --cpus-per-task sets each one's threads"
        );
    }
    let variants = args
        .variants
        .as_ref()
        .map(|v| v.iter().map(|s| parse_variant(s)).collect::<Result<Vec<_>>>())
        .transpose()
        .context("--variants")?;
    let opts = AblateOptions {
        config: args.config.clone(),
        overrides: args.set.clone(),
        variants,
        seeds: args.seeds,
        lrs: args.lrs.clone(),
        grid: (!args.grid_axes.is_empty()).then(|| args.grid_axes.clone()),
        jobs: args.jobs,
        threads: args.threads,
        out: args.out.clone(),
        runner: Runner::Process {
            exe: std::env::current_exe().context("locating the ember executable")?,
        },
        quiet: args.quiet || args.json,
        // Planning checks it between steps; a local sweep passes each signal on to its running
        // children, which stop with a checkpoint.
        stop: Some(interrupt::install(OnRepeat::Count)?),
    };
    if args.launcher == Launcher::Slurm {
        return ablate_slurm(&args, &opts);
    }
    let outcome = ember_experiment::ablate::ablate(&opts)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&outcome)?);
    }
    let failed = outcome.failed();
    if !failed.is_empty() {
        bail!(
            "{} of {} runs failed ({}); their errors are in {} and each run directory's ablate-stderr.log. \
             Re-running the same command retries them and skips the finished runs.",
            failed.len(),
            outcome.runs.len(),
            failed
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            outcome
                .plan
                .out
                .join(ember_experiment::layout::REPORT_MD)
                .display()
        );
    }
    Ok(())
}

/// `ember ablate DIR --cell I`: one cell of a planned sweep (a Slurm array task).
fn ablate_cell(args: &AblateArgs, cell: &str) -> Result<()> {
    use ember_experiment::ablate::{ablate_cell, RunStatus, Runner};
    let runner = Runner::Process {
        exe: std::env::current_exe().context("locating the ember executable")?,
    };
    // Each stop signal (Slurm's USR1 warning included) goes on to `ember train`, which stops
    // with a checkpoint; the cell then ends in SweepInterrupted, exit status 128 + signal.
    let stop = interrupt::install(OnRepeat::Count)?;
    stop.set_phase("passing it on to the cell's run, which stops after its current step with a checkpoint");
    let outcome = ablate_cell(&args.config, cell, &runner, Some(&stop), args.quiet || args.json)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&outcome)?);
    }
    if let RunStatus::Failed { error, .. } = &outcome.status {
        bail!(
            "cell {cell} ({}) failed: {error}; status.json records it, {} holds its output, and \
             `ember ablate {} --cell {cell}` retries it",
            outcome.name,
            outcome
                .run_dir
                .join(ember_experiment::layout::STDERR_LOG)
                .display(),
            shell_word(&args.config.display().to_string())
        );
    }
    Ok(())
}

/// `ember ablate DIR --status`.
fn ablate_status(args: &AblateArgs) -> Result<()> {
    use ember_experiment::ablate::{status_table, sweep_status};
    let cells = sweep_status(&args.config)?;
    print_result(args.json, &cells, || status_table(&cells))
}

/// `ember ablate CONFIG --launcher slurm [--submit]`.
fn ablate_slurm(args: &AblateArgs, opts: &ember_experiment::ablate::AblateOptions) -> Result<()> {
    use ember_experiment::slurm::{prepare, submit, SlurmOptions};
    let slurm = SlurmOptions {
        partition: args.partition.clone(),
        time: args.time.clone(),
        cpus_per_task: args.cpus_per_task,
        gpus_per_task: args.gpus_per_task,
        max_parallel: args.max_parallel,
        sbatch_args: args.sbatch_args.clone(),
        warning_secs: args.warning_secs,
    };
    let exe = std::env::current_exe().context("locating the ember executable")?;
    if let Some(stop) = &opts.stop {
        stop.set_phase("stopping the planning of the sweep (nothing has been written yet)");
    }
    let sp = prepare(opts, &slurm, &exe)?;
    let out = shell_word(&sp.plan.out.display().to_string());
    let total = sp.plan.runs.len();
    if sp.cells.is_empty() {
        say!(
            "every one of the {total} cells in {out} is finished: nothing to submit; `ember report {out}` \
             writes the report"
        );
        return Ok(());
    }
    let quiet = args.quiet || args.json;
    if !quiet {
        say!(
            "planned {total} cells into {} ({} to run, {} finished earlier); wrote {} and {}",
            sp.plan.out.join(ember_experiment::layout::GRID).display(),
            sp.cells.len(),
            total - sp.cells.len(),
            sp.cells_script.display(),
            sp.report_script.display()
        );
    }
    if !args.submit {
        if args.json {
            say!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "out": sp.plan.out, "array": sp.array, "cells_script": sp.cells_script,
                    "report_script": sp.report_script, "commands": sp.commands(),
                }))?
            );
        } else {
            say!("submit with (on a Slurm login node, from this directory):");
            for c in sp.commands() {
                say!("  {c}");
            }
        }
        return Ok(());
    }
    let ids = submit(&sp)?;
    if args.json {
        say!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "out": sp.plan.out, "array": sp.array, "array_job": ids.array_job, "report_job": ids.report_job,
            }))?
        );
    } else {
        say!(
            "submitted the array as job {} (cells {}) and the report as job {} (after the array ends)\n\
             watch:   squeue -j {},{}\n\
             cells:   ember ablate {out} --status\n\
             logs:    {}/\n\
             report:  {}/report.md once job {} ends (or `ember report {out}` any time)",
            ids.array_job,
            sp.array,
            ids.report_job,
            ids.array_job,
            ids.report_job,
            sp.plan
                .out
                .join(ember_experiment::slurm::SLURM_DIR)
                .join(ember_experiment::slurm::LOGS)
                .display(),
            sp.plan.out.display(),
            ids.report_job
        );
    }
    Ok(())
}
