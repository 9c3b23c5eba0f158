//! Tiny runs for the trainer's specification tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ember_trainer::config::RunConfig;
use ember_trainer::metrics::{self, Record, Verbosity};
use ember_trainer::run_dir::METRICS;
use ember_trainer::TrainOptions;

/// A seq2seq config on a small slice of the embedded task: milliseconds per step.
pub fn seq2seq_yaml() -> String {
    r#"
model:
  arch: seq2seq
  d_model: 32
  n_layers: 1
  n_heads: 4
  d_ff: 64
  max_seq_len: 64
  dropout: 0.1
  attn_dropout: 0.1
data:
  corpus: { kind: embedded, seed: 7, train_size: 300, val_size: 40, test_size: 40 }
  tokenizer: { kind: bpe, vocab_size: 200 }
train:
  steps: 8
  seed: 3
  lr: 3.0e-3
  warmup_steps: 2
  max_tokens: 300
  label_smoothing: 0.1
  z_loss: 1.0e-4
  log_every: 1
eval:
  every: 4
checkpoint:
  every: 2
  keep_last: 2
"#
    .to_string()
}

/// A character LM on generated text.
pub fn lm_yaml(text_path: &Path) -> String {
    format!(
        r#"
model:
  arch: lm
  d_model: 32
  n_layers: 2
  n_heads: 4
  n_kv_heads: 2
  d_ff: 64
  max_seq_len: 32
  qk_norm: rmsnorm
  dropout: 0.1
data:
  corpus: {{ kind: text, path: "{}", val_fraction: 0.1 }}
  tokenizer: {{ kind: char }}
train:
  steps: 8
  seed: 5
  lr: 3.0e-3
  batch_size: 4
  block_size: 16
  accumulation: 2
  log_every: 1
eval:
  every: 4
checkpoint:
  every: 3
"#,
        text_path.display()
    )
}

/// `yaml` with `train.precision: bf16` (mixed precision).
pub fn in_bf16(yaml: &str) -> String {
    yaml.replacen("\ntrain:\n", "\ntrain:\n  precision: bf16\n", 1)
}

/// Lets this test process run bf16 products on any CPU: natively where it has AVX512_BF16, else
/// emulated with the same bits (`ember_kernels::emulate_bf16_products`), so that the bf16
/// specifications run everywhere, CI's CPU included (`tests/cli.rs` covers the refusal without
/// the emulation).
pub fn bf16_everywhere() {
    ember_kernels::emulate_bf16_products();
}

pub fn write_text(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.txt");
    let mut text = String::new();
    for i in 0..400 {
        text.push_str(&format!(
            "line {i}: the quick brown fox jumps over {} lazy dogs.\n",
            i % 17
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

pub fn config(yaml: &str, overrides: &[&str]) -> RunConfig {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    RunConfig::from_yaml(yaml, Path::new("test.yaml"), &o).unwrap_or_else(|e| panic!("{e}"))
}

pub fn opts(run_dir: &Path) -> TrainOptions {
    TrainOptions {
        run_dir: run_dir.to_path_buf(),
        resume: false,
        fallback: false,
        verbosity: Verbosity::Quiet,
        ..TrainOptions::new(run_dir)
    }
}

/// Per-step training losses from a run's metrics.jsonl.
pub fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    metrics::read(&run_dir.join(METRICS))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some((t.step, t.loss)),
            Record::Eval(_) => None,
        })
        .collect()
}

pub fn newest_checkpoint(run_dir: &Path) -> PathBuf {
    ember_trainer::checkpoint::list(run_dir)
        .pop()
        .expect("a checkpoint")
        .1
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
