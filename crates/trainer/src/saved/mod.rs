//! What a run leaves on disk and reading it back: checkpoints, what `--resume` checks of them,
//! model folders, and opening a trained model for evaluation and decoding; what a folder on the
//! disk is to Ember, and the one rule that keeps every command from writing over what runs read.

pub mod checkpoint;
pub mod model_dir;
pub(crate) mod open;
pub mod places;
pub mod protected;
pub mod resume_check;
