//! The names of the files in a run directory, each defined once. A run directory holds:
//!
//! ```text
//! runs/my-run/
//! ├── .lock                         LOCK_FILE: held by the one process writing the run
//! ├── config.yaml                   RUN_CONFIG: the config completed from the data
//! ├── config-history/               CONFIG_HISTORY: config.step-NNNNNNNN.yaml, the config of the
//! │                                 steps before a resume that changed it
//! ├── tokenizer.json                ember_data::TOKENIZER_FILE, trained or copied by the data
//! ├── token-cache.bin               the data's tokenized corpus (ember_data)
//! ├── metrics.jsonl                 METRICS: one record per logged step or evaluation
//! ├── metrics.csv                   METRICS_CSV: its export, refreshed with every checkpoint
//! ├── events.out.tfevents.*         TensorBoard events (log.tensorboard)
//! ├── summary.json                  SUMMARY: how the run ended
//! └── checkpoints/                  CHECKPOINTS
//!     ├── .lock                     LOCK_FILE: orders the run's saving and pruning against
//!     │                             `ember average` reading
//!     ├── step-00000040/            one checkpoint (`checkpoint::dir_for`)
//!     │   ├── model.safetensors     MODEL: the weights
//!     │   ├── optimizer.safetensors OPTIMIZER: AdamW's moments
//!     │   ├── config.yaml           RUN_CONFIG: the config the step was trained with
//!     │   └── state.json            STATE: step, data position, RNG and the others' checksums,
//!     │                             written last (a checkpoint without it is incomplete)
//!     └── average-last-N/           `ember average`: a checkpoint of the same files
//! ```

/// The lock file of a locked directory: a run directory, its `checkpoints/`, a sweep's output.
pub const LOCK_FILE: &str = ".lock";

/// The resolved config a run directory holds (also copied into every checkpoint).
pub const RUN_CONFIG: &str = "config.yaml";

/// The configs a run was trained with before a resume changed it.
pub const CONFIG_HISTORY: &str = "config-history";

/// The run's metrics log, one JSON object per line.
pub const METRICS: &str = "metrics.jsonl";

/// [`METRICS`] as CSV.
pub const METRICS_CSV: &str = "metrics.csv";

/// How the run ended (the `Summary` that `train` returns), written when it ends.
pub const SUMMARY: &str = "summary.json";

/// The folder of a run's checkpoints.
pub const CHECKPOINTS: &str = "checkpoints";

/// A checkpoint's state: step, data position, RNG and the checksums of its other files.
pub const STATE: &str = "state.json";

/// A checkpoint's weights.
pub const MODEL: &str = "model.safetensors";

/// A checkpoint's optimizer state.
pub const OPTIMIZER: &str = "optimizer.safetensors";
