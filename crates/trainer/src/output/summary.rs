//! What a run reports when it ends (`summary.json`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::checkpoint::Best;

/// What a run reports when it ends; also written to `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub run_dir: PathBuf,
    pub steps: u64,
    pub total_steps: u64,
    /// Whether the run reached `total_steps` (false after `stop_after` or an interruption).
    pub finished: bool,
    /// The stop signal that interrupted the run (`SIGINT`, ...); it resumes with `--resume`.
    #[serde(default)]
    pub interrupted: Option<String>,
    pub params: usize,
    /// Training objective per token over the last logging window.
    pub final_train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_ppl: Option<f64>,
    pub best: Option<Best>,
    pub skipped_steps: u64,
    /// Median over logged windows of target tokens per second.
    pub tokens_per_sec: f64,
    /// Wall time of this invocation.
    pub wall_secs: f64,
    /// Training time over all invocations of the run.
    pub train_secs: f64,
    pub resumed_from_step: Option<u64>,
    /// Why the run stopped early as diverged (non-finite values, validation loss stuck above its
    /// initial value, or most steps skipped); `None` for a healthy run.
    pub diverged: Option<String>,
    /// Ranks of the data-parallel job that trained this invocation (absent for one process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<usize>,
    /// SHA-256 of the final weights, checked to be the same on every rank (jobs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_sha256: Option<String>,
}
