//! The grid of `ember ablate`, resolved: flags over the config's `ablation:` section over the
//! defaults, then every run's `--set` overrides and exact command.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ember_model::QkNorm;
use ember_trainer::config::{AblationConfig, RunConfig};
use serde_json::Value;

use super::{AblateOptions, Runner};
use crate::layout::{
    hardware, levels_label, lr_label, round_sig, run_name, train_command, variant_name, Axis, Plan,
    PlannedRun, RUNS,
};

/// A QK-norm variant from its config name (`none`, `layernorm`, `rmsnorm`, `l2`).
pub fn parse_variant(s: &str) -> Result<QkNorm> {
    serde_json::from_value(Value::String(s.trim().to_string())).map_err(|_| {
        anyhow::anyhow!("unknown QK-norm variant {s:?}; expected one of none, layernorm, rmsnorm, l2")
    })
}

/// `none,rmsnorm` → variants.
pub fn parse_variants(s: &str) -> Result<Vec<QkNorm>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(parse_variant)
        .collect()
}

/// `1e-3,3e-3` → learning rates (positive, finite).
pub fn parse_lrs(s: &str) -> Result<Vec<f64>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let lr: f64 = p
                .trim()
                .parse()
                .with_context(|| format!("learning rate {p:?} is not a number"))?;
            if !(lr > 0.0 && lr.is_finite()) {
                bail!("learning rates must be positive numbers, got {p}");
            }
            Ok(lr)
        })
        .collect()
}

/// Keys the sweep sets itself, so they cannot be axes.
const GRID_OWNED_KEYS: [(&str, &str); 5] = [
    ("model.qk_norm", "--variants"),
    ("train.lr", "--lrs"),
    ("train.min_lr", "--lrs (it scales with the learning rate)"),
    ("train.seed", "--seeds"),
    ("train.threads", "--threads"),
];

/// `model.positions=rope,learned` → an axis (values trimmed, each once, in the order given).
/// Values cannot contain commas.
pub fn parse_axis(s: &str) -> Result<Axis> {
    let Some((key, values)) = s.split_once('=') else {
        bail!("--grid {s:?}: expected KEY=V1,V2,... (e.g. model.positions=rope,learned)");
    };
    let key = key.trim();
    if key.is_empty() {
        bail!("--grid {s:?}: the key before '=' is empty");
    }
    if let Some((_, flag)) = GRID_OWNED_KEYS.iter().find(|(k, _)| *k == key) {
        bail!("--grid {key}: the sweep sets {key} itself; use {flag} instead");
    }
    let mut unique: Vec<String> = vec![];
    for v in values.split(',').map(str::trim) {
        if v.is_empty() {
            bail!("--grid {s:?}: an empty value (values are separated by commas, none may be empty)");
        }
        if !unique.iter().any(|u| u == v) {
            unique.push(v.to_string());
        }
    }
    Ok(Axis {
        key: key.to_string(),
        values: unique,
    })
}

/// The axes given on the command line, else the config's `ablation.grid`; each key once.
fn axes(opts: &AblateOptions, section: &AblationConfig) -> Result<Vec<Axis>> {
    let given = opts.grid.clone().unwrap_or_else(|| section.grid.clone());
    let mut axes: Vec<Axis> = vec![];
    for s in &given {
        let axis = parse_axis(s)?;
        if axes.iter().any(|a| a.key == axis.key) {
            bail!(
                "--grid {}: the key is given twice; list all its values in one KEY=V1,V2",
                axis.key
            );
        }
        axes.push(axis);
    }
    Ok(axes)
}

/// Every combination of the axes' values, the first axis varying slowest (one empty combination
/// without axes).
fn combinations(axes: &[Axis]) -> Vec<Vec<String>> {
    axes.iter().fold(vec![vec![]], |acc, axis| {
        acc.iter()
            .flat_map(|prefix| {
                axis.values.iter().map(move |v| {
                    let mut c = prefix.clone();
                    c.push(v.clone());
                    c
                })
            })
            .collect()
    })
}

/// A YAML float that every YAML reader takes as a float (`3.0e-3`).
fn yaml_float(x: f64) -> String {
    let s = format!("{:e}", round_sig(x));
    match s.split_once('e') {
        Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
        _ => s,
    }
}
/// The most cells (runs) a sweep may plan: settings × variants × learning rates × seeds. A
/// sweep of 10,000 runs is months of CPU time; a larger one is a typo (`--seeds 1000000`), and
/// planning it would take hours and gigabytes before the first run.
pub const MAX_CELLS: u128 = 10_000;

/// The most `--jobs` (runs at a time) and `--threads` (per run) a sweep takes.
pub const MAX_JOBS: usize = 1024;

/// The number of cells of a grid, computed without enumerating it (saturating: an absurd grid
/// gives a number above [`MAX_CELLS`], never an overflow).
pub fn cell_count(axis_levels: &[usize], variants: usize, lrs: usize, seeds: usize) -> u128 {
    axis_levels
        .iter()
        .chain([&variants, &lrs, &seeds])
        .fold(1u128, |n, &k| n.saturating_mul(k as u128))
}

/// Refuses a grid above [`MAX_CELLS`] cells before anything is enumerated, naming each factor.
fn check_size(axes: &[Axis], variants: usize, lrs: usize, seeds: usize) -> Result<()> {
    let levels: Vec<usize> = axes.iter().map(|a| a.values.len()).collect();
    let cells = cell_count(&levels, variants, lrs, seeds);
    if cells > MAX_CELLS {
        let factors: Vec<String> = axes
            .iter()
            .map(|a| format!("{} levels of --grid {}", a.values.len(), a.key))
            .chain([
                format!("{variants} variant(s)"),
                format!("{lrs} learning rate(s)"),
                format!("{seeds} seed(s)"),
            ])
            .collect();
        bail!(
            "this sweep would have {cells} cells ({}), more than the {MAX_CELLS} a sweep may plan; \
             lower --seeds, --lrs, --variants or the levels of --grid. Nothing was planned.",
            factors.join(" × ")
        );
    }
    Ok(())
}

/// Planning stops between steps when a stop signal arrives.
fn check_stop(opts: &AblateOptions) -> Result<()> {
    match opts.stop.as_ref().and_then(|s| s.requested()) {
        Some(signal) => Err(super::PlanningInterrupted { signal }.into()),
        None => Ok(()),
    }
}

/// Resolves the grid: flags over the config's `ablation:` section over the defaults.
pub fn plan(opts: &AblateOptions) -> Result<Plan> {
    let (user_overrides, cfg, section) = load_config(opts)?;
    let variants = variants(opts, &section)?;
    imported_variants(&cfg, &variants)?;
    let n_seeds = opts.seeds.unwrap_or(section.seeds);
    if n_seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let lrs = lrs(opts, &section, cfg.train.lr)?;
    let (jobs, threads) = jobs_and_threads(opts, &section)?;
    let out = out_dir(opts, &section);
    let axes = axes(opts, &section)?;
    check_size(&axes, variants.len(), lrs.len(), n_seeds)?;
    let settings = combinations(&axes);
    let keys = GridKeys::new(&cfg, &lrs);
    let base_command = base_command(opts, &user_overrides);
    let mut runs: Vec<PlannedRun> = vec![];
    // What the products compute in and on, each once, in the order the settings first use it
    // (a `--grid train.precision=f32,bf16` sweep names both).
    let mut products: Vec<String> = vec![];
    for levels in &settings {
        check_stop(opts)?;
        // Each combination must make a valid config on its own (a bad value names its key).
        let setting = check_setting(opts, &user_overrides, &level_overrides(&axes, levels))?;
        let setting = setting.as_ref().unwrap_or(&cfg);
        // A precision this machine cannot run is refused here, not by every run of the sweep;
        // so is recomputing activations in a variant whose sub-blocks cannot (L2 QK-norm).
        ember_trainer::precision::for_training(setting)?;
        for &variant in &variants {
            let mut cell = setting.clone();
            cell.model.qk_norm = variant;
            ember_trainer::activations::check(&cell)
                .with_context(|| format!("the {} variant", variant_name(variant)))?;
        }
        let described = ember_trainer::precision::describe_products(setting);
        if !products.contains(&described) {
            products.push(described);
        }
    }
    let mut names: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for seed in 1..=n_seeds as u64 {
        check_stop(opts)?;
        for levels in &settings {
            for &lr in &lrs {
                for &variant in &variants {
                    let mut overrides = user_overrides.clone();
                    overrides.extend(level_overrides(&axes, levels));
                    overrides.extend(keys.overrides(variant, seed, lr, threads));
                    let cell = Cell {
                        levels: levels.clone(),
                        label: levels_label(&axes, levels),
                        variant,
                        seed,
                        lr,
                    };
                    let run = planned_run(cell, &out, overrides, &base_command);
                    if let Some(other) = names.get(&run.name).map(|&i| &runs[i]) {
                        bail!(
                            "--grid: levels {:?} and {:?} give the same run name {} (their values differ only in \
                             characters a file name cannot hold); choose values that differ in letters or digits",
                            other.levels,
                            run.levels,
                            run.name
                        );
                    }
                    names.insert(run.name.clone(), runs.len());
                    runs.push(run);
                }
            }
        }
    }
    Ok(Plan {
        config: opts.config.clone(),
        config_source: None,
        overrides: user_overrides,
        notes: keys.notes(&variants),
        variants,
        seeds: (1..=n_seeds as u64).collect(),
        lrs,
        axes,
        jobs,
        threads,
        out,
        base_command,
        hardware: hardware(products.join("; ")),
        runs,
    })
}

/// The config a planned run trains (before the data fills in the vocabulary size).
pub fn run_config(plan: &Plan, run: &PlannedRun) -> Result<RunConfig> {
    Ok(RunConfig::load(&plan.config, &run.overrides)?)
}

/// The config with the user's overrides, and its `ablation:` section. The section's own `set`
/// comes first, so the command line's `--set` wins over it.
fn load_config(opts: &AblateOptions) -> Result<(Vec<String>, RunConfig, AblationConfig)> {
    let section = |cfg: &RunConfig| -> Result<AblationConfig> {
        match &cfg.ablation {
            Some(a) => Ok(a.clone()),
            // The config's own defaults for an empty `ablation:` section.
            None => serde_json::from_value(Value::Object(Default::default()))
                .context("the ablation section's defaults"),
        }
    };
    let first = section(&RunConfig::load(&opts.config, &opts.overrides)?)?;
    let user_overrides: Vec<String> = first.set.iter().chain(&opts.overrides).cloned().collect();
    let cfg = RunConfig::load(&opts.config, &user_overrides)?;
    let section = section(&cfg)?;
    Ok((user_overrides, cfg, section))
}

/// The variants, each once, in the order given.
fn variants(opts: &AblateOptions, section: &AblationConfig) -> Result<Vec<QkNorm>> {
    let mut variants: Vec<QkNorm> = vec![];
    for v in opts.variants.clone().unwrap_or_else(|| section.variants.clone()) {
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    if variants.is_empty() {
        bail!("--variants: list at least one of none, layernorm, rmsnorm, l2");
    }
    Ok(variants)
}

/// A model imported with `model.init_from` has its weights' QK-norm: its sweep varies the
/// learning rate and the seed (the data order), never the variant.
fn imported_variants(cfg: &RunConfig, variants: &[QkNorm]) -> Result<()> {
    let (Some(dir), own) = (&cfg.model.init_from, cfg.model.qk_norm) else {
        return Ok(());
    };
    if let Some(other) = variants.iter().find(|v| **v != own) {
        let name = |v: QkNorm| variant_name(v);
        bail!(
            "the model is imported from {} with qk_norm: {} (its weights fix it), so it cannot be \
             trained as variant {}; sweep learning rates and seeds over it with ablation.variants: \
             [{}] (or --variants {})",
            dir.display(),
            name(own),
            name(*other),
            name(own),
            name(own)
        );
    }
    Ok(())
}

/// The peak learning rates (the config's `train.lr` when none are given), each once as run
/// names print them.
fn lrs(opts: &AblateOptions, section: &AblationConfig, config_lr: f64) -> Result<Vec<f64>> {
    let mut lrs: Vec<f64> = vec![];
    let given = match &opts.lrs {
        Some(l) => l.clone(),
        None if !section.lrs.is_empty() => section.lrs.clone(),
        None => vec![config_lr],
    };
    for lr in given {
        if !(lr > 0.0 && lr.is_finite()) {
            bail!("--lrs: learning rates must be positive numbers, got {lr}");
        }
        if !lrs.iter().any(|l| lr_label(*l) == lr_label(lr)) {
            lrs.push(lr);
        }
    }
    if lrs.is_empty() {
        bail!("--lrs: give at least one learning rate");
    }
    Ok(lrs)
}

/// Runs at a time and `train.threads` per run: in-process, one run with the config's threads;
/// else the cores shared out between the jobs unless given.
fn jobs_and_threads(opts: &AblateOptions, section: &AblationConfig) -> Result<(usize, Option<usize>)> {
    let in_process = opts.runner == Runner::InProcess;
    let jobs = if in_process {
        1
    } else {
        opts.jobs.unwrap_or(section.jobs)
    };
    if jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    if jobs > MAX_JOBS {
        bail!("--jobs {jobs}: at most {MAX_JOBS} runs at a time (each is a process of its own)");
    }
    let threads = if in_process {
        None
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let t = opts.threads.or(section.threads).unwrap_or((cores / jobs).max(1));
        if t == 0 {
            bail!("--threads must be at least 1");
        }
        if t > ember_trainer::config::MAX_THREADS {
            bail!(
                "--threads {t}: at most {} threads per run (train.threads has the same bound)",
                ember_trainer::config::MAX_THREADS
            );
        }
        Some(t)
    };
    Ok((jobs, threads))
}

/// `--out`, else the section's `out`, else `runs/<config name>-ablation`.
fn out_dir(opts: &AblateOptions, section: &AblationConfig) -> PathBuf {
    opts.out.clone().or(section.out.clone()).unwrap_or_else(|| {
        let stem = opts
            .config
            .file_stem()
            .map_or("run".into(), |s| s.to_string_lossy().to_string());
        PathBuf::from("runs").join(format!("{stem}-ablation"))
    })
}

/// `ember train CONFIG [--set USER]... --quiet --json`, which every run's command extends.
fn base_command(opts: &AblateOptions, user_overrides: &[String]) -> Vec<String> {
    let exe = match &opts.runner {
        Runner::Process { exe } => exe.display().to_string(),
        Runner::InProcess => "ember".into(),
    };
    train_command(&exe, &opts.config, user_overrides, None)
}

/// The keys the grid sets for every run besides the variant, seed and learning rate.
struct GridKeys {
    /// The config's `(train.min_lr, train.lr)` when min_lr scales with the swept learning rate.
    min_lr_scale: Option<(f64, f64)>,
    /// The config sets keys that apply to `l2` only; the other variants get them cleared.
    l2_keys: bool,
}

impl GridKeys {
    fn new(cfg: &RunConfig, lrs: &[f64]) -> Self {
        let scale_min_lr = cfg.train.min_lr > 0.0 && lrs.iter().any(|&lr| lr != cfg.train.lr);
        Self {
            min_lr_scale: scale_min_lr.then_some((cfg.train.min_lr, cfg.train.lr)),
            l2_keys: cfg.model.qk_norm_init_scale.is_some() || cfg.model.qk_norm_length.is_some(),
        }
    }

    /// How the keys are set, in words, for the plan and the report.
    fn notes(&self, variants: &[QkNorm]) -> Vec<String> {
        let mut notes = vec![];
        if let Some((min_lr, lr)) = self.min_lr_scale {
            notes.push(format!(
                "train.min_lr is scaled with the learning rate (min_lr = {min_lr} × lr / {lr}), keeping the schedule's shape"
            ));
        }
        if self.l2_keys && variants.iter().any(|v| *v != QkNorm::L2) {
            notes.push(
                "model.qk_norm_init_scale/qk_norm_length apply to l2 only and are cleared for the other variants"
                    .into(),
            );
        }
        notes
    }

    /// The grid's `--set`s of one run (they follow the user's).
    fn overrides(&self, variant: QkNorm, seed: u64, lr: f64, threads: Option<usize>) -> Vec<String> {
        let mut overrides = vec![format!("model.qk_norm={}", variant_name(variant))];
        if self.l2_keys && variant != QkNorm::L2 {
            overrides.push("model.qk_norm_init_scale=null".into());
            overrides.push("model.qk_norm_length=null".into());
        }
        overrides.push(format!("train.seed={seed}"));
        overrides.push(format!("train.lr={}", yaml_float(lr)));
        if let Some((min_lr, base_lr)) = self.min_lr_scale {
            overrides.push(format!("train.min_lr={}", yaml_float(min_lr * lr / base_lr)));
        }
        if let Some(t) = threads {
            overrides.push(format!("train.threads={t}"));
        }
        overrides
    }
}

/// `KEY=VALUE` for each axis's level.
fn level_overrides(axes: &[Axis], levels: &[String]) -> Vec<String> {
    axes.iter()
        .zip(levels)
        .map(|(a, v)| format!("{}={v}", a.key))
        .collect()
}

/// Loads the config as one combination of levels sets it, so that a key that does not exist or
/// a value it cannot take is reported before anything runs; returns it (`None` without levels:
/// the base config).
fn check_setting(
    opts: &AblateOptions,
    user_overrides: &[String],
    levels: &[String],
) -> Result<Option<RunConfig>> {
    if levels.is_empty() {
        return Ok(None);
    }
    let overrides: Vec<String> = user_overrides.iter().chain(levels).cloned().collect();
    let cfg = RunConfig::load(&opts.config, &overrides).with_context(|| {
        format!(
            "--grid: the combination {} is not a valid config",
            levels.join(", ")
        )
    })?;
    Ok(Some(cfg))
}

/// Where one run sits in the grid.
struct Cell {
    levels: Vec<String>,
    label: String,
    variant: QkNorm,
    seed: u64,
    lr: f64,
}

/// One cell of the grid with its directory and exact command.
fn planned_run(cell: Cell, out: &Path, overrides: Vec<String>, base_command: &[String]) -> PlannedRun {
    let Cell {
        levels,
        label,
        variant,
        seed,
        lr,
    } = cell;
    let name = run_name(&label, variant, lr, seed);
    let dir = out.join(RUNS).join(&name);
    let config = Path::new(&base_command[2]);
    let command = train_command(&base_command[0], config, &overrides, Some(&dir));
    PlannedRun {
        name,
        variant,
        seed,
        lr,
        levels,
        dir,
        overrides,
        command,
    }
}
