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

/// The system allocator (glibc), with transparent huge pages asked for on every block of 4 MiB
/// or more (`madvise(MADV_HUGEPAGE)` on its 2 MiB-aligned interior): a big activation then faults
/// in 2 MiB at a time instead of 4 KiB, the first time; [`keep_freed_memory`] makes that the
/// only time. glibc's own `glibc.malloc.hugetlb` tunable does this, but a
/// tunable is read at process start, from the environment, so Ember cannot set it for itself.
/// Every block's bytes are counted too ([`ember_trainer::heap`]: `ember bench` reports the peak).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod huge_pages {
    use std::alloc::{GlobalAlloc, Layout, System};

    use ember_trainer::heap;

    const HUGE_PAGE: usize = 2 << 20;
    const MIN_BLOCK: usize = 4 << 20;

    pub struct HugePages;

    /// Asks for huge pages on the whole 2 MiB pages inside a block of `size` bytes at `p`.
    fn advise(p: *mut u8, size: usize) {
        if p.is_null() || size < MIN_BLOCK {
            return;
        }
        let start = (p as usize).next_multiple_of(HUGE_PAGE);
        let end = (p as usize + size) & !(HUGE_PAGE - 1);
        if end > start {
            // SAFETY: the range lies inside a block the allocator just handed out; MADV_HUGEPAGE
            // changes how its pages are backed, never their contents. A failure (no THP) is
            // harmless and ignored.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }

    /// A block of `size` bytes at `p` handed out: huge pages asked for, its bytes counted.
    fn handed_out(p: *mut u8, size: usize) {
        if !p.is_null() {
            advise(p, size);
            heap::allocated(size);
        }
    }

    // SAFETY: every call is System's own; `advise` only adds a paging hint, and the counts
    // touch no memory of the blocks.
    unsafe impl GlobalAlloc for HugePages {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc(layout) };
            handed_out(p, layout.size());
            p
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc_zeroed(layout) };
            handed_out(p, layout.size());
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
            unsafe { System.dealloc(p, layout) };
            heap::freed(layout.size());
        }
        unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
            let q = unsafe { System.realloc(p, layout, size) };
            if !q.is_null() {
                heap::freed(layout.size());
                handed_out(q, size);
            }
            q
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: huge_pages::HugePages = huge_pages::HugePages;

/// Keeps freed memory in the heap instead of handing it back to the kernel. glibc serves blocks
/// above its mmap threshold (at most 32 MiB) with fresh mappings and unmaps them on free, so
/// every training step faulted its logits and activations in again page by page: 9% of a
/// multi30k-tiny step went to page faults. Turning those mappings off left peak RSS where it
/// was (the same bytes are live at the peak); they are simply reused.
///
/// The kernels' worker threads allocate from glibc's per-thread arenas, which grow in heaps of
/// at most 64 MiB. When the last heap of an arena empties, glibc unmaps it whatever the trim
/// threshold, unless the heap before it would then keep less than `M_TOP_PAD` free (glibc
/// 2.36 `heap_trim`); the default pad is 128 KiB, so each step unmapped heaps and faulted them
/// in again (16.7k page faults a step at nanoGPT's standard shape in bf16, 8 with a 64 MiB pad).
/// The pad is address space, never touched until used. Memory kept this way serves only its own
/// arena, so the process holds each arena's high-water mark: fine-tuning SmolLM2-135M's shape
/// in bf16 peaked at 4,663–4,685 MiB against 4,242–4,556 before, for a 1.07× faster step.
/// One arena per core instead of glibc's eight kept the peak where it was but cost the smallest
/// models 7–20% a step (docs/performance.md), and they are what Ember is mostly used for.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only adjusts allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, ARENA_HEAP_MAX as i32);
    }
}

/// The largest heap of a glibc per-thread arena on 64-bit Linux (`HEAP_MAX_SIZE`, twice the
/// 32 MiB ceiling of the mmap threshold): a pad this large keeps every heap mapped.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_HEAP_MAX: usize = 64 << 20;

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
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
