//! Ember's QK-norm experiment on top of the trainer: `ember ablate` trains every variant ×
//! seed × learning rate of one config as ordinary run directories, and `ember report` turns
//! those directories into report.md, report.json and plots. [`slurm`] runs the same grid as a
//! Slurm job array.

pub mod ablate;
pub mod layout;
pub mod length;
pub mod report;
pub mod shell;
pub mod slurm;
