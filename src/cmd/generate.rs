//! `ember generate`: samples text from a trained language-model run.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use ember_model::{sample, Model, SampleConfig};
use ember_trainer::{open_model, tell};

use super::print_result;

/// `generate --max-tokens` bound: a million tokens is hours of sampling on a CPU, and the
/// output buffer is sized from it.
const MAX_GENERATE_TOKENS: u64 = 1_000_000;

#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// A language-model run directory, one of its checkpoint directories, or a model folder
    /// (`ember package`).
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

pub(crate) fn run(args: GenerateArgs) -> Result<()> {
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
    let run = open_model(&args.run, args.device.as_deref())?;
    let Model::Lm(m) = &run.model else {
        bail!(
            "{} is a translation model; use `ember translate`",
            args.run.display()
        );
    };
    let tok = &run.tokenizer;
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
    let out =
        serde_json::json!({"prompt": args.prompt, "text": text, "tokens": tokens.len(), "seed": args.seed});
    print_result(args.json, &out, || format!("{}{}", args.prompt, text))
}
