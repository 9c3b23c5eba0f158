//! `ember export`: writes a trained language model for other tools (a Hugging Face
//! transformers directory), and optionally Ember's logits of a text to check the export with.

use std::path::PathBuf;

use anyhow::{Context, Result};
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
    // Both outputs by the one rule, before anything is read or written: OUT a new folder outside
    // any run's checkpoints, model folder or Hugging Face folder (the run's own model.init_from
    // above all), the logits file none of the run's own files.
    ember_export::check_out(&args.out, &args.run)?;
    if let Some(path) = &args.reference_logits {
        check_run_output(path, &args.run, "--reference-logits")?;
    }
    let dtype = match args.dtype {
        Dtype::F32 => ember_export::ExportDtype::F32,
        Dtype::Bf16 => ember_export::ExportDtype::Bf16,
    };
    let source = ember_export::ExportSource::open(&args.run)?;
    source.architecture()?;
    // The reference logits are computed before anything is written: a text that cannot be
    // encoded refuses the export whole.
    let reference = match &args.reference_logits {
        Some(_) => {
            let text = args.reference_text.as_deref().unwrap_or(REFERENCE_TEXT);
            Some(ember_export::reference_logits(&source, text, dtype)?)
        }
        None => None,
    };
    let exported = ember_export::export_hf_as(&source, &args.out, dtype)?;
    if let (Some(path), Some(reference)) = (&args.reference_logits, &reference) {
        ember_data::io::write_atomic(path, serde_json::to_string(reference)?.as_bytes())
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
