//! `ember package`: writes a model folder — one checkpoint's weights with the run's tokenizer and
//! config, verified by checksums — that `ember translate`, `generate` and `eval` open in place of
//! a run (the form a trained model is released in).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ember_model::LengthPenalty;
use ember_trainer::model_dir;

use super::print_result;

#[derive(Args)]
pub(crate) struct PackageArgs {
    /// A run directory (its newest checkpoint) or a checkpoint directory inside it, e.g.
    /// RUN/checkpoints/average-last-10 from `ember average`.
    run: PathBuf,
    /// The model folder to write; must not exist yet.
    out: PathBuf,
    /// The length penalty the model was chosen with (GNMT's α as `gnmt:1.6` or `1.6`, or
    /// fairseq's `fairseq:1`): written into the folder's config as `eval.length_penalty`, which
    /// `ember translate` and `ember eval` use when not given `--length-penalty`.
    #[arg(long, value_parser = |s: &str| s.parse::<LengthPenalty>())]
    length_penalty: Option<LengthPenalty>,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: PackageArgs) -> Result<()> {
    let packaged = model_dir::package(&args.run, &args.out, args.length_penalty)?;
    print_result(args.json, &packaged, || {
        format!(
            "wrote {} ({:.1} MB) from {} (step {}): model.safetensors, config.yaml, tokenizer, {}",
            packaged.dir.display(),
            packaged.bytes as f64 / 1e6,
            packaged.checkpoint.display(),
            packaged.step,
            model_dir::MANIFEST
        )
    })
}
