//! `ember`: the command-line front end. Each subcommand parses its arguments and hands over to
//! the trainer crate; no training logic lives here.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ember_model::{sample, BeamConfig, Model, SampleConfig};
use ember_sacrebleu::{corpus_bleu, corpus_chrf, BleuConfig, ChrfConfig, Tokenize};
use ember_trainer::metrics::Verbosity;
use ember_trainer::translate::{score_split, translate_lines};
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
    /// Measure training throughput of a config.
    Bench(BenchArgs),
    /// Average the weights of a run's newest checkpoints into a new checkpoint.
    Average(AverageArgs),
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
}

/// A trained run to decode with, and how: the options `eval` and `translate` share.
#[derive(Args)]
struct DecodeArgs {
    /// A run directory (its newest checkpoint) or a checkpoint directory inside it.
    run: PathBuf,
    /// Beam size (1 = greedy).
    #[arg(long, default_value_t = 5)]
    beam: usize,
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

impl DecodeArgs {
    fn open(&self) -> Result<OpenRun> {
        open_run(&self.run, self.device.as_deref())
    }

    /// The run's evaluation decoder with these options.
    fn beam_config(&self, run: &OpenRun) -> BeamConfig {
        let mut beam = eval_beam(&run.cfg, self.beam);
        beam.length_penalty = self.length_penalty;
        beam.use_cache = !self.no_cache;
        beam
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
    #[arg(long, default_value_t = 500)]
    max_tokens: usize,
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
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AblateArgs {
    /// The base YAML config (its `ablation:` section gives defaults for the flags below).
    config: PathBuf,
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

#[derive(Args)]
struct ReportArgs {
    /// An `ember ablate` output directory.
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
    /// Timed steps (after the warm-up).
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
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
        Command::Bench(args) => bench(args),
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
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn train(args: TrainArgs) -> Result<()> {
    let cfg = RunConfig::load(&args.config, &args.set)?;
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
    };
    let summary = ember_trainer::train(cfg, &opts)?;
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

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.4}"))
}

fn eval(args: EvalArgs) -> Result<()> {
    let split: Split = args.split.parse()?;
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
        let beam = args.decode.beam_config(&run);
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

fn translate(args: TranslateArgs) -> Result<()> {
    let run = args.decode.open()?;
    let Model::Seq2seq(m) = &run.model else {
        bail!(
            "{} is a language model; use `ember generate`",
            args.decode.run.display()
        );
    };
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading source lines from stdin")?;
    let lines = split_lines(&text);
    let beam = args.decode.beam_config(&run);
    let out = translate_lines(m, &run.data.tokenizer, &lines, &beam, &run.device)?;
    let mut stdout = std::io::stdout().lock();
    for t in out {
        if args.json {
            writeln!(stdout, "{}", serde_json::to_string(&t)?)?;
        } else {
            writeln!(stdout, "{}", t.text)?;
        }
    }
    Ok(())
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
        max_new_tokens: args.max_tokens,
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
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let cfg = RunConfig::load(&args.config, &args.set)?;
    let r = ember_trainer::bench::bench(cfg, args.steps, args.warmup)?;
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
    let variants = args
        .variants
        .map(|v| v.iter().map(|s| parse_variant(s)).collect::<Result<Vec<_>>>())
        .transpose()
        .context("--variants")?;
    let opts = AblateOptions {
        config: args.config,
        overrides: args.set,
        variants,
        seeds: args.seeds,
        lrs: args.lrs,
        jobs: args.jobs,
        threads: args.threads,
        out: args.out,
        runner: Runner::Process {
            exe: std::env::current_exe().context("locating the ember executable")?,
        },
        quiet: args.quiet || args.json,
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
    let mut json = serde_json::Map::new();
    for metric in &args.metrics {
        match metric.as_str() {
            "bleu" => {
                let cfg = BleuConfig {
                    tokenize,
                    lowercase: args.lowercase,
                    ..BleuConfig::default()
                };
                let score = corpus_bleu(&hyps, &refs, &cfg)?;
                if args.json {
                    json.insert("bleu".into(), serde_json::to_value(&score)?);
                } else {
                    println!("{}", score.format());
                }
            }
            "chrf" => {
                let cfg = ChrfConfig {
                    lowercase: args.lowercase,
                    ..ChrfConfig::default()
                };
                let score = corpus_chrf(&hyps, &refs, &cfg)?;
                if args.json {
                    json.insert("chrf".into(), serde_json::to_value(&score)?);
                } else {
                    println!("{}", score.format());
                }
            }
            other => bail!("--metrics: unknown metric {other:?}; use bleu, chrf or bleu,chrf"),
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}
