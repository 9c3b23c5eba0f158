//! `ember tokenize`: tokenises a text file into a llama2.c token shard (raw u16 ids) with a
//! run's tokenizer.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ember_trainer::{say, tell};

#[derive(Args)]
pub(crate) struct TokenizeArgs {
    /// A run directory (its tokenizer.json) or a tokenizer.json file.
    tokenizer: PathBuf,
    /// The text file to tokenise (plain or gzip, UTF-8), encoded whole as `kind: text` does.
    input: PathBuf,
    /// The shard to write: little-endian u16 token ids, no header (llama2.c's .bin format).
    output: PathBuf,
}

pub(crate) fn run(args: TokenizeArgs) -> Result<()> {
    let path = if args.tokenizer.is_dir() {
        args.tokenizer.join(ember_data::TOKENIZER_FILE)
    } else {
        args.tokenizer.clone()
    };
    // Before anything is read, by the one rule: the shard must not replace the text, the
    // tokenizer, a run's own file or a device, nor go into a checkpoint or model folder.
    ember_trainer::protected::check(
        &args.output,
        "OUTPUT",
        ember_trainer::protected::Output::File,
        &[&args.input, &args.tokenizer, &path],
        &[],
    )?;
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
