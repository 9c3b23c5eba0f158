//! Ember's trainer: configuration, the training loop, optimizer, checkpoints, metrics and
//! evaluation.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod train;
pub mod translate;

pub use config::RunConfig;
pub use train::{train, Summary, TrainOptions};
