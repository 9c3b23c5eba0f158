//! How a training run is invoked: everything that is not part of the config.

use std::path::PathBuf;
use std::rc::Rc;

use ember_distributed::World;

use crate::interrupt::StopRequest;
use crate::metrics::Verbosity;

/// How `train` is invoked (everything that is not part of the config).
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub run_dir: PathBuf,
    /// Continue from the newest complete checkpoint in `run_dir`.
    pub resume: bool,
    /// With `resume`: if the newest checkpoint is corrupt, use the newest good one instead of stopping.
    pub fallback: bool,
    pub verbosity: Verbosity,
    /// Stop (with a checkpoint) after this many steps of this invocation, as an interruption would.
    pub stop_after: Option<u64>,
    /// Stop signals: honoured at the next step boundary with a checkpoint, ending in [`Interrupted`](crate::interrupt::Interrupted).
    pub stop: Option<StopRequest>,
    /// With `resume`: continue although the data differs from the checkpoint's.
    pub allow_data_change: bool,
    /// With `resume`: continue although the tokenizer differs from the checkpoint's (or is missing).
    pub allow_tokenizer_change: bool,
    /// With `resume`: continue although `train.precision` differs from the checkpoint's.
    pub allow_precision_change: bool,
    /// The job this process is a rank of (a world of one without a launcher). Rc: MPI is called
    /// from the main thread only.
    pub world: Rc<World>,
}

impl TrainOptions {
    /// A fresh run into `run_dir`, printing progress, no stop signals connected.
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        Self {
            run_dir: run_dir.into(),
            resume: false,
            fallback: false,
            verbosity: Verbosity::Normal,
            stop_after: None,
            stop: None,
            allow_data_change: false,
            allow_tokenizer_change: false,
            allow_precision_change: false,
            world: Rc::new(World::single()),
        }
    }
}
