//! What a run leaves on disk and reading it back: checkpoints, what `--resume` checks of them,
//! model folders, and opening a trained model for evaluation and decoding.

pub mod checkpoint;
pub mod model_dir;
pub(crate) mod open;
pub mod resume_check;
