//! Tiny runs for the ablation specification tests (what they need of the trainer's tests/common).
// Each test file uses its own part of these helpers.
#![allow(dead_code)]

use std::path::Path;

use ember_trainer::metrics::{self, Record, Verbosity};
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
    metrics::read(&run_dir.join(metrics::METRICS))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some((t.step, t.loss)),
            Record::Eval(_) => None,
        })
        .collect()
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
