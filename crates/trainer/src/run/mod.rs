//! The run directory and its life: the names of its files, the lock of its one writer, files
//! written whole or not at all, the bookkeeping of a run, how it was invoked, and stop requests.

pub(crate) mod files;
pub mod interrupt;
pub(crate) mod lock_file;
pub(crate) mod options;
pub mod run_dir;
pub mod run_lock;
pub(crate) mod run_state;
