//! `ember`: the command-line front end. Each subcommand parses its arguments and hands over to
//! the trainer crate; no training logic lives here.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ember_experiment::ablate::SweepInterrupted;
use ember_experiment::slurm::shell_word;
use ember_model::{sample, BeamConfig, Model, SampleConfig};
use ember_sacrebleu::{corpus_bleu, corpus_chrf, BleuConfig, ChrfConfig, Tokenize};
use ember_trainer::context::{evaluate_context, ContextEval, ContextOptions};
use ember_trainer::interrupt::{exit_status, Interrupted, OnRepeat, StopRequest};
use ember_trainer::metrics::Verbosity;
use ember_trainer::translate::{score_split, translate_source_lines};
use ember_trainer::{eval_beam, evaluate, open_run, OpenRun, RunConfig, Split, TrainOptions};

#[derive(Parser)]
#[command(
    name = "ember",
    version,
    about = "Train small transformers on candle, and measure QK-norm."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model from a YAML config into a run directory.
    Train(TrainArgs),
    /// Compute loss/perplexity (and BLEU/chrF for translation) of a run on a data split.
    Eval(EvalArgs),
    /// Translate source lines from stdin to stdout with a trained seq2seq run.
    Translate(TranslateArgs),
    /// Sample text from a trained language-model run.
    Generate(GenerateArgs),
    /// Score a hypothesis file against references exactly as sacreBLEU 2.x does.
    Bleu(BleuArgs),
    /// Run the QK-norm ablation grid (variants × seeds × learning rates) of a config.
    Ablate(AblateArgs),
    /// Regenerate an ablation's report.md, report.json and plots from its run directories.
    Report(ReportArgs),
    /// Report a length-generalisation study (scripts/length-study.sh): loss by context and
    /// position, per QK-norm variant, with log-n scaling off and on.
    LengthReport(ReportArgs),
    /// Measure training throughput of a config.
    Bench(BenchArgs),
    /// Average the weights of a run's newest checkpoints into a new checkpoint.
    Average(AverageArgs),
    /// Export a trained language model for other tools (a Hugging Face transformers directory).
    Export(ExportArgs),
    /// Tokenise a text file into a llama2.c token shard (raw u16 ids) with a run's tokenizer.
    Tokenize(TokenizeArgs),
}

#[derive(Args)]
struct ExportArgs {
    /// A run directory (its newest checkpoint) or a checkpoint directory inside it.
    run: PathBuf,
    /// The directory to write (created if needed).
    out: PathBuf,
    /// hf: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
    /// generation_config.json for transformers' AutoModelForCausalLM (Llama or Qwen3).
    #[arg(long, value_enum, default_value_t = ExportFormat::Hf)]
    format: ExportFormat,
    /// Also write Ember's logits for --reference-text to this JSON file, for checking the
    /// export against transformers (scripts/check-hf-export.py).
    #[arg(long, value_name = "FILE")]
    reference_logits: Option<PathBuf>,
    /// The text of --reference-logits (truncated to model.max_seq_len tokens).
    #[arg(long, requires = "reference_logits")]
    reference_text: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    /// Hugging Face transformers.
    Hf,
}

/// The reference text when none is given: characters any English-trained tokenizer knows.
const REFERENCE_TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n";

#[derive(Args)]
struct TokenizeArgs {
    /// A run directory (its tokenizer.json) or a tokenizer.json file.
    tokenizer: PathBuf,
    /// The text file to tokenise (plain or gzip, UTF-8), encoded whole as `kind: text` does.
    input: PathBuf,
    /// The shard to write: little-endian u16 token ids, no header (llama2.c's .bin format).
    output: PathBuf,
}

#[derive(Args)]
struct AverageArgs {
    run: PathBuf,
    /// How many of the newest checkpoints to average.
    #[arg(long, default_value_t = 5)]
    last: usize,
}

#[derive(Args)]
struct TrainArgs {
    /// The YAML config.
    config: PathBuf,
    /// Override a config key, e.g. `--set train.lr=3e-3` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Where to write checkpoints and metrics (default: runs/<config name>).
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
}

/// A trained run to decode with, and how: the options `eval` and `translate` share.
#[derive(Args)]
struct DecodeArgs {
    /// A run directory (its newest checkpoint) or a checkpoint directory inside it.
    run: PathBuf,
    /// Beam size (1 = greedy; at most 1024).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=MAX_BEAM))]
    beam: u32,
    /// GNMT length penalty α.
    #[arg(long, default_value_t = 0.6)]
    length_penalty: f64,
    /// Decode without the KV cache (same output, slower: for timing the cache).
    #[arg(long)]
    no_cache: bool,
    /// Run on this device instead of the run's own: `cpu` or `cuda:N`.
    #[arg(long)]
    device: Option<String>,
}

/// `--beam` bound: the one `eval.beam` has (beam search keeps beam × vocabulary scores per
/// sentence; beyond a few dozen it stops helping, and a beam of 100,000 needs gigabytes).
const MAX_BEAM: i64 = ember_trainer::config::MAX_BEAM as i64;
/// `generate --max-tokens` bound: a million tokens is hours of sampling on a CPU, and the
/// output buffer is sized from it.
const MAX_GENERATE_TOKENS: u64 = 1_000_000;
/// `eval --context` bound: attention at N positions holds N² probabilities per head, so a
/// context of 65,536 is already gigabytes per window on a small model.
const MAX_CONTEXT: u64 = 65_536;
/// `bench --steps` / `--warmup` bound: a million steps is days of benchmarking.
const MAX_BENCH_STEPS: u64 = 1_000_000;

impl DecodeArgs {
    fn open(&self) -> Result<OpenRun> {
        open_run(&self.run, self.device.as_deref())
    }

    /// The run's evaluation decoder with these options.
    fn beam_config(&self, run: &OpenRun) -> Result<BeamConfig> {
        if !(self.length_penalty.is_finite() && self.length_penalty >= 0.0) {
            bail!(
                "--length-penalty must be a number ≥ 0 (0.6 is GNMT's α), got {}",
                self.length_penalty
            );
        }
        let mut beam = eval_beam(&run.cfg, self.beam as usize);
        beam.length_penalty = self.length_penalty;
        beam.use_cache = !self.no_cache;
        Ok(beam)
    }
}

// `eval` decodes only translation runs, and its help says so.
#[derive(Args)]
#[command(
    mut_arg("beam", |a| a.help("Translation: beam size for BLEU/chrF (1 = greedy)")),
    mut_arg("length_penalty", |a| a.help("Translation: GNMT length penalty α")),
    mut_arg("no_cache", |a| a.help(
        "Translation: decode without the KV cache (re-runs the decoder over the whole prefix at \
         every step; the same output, slower: for timing the cache)"
    )),
)]
struct EvalArgs {
    /// Which split to evaluate: valid or test.
    #[arg(long, default_value = "valid")]
    split: String,
    #[command(flatten)]
    decode: DecodeArgs,
    /// Translation: skip decoding (loss and perplexity only).
    #[arg(long)]
    no_bleu: bool,
    /// Translation: write the detokenised hypotheses to this file.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Language models: evaluate windows of N tokens of the validation split (past the training
    /// length too) and report loss and attention entropy by position.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_CONTEXT))]
    context: Option<u64>,
    /// With --context: log-n attention scaling on or off for this evaluation (default: as trained).
    #[arg(long, requires = "context", value_parser = ["on", "off"])]
    logn: Option<String>,
    /// With --context: at most this many windows (default: every whole window of the split).
    #[arg(long, requires = "context", value_parser = clap::value_parser!(u64).range(1..))]
    max_windows: Option<u64>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TranslateArgs {
    #[command(flatten)]
    decode: DecodeArgs,
    /// One JSON object per line (text, score, tokens) instead of plain text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GenerateArgs {
    /// A language-model run directory or one of its checkpoint directories.
    run: PathBuf,
    /// Text to continue (default: a newline, as nanoGPT's sampler starts).
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Most tokens to generate (at most 1,000,000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=MAX_GENERATE_TOKENS))]
    max_tokens: u64,
    /// 0 = always the most probable token.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    json: bool,
    /// Run on this device instead of the run's own: `cpu` or `cuda:N`.
    #[arg(long)]
    device: Option<String>,
}

#[derive(Args)]
struct BleuArgs {
    /// Reference file(s), one segment per line (repeat for multiple references).
    #[arg(short = 'r', long = "reference", required = true)]
    references: Vec<PathBuf>,
    /// Hypothesis file (default: standard input).
    #[arg(short = 'i', long = "input")]
    input: Option<PathBuf>,
    /// Metrics to compute: bleu, chrf, or both separated by commas.
    #[arg(short = 'm', long, default_value = "bleu", value_delimiter = ',')]
    metrics: Vec<String>,
    /// Tokenisation for BLEU: none, 13a or intl.
    #[arg(long, default_value = "13a")]
    tokenize: String,
    /// Case-insensitive scoring.
    #[arg(long)]
    lowercase: bool,
    /// The source side, one segment per line: also score the segments grouped by source length
    /// (whitespace-separated words) into the buckets of --length-buckets.
    #[arg(long)]
    source: Option<PathBuf>,
    /// With --source: the last length of every bucket but the open-ended last one.
    #[arg(long, requires = "source", value_delimiter = ',', default_value = "10,15,20")]
    length_buckets: Vec<usize>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(
    group(clap::ArgGroup::new("grid").multiple(true)
        .args(["set", "variants", "seeds", "lrs", "jobs", "threads", "out", "launcher"])),
    group(clap::ArgGroup::new("slurm").multiple(true)
        .args(["partition", "time", "cpus_per_task", "gpus_per_task", "max_parallel", "sbatch_args",
               "warning_secs", "submit"])),
)]
struct AblateArgs {
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
    /// Runs at a time, each a separate `ember train` process (default 1).
    #[arg(long)]
    jobs: Option<usize>,
    /// CPU threads per run (default: cores / jobs).
    #[arg(long)]
    threads: Option<usize>,
    /// Output directory (default: runs/<config name>-ablation).
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
enum Launcher {
    Local,
    Slurm,
}

#[derive(Args)]
struct ReportArgs {
    /// An `ember ablate` output directory (for length-report: a scripts/length-study.sh directory).
    dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    config: PathBuf,
    /// Override a config key, e.g. `--set train.threads=1` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Timed steps (after the warm-up; 1 to 1,000,000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_STEPS))]
    steps: u64,
    /// Untimed warm-up steps (at most 1,000,000).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=MAX_BENCH_STEPS))]
    warmup: u64,
    #[arg(long)]
    json: bool,
}

/// Keeps freed memory in the heap instead of handing it back to the kernel. glibc serves blocks
/// above its mmap threshold (at most 32 MiB) with fresh mappings and unmaps them on free, so
/// every training step faulted its logits and activations in again page by page: 9% of a
/// multi30k-tiny step went to page faults. Peak RSS is unchanged (the same bytes are live at the
/// peak); they are simply reused.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only adjusts allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bleu(args) => bleu(args),
        Command::Train(args) => train(args),
        Command::Eval(args) => eval(args),
        Command::Translate(args) => translate(args),
        Command::Generate(args) => generate(args),
        Command::Ablate(args) => ablate(args),
        Command::Report(args) => report(args),
        Command::LengthReport(args) => length_report(args),
        Command::Bench(args) => bench(args),
        Command::Export(args) => export(args),
        Command::Tokenize(args) => tokenize(args),
        Command::Average(args) => ember_trainer::checkpoint::average(&args.run, args.last).map(|dir| {
            println!(
                "averaged the newest {} checkpoints into {}",
                args.last,
                dir.display()
            );
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(stop) = e.downcast_ref::<Interrupted>() {
                // The outermost message only: it already says what the Interrupted below it says,
                // followed by the command that resumes the run.
                eprintln!("{e}");
                return ExitCode::from(exit_status(stop.signal));
            }
            if let Some(code) = e
                .downcast_ref::<SweepInterrupted>()
                .map(|s| exit_status(s.signal))
            {
                eprintln!("{e:#}");
                return ExitCode::from(code);
            }
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn train(args: TrainArgs) -> Result<()> {
    let cfg = RunConfig::load(&args.config, &args.set)?;
    for warning in cfg.warnings() {
        eprintln!("warning: {warning}");
    }
    // Installed once the config loads: from here on SIGINT/SIGTERM/SIGHUP/SIGUSR1 stop at a step boundary.
    let stop = install_stop_signals(OnRepeat::Abort)?;
    let run_dir = args.run_dir.unwrap_or_else(|| {
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
    };
    let summary = ember_trainer::train(cfg, &opts).map_err(|e| match e.downcast::<Interrupted>() {
        Ok(stop) => {
            let resume = format!(
                "ember train {} --run-dir {} --resume{}",
                shell_word(&args.config.display().to_string()),
                shell_word(&stop.run_dir.display().to_string()),
                args.set
                    .iter()
                    .map(|s| format!(" --set {}", shell_word(s)))
                    .collect::<String>()
            );
            let message = format!("{stop}\nresume with: {resume}");
            anyhow::Error::new(stop).context(message)
        }
        Err(e) => e,
    })?;
    if let Some(reason) = &summary.diverged {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        }
        bail!("training diverged ({reason}); the run directory holds its checkpoints and summary.json");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "done: {} steps in {:.1}s | final train loss {} | val loss {} | val ppl {} | {:.0} tok/s | {}",
            summary.steps,
            summary.wall_secs,
            fmt_opt(summary.final_train_loss),
            fmt_opt(summary.val_loss),
            fmt_opt(summary.val_ppl),
            summary.tokens_per_sec,
            summary.run_dir.display()
        );
    }
    Ok(())
}

fn install_stop_signals(on_repeat: OnRepeat) -> Result<StopRequest> {
    ember_trainer::interrupt::install(on_repeat)
}

fn export(args: ExportArgs) -> Result<()> {
    let ExportFormat::Hf = args.format;
    let source = ember_export::ExportSource::open(&args.run)?;
    let exported = ember_export::export_hf(&source, &args.out)?;
    if let Some(path) = &args.reference_logits {
        let text = args.reference_text.as_deref().unwrap_or(REFERENCE_TEXT);
        let reference = ember_export::reference_logits(&source, text)?;
        std::fs::write(path, serde_json::to_string(&reference)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&exported)?);
    } else {
        println!(
            "exported {} as {} ({} tensors, {} parameters) to {}",
            exported.checkpoint.display(),
            exported.arch.class_name(),
            exported.tensors,
            exported.params,
            exported.out.display()
        );
    }
    Ok(())
}

fn tokenize(args: TokenizeArgs) -> Result<()> {
    let path = if args.tokenizer.is_dir() {
        args.tokenizer.join(ember_data::TOKENIZER_FILE)
    } else {
        args.tokenizer.clone()
    };
    let tokenizer = ember_data::Tokenizer::load(&path)?;
    let n = ember_data::shards::tokenize_file(&tokenizer, &args.input, &args.output)?;
    println!(
        "wrote {n} tokens of {} to {} ({} tokenizer, vocabulary {})",
        args.input.display(),
        args.output.display(),
        path.display(),
        tokenizer.vocab_size()
    );
    Ok(())
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.4}"))
}

fn eval(args: EvalArgs) -> Result<()> {
    let split: Split = args.split.parse()?;
    if let Some(context) = args.context {
        if split != Split::Valid {
            bail!("--context evaluates the validation split (text corpora have no test split)");
        }
        let mut run = args.decode.open()?;
        let opts = ContextOptions {
            context: context as usize,
            logn: args.logn.as_deref().map(|v| v == "on"),
            max_windows: args.max_windows.map(|w| w as usize),
        };
        let r = evaluate_context(&mut run, opts)?;
        if args.json {
            let mut out = serde_json::to_value(&r)?;
            out["checkpoint"] = serde_json::to_value(&run.checkpoint)?;
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            println!("{}", context_lines(&run.checkpoint, &r).join("\n"));
        }
        return Ok(());
    }
    let run = args.decode.open()?;
    let r = evaluate(&run.model, &run.data, &run.cfg, split, &run.device)?;
    let mut out = serde_json::json!({
        "checkpoint": run.checkpoint,
        "split": args.split,
        "loss": r.loss,
        "ppl": r.ppl,
        "tokens": r.tokens,
    });
    let mut lines = vec![format!(
        "{} | {} | loss {:.4} | ppl {:.3} | {} tokens",
        run.checkpoint.display(),
        args.split,
        r.loss,
        r.ppl,
        r.tokens
    )];
    if let (Model::Seq2seq(m), Some(splits), false) =
        (&run.model, run.data.splits.translation(), args.no_bleu)
    {
        let pairs = match split {
            Split::Valid => &splits.valid,
            Split::Test => splits
                .test
                .as_ref()
                .context("this run's corpus has no test split")?,
        };
        let beam = args.decode.beam_config(&run)?;
        let scores = score_split(m, &run.data.tokenizer, pairs, &beam, None, &run.device)?;
        if let Some(path) = &args.output {
            std::fs::write(path, scores.hypotheses.join("\n") + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        lines.push(scores.bleu.format());
        lines.push(scores.chrf.format());
        lines.push(format!(
            "decoded {} sentences with beam {}{} in {:.1}s ({:.1} sentences/s)",
            scores.sentences,
            args.decode.beam,
            if args.decode.no_cache {
                ", without the KV cache,"
            } else {
                ""
            },
            scores.secs,
            scores.sentences as f64 / scores.secs.max(1e-9)
        ));
        out["bleu"] = serde_json::to_value(&scores.bleu)?;
        out["chrf"] = serde_json::to_value(&scores.chrf)?;
        out["beam"] = args.decode.beam.into();
        out["kv_cache"] = (!args.decode.no_cache).into();
        out["sentences_per_sec"] = (scores.sentences as f64 / scores.secs.max(1e-9)).into();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", lines.join("\n"));
    }
    Ok(())
}

/// `ember eval --context` as text: the headline, then a line per position bucket.
fn context_lines(checkpoint: &Path, r: &ContextEval) -> Vec<String> {
    let logn = match r.logn_length {
        Some(m) => format!("log-n scaling on (m = {m})"),
        None => "log-n scaling off".to_string(),
    };
    let beyond = if r.beyond_training {
        format!(
            "{:.1}x the training length {}: positions past it were never trained on",
            r.context as f64 / r.train_length as f64,
            r.train_length
        )
    } else {
        format!("within the training length {}", r.train_length)
    };
    let mut lines = vec![format!(
        "{} | valid | context {} ({beyond}) | {logn} | loss {:.4} | ppl {:.3} | {} windows, {} tokens",
        checkpoint.display(),
        r.context,
        r.loss,
        r.ppl,
        r.windows,
        r.tokens
    )];
    for b in &r.buckets {
        lines.push(format!(
            "  positions {:>5}..{:<5} loss {:.4}  attention entropy {:.3} nats",
            b.first, b.last, b.loss, b.entropy
        ));
    }
    lines
}

fn translate(args: TranslateArgs) -> Result<()> {
    let run = args.decode.open()?;
    let Model::Seq2seq(m) = &run.model else {
        bail!(
            "{} is a language model; use `ember generate`",
            args.decode.run.display()
        );
    };
    let beam = args.decode.beam_config(&run)?;
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading source lines from stdin")?;
    // Line by line, so that one line that is not UTF-8 costs that line only.
    let lines: Vec<Result<String, String>> = split_byte_lines(&bytes)
        .into_iter()
        .map(|l| {
            String::from_utf8(l.to_vec()).map_err(|e| {
                format!(
                    "not valid UTF-8 (byte {} of the line); re-encode the input as UTF-8",
                    e.utf8_error().valid_up_to() + 1
                )
            })
        })
        .collect();
    let out = translate_source_lines(
        m,
        &run.data.tokenizer,
        &lines,
        run.cfg.model.max_seq_len,
        &beam,
        &run.device,
    )?;
    let mut stdout = std::io::stdout().lock();
    let mut failed = vec![];
    for (i, t) in out.iter().enumerate() {
        match t {
            Ok(t) if args.json => writeln!(stdout, "{}", serde_json::to_string(t)?)?,
            Ok(t) => writeln!(stdout, "{}", t.text)?,
            Err(reason) => {
                eprintln!("stdin:{}: {reason}; its output line is left blank", i + 1);
                failed.push(i + 1);
                if args.json {
                    let line = serde_json::json!({"line": i + 1, "error": reason});
                    writeln!(stdout, "{line}")?;
                } else {
                    writeln!(stdout)?;
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} lines could not be translated (line{} {}); their output lines are blank and \
             every other line was translated",
            failed.len(),
            out.len(),
            if failed.len() == 1 { "" } else { "s" },
            failed
                .iter()
                .take(20)
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Lines of raw input as `split_lines` cuts text: on '\n', a trailing newline ends the last
/// line rather than starting an empty one, and a '\r' before the '\n' is dropped.
fn split_byte_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return vec![];
    }
    body.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect()
}

fn generate(args: GenerateArgs) -> Result<()> {
    let run = open_run(&args.run, args.device.as_deref())?;
    let Model::Lm(m) = &run.model else {
        bail!(
            "{} is a translation model; use `ember translate`",
            args.run.display()
        );
    };
    let tok = &run.data.tokenizer;
    let prompt = tok.encode(&args.prompt)?;
    if prompt.is_empty() {
        bail!("--prompt encodes to no tokens; give at least one character the tokenizer knows");
    }
    let cfg = SampleConfig {
        max_new_tokens: args.max_tokens as usize,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop_token: Some(tok.eos_id()),
        max_seq_len: Some(run.cfg.model.max_seq_len),
        sliding_window: true,
    };
    let tokens = sample(m, &prompt, &run.device, &cfg)?;
    let text = tok.decode(&tokens)?;
    if args.json {
        let out = serde_json::json!({"prompt": args.prompt, "text": text, "tokens": tokens.len(), "seed": args.seed});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}{}", args.prompt, text);
    }
    Ok(())
}

fn bench(args: BenchArgs) -> Result<()> {
    let cfg = RunConfig::load(&args.config, &args.set)?;
    for warning in cfg.warnings() {
        eprintln!("warning: {warning}");
    }
    let r = ember_trainer::bench::bench(cfg, args.steps as usize, args.warmup as usize)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}: {} params, {} threads, {:.0} tokens/step\n\
             step {:.1} ms median (p10 {:.1}, p90 {:.1}) = forward {:.1} + backward {:.1} + optimizer {:.1}\n\
             {:.0} tokens/s | peak RSS {:.0} MiB | {:.0} FLOPs/token → {:.1} GFLOP/s of a {:.1} GFLOP/s matmul peak ({:.0}%)",
            args.config.display(),
            r.params,
            r.threads,
            r.tokens_per_step,
            r.ms_per_step_median,
            r.ms_per_step_p10,
            r.ms_per_step_p90,
            r.forward_ms,
            r.backward_ms,
            r.optimizer_ms,
            r.tokens_per_sec,
            r.peak_rss_mib,
            r.flops_per_token,
            r.achieved_gflops,
            r.matmul_peak_gflops,
            100.0 * r.utilisation
        );
    }
    Ok(())
}

fn ablate(args: AblateArgs) -> Result<()> {
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
        jobs: args.jobs,
        threads: args.threads,
        out: args.out.clone(),
        runner: Runner::Process {
            exe: std::env::current_exe().context("locating the ember executable")?,
        },
        quiet: args.quiet || args.json,
        stop: None,
    };
    if args.launcher == Launcher::Slurm {
        return ablate_slurm(&args, &opts);
    }
    // Each signal is passed on to the running children, which stop with a checkpoint.
    let opts = AblateOptions {
        stop: Some(install_stop_signals(OnRepeat::Count)?),
        ..opts
    };
    let outcome = ember_experiment::ablate::ablate(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
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
    let stop = install_stop_signals(OnRepeat::Count)?;
    let outcome = ablate_cell(&args.config, cell, &runner, Some(&stop), args.quiet || args.json)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
    } else {
        println!("{}", status_table(&cells));
    }
    Ok(())
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
    let sp = prepare(opts, &slurm, &exe)?;
    let out = shell_word(&sp.plan.out.display().to_string());
    let total = sp.plan.runs.len();
    if sp.cells.is_empty() {
        println!(
            "every one of the {total} cells in {out} is finished: nothing to submit; `ember report {out}` \
             writes the report"
        );
        return Ok(());
    }
    let quiet = args.quiet || args.json;
    if !quiet {
        println!(
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
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "out": sp.plan.out, "array": sp.array, "cells_script": sp.cells_script,
                    "report_script": sp.report_script, "commands": sp.commands(),
                }))?
            );
        } else {
            println!("submit with (on a Slurm login node, from this directory):");
            for c in sp.commands() {
                println!("  {c}");
            }
        }
        return Ok(());
    }
    let ids = submit(&sp)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "out": sp.plan.out, "array": sp.array, "array_job": ids.array_job, "report_job": ids.report_job,
            }))?
        );
    } else {
        println!(
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

fn length_report(args: ReportArgs) -> Result<()> {
    let r = ember_experiment::length::length_report(&args.dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} variants x {} seeds x log-n off/on at contexts {:?} (trained at {}): wrote {}, {} and {} plots",
            r.variants.len(),
            r.seeds.len(),
            r.contexts,
            r.train_length,
            args.dir.join("report.md").display(),
            args.dir.join("report.json").display(),
            r.plots.len() / 2
        );
    }
    Ok(())
}

fn report(args: ReportArgs) -> Result<()> {
    let r = ember_experiment::report::report(&args.dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} runs ({} finished, {} diverged, {} failed): wrote {}, {} and {} plots",
            r.counts.runs,
            r.counts.ok,
            r.counts.diverged,
            r.counts.failed,
            args.dir.join(ember_experiment::layout::REPORT_MD).display(),
            args.dir.join(ember_experiment::layout::REPORT_JSON).display(),
            r.plots.len() / 2
        );
    }
    Ok(())
}

/// Segments whose source has `first..=last` words (`last` = `None`: no upper bound).
struct LengthBucket {
    first: usize,
    last: Option<usize>,
    rows: Vec<usize>,
}

impl LengthBucket {
    fn label(&self) -> String {
        match self.last {
            Some(last) => format!("{}-{last}", self.first),
            None => format!("{}+", self.first),
        }
    }
}

/// The segments of each source-length bucket; `ends` are the buckets' last lengths, ascending.
fn source_length_buckets(
    sources: &[String],
    path: &Path,
    segments: usize,
    ends: &[usize],
) -> Result<Vec<LengthBucket>> {
    if sources.len() != segments {
        bail!(
            "--source {} has {} lines but the hypothesis has {segments}; they must be line-aligned",
            path.display(),
            sources.len()
        );
    }
    if ends.is_empty() || ends[0] == 0 || ends.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--length-buckets must be ascending word counts above 0, e.g. 10,15,20; got {ends:?}");
    }
    let mut buckets: Vec<LengthBucket> = std::iter::once(0)
        .chain(ends.iter().map(|e| e + 1))
        .zip(ends.iter().map(|&e| Some(e)).chain([None]))
        .map(|(first, last)| LengthBucket {
            first,
            last,
            rows: Vec::new(),
        })
        .collect();
    for (i, line) in sources.iter().enumerate() {
        let words = line.split_whitespace().count();
        let b = ends.iter().position(|&e| words <= e).unwrap_or(ends.len());
        buckets[b].rows.push(i);
    }
    buckets.retain(|b| !b.rows.is_empty());
    Ok(buckets)
}

fn read_lines(path: &PathBuf) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(split_lines(&text))
}

/// Lines as sacreBLEU reads them: split on '\n', a trailing newline does not make an empty segment.
fn split_lines(text: &str) -> Vec<String> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    if text.is_empty() {
        return vec![];
    }
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l).to_string())
        .collect()
}

fn bleu(args: BleuArgs) -> Result<()> {
    let hyps = match &args.input {
        Some(path) => read_lines(path)?,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the hypothesis from stdin")?;
            split_lines(&text)
        }
    };
    let refs = args
        .references
        .iter()
        .map(read_lines)
        .collect::<Result<Vec<_>>>()?;
    let tokenize: Tokenize = args
        .tokenize
        .parse()
        .map_err(|e| anyhow::anyhow!("--tokenize: {e}"))?;
    // Every metric is checked before any is computed: a typo must not print half the output.
    if let Some(bad) = args
        .metrics
        .iter()
        .find(|m| !["bleu", "chrf"].contains(&m.as_str()))
    {
        bail!("--metrics: unknown metric {bad:?}; use bleu, chrf or bleu,chrf");
    }
    let buckets = match &args.source {
        Some(path) => source_length_buckets(&read_lines(path)?, path, hyps.len(), &args.length_buckets)?,
        None => Vec::new(),
    };
    let mut json = serde_json::Map::new();
    for metric in &args.metrics {
        // The whole corpus, then each source-length bucket.
        let score = |hyps: &[String], refs: &[Vec<String>]| -> Result<(String, serde_json::Value)> {
            Ok(match metric.as_str() {
                "bleu" => {
                    let cfg = BleuConfig {
                        tokenize,
                        lowercase: args.lowercase,
                        ..BleuConfig::default()
                    };
                    let score = corpus_bleu(hyps, refs, &cfg)?;
                    (score.format(), serde_json::to_value(&score)?)
                }
                "chrf" => {
                    let cfg = ChrfConfig {
                        lowercase: args.lowercase,
                        ..ChrfConfig::default()
                    };
                    let score = corpus_chrf(hyps, refs, &cfg)?;
                    (score.format(), serde_json::to_value(&score)?)
                }
                other => bail!("--metrics: unknown metric {other:?}; use bleu, chrf or bleu,chrf"),
            })
        };
        let (line, value) = score(&hyps, &refs)?;
        let mut by_length = Vec::new();
        for b in &buckets {
            let pick = |lines: &[String]| b.rows.iter().map(|&i| lines[i].clone()).collect::<Vec<_>>();
            let sub_refs: Vec<Vec<String>> = refs.iter().map(|r| pick(r)).collect();
            let (sub_line, sub_value) = score(&pick(&hyps), &sub_refs)?;
            by_length.push((b, sub_line, sub_value));
        }
        if args.json {
            json.insert(metric.clone(), value);
            if !buckets.is_empty() {
                let rows: Vec<serde_json::Value> = by_length
                    .into_iter()
                    .map(|(b, _, v)| {
                        serde_json::json!({
                            "first": b.first, "last": b.last, "sentences": b.rows.len(), "score": v,
                        })
                    })
                    .collect();
                json.insert(format!("{metric}_by_source_length"), rows.into());
            }
        } else {
            println!("{line}");
            for (b, sub_line, _) in by_length {
                println!(
                    "  source words {}: {} sentences | {sub_line}",
                    b.label(),
                    b.rows.len()
                );
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}
