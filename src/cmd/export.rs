//! `ember export`: writes a trained language model for other tools (a Hugging Face
//! transformers directory), and optionally Ember's logits of a text to check the export with.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use super::print_result;
use super::run_output::check_run_output;

#[derive(Args)]
pub(crate) struct ExportArgs {
    /// A run directory (its newest checkpoint) or a checkpoint directory inside it.
    run: PathBuf,
    /// The directory to write (created if needed).
    out: PathBuf,
    /// hf: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
    /// generation_config.json for transformers' AutoModelForCausalLM (Llama, Qwen2 or Qwen3).
    #[arg(long, value_enum, default_value_t = ExportFormat::Hf)]
    format: ExportFormat,
    /// The dtype of the exported weights: f32 (the checkpoint's, exactly) or bf16 (rounded to
    /// nearest even: half the size, as Hugging Face models ship; --reference-logits are then
    /// those of the rounded weights).
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
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

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
}

/// The reference text when none is given: characters any English-trained tokenizer knows.
const REFERENCE_TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n";

pub(crate) fn run(args: ExportArgs) -> Result<()> {
    let ExportFormat::Hf = args.format;
    // The export writes tokenizer.json, model.safetensors and config.json into OUT: inside the
    // run it would replace the run's own files (a checkpoint would fail its checksums).
    if let (Ok(out), Ok(run)) = (args.out.canonicalize(), args.run.canonicalize()) {
        let run_dir = ember_trainer::checkpoint::run_and_checkpoint(&run).map_or(run.clone(), |(r, _)| r);
        if out == run_dir || out.starts_with(run_dir.join(ember_trainer::run_dir::CHECKPOINTS)) {
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
    let dtype = match args.dtype {
        Dtype::F32 => ember_export::ExportDtype::F32,
        Dtype::Bf16 => ember_export::ExportDtype::Bf16,
    };
    let source = ember_export::ExportSource::open(&args.run)?;
    let exported = ember_export::export_hf_as(&source, &args.out, dtype)?;
    if let Some(path) = &args.reference_logits {
        let text = args.reference_text.as_deref().unwrap_or(REFERENCE_TEXT);
        let reference = ember_export::reference_logits(&source, text, dtype)?;
        std::fs::write(path, serde_json::to_string(&reference)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print_result(args.json, &exported, || {
        format!(
            "exported {} as {} ({} tensors, {} parameters, {}) to {}",
            exported.checkpoint.display(),
            exported.arch.class_name(),
            exported.tensors,
            exported.params,
            exported.dtype.hf_name(),
            exported.out.display()
        )
    })
}
