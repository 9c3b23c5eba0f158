//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics and
//! evaluation.
//!
//! The training loop is [`train()`]; it sets up with [`setup`], steps with [`step`], validates
//! with [`evaluate`](mod@evaluate) and leaves its bookkeeping to `run_state`.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod console;
pub mod context;
pub mod data_parallel;
pub mod evaluate;
mod files;
mod init_from;
pub mod interrupt;
pub mod limits;
pub mod loss;
pub mod metrics;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod optim;
pub mod options;
pub mod resume_check;
pub mod run_lock;
mod run_state;
pub mod setup;
pub mod step;
pub mod summary;
pub mod tensorboard;
pub mod train;
pub mod translate;
pub mod update;

pub use config::RunConfig;
pub use evaluate::{eval_beam, evaluate, EvalResult, Split};
pub use setup::{device, make_batcher, open_run, resolve_model_config, OpenRun, RUN_CONFIG};
pub use step::{forward_backward, StepOutput};
pub use train::{train, Summary, TrainOptions, SUMMARY};
