//! Next-token logits of a Hugging Face model folder as `model.init_from` imports it, for checking
//! the import against transformers (scripts/check-hf-import.py):
//!
//! ```text
//! cargo run --release -p ember-import --example hf_logits -- DIR ID [ID...]
//! ```
//!
//! prints `{"logits": [[f32; vocab]; ids]}` for the ids as one sequence.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use ember_model::{ForwardCtx, Model};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        bail!("usage: hf_logits DIR ID [ID...]");
    };
    let ids = args
        .map(|a| {
            a.parse::<u32>()
                .with_context(|| format!("token id {a:?} is not a number"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("give at least one token id");
    }
    let cfg = ember_import::model_config(&dir)?;
    let params = ember_import::load_weights(&dir, &cfg, &Device::Cpu)?.params;
    let model = Model::new(&cfg, &params)?;
    let lm = model.as_lm().context("an imported model is a language model")?;
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
    let logits = lm
        .forward(&input, ForwardCtx::eval())?
        .squeeze(0)?
        .to_vec2::<f32>()?;
    println!("{}", serde_json::json!({ "logits": logits }));
    Ok(())
}
