//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics and
//! evaluation.
//!
//! The training loop is [`train()`]; it sets up with `setup`, steps with `training` (the step
//! `ember bench` times too), validates with [`evaluate()`] and leaves its bookkeeping to
//! `run_state`. The files of a run directory are named in [`run_dir`].
//!
//! Every public name has one path: the modules below for their own names, the crate root for
//! the entry points of the private modules (training, evaluation, opening a run).

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
pub mod precision;
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
