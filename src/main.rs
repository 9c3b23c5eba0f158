//! `ember`: the command-line front end. Each subcommand parses its arguments and hands over to
//! the trainer crate; no training logic lives here.

mod ablate;
mod bleu;

use ember_trainer::{say, tell};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ember_distributed::World;
use ember_experiment::ablate::{PlanningInterrupted, SweepInterrupted};
use ember_experiment::shell::shell_word;
use ember_model::{sample, BeamConfig, Model, SampleConfig};
use ember_trainer::context::{evaluate_context, ContextEval, ContextOptions};
use ember_trainer::interrupt::{exit_status, Interrupted, OnRepeat, StopRequest};
use ember_trainer::metrics::Verbosity;
use ember_trainer::train::RankFailed;
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
    Bleu(bleu::BleuArgs),
    /// Run the QK-norm ablation grid (variants × seeds × learning rates) of a config.
    Ablate(ablate::AblateArgs),
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
    /// generation_config.json for transformers' AutoModelForCausalLM (Llama, Qwen2 or Qwen3).
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print as clap writes them; a usage error is bounded like every
        // other error (clap echoes the value it refused, however long).
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) if e.kind() == clap::error::ErrorKind::InvalidUtf8 => {
            tell!("error: {}", bounded(&not_utf8_argument()));
            return ExitCode::from(2);
        }
        Err(e) => {
            tell!("{}", bounded(e.render().to_string().trim_end()));
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = match cli.command {
        Command::Bleu(args) => bleu::run(args),
        Command::Train(args) => train(args),
        Command::Eval(args) => eval(args),
        Command::Translate(args) => translate(args),
        Command::Generate(args) => generate(args),
        Command::Ablate(args) => ablate::run(args),
        Command::Report(args) => report(args),
        Command::LengthReport(args) => length_report(args),
        Command::Bench(args) => bench(args),
        Command::Export(args) => export(args),
        Command::Tokenize(args) => tokenize(args),
        Command::Average(args) => ember_trainer::checkpoint::average(&args.run, args.last).map(|dir| {
            say!(
                "averaged the newest {} checkpoints into {}",
                args.last,
                dir.display()
            );
        }),
    };
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

fn train(args: TrainArgs) -> Result<()> {
    let (cfg, world) = load_and_join(&args.config, &args.set)?;
    // Installed once the config loads: from here on SIGINT/SIGTERM/SIGHUP/SIGUSR1 stop at a step boundary.
    let stop = install_stop_signals(OnRepeat::Abort)?;
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
        bail!("training diverged ({reason}); the run directory holds its checkpoints and summary.json");
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        say!(
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

/// An exit status whose reason was already printed (or is printed by another rank). Returned,
/// not `process::exit`ed, so that MPI shuts down cleanly on every rank first.
#[derive(Debug)]
struct QuietExit(u8);

impl std::fmt::Display for QuietExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for QuietExit {}

/// How a rank of a job ends. Rank 0 reports as a lone process does. An error the ranks agreed
/// on (a stop signal, a failed set-up) ends each rank quietly with the same status; any other
/// error happened on this rank alone, and the others would wait for it in their next
/// collective, so it ends the whole job (MPI_Abort) after saying which rank failed and why.
fn finish_rank(world: &World, result: Result<ember_trainer::Summary>, args: &TrainArgs) -> Result<()> {
    let rank = world.rank();
    match result {
        Ok(summary) => {
            if world.is_leader() {
                match &summary.diverged {
                    Some(reason) => tell!("error: training diverged ({reason}); the run directory holds its checkpoints and summary.json"),
                    None if args.json => say!("{}", serde_json::to_string_pretty(&summary)?),
                    None => say!(
                        "done: {} steps on {} ranks in {:.1}s | final train loss {} | val loss {} | {:.0} tok/s | weights {} on every rank | {}",
                        summary.steps,
                        world.size(),
                        summary.wall_secs,
                        fmt_opt(summary.final_train_loss),
                        fmt_opt(summary.val_loss),
                        summary.tokens_per_sec,
                        summary.weights_sha256.as_deref().map_or("?", |h| &h[..12]),
                        summary.run_dir.display()
                    ),
                }
            }
            if summary.diverged.is_some() {
                bail!(QuietExit(1));
            }
            Ok(())
        }
        Err(e) => {
            if let Some(stop) = e.downcast_ref::<Interrupted>() {
                if world.is_leader() {
                    tell!("{stop}\n{}", next_command(args, stop, "the same launcher line"));
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
    }
}

/// Loads a config and joins the job the launcher started (a world of one without one), before
/// anything else runs; rank 0 alone prints the config's warnings.
fn load_and_join(config: &Path, set: &[String]) -> Result<(RunConfig, Rc<World>)> {
    let cfg = RunConfig::load(config, set)?;
    let timeout = std::time::Duration::from_secs(cfg.distributed.timeout_secs);
    let world = Rc::new(World::from_launcher(timeout)?);
    if world.is_leader() {
        for warning in cfg.warnings() {
            tell!("warning: {warning}");
        }
    }
    Ok((cfg, world))
}

fn install_stop_signals(on_repeat: OnRepeat) -> Result<StopRequest> {
    ember_trainer::interrupt::install(on_repeat)
}

fn export(args: ExportArgs) -> Result<()> {
    let ExportFormat::Hf = args.format;
    // The export writes tokenizer.json, model.safetensors and config.json into OUT: inside the
    // run it would replace the run's own files (a checkpoint would fail its checksums).
    if let (Ok(out), Ok(run)) = (args.out.canonicalize(), args.run.canonicalize()) {
        let run_dir = ember_trainer::checkpoint::run_and_checkpoint(&run).map_or(run.clone(), |(r, _)| r);
        if out == run_dir || out.starts_with(run_dir.join(ember_trainer::checkpoint::CHECKPOINTS)) {
            bail!(
                "OUT {} is {} itself: the export's tokenizer.json, model.safetensors and config.json \
                 would replace the run's own files. Choose a new folder, e.g. {}. Nothing was written.",
                args.out.display(),
                if out == run_dir {
                    "the run directory"
                } else {
                    "inside the run's checkpoints"
                },
                run_dir
                    .with_file_name(format!(
                        "{}-hf",
                        run_dir
                            .file_name()
                            .map_or("export".into(), |n| n.to_string_lossy())
                    ))
                    .display()
            );
        }
    }
    if let Some(path) = &args.reference_logits {
        check_run_output(path, &args.run, "--reference-logits")?;
    }
    let source = ember_export::ExportSource::open(&args.run)?;
    let exported = ember_export::export_hf(&source, &args.out)?;
    if let Some(path) = &args.reference_logits {
        let text = args.reference_text.as_deref().unwrap_or(REFERENCE_TEXT);
        let reference = ember_export::reference_logits(&source, text)?;
        std::fs::write(path, serde_json::to_string(&reference)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&exported)?);
    } else {
        say!(
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
    // Before anything is read: the shard must not replace the text, the tokenizer or a device.
    ember_data::io::check_output(&args.output, &[&args.input, &path], "OUTPUT")?;
    let tokenizer = ember_data::Tokenizer::load(&path)?;
    let t = ember_data::shards::tokenize_file_counting(&tokenizer, &args.input, &args.output)?;
    if t.unknown > 0 {
        tell!(
            "warning: {} of the {} tokens ({:.2}%) are <unk>: characters of {} that {} does not \
             know, each written as the one unknown id",
            t.unknown,
            t.tokens,
            100.0 * t.unknown as f64 / t.tokens.max(1) as f64,
            args.input.display(),
            path.display()
        );
    }
    say!(
        "wrote {} tokens of {} to {} ({} tokenizer, vocabulary {})",
        t.tokens,
        args.input.display(),
        args.output.display(),
        path.display(),
        tokenizer.vocab_size()
    );
    Ok(())
}

/// The files of a run that Ember wrote (its config, tokenizer, token cache, metrics, summary,
/// events and lock, and every file of the checkpoint a command uses): an output path must be
/// none of them.
fn run_files(run: &Path) -> Vec<PathBuf> {
    let Ok((run_dir, ckpt)) = ember_trainer::checkpoint::run_and_checkpoint(run) else {
        return vec![];
    };
    let own = [
        ember_trainer::train::RUN_CONFIG,
        ember_data::TOKENIZER_FILE,
        ember_data::TOKEN_CACHE_FILE,
        ember_trainer::train::SUMMARY,
        ember_trainer::metrics::METRICS,
        ember_trainer::metrics::METRICS_CSV,
        ember_trainer::run_lock::LOCK_FILE,
    ];
    let top = std::fs::read_dir(&run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| own.contains(&n) || n.starts_with("events.out.tfevents"))
        });
    let checkpoint = std::fs::read_dir(&ckpt)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    top.chain(checkpoint).filter(|p| p.is_file()).collect()
}

/// Refuses an output file that is one of the run's own files (or a device, or a folder).
fn check_run_output(output: &Path, run: &Path, flag: &str) -> Result<()> {
    let files = run_files(run);
    let inputs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    Ok(ember_data::io::check_output(output, &inputs, flag)?)
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.4}"))
}

fn eval(args: EvalArgs) -> Result<()> {
    let split: Split = args.split.parse()?;
    if let Some(path) = &args.output {
        check_run_output(path, &args.decode.run, "--output")?;
    }
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
            say!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            say!("{}", context_lines(&run.checkpoint, &r).join("\n"));
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
        say!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        say!("{}", lines.join("\n"));
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
                tell!("stdin:{}: {reason}; its output line is left blank", i + 1);
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
    // The sampling flags, before the run is opened.
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!(
            "--temperature must be a number ≥ 0 (0 always takes the most probable token), got {}",
            args.temperature
        );
    }
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1 (leave it out to sample from every token)");
    }
    if let Some(p) = args.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        bail!("--top-p must be a probability in (0, 1] (leave it out to sample from every token), got {p}");
    }
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
    let unknown = prompt.iter().filter(|&&id| id == tok.unk_id()).count();
    if unknown > 0 {
        tell!(
            "warning: {unknown} of the {} tokens of --prompt are <unk> (characters this run's tokenizer \
             does not know); the model sees one unknown token for each",
            prompt.len()
        );
    }
    let cfg = SampleConfig {
        max_new_tokens: args.max_tokens as usize,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop_token: tok.special_tokens().eos,
        max_seq_len: Some(run.cfg.model.max_seq_len),
        sliding_window: true,
    };
    let tokens = sample(m, &prompt, &run.device, &cfg)?;
    let text = tok.decode(&tokens)?;
    if args.json {
        let out = serde_json::json!({"prompt": args.prompt, "text": text, "tokens": tokens.len(), "seed": args.seed});
        say!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        say!("{}{}", args.prompt, text);
    }
    Ok(())
}

fn bench(args: BenchArgs) -> Result<()> {
    let (cfg, world) = load_and_join(&args.config, &args.set)?;
    let r = ember_trainer::bench::bench(cfg, args.steps as usize, args.warmup as usize, world.clone())?;
    if !world.is_leader() {
        return Ok(());
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        say!(
            "{}: {} params, {}{} threads, {} shares, {:.0} tokens/step\n\
             step {:.1} ms median (p10 {:.1}, p90 {:.1}) = forward {:.1} + backward {:.1} + optimizer {:.1}{}\n\
             {:.0} tokens/s | peak RSS {:.0} MiB | {:.0} FLOPs/token → {:.1} GFLOP/s of a {:.1} GFLOP/s matmul peak ({:.0}%)",
            args.config.display(),
            r.params,
            if r.ranks > 1 { format!("{} ranks x ", r.ranks) } else { String::new() },
            r.threads,
            r.shares,
            r.tokens_per_step,
            r.ms_per_step_median,
            r.ms_per_step_p10,
            r.ms_per_step_p90,
            r.forward_ms,
            r.backward_ms,
            r.optimizer_ms,
            if r.ranks > 1 { format!(" (waiting for the slowest rank {:.1}, gradient all-reduce {:.1})", r.wait_ms, r.comm_ms) } else { String::new() },
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

fn length_report(args: ReportArgs) -> Result<()> {
    let r = ember_experiment::length::length_report(&args.dir)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        say!(
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
    for w in &r.warnings {
        tell!("warning: {w}");
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        say!(
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
