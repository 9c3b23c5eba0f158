//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics and
//! evaluation.
//!
//! The training loop is [`train()`]; it sets up with `setup`, steps with `step::training` (the
//! step `ember bench` times too), validates with [`evaluate()`] and leaves its bookkeeping to
//! `run::run_state`. The files of a run directory are named in [`run_dir`].
//!
//! The source is grouped by concern, each folder a private module:
//!
//! - `setup/` — everything before the first step: device, data, the config completed from the
//!   data (`resolve`), an imported model (`init_from`), memory [`limits`];
//! - `step/` — one training step: forward and backward, the [`loss`], the [`update`] with
//!   [`optim`]'s AdamW, [`data_parallel`] sums, and the `training` state both `ember train` and
//!   `ember bench` step;
//! - `run/` — the run directory and its life: its names ([`run_dir`]), lock ([`run_lock`]),
//!   atomic files, bookkeeping, options and stop requests ([`interrupt`]);
//! - `saved/` — what a run leaves and reading it back: [`checkpoint`]s, what `--resume` checks
//!   ([`resume_check`]), [`model_dir`]s, opening a trained model; what a folder is to Ember
//!   ([`places`]) and the one rule for what no command writes over ([`protected`]);
//! - `eval/` — [`evaluate()`], [`context`] evaluation, decoding and scoring ([`translate`]);
//! - `output/` — what the user sees and the logs: [`console`], [`metrics`], [`tensorboard`],
//!   the summary.
//!
//! Every public name has one path: the modules re-exported below (at the paths other crates
//! have always used) for their own names, the crate root for the entry points of the private
//! modules (training, evaluation, opening a run).
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
pub mod config;
mod eval;
pub mod heap;
mod output;
mod run;
mod saved;
mod setup;
mod step;
mod train;

pub use eval::evaluate::{eval_beam, evaluate, EvalResult, Split};
pub use eval::{context, translate};
pub use output::summary::Summary;
pub use output::{console, metrics, tensorboard};
pub use run::options::TrainOptions;
pub use run::{interrupt, run_dir, run_lock};
pub use saved::open::{open_model, open_run, OpenModel, OpenRun};
pub use saved::{checkpoint, model_dir, places, protected, resume_check};
pub use setup::resolve::{resolve_model_config, DataFilled};
pub use setup::{activations, limits, precision};
pub use setup::{device, make_batcher};
#[cfg(feature = "nccl")]
pub use step::nccl;
pub use step::{data_parallel, forward_backward, loss, optim, update, StepOutput};
pub use train::{train, RankFailed};
