//! Ember's QK-norm experiment on top of the trainer: `ember ablate` trains every variant ×
//! seed × learning rate of one config as ordinary run directories, and `ember report` turns
//! those directories into report.md, report.json and plots. [`slurm`] runs the same grid as a
//! Slurm job array.
//!
//! The report's statistics are plain functions of the runs' numbers, e.g. the paired difference
//! of two variants over seeds with its 95% t interval:
//!
//! ```
//! use ember_experiment::report::stats::paired_diff;
//! // Made-up validation BLEU of three paired seeds (same initial weights and batches per seed).
//! let rmsnorm = [Some(34.1), Some(33.0), Some(35.2)];
//! let none = [Some(32.9), Some(32.1), Some(33.8)];
//! let d = paired_diff(&rmsnorm, &none, 0.95).unwrap();
//! assert_eq!(d.n, 3);
//! assert!(d.ci_low.unwrap() < d.mean && d.mean < d.ci_high.unwrap());
//! ```

pub mod ablate;
pub mod layout;
pub mod length;
pub mod report;
pub mod shell;
pub mod slurm;
