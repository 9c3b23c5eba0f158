//! The on-disk layout of a sweep, shared by the runner ([`crate::ablate`]) that writes it and the
//! report ([`crate::report`]) that reads it:
//!
//! ```text
//! OUT/grid.json                           the plan: every run, its overrides, its command
//! OUT/status.json                         each run's latest outcome, each invocation's wall time
//! OUT/runs/[<levels>_]<variant>-lr<lr>-seed<s>/  an ordinary run directory per grid cell
//!     ablate-stdout.log, ablate-stderr.log    a subprocess run's output
//! OUT/report.md, report.json, plots/      the report
//! OUT/status.json.lock                    held while a Slurm array task updates status.json
//! OUT/slurm/                              a Slurm sweep's batch scripts and logs (crate::slurm)
//! ```
//!
//! Besides the names, this module owns the types of `grid.json` and `status.json` (with the
//! machine and the UTC time stamps they record), how they are written, how runs and learning
//! rates are named, and how a run directory's state is judged from its files.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ember_model::QkNorm;
use ember_trainer::checkpoint;
use ember_trainer::run_dir::SUMMARY;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The plan of the sweep, in the output directory.
pub const GRID: &str = "grid.json";
/// Each run's last outcome and each invocation's wall time, in the output directory.
pub const STATUS: &str = "status.json";
/// The folder of run directories inside the output directory.
pub const RUNS: &str = "runs";
/// A subprocess's stdout and stderr, in its run directory.
pub const STDOUT_LOG: &str = "ablate-stdout.log";
pub const STDERR_LOG: &str = "ablate-stderr.log";
/// The report, in the output directory: Markdown, the same as JSON, and the folder of plots.
pub const REPORT_MD: &str = "report.md";
pub const REPORT_JSON: &str = "report.json";
pub const PLOTS: &str = "plots";

/// The resolved grid, as written to `grid.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub config: PathBuf,
    /// The user's `--set` overrides, applied to every run before the grid's own.
    pub overrides: Vec<String>,
    pub variants: Vec<QkNorm>,
    pub seeds: Vec<u64>,
    pub lrs: Vec<f64>,
    /// Factorial axes beside variant, learning rate and seed (`--grid KEY=V1,V2`), in the order
    /// given; empty when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub axes: Vec<Axis>,
    /// Runs at a time (1 in-process).
    pub jobs: usize,
    /// `train.threads` given to each run (`None` in-process: the config's own).
    pub threads: Option<usize>,
    pub out: PathBuf,
    /// The command every run extends: `ember train CONFIG [--set USER]... --quiet --json`.
    pub base_command: Vec<String>,
    /// How the grid's keys are set, in words (min_lr scaling, l2-only keys).
    pub notes: Vec<String>,
    pub hardware: Hardware,
    /// In the order they are run: seed, then the axes' levels, then learning rate, then variant.
    pub runs: Vec<PlannedRun>,
}

/// One factorial axis of a sweep: a config key and the values it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Axis {
    pub key: String,
    pub values: Vec<String>,
}

impl Axis {
    /// How the axis appears in run names and tables: the key's last part (`positions` for
    /// `model.positions`), or the whole key when another axis ends the same way.
    pub fn label(&self, axes: &[Axis]) -> String {
        let short = |k: &str| k.rsplit('.').next().unwrap_or(k).to_string();
        let mine = short(&self.key);
        if axes.iter().filter(|a| short(&a.key) == mine).count() > 1 {
            self.key.clone()
        } else {
            mine
        }
    }
}

/// The part of a run name that names its levels on the axes: `positions-learned_decay_embeddings-true`
/// (empty without axes). Characters a file name should not hold become `-`.
pub fn levels_label(axes: &[Axis], levels: &[String]) -> String {
    axes.iter()
        .zip(levels)
        .map(|(a, v)| {
            let v: String = v
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("{}-{v}", a.label(axes))
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// One cell of the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    /// `<variant>-lr<lr>-seed<s>`, also the directory name.
    pub name: String,
    pub variant: QkNorm,
    pub seed: u64,
    pub lr: f64,
    /// Its value on each of the plan's axes, in their order (empty without axes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    pub dir: PathBuf,
    /// Every `--set` of this run: the user's, then its levels, then the grid's.
    pub overrides: Vec<String>,
    /// The exact command (without `--resume`, which is added when resuming).
    pub command: Vec<String>,
}

/// `status.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepStatus {
    pub invocations: Vec<Invocation>,
    /// The latest record of each run, by name.
    pub runs: BTreeMap<String, RunRecord>,
}

/// One invocation of `ember ablate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    /// UTC, ISO 8601.
    pub started: String,
    /// Updated after every run, so an interrupted invocation still counts what it spent.
    pub wall_secs: f64,
    pub jobs: usize,
    pub threads: Option<usize>,
    pub hardware: Hardware,
    /// Runs executed (started or resumed) / skipped.
    pub executed: usize,
    pub skipped: usize,
}

/// The latest outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// `running`, `ok`, `diverged` or `failed`.
    pub status: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_secs: Option<f64>,
    /// UTC, ISO 8601.
    pub updated: String,
}

/// The machine a sweep ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardware {
    /// `model name` from /proc/cpuinfo.
    pub cpu: String,
    pub logical_cores: usize,
    /// The vector unit the CPU kernels used (`AVX-512`, `AVX2`): results differ in their last
    /// digits between units ([`ember_kernels::vector_unit`]). Absent in sweeps from before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector_unit: Option<String>,
    /// The precision of the sweep's matrix products and the instructions they run on here
    /// (`f32 products on AVX-512 FMA`; `bf16 products on AVX512_BF16 (vdpbf16ps), f32 sums`),
    /// one for each precision its runs use. Absent in sweeps from before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub products: Option<String>,
}

/// This machine, running products as `products` says ([`ember_trainer::precision::describe_products`]).
pub fn hardware(products: String) -> Hardware {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    Hardware {
        cpu,
        logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        vector_unit: Some(ember_kernels::vector_unit().to_string()),
        products: Some(products),
    }
}

/// Now, UTC, ISO 8601 (`2025-01-31T12:00:00Z`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The config name of a variant (`none`, `layernorm`, `rmsnorm`, `l2`).
pub fn variant_name(v: QkNorm) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => format!("{v:?}").to_lowercase(),
    }
}

/// `3e-3`, `1.5e-2`: the learning rate as it appears in run names.
pub fn lr_label(lr: f64) -> String {
    format!("{:e}", round_sig(lr))
}

/// Rounds to 12 significant digits, so 3e-4·1e-2/3e-3 prints as 1e-3.
pub(crate) fn round_sig(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
}

/// The run name of a grid cell: `<variant>-lr<lr>-seed<s>`, after its levels' label when the
/// sweep has axes (`positions-learned_none-lr1e-3-seed1`).
pub fn run_name(levels: &str, variant: QkNorm, lr: f64, seed: u64) -> String {
    let name = format!("{}-lr{}-seed{seed}", variant_name(variant), lr_label(lr));
    if levels.is_empty() {
        name
    } else {
        format!("{levels}_{name}")
    }
}

/// What a run directory holds, judged from its files.
#[derive(Debug, Clone, PartialEq)]
pub enum DiskState {
    /// summary.json says finished.
    Finished,
    /// summary.json says diverged, with the reason.
    Diverged(String),
    /// Checkpoints but no finished summary: resume from this step.
    Interrupted { step: u64 },
    /// Nothing to continue from.
    Empty,
}

/// Reads a run directory's state.
pub fn disk_state(dir: &Path) -> DiskState {
    if let Some(s) = read_summary(dir) {
        if s.get("finished").and_then(Value::as_bool) == Some(true) {
            return DiskState::Finished;
        }
        if let Some(reason) = s.get("diverged").and_then(Value::as_str) {
            return DiskState::Diverged(reason.to_string());
        }
    }
    match checkpoint::list(dir).last() {
        Some((step, _)) => DiskState::Interrupted { step: *step },
        None => DiskState::Empty,
    }
}

/// `out/status.json`, or an empty one when it is missing or unreadable.
pub fn read_status(out: &Path) -> SweepStatus {
    ember_data::io::read_own_to_string(out.join(STATUS))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// The QK-norm variants in the report's order: the baseline first, then the norms.
pub const VARIANT_ORDER: [&str; 4] = ["none", "layernorm", "rmsnorm", "l2"];

/// `summary.json` as JSON (read loosely, so older or partial summaries still count).
pub fn read_summary(dir: &Path) -> Option<Value> {
    let text = ember_data::io::read_own_to_string(dir.join(SUMMARY)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes a sweep's JSON file (`grid.json`, `status.json`, `report.json`) as pretty JSON with
/// [`ember_data::io::write_atomic`]: a crash leaves the old content or the new, and a link put in
/// its place is replaced, never written through.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    ember_data::io::write_atomic(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}
