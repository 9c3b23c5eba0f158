//! What a run tells the user and leaves to read: console lines that never panic, the metrics
//! log and progress display, the TensorBoard log, and the summary.

pub mod console;
pub mod metrics;
pub(crate) mod summary;
pub mod tensorboard;
