//! The on-disk layout of a sweep, shared by the runner ([`crate::ablate`]) that writes it and the
//! report ([`crate::report`]) that reads it:
//!
//! ```text
//! OUT/grid.json                           the plan: every run, its overrides, its command
//! OUT/base.yaml                           the base config, as it was when the sweep was planned
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
//!
//! A sweep can be moved or copied (planned in a cluster's scratch, copied home): `grid.json`
//! names its base config and its runs relative to the sweep ([`Plan::stored`]), and every reader
//! makes them point into the directory where the sweep now lies ([`Plan::rebased`]), so
//! `--status`, `--cell`, `ember report` and resuming work in the copy. Plans from before (paths
//! relative to the directory the sweep was planned from, or absolute) are read the same way,
//! their config where it was.

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

/// The base config a sweep keeps, in the output directory: the runs train from this copy, so that
/// the sweep holds all it needs wherever it is moved.
pub const BASE_CONFIG: &str = "base.yaml";

/// The resolved grid, as written to `grid.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The base config the runs train from: the sweep's [`BASE_CONFIG`] once it is written.
    pub config: PathBuf,
    /// The config the sweep was planned from, as it was given (absent in plans from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_source: Option<PathBuf>,
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

/// `EXE train CONFIG [--set O]... [--run-dir DIR] --quiet --json`: the command of a run of a
/// sweep (with its directory), or the base every run's command extends (without).
pub fn train_command(exe: &str, config: &Path, overrides: &[String], dir: Option<&Path>) -> Vec<String> {
    let mut command = vec![exe.to_string(), "train".into(), config.display().to_string()];
    for o in overrides {
        command.extend(["--set".to_string(), o.clone()]);
    }
    if let Some(dir) = dir {
        command.extend(["--run-dir".to_string(), dir.display().to_string()]);
    }
    command.extend(["--quiet".to_string(), "--json".to_string()]);
    command
}

impl Plan {
    /// The plan with its paths under `out` and `config` (the sweep's output directory and base
    /// config, as the caller names them), every run's directory and command made from them.
    fn placed(&self, out: &Path, config: &Path) -> Plan {
        let exe = self
            .base_command
            .first()
            .cloned()
            .unwrap_or_else(|| "ember".into());
        let mut plan = self.clone();
        plan.out = out.to_path_buf();
        plan.config = config.to_path_buf();
        plan.base_command = train_command(&exe, config, &self.overrides, None);
        // Inside the sweep (as grid.json stores it): `runs/NAME`, not `./runs/NAME`.
        let runs = match out == Path::new(".") {
            true => PathBuf::from(RUNS),
            false => out.join(RUNS),
        };
        for run in &mut plan.runs {
            run.dir = runs.join(&run.name);
            run.command = train_command(&exe, config, &run.overrides, Some(&run.dir));
        }
        plan
    }

    /// The plan as `grid.json` stores it: its output directory `.`, its base config and runs
    /// relative to the sweep.
    pub fn stored(&self) -> Plan {
        let config = match self.config.file_name() {
            Some(name) if name == BASE_CONFIG => PathBuf::from(BASE_CONFIG),
            _ => self.config.clone(),
        };
        self.placed(Path::new("."), &config)
    }

    /// A plan read from `out/grid.json`, its paths made to point into `out` wherever the sweep
    /// lies now: the base config it keeps (or, for a plan from before, the config where it
    /// was), each run in `out/runs/`.
    pub fn rebased(&self, out: &Path) -> Plan {
        let kept = out.join(&self.config);
        let config = if self.config.is_relative() && kept.is_file() {
            kept
        } else {
            self.config.clone()
        };
        self.placed(out, &config)
    }
}

/// Copies the config `plan` was planned from into its output directory as [`BASE_CONFIG`] (the
/// runs train from the copy from now on) and writes `grid.json` with paths relative to the
/// sweep. Re-planning from the copy itself leaves it as it is.
pub(crate) fn write_plan(plan: &mut Plan) -> Result<()> {
    let copy = plan.out.join(BASE_CONFIG);
    let same = fs::canonicalize(&copy)
        .ok()
        .zip(fs::canonicalize(&plan.config).ok())
        .is_some_and(|(a, b)| a == b);
    if same {
        // Planned again from its own copy: the config it came from stays on record.
        let earlier: Option<Plan> = ember_data::io::read_own_to_string(plan.out.join(GRID))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        plan.config_source = earlier.and_then(|p| p.config_source);
    } else {
        let text =
            ember_data::io::read_small_text(&plan.config, ember_trainer::config::MAX_CONFIG_BYTES as u64)
                .with_context(|| format!("reading {}", plan.config.display()))?;
        ember_data::io::write_atomic(&copy, text.as_bytes())
            .with_context(|| format!("writing {}", copy.display()))?;
        plan.config_source.get_or_insert(plan.config.clone());
    }
    *plan = plan.placed(&plan.out.clone(), &copy);
    write_json(&plan.out.join(GRID), &plan.stored())
}

/// Refuses `out` as a sweep's output directory by the one rule of [`ember_trainer::protected`]
/// (not a run's directory, not inside a checkpoint, a model folder or a Hugging Face folder),
/// before anything is written into it.
pub(crate) fn check_out_dir(out: &Path) -> Result<()> {
    ember_trainer::protected::check(out, "--out", ember_trainer::protected::Output::SweepDir, &[], &[])
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

/// The vector units the sweep in `out` has computed with so far: its plan's machine, every
/// invocation's, and what each run's checkpoints record.
fn units_so_far(out: &Path) -> std::collections::BTreeSet<String> {
    let plan: Option<Plan> = ember_data::io::read_own_to_string(out.join(GRID))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let status = read_status(out);
    let machines = plan
        .iter()
        .map(|p| &p.hardware)
        .chain(status.invocations.iter().map(|i| &i.hardware))
        .filter_map(|h| h.vector_unit.clone());
    let runs = fs::read_dir(out.join(RUNS))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| checkpoint::list(&e.path()).pop())
        .filter_map(|(_, ckpt)| {
            let text = ember_data::io::read_own_to_string(ckpt.join(ember_trainer::run_dir::STATE)).ok()?;
            let state: Value = serde_json::from_str(&text).ok()?;
            serde_json::from_value::<Vec<String>>(state.get("vector_units")?.clone()).ok()
        })
        .flatten();
    machines.chain(runs).collect()
}

/// A warning when the sweep in `out` was computed with a vector unit other than `now`'s (an
/// extension, a resume or a cell on another CPU, or under `EMBER_CPU_VECTOR_UNIT`): its runs
/// would not all be comparable bit for bit. `None` for a new sweep or the same unit.
pub fn unit_change(out: &Path, now_unit: &str) -> Option<String> {
    let before: Vec<String> = units_so_far(out).into_iter().filter(|u| u != now_unit).collect();
    if before.is_empty() {
        return None;
    }
    let env = ember_kernels::VECTOR_UNIT_ENV;
    let chosen = std::env::var(env)
        .map(|v| format!(" ({env}={v})"))
        .unwrap_or_default();
    Some(format!(
        "{} was computed with {} so far, this invocation computes with {now_unit}{chosen}: runs \
         it starts differ from the earlier ones in their last digits, and a run it resumes is no \
         longer bit-identical to an uninterrupted one; the report names each run's units",
        out.display(),
        before.join(" and ")
    ))
}

/// Warns on stderr when the sweep `plan` is run with another vector unit than its runs so far
/// ([`unit_change`]), before it starts or plans anything.
pub fn warn_of_unit_change(plan: &Plan) {
    let now = plan.hardware.vector_unit.as_deref();
    if let Some(warning) = now.and_then(|unit| unit_change(&plan.out, unit)) {
        ember_trainer::tell!("warning: {warning}");
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
