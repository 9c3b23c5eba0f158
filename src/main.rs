//! `ember`: the command-line front end. It parses the arguments and hands each command to its
//! module in [`cmd`]; [`exit`] turns the result into the exit status. No training logic lives
//! here: the commands hand over to the trainer and experiment crates.

mod cmd;
mod exit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Train(cmd::train::TrainArgs),
    /// Compute loss/perplexity (and BLEU/chrF for translation) of a run on a data split.
    Eval(cmd::eval::EvalArgs),
    /// Translate source lines from stdin to stdout with a trained seq2seq run.
    Translate(cmd::translate::TranslateArgs),
    /// Sample text from a trained language-model run.
    Generate(cmd::generate::GenerateArgs),
    /// Score a hypothesis file against references exactly as sacreBLEU 2.x does.
    Bleu(cmd::bleu::BleuArgs),
    /// Run the QK-norm ablation grid (variants × seeds × learning rates) of a config.
    Ablate(cmd::ablate::AblateArgs),
    /// Regenerate an ablation's report.md, report.json and plots from its run directories.
    Report(cmd::report::ReportArgs),
    /// Report a length-generalisation study (scripts/length-study.sh): loss by context and
    /// position, per QK-norm variant, with log-n scaling off and on.
    LengthReport(cmd::report::ReportArgs),
    /// Measure training throughput of a config.
    Bench(cmd::bench::BenchArgs),
    /// Average the weights of a run's newest checkpoints into a new checkpoint.
    Average(cmd::average::AverageArgs),
    /// Write a model folder (weights, tokenizer, config) that translate, generate and eval open
    /// in place of a run.
    Package(cmd::package::PackageArgs),
    /// Export a trained language model for other tools (a Hugging Face transformers directory).
    Export(cmd::export::ExportArgs),
    /// Tokenise a text file into a llama2.c token shard (raw u16 ids) with a run's tokenizer.
    Tokenize(cmd::tokenize::TokenizeArgs),
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
        Err(e) => return exit::usage_error(e),
    };
    let result = match cli.command {
        Command::Bleu(args) => cmd::bleu::run(args),
        Command::Train(args) => cmd::train::run(args),
        Command::Eval(args) => cmd::eval::run(args),
        Command::Translate(args) => cmd::translate::run(args),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Ablate(args) => cmd::ablate::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::LengthReport(args) => cmd::length_report::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Tokenize(args) => cmd::tokenize::run(args),
        Command::Average(args) => cmd::average::run(args),
        Command::Package(args) => cmd::package::run(args),
    };
    exit::exit_code(result)
}
