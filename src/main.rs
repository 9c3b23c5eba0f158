//! `ember`: the command-line front end. It parses the arguments and hands each command to its
//! module in [`cmd`]; [`exit`] turns the result into the exit status. No training logic lives
//! here: the commands hand over to the trainer and experiment crates.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator;
mod cmd;
mod exit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ember",
    version,
    about = "Train small transformers on candle, and measure QK-norm.",
    after_help = "Examples:\n  ember ablate configs/quickstart.yaml          # the QK-norm ablation on the embedded task\n  \
                  ember train configs/quickstart.yaml --set model.qk_norm=rmsnorm\n\n\
                  `ember COMMAND --help` shows each command's options and examples; the user guide is docs/guide/."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model from a YAML config into a run directory.
    #[command(
        after_help = "Examples:\n  ember train configs/quickstart.yaml --set model.qk_norm=rmsnorm\n  ember train configs/quickstart.yaml --run-dir runs/quickstart --resume"
    )]
    Train(cmd::train::TrainArgs),
    /// Compute loss/perplexity (and BLEU/chrF for translation) of a run on a data split.
    #[command(
        after_help = "Examples:\n  ember eval runs/quickstart --split test --beam 5\n  ember eval runs/shakespeare-char --context 1024 --logn on"
    )]
    Eval(cmd::eval::EvalArgs),
    /// Translate source lines from stdin to stdout with a trained seq2seq run.
    #[command(
        after_help = "Examples:\n  echo \"i see twenty-one red cats\" | ember translate runs/quickstart\n  ember translate runs/quickstart --beam 5 < source.txt > hyps.txt"
    )]
    Translate(cmd::translate::TranslateArgs),
    /// Sample text from a trained language-model run.
    #[command(
        after_help = "Examples:\n  ember generate runs/shakespeare-char --prompt \"ROMEO:\" --max-tokens 200\n  ember generate runs/shakespeare-char --temperature 0.8 --top-k 40 --seed 7"
    )]
    Generate(cmd::generate::GenerateArgs),
    /// Score a hypothesis file against references exactly as sacreBLEU 2.x does.
    #[command(
        after_help = "Examples:\n  ember bleu -r ref.de -i hyps.de\n  ember bleu -r ref.de -i hyps.de --metrics bleu,chrf --lowercase --tokenize 13a"
    )]
    Bleu(cmd::bleu::BleuArgs),
    /// Run the QK-norm ablation grid (variants × seeds × learning rates) of a config.
    #[command(
        after_help = "Examples:\n  ember ablate configs/quickstart.yaml\n  ember ablate configs/shakespeare-char.yaml --variants none,rmsnorm --lrs 1e-3,3e-3 --seeds 2 --jobs 2"
    )]
    Ablate(cmd::ablate::AblateArgs),
    /// Regenerate an ablation's report.md, report.json and plots from its run directories.
    #[command(after_help = "Examples:\n  ember report runs/quickstart-ablation")]
    Report(cmd::report::ReportArgs),
    /// Report a length-generalisation study (scripts/length-study.sh): loss by context and
    /// position, per QK-norm variant, with log-n scaling off and on.
    #[command(
        after_help = "Examples:\n  scripts/length-study.sh runs/length   # trains and evaluates the study\n  ember length-report runs/length"
    )]
    LengthReport(cmd::report::ReportArgs),
    /// Measure training throughput of a config.
    #[command(
        after_help = "Examples:\n  ember bench configs/multi30k-tiny.yaml --steps 100\n  ember bench configs/shakespeare-char.yaml --set train.threads=1 --json"
    )]
    Bench(cmd::bench::BenchArgs),
    /// Average the weights of a run's newest checkpoints into a new checkpoint.
    #[command(after_help = "Examples:\n  ember average runs/multi30k-tiny --last 10")]
    Average(cmd::average::AverageArgs),
    /// Write a model folder (weights, tokenizer, config) that translate, generate and eval open
    /// in place of a run.
    #[command(
        after_help = "Examples:\n  ember average runs/multi30k-tiny --last 10\n  ember package runs/multi30k-tiny/checkpoints/average-last-10 my-model\n  echo \"a man rides a bike\" | ember translate my-model"
    )]
    Package(cmd::package::PackageArgs),
    /// Export a trained language model for other tools (a Hugging Face transformers directory).
    #[command(
        after_help = "Examples:\n  ember export runs/fine-tune-smollm2 out/\n  ember export runs/fine-tune-smollm2 out/ --reference-logits out/ember-logits.json"
    )]
    Export(cmd::export::ExportArgs),
    /// Tokenise a text file into a llama2.c token shard (raw u16 ids) with a run's tokenizer.
    #[command(
        after_help = "Examples:\n  ember tokenize runs/shakespeare-char data/tinyshakespeare/input.txt data/shards/train.bin"
    )]
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// The config's JSON Schema and reference, and a config resolved with every default.
    #[command(
        after_help = "Examples:\n  ember config show configs/quickstart.yaml --set train.lr=1e-3\n  ember config schema --output configs/ember.schema.json"
    )]
    Config(cmd::config::ConfigArgs),
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: allocator::LinedBlocks = allocator::LinedBlocks;

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    allocator::keep_freed_memory();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    ember_trainer::heap::count_from_now();
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
        Command::Config(args) => cmd::config::run(args),
    };
    exit::exit_code(result)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// The `ember …` invocations on the indented lines of an `Examples:` help text (from `ember`
    /// on: what a pipe feeds it comes before), cut at a pipe out of it, a redirection or a
    /// comment, and split into words with double quotes kept together.
    fn examples(help: &str) -> Vec<Vec<String>> {
        help.lines()
            .filter(|l| l.starts_with("  "))
            .filter_map(|l| Some(&l[l.find("ember ")?..]))
            .map(|l| l.split(['#', '<', '>', '|']).next().unwrap_or(l))
            .map(|l| {
                l.split('"')
                    .enumerate()
                    .flat_map(|(i, part)| {
                        if i % 2 == 1 {
                            vec![part.to_string()]
                        } else {
                            part.split_whitespace().map(str::to_string).collect()
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_command_shows_examples_that_parse() {
        let mut cli = Cli::command();
        cli.build();
        for words in examples(&cli.get_after_help().map(|h| h.to_string()).unwrap_or_default()) {
            Cli::try_parse_from(&words)
                .unwrap_or_else(|e| panic!("`{}` does not parse: {e}", words.join(" ")));
        }
        // clap's own `help` subcommands aside.
        let mut commands: Vec<&clap::Command> =
            cli.get_subcommands().filter(|c| c.get_name() != "help").collect();
        let nested: Vec<&clap::Command> = commands
            .iter()
            .flat_map(|c| c.get_subcommands())
            .filter(|c| c.get_name() != "help")
            .collect();
        commands.extend(nested);
        for command in commands {
            let help = command
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let runs = examples(&help);
            assert!(
                help.starts_with("Examples:") && !runs.is_empty(),
                "`ember {}` has no examples in its --help",
                command.get_name()
            );
            for words in runs {
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!(
                        "`{}` from the help of `{}` does not parse: {e}",
                        words.join(" "),
                        command.get_name()
                    );
                }
            }
        }
    }
}
