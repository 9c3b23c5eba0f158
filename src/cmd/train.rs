//! `ember train`: trains a model from a YAML config into a run directory, alone or as one rank
//! of a data-parallel job, and says how to resume it after a stop.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use ember_distributed::World;
use ember_experiment::shell::shell_word;
use ember_trainer::interrupt::{Interrupted, OnRepeat};
use ember_trainer::metrics::Verbosity;
use ember_trainer::{say, tell, Summary, TrainOptions};

use super::{load_and_join, print_result};
use crate::exit::{end_rank, QuietExit};

#[derive(Args)]
pub(crate) struct TrainArgs {
    /// The YAML config.
    config: PathBuf,
    /// Override a config key, e.g. `--set train.lr=3e-3` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Where to write checkpoints and metrics (default: `runs/<config name>`).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Continue from the latest complete checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
    /// Print only errors and the final summary.
    #[arg(long)]
    quiet: bool,
    /// With --resume: if the newest checkpoint is corrupt, continue from the newest intact one.
    #[arg(long, requires = "resume")]
    fallback: bool,
    /// Print the final summary as JSON.
    #[arg(long)]
    json: bool,
    /// With --resume: continue although the data differs from what the checkpoint was trained on.
    #[arg(long, requires = "resume")]
    allow_data_change: bool,
    /// With --resume: continue although tokenizer.json differs from the checkpoint's (or train a
    /// new one if it is missing).
    #[arg(long, requires = "resume")]
    allow_tokenizer_change: bool,
    /// With --resume: continue although train.precision differs from the checkpoint's.
    #[arg(long, requires = "resume")]
    allow_precision_change: bool,
}

pub(crate) fn run(args: TrainArgs) -> Result<()> {
    let (cfg, world) = load_and_join(&args.config, &args.set)?;
    // Installed once the config loads: from here on SIGINT/SIGTERM/SIGHUP/SIGUSR1 stop at a step boundary.
    let stop = ember_trainer::interrupt::install(OnRepeat::Abort)?;
    let run_dir = args.run_dir.clone().unwrap_or_else(|| {
        let stem = args
            .config
            .file_stem()
            .map_or("run".into(), |s| s.to_string_lossy().to_string());
        PathBuf::from("runs").join(stem)
    });
    let opts = TrainOptions {
        run_dir,
        resume: args.resume,
        fallback: args.fallback,
        verbosity: if args.quiet || args.json {
            Verbosity::Quiet
        } else {
            Verbosity::Normal
        },
        stop_after: None,
        stop: Some(stop),
        allow_data_change: args.allow_data_change,
        allow_tokenizer_change: args.allow_tokenizer_change,
        allow_precision_change: args.allow_precision_change,
        world: world.clone(),
    };
    let result = ember_trainer::train(cfg, &opts);
    if world.size() > 1 {
        return finish_rank(&world, result, &args);
    }
    let summary = result.map_err(|e| match e.downcast::<Interrupted>() {
        Ok(stop) => {
            let message = format!("{stop}\n{}", next_command(&args, &stop, ""));
            anyhow::Error::new(stop).context(message)
        }
        Err(e) => e,
    })?;
    if let Some(reason) = &summary.diverged {
        if args.json {
            say!("{}", serde_json::to_string_pretty(&summary)?);
        }
        bail!(diverged(reason));
    }
    print_result(args.json, &summary, || done_line(&summary, 1))
}

/// How a rank of a job ends: rank 0 reports as a lone process does, and an error ends the rank
/// as [`end_rank`] says.
fn finish_rank(world: &World, result: Result<Summary>, args: &TrainArgs) -> Result<()> {
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => {
            return end_rank(world, e, |stop| {
                format!("{stop}\n{}", next_command(args, stop, "the same launcher line"))
            })
        }
    };
    if world.is_leader() {
        match &summary.diverged {
            Some(reason) => tell!("error: {}", diverged(reason)),
            None => print_result(args.json, &summary, || done_line(&summary, world.size()))?,
        }
    }
    if summary.diverged.is_some() {
        bail!(QuietExit(1));
    }
    Ok(())
}

/// The error of a run that diverged (a result of its own: it ends with exit status 1).
fn diverged(reason: &str) -> String {
    format!("training diverged ({reason}); the run directory holds its checkpoints and summary.json")
}

/// The line a finished training prints. A lone process gives the validation perplexity; a job
/// of several ranks gives their number instead, and the start of the weights' hash, which every
/// rank checked it holds.
fn done_line(summary: &Summary, ranks: usize) -> String {
    if ranks == 1 {
        format!(
            "done: {} steps in {:.1}s | final train loss {} | val loss {} | val ppl {} | {:.0} tok/s | {}",
            summary.steps,
            summary.wall_secs,
            fmt_opt(summary.final_train_loss),
            fmt_opt(summary.val_loss),
            fmt_opt(summary.val_ppl),
            summary.tokens_per_sec,
            summary.run_dir.display()
        )
    } else {
        format!(
            "done: {} steps on {ranks} ranks in {:.1}s | final train loss {} | val loss {} | {:.0} tok/s | weights {} on every rank | {}",
            summary.steps,
            summary.wall_secs,
            fmt_opt(summary.final_train_loss),
            fmt_opt(summary.val_loss),
            summary.tokens_per_sec,
            summary.weights_sha256.as_deref().map_or("?", |h| &h[..12]),
            summary.run_dir.display()
        )
    }
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.4}"))
}

/// What to run after a stop: the command that resumes the run when a checkpoint holds it (a
/// job is resumed by the same launcher line), else the one that starts it over (`--resume`
/// would find nothing to resume).
fn next_command(args: &TrainArgs, stop: &Interrupted, launcher: &str) -> String {
    let command = |resume: &str| {
        format!(
            "ember train {} --run-dir {}{resume}{}",
            shell_word(&args.config.display().to_string()),
            shell_word(&stop.run_dir.display().to_string()),
            args.set
                .iter()
                .map(|s| format!(" --set {}", shell_word(s)))
                .collect::<String>()
        )
    };
    match (&stop.checkpoint, launcher.is_empty()) {
        (Some(_), true) => format!("resume with: {}", command(" --resume")),
        (Some(_), false) => format!("resume with {launcher}, ending in: {}", command(" --resume")),
        (None, true) => format!("to start it over, run: {}", command("")),
        (None, false) => format!("to start it over, run {launcher}, ending in: {}", command("")),
    }
}
