//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics and
//! evaluation.
//!
//! The training loop is [`train()`]; it sets up with `setup`, steps with `training` (the step
//! `ember bench` times too), validates with [`evaluate()`] and leaves its bookkeeping to
//! `run_state`. The files of a run directory are named in [`run_dir`].
//!
//! Every public name has one path: the modules below for their own names, the crate root for
//! the entry points of the private modules (training, evaluation, opening a run).
//!
//! [`train()`] runs a whole run from a config, as `ember train` does. Its parts are public too;
//! here, one training step of a small translation model (`examples/train_small.rs` loops it):
//!
//! ```
//! use candle_core::{DType, Device};
//! use ember_trainer::config::RunConfig;
//! use ember_trainer::optim::AdamW;
//! use ember_trainer::{forward_backward, make_batcher, resolve_model_config};
//! # fn main() -> anyhow::Result<()> {
//! let yaml = "
//! model: { arch: seq2seq, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64 }
//! data:
//!   corpus: { kind: embedded, train_size: 200, val_size: 20, test_size: 0 }
//!   tokenizer: { kind: bpe, vocab_size: 100 }
//! train: { steps: 1, lr: 1.0e-3, max_tokens: 256 }
//! ";
//! let mut cfg = RunConfig::from_yaml(yaml, "demo.yaml".as_ref(), &[])?;
//! let data = ember_data::Dataset::prepare(&cfg.data, None)?;
//! resolve_model_config(&mut cfg, &data)?; // the vocabulary size, from the tokenizer
//! let (model, params) = ember_model::init_model(&cfg.model, cfg.train.seed, DType::F32, &Device::Cpu)?;
//! let mut optimizer = AdamW::new(params.vars(), &cfg.train)?;
//! let batch = [make_batcher(&cfg, &data)?.next_batch()];
//! let step = forward_backward(&model, optimizer.params(), &batch, &cfg.train, &Device::Cpu, 1, false)?;
//! optimizer.step(&step.grads, cfg.train.lr, 1.0)?;
//! let (loss_sum, _) = step.losses.to_host()?;
//! assert!((loss_sum / step.tokens as f64).is_finite());
//! # Ok(()) }
//! ```

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod console;
pub mod context;
pub mod data_parallel;
mod evaluate;
mod files;
mod init_from;
pub mod interrupt;
pub mod limits;
mod lock_file;
pub mod loss;
pub mod metrics;
pub mod model_dir;
#[cfg(feature = "nccl")]
pub mod nccl;
mod open;
pub mod optim;
mod options;
mod resolve;
pub mod resume_check;
pub mod run_dir;
pub mod run_lock;
mod run_state;
mod setup;
mod step;
mod summary;
pub mod tensorboard;
mod train;
mod training;
pub mod translate;
pub mod update;

pub use evaluate::{eval_beam, evaluate, EvalResult, Split};
pub use open::{open_model, open_run, OpenModel, OpenRun};
pub use options::TrainOptions;
pub use resolve::{resolve_model_config, DataFilled};
pub use setup::{device, make_batcher};
pub use step::{forward_backward, StepOutput};
pub use summary::Summary;
pub use train::{train, RankFailed};
