//! Trains a small translation model on the embedded English→German task through Ember's crates
//! — the loop `ember train` runs, without its checkpoints, logging and evaluation — then
//! translates a sentence with it: `cargo run --release --example train_small` (a minute or two).
use candle_core::{DType, Device};
use ember_data::Dataset;
use ember_model::{init_model, BeamConfig};
use ember_trainer::config::RunConfig;
use ember_trainer::optim::{clip_grad_norm, AdamW, LrSchedule};
use ember_trainer::translate::translate_lines;
use ember_trainer::{forward_backward, make_batcher, resolve_model_config};

const CONFIG: &str = "
model: { arch: seq2seq, d_model: 128, n_layers: 1, n_heads: 4, d_ff: 256, qk_norm: rmsnorm, dropout: 0.1 }
data: { corpus: { kind: embedded }, tokenizer: { kind: bpe, vocab_size: 1000 } }
train: { steps: 600, lr: 3.0e-3, warmup_steps: 60, min_lr: 3.0e-4, max_tokens: 1024, label_smoothing: 0.1 }
";

fn main() -> anyhow::Result<()> {
    let mut cfg = RunConfig::from_yaml(CONFIG, "example.yaml".as_ref(), &[])?;
    let data = Dataset::prepare(&cfg.data, None)?; // the corpus, tokenized by a BPE it trains
    resolve_model_config(&mut cfg, &data)?; // the vocabulary size comes from the tokenizer
    let device = Device::Cpu;
    let (model, params) = init_model(&cfg.model, cfg.train.seed, DType::F32, &device)?;
    let mut batcher = make_batcher(&cfg, &data)?;
    let mut opt = AdamW::new(params.vars(), &cfg.train)?;
    let steps = cfg.train.steps.unwrap_or(1);
    let schedule = LrSchedule::new(&cfg.train, steps);
    for step in 1..=steps {
        let batch = [batcher.next_batch()];
        let out = forward_backward(&model, opt.params(), &batch, &cfg.train, &device, step, false)?;
        let clip = clip_grad_norm(opt.params(), &out.grads, cfg.train.clip_grad_norm)?;
        opt.step(&out.grads, schedule.at(step), clip.scale)?;
        if step % 100 == 0 {
            let (loss, _) = out.losses.to_host()?;
            println!("step {step}: loss {:.3}", loss / out.tokens as f64);
        }
    }
    let source = vec!["i see twenty-one red cats".to_string()];
    let seq2seq = model.as_seq2seq().expect("the config builds a translation model");
    let best = translate_lines(seq2seq, &data.tokenizer, &source, &BeamConfig::greedy(), &device)?;
    println!("{} → {}", source[0], best[0].text);
    Ok(())
}
