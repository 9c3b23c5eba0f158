//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics,
//! evaluation and ablation reports.

pub mod sacrebleu;
