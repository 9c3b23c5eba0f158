//! The ablation report: `report.md`, `report.json` and `plots/` in a sweep's output directory,
//! computed from the run directories alone (`summary.json`, `metrics.jsonl`, `config.yaml`,
//! checkpoint `state.json`) plus the sweep's `grid.json` and `status.json`, so `ember report DIR`
//! regenerates it without training. Nothing in it depends on when it was generated: the same
//! run directories give byte-identical files.
//!
//! Statistics (see [`stats`]): per variant and learning rate, mean ± sample std over seeds of
//! the finished runs (diverged runs are counted, not averaged); the paired difference to `none`
//! on the same seed with a two-sided 95% t interval (df = n − 1); and per variant the LR
//! sensitivity of Wortsman et al. (2023).

pub mod plots;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ember_trainer::checkpoint;
use ember_trainer::metrics::{self, Record};
use ember_trainer::train::RUN_CONFIG;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::layout::{
    disk_state, lr_label, read_summary, variant_name, DiskState, Hardware, Plan, SweepStatus, GRID,
    REPORT_JSON, REPORT_MD, RUNS, STATUS,
};
use stats::{lr_sensitivity, mean_std, paired_diff, MeanStd, PairedDiff};

/// The baseline every variant is paired against.
pub const BASELINE: &str = "none";
/// Confidence level of the paired intervals.
pub const LEVEL: f64 = 0.95;

/// Everything the report says, as written to `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub out_dir: PathBuf,
    /// The base config and the user's overrides (from grid.json).
    pub config: Option<PathBuf>,
    pub overrides: Vec<String>,
    pub base_command: Option<Vec<String>>,
    /// `seq2seq` or `lm`.
    pub arch: Option<String>,
    /// The quality column: `bleu` when eval records carry BLEU, else `ppl`.
    pub quality: String,
    pub variants: Vec<String>,
    pub lrs: Vec<f64>,
    pub seeds: Vec<u64>,
    /// Planned optimizer steps per run.
    pub steps: Option<u64>,
    pub hardware: Option<Hardware>,
    pub jobs: Option<usize>,
    pub threads: Option<usize>,
    /// Wall time of the sweep, summed over invocations of `ember ablate`.
    pub wall_secs: Option<f64>,
    pub invocations: usize,
    /// Training time summed over runs.
    pub train_secs: f64,
    pub counts: Counts,
    /// One per variant × learning rate.
    pub cells: Vec<Cell>,
    /// One per variant (empty with a single learning rate).
    pub lr_sensitivity: Vec<Sensitivity>,
    /// Where ℓ₀ (loss at initialisation) in the LR sensitivity came from.
    pub init_loss_source: String,
    pub runs: Vec<RunResult>,
    /// Relative to the output directory.
    pub plots: Vec<String>,
    pub notes: Vec<String>,
}

/// How many runs ended how.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub runs: usize,
    pub ok: usize,
    pub diverged: usize,
    pub failed: usize,
    /// Started but neither finished nor diverged (interrupted, or running now).
    pub incomplete: usize,
    pub not_run: usize,
}

/// One variant at one learning rate, over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub variant: String,
    pub lr: f64,
    pub counts: Counts,
    /// Parameters of the model (from a run's summary).
    pub params: Option<usize>,
    /// Over finished runs: final training objective, final validation loss, BLEU, perplexity,
    /// max |attention logit| (peak over training, and at the last logged step), tokens/s.
    pub train_loss: Option<MeanStd>,
    pub val_loss: Option<MeanStd>,
    pub bleu: Option<MeanStd>,
    pub ppl: Option<MeanStd>,
    pub max_attn_logit: Option<MeanStd>,
    pub final_attn_logit: Option<MeanStd>,
    pub tokens_per_sec: Option<MeanStd>,
    /// This variant − `none` on the same seed, per metric (empty for `none` itself).
    pub vs_none: BTreeMap<String, PairedDiff>,
}

/// LR sensitivity of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct Sensitivity {
    pub variant: String,
    /// Over seeds whose runs at every learning rate finished or diverged.
    pub value: Option<MeanStd>,
    pub per_seed: BTreeMap<u64, f64>,
    pub vs_none: Option<PairedDiff>,
    /// The learning rate with the lowest mean final validation loss over finished runs.
    pub best_lr: Option<f64>,
    pub best_val_loss: Option<f64>,
}

/// One run, as the report reads it.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub name: String,
    pub variant: String,
    pub seed: u64,
    pub lr: f64,
    /// `ok`, `diverged`, `failed`, `incomplete` or `not_run`.
    pub status: String,
    /// Why it diverged or failed.
    pub detail: Option<String>,
    pub stderr_tail: Option<String>,
    pub steps: Option<u64>,
    pub total_steps: Option<u64>,
    pub params: Option<usize>,
    pub final_train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_ppl: Option<f64>,
    pub bleu: Option<f64>,
    /// Validation loss before training (recorded when train.divergence_evals is set).
    pub init_val_loss: Option<f64>,
    pub vocab_size: Option<usize>,
    /// Max over attention modules of max |pre-softmax logit|: its peak over logged steps, and
    /// its value at the last logged step.
    pub max_attn_logit: Option<f64>,
    pub final_attn_logit: Option<f64>,
    /// Median over logged windows.
    pub tokens_per_sec: Option<f64>,
    pub train_secs: Option<f64>,
    #[serde(skip)]
    pub(crate) curves: Curves,
}

/// Per-step series of a run, for the plots.
#[derive(Debug, Clone, Default)]
pub(crate) struct Curves {
    pub train_loss: Vec<(u64, f64)>,
    pub val_loss: Vec<(u64, f64)>,
    pub max_logit: Vec<(u64, f64)>,
    pub bleu: Vec<(u64, f64)>,
}

/// Reads every run under `out_dir`, writes `report.md`, `report.json` and `plots/`, and returns
/// the report.
pub fn report(out_dir: &Path) -> Result<Report> {
    let plan: Option<Plan> = read_json(&out_dir.join(GRID))?;
    let status: Option<SweepStatus> = read_json(&out_dir.join(STATUS))?;
    let runs = load_runs(out_dir, plan.as_ref(), status.as_ref())?;
    if runs.is_empty() {
        bail!(
            "{} holds no runs: expected {GRID} or run directories under {}/",
            out_dir.display(),
            out_dir.join(RUNS).display()
        );
    }

    // Axes of the grid: the plan's order, then anything else found on disk.
    let mut variants: Vec<String> = plan
        .as_ref()
        .map(|p| p.variants.iter().map(|v| variant_name(*v)).collect())
        .unwrap_or_default();
    for r in &runs {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
    }
    if plan.is_none() {
        // No plan: the baseline first, then the variants' config order.
        let order = ["none", "layernorm", "rmsnorm", "l2"];
        variants.sort_by_key(|v| order.iter().position(|o| o == v).unwrap_or(order.len()));
    }
    let mut lrs: Vec<f64> = vec![];
    for r in &runs {
        if !lrs.iter().any(|l| same_lr(*l, r.lr)) {
            lrs.push(r.lr);
        }
    }
    lrs.sort_by(|a, b| a.total_cmp(b));
    let seeds: Vec<u64> = runs
        .iter()
        .map(|r| r.seed)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();

    let quality = if runs.iter().any(|r| r.bleu.is_some()) {
        "bleu"
    } else {
        "ppl"
    }
    .to_string();
    let find = |v: &str, lr: f64, s: u64| -> Option<&RunResult> {
        runs.iter()
            .find(|r| r.variant == v && same_lr(r.lr, lr) && r.seed == s)
            .map(|r| &r.result)
    };
    let ok_value = |v: &str, lr: f64, s: u64, f: &dyn Fn(&RunResult) -> Option<f64>| {
        find(v, lr, s).filter(|r| r.status == "ok").and_then(f)
    };

    type Getter = fn(&RunResult) -> Option<f64>;
    let metrics: [(&str, Getter); 7] = [
        ("train_loss", |r| r.final_train_loss),
        ("val_loss", |r| r.val_loss),
        ("bleu", |r| r.bleu),
        ("ppl", |r| r.val_ppl),
        ("max_attn_logit", |r| r.max_attn_logit),
        ("final_attn_logit", |r| r.final_attn_logit),
        ("tokens_per_sec", |r| r.tokens_per_sec),
    ];
    let has_baseline = variants.iter().any(|v| v == BASELINE);
    let mut cells = vec![];
    for v in &variants {
        for &lr in &lrs {
            let cell_runs: Vec<&RunResult> = runs
                .iter()
                .map(|r| &r.result)
                .filter(|r| &r.variant == v && same_lr(r.lr, lr))
                .collect();
            if cell_runs.is_empty() {
                continue;
            }
            let ok: Vec<&RunResult> = cell_runs.iter().copied().filter(|r| r.status == "ok").collect();
            let stat = |f: Getter| mean_std(&ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>());
            let mut vs_none = BTreeMap::new();
            if has_baseline && v != BASELINE {
                for (key, f) in metrics {
                    let a: Vec<Option<f64>> = seeds.iter().map(|&s| ok_value(v, lr, s, &f)).collect();
                    let b: Vec<Option<f64>> = seeds.iter().map(|&s| ok_value(BASELINE, lr, s, &f)).collect();
                    if let Some(d) = paired_diff(&a, &b, LEVEL) {
                        vs_none.insert(key.to_string(), d);
                    }
                }
            }
            cells.push(Cell {
                variant: v.clone(),
                lr,
                counts: count(cell_runs.iter().copied()),
                params: cell_runs.iter().find_map(|r| r.params),
                train_loss: stat(metrics[0].1),
                val_loss: stat(metrics[1].1),
                bleu: stat(metrics[2].1),
                ppl: stat(metrics[3].1),
                max_attn_logit: stat(metrics[4].1),
                final_attn_logit: stat(metrics[5].1),
                tokens_per_sec: stat(metrics[6].1),
                vs_none,
            });
        }
    }

    // LR sensitivity (needs at least two learning rates).
    let mut fallback_init = BTreeSet::new();
    let mut recorded_init = 0usize;
    let mut per_variant_seed: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    if lrs.len() >= 2 {
        for v in &variants {
            let mut per_seed = BTreeMap::new();
            for &s in &seeds {
                let cell: Vec<Option<&RunResult>> = lrs.iter().map(|&lr| find(v, lr, s)).collect();
                let complete = cell
                    .iter()
                    .all(|r| r.is_some_and(|r| r.status == "ok" || r.status == "diverged"));
                if !complete {
                    continue;
                }
                let cell: Vec<&RunResult> = cell.into_iter().flatten().collect();
                let init = match cell.iter().find_map(|r| r.init_val_loss) {
                    Some(l) => {
                        recorded_init += 1;
                        l
                    }
                    None => match cell.iter().find_map(|r| r.vocab_size) {
                        Some(vocab) => {
                            fallback_init.insert(vocab);
                            (vocab as f64).ln()
                        }
                        None => continue,
                    },
                };
                let losses: Vec<f64> = cell.iter().map(|r| r.val_loss.unwrap_or(f64::NAN)).collect();
                if let Some(x) = lr_sensitivity(&losses, init) {
                    per_seed.insert(s, x);
                }
            }
            per_variant_seed.insert(v.clone(), per_seed);
        }
    }
    let init_loss_source = match (recorded_init > 0, fallback_init.is_empty()) {
        (_, true) if lrs.len() < 2 => "not needed (one learning rate)".to_string(),
        (_, true) => "the validation loss before training, recorded by the runs (train.divergence_evals is set)".to_string(),
        (false, false) => format!(
            "ln(vocab_size) = ln {} — train.divergence_evals was not set, so the runs did not record their validation loss before training",
            fallback_init.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ln ")
        ),
        (true, false) => format!(
            "the recorded validation loss before training where available, else ln(vocab_size) = ln {} (runs without train.divergence_evals)",
            fallback_init.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ln ")
        ),
    };
    let mut lr_sens = vec![];
    if lrs.len() >= 2 {
        for v in &variants {
            let per_seed = per_variant_seed.get(v).cloned().unwrap_or_default();
            let value = mean_std(&per_seed.values().copied().collect::<Vec<_>>());
            let vs_none = (has_baseline && v != BASELINE)
                .then(|| {
                    let base = per_variant_seed.get(BASELINE)?;
                    let a: Vec<Option<f64>> = seeds.iter().map(|s| per_seed.get(s).copied()).collect();
                    let b: Vec<Option<f64>> = seeds.iter().map(|s| base.get(s).copied()).collect();
                    paired_diff(&a, &b, LEVEL)
                })
                .flatten();
            let best = cells
                .iter()
                .filter(|c| &c.variant == v)
                .filter_map(|c| c.val_loss.map(|m| (c.lr, m.mean)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            lr_sens.push(Sensitivity {
                variant: v.clone(),
                value,
                per_seed,
                vs_none,
                best_lr: best.map(|b| b.0),
                best_val_loss: best.map(|b| b.1),
            });
        }
    }

    let results: Vec<&RunResult> = runs.iter().map(|r| &r.result).collect();
    let plot_files = plots::write_plots(out_dir, &variants, &lrs, &results, &quality)?;

    let arch = runs.iter().find_map(|r| r.arch.clone());
    let report = Report {
        out_dir: out_dir.to_path_buf(),
        config: plan.as_ref().map(|p| p.config.clone()),
        overrides: plan.as_ref().map(|p| p.overrides.clone()).unwrap_or_default(),
        base_command: plan.as_ref().map(|p| p.base_command.clone()),
        arch,
        quality,
        variants,
        lrs,
        seeds,
        steps: runs.iter().find_map(|r| r.total_steps.or(r.planned_steps)),
        hardware: status
            .as_ref()
            .and_then(|s| s.invocations.first().map(|i| i.hardware.clone()))
            .or_else(|| plan.as_ref().map(|p| p.hardware.clone())),
        jobs: plan.as_ref().map(|p| p.jobs),
        threads: plan.as_ref().and_then(|p| p.threads),
        wall_secs: status
            .as_ref()
            .filter(|s| !s.invocations.is_empty())
            .map(|s| s.invocations.iter().map(|i| i.wall_secs).sum()),
        invocations: status.as_ref().map_or(0, |s| s.invocations.len()),
        train_secs: runs.iter().filter_map(|r| r.train_secs).sum(),
        counts: count(runs.iter().map(|r| &r.result)),
        cells,
        lr_sensitivity: lr_sens,
        init_loss_source,
        runs: runs.iter().map(|r| r.result.clone()).collect(),
        plots: plot_files,
        notes: plan.as_ref().map(|p| p.notes.clone()).unwrap_or_default(),
    };
    fs::write(out_dir.join(REPORT_MD), markdown(&report))
        .with_context(|| format!("writing {}", out_dir.join(REPORT_MD).display()))?;
    fs::write(
        out_dir.join(REPORT_JSON),
        serde_json::to_string_pretty(&report)? + "\n",
    )
    .with_context(|| format!("writing {}", out_dir.join(REPORT_JSON).display()))?;
    Ok(report)
}

fn count<'a>(runs: impl Iterator<Item = &'a RunResult>) -> Counts {
    let mut c = Counts::default();
    for r in runs {
        c.runs += 1;
        match r.status.as_str() {
            "ok" => c.ok += 1,
            "diverged" => c.diverged += 1,
            "failed" => c.failed += 1,
            "incomplete" => c.incomplete += 1,
            _ => c.not_run += 1,
        }
    }
    c
}

/// Learning rates equal as run names print them.
fn same_lr(a: f64, b: f64) -> bool {
    lr_label(a) == lr_label(b)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(_) => Ok(None),
    }
}

/// A run as loaded, with what the report needs beyond [`RunResult`].
pub(crate) struct LoadedRun {
    pub result: RunResult,
    pub arch: Option<String>,
    pub planned_steps: Option<u64>,
}

impl std::ops::Deref for LoadedRun {
    type Target = RunResult;
    fn deref(&self) -> &RunResult {
        &self.result
    }
}

/// The planned runs (missing ones as `not_run`) and every other run directory found.
fn load_runs(out_dir: &Path, plan: Option<&Plan>, status: Option<&SweepStatus>) -> Result<Vec<LoadedRun>> {
    let mut out = vec![];
    let mut seen = BTreeSet::new();
    if let Some(plan) = plan {
        for p in &plan.runs {
            let dir = out_dir.join(RUNS).join(&p.name);
            seen.insert(p.name.clone());
            let mut run = load_run(&dir, &p.name, status)?;
            if run.result.status == "not_run" || run.result.variant.is_empty() {
                run.result.variant = variant_name(p.variant);
                run.result.seed = p.seed;
                run.result.lr = p.lr;
            }
            out.push(run);
        }
    }
    let mut extra: Vec<PathBuf> = fs::read_dir(out_dir.join(RUNS))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(RUN_CONFIG).is_file())
        .collect();
    extra.sort();
    for dir in extra {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if seen.insert(name.clone()) {
            let run = load_run(&dir, &name, status)?;
            if !run.result.variant.is_empty() {
                out.push(run);
            }
        }
    }
    Ok(out)
}

fn load_run(dir: &Path, name: &str, status: Option<&SweepStatus>) -> Result<LoadedRun> {
    let cfg: Option<Value> = fs::read_to_string(dir.join(RUN_CONFIG))
        .ok()
        .and_then(|t| serde_saphyr::from_str(&t).ok());
    let at = |path: &[&str]| {
        let mut v = cfg.as_ref()?;
        for p in path {
            v = v.get(p)?;
        }
        Some(v.clone())
    };
    let summary = read_summary(dir);
    let sum = |k: &str| {
        summary
            .as_ref()
            .and_then(|s| s.get(k).cloned())
            .filter(|v| !v.is_null())
    };
    let record = status.and_then(|s| s.runs.get(name));

    let (state_label, detail) = match disk_state(dir) {
        DiskState::Finished => ("ok", None),
        DiskState::Diverged(reason) => ("diverged", Some(reason)),
        state => match record.map(|r| r.status.as_str()) {
            Some("failed") => ("failed", record.and_then(|r| r.detail.clone())),
            _ if state != DiskState::Empty || dir.join(metrics::METRICS).is_file() => ("incomplete", None),
            _ => ("not_run", None),
        },
    };
    let stderr_tail = (state_label == "failed")
        .then(|| record.and_then(|r| r.stderr_tail.clone()))
        .flatten();

    let records = metrics::read(&dir.join(metrics::METRICS))?;
    let mut curves = Curves::default();
    let mut rates = vec![];
    let (mut bleu, mut val) = (None, None);
    for r in &records {
        match r {
            Record::Train(t) => {
                if t.loss.is_finite() {
                    curves.train_loss.push((t.step, t.loss));
                }
                let m = t
                    .attn_max_logit
                    .iter()
                    .map(|&x| x as f64)
                    .filter(|x| x.is_finite())
                    .fold(f64::NAN, f64::max);
                if m.is_finite() {
                    curves.max_logit.push((t.step, m));
                }
                if t.tokens_per_sec.is_finite() && t.tokens_per_sec > 0.0 {
                    rates.push(t.tokens_per_sec);
                }
            }
            Record::Eval(e) if e.split == "valid" => {
                if e.loss.is_finite() {
                    curves.val_loss.push((e.step, e.loss));
                }
                val = Some(e.clone());
                if let Some(b) = e.bleu {
                    curves.bleu.push((e.step, b));
                    bleu = Some(b);
                }
            }
            Record::Eval(_) => {}
        }
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    let last_train = records.iter().rev().find_map(|r| match r {
        Record::Train(t) => Some(t),
        _ => None,
    });
    let init_val_loss = checkpoint::list(dir).iter().rev().find_map(|(_, ckpt)| {
        let state: Value = serde_json::from_str(&fs::read_to_string(ckpt.join("state.json")).ok()?).ok()?;
        state.get("initial_val_loss")?.as_f64()
    });
    let f = |v: Option<Value>| v.and_then(|v| v.as_f64());
    let result = RunResult {
        name: name.to_string(),
        variant: at(&["model", "qk_norm"])
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        seed: at(&["train", "seed"]).and_then(|v| v.as_u64()).unwrap_or(0),
        lr: f(at(&["train", "lr"])).unwrap_or(f64::NAN),
        status: state_label.to_string(),
        detail,
        stderr_tail,
        steps: sum("steps").and_then(|v| v.as_u64()),
        total_steps: sum("total_steps").and_then(|v| v.as_u64()),
        params: sum("params").and_then(|v| v.as_u64()).map(|p| p as usize),
        final_train_loss: last_train.map(|t| t.loss).or_else(|| f(sum("final_train_loss"))),
        val_loss: val.as_ref().map(|e| e.loss).or_else(|| f(sum("val_loss"))),
        val_ppl: val.as_ref().map(|e| e.ppl).or_else(|| f(sum("val_ppl"))),
        bleu,
        init_val_loss,
        vocab_size: at(&["model", "vocab_size"])
            .and_then(|v| v.as_u64())
            .map(|v| v as usize),
        max_attn_logit: curves.max_logit.iter().map(|p| p.1).reduce(f64::max),
        final_attn_logit: curves.max_logit.last().map(|p| p.1),
        tokens_per_sec: rates
            .get(rates.len() / 2)
            .copied()
            .or_else(|| f(sum("tokens_per_sec")).filter(|t| *t > 0.0)),
        train_secs: f(sum("train_secs")),
        curves,
    };
    Ok(LoadedRun {
        result,
        arch: at(&["model", "arch"]).and_then(|v| v.as_str().map(str::to_string)),
        planned_steps: at(&["train", "steps"]).and_then(|v| v.as_u64()),
    })
}

// ---------------------------------------------------------------------------------------------
// Markdown

/// `2.3456 ± 0.0123 (3)`.
fn fmt_ms(m: &Option<MeanStd>, prec: usize) -> String {
    match m {
        Some(m) => format!("{:.p$} ± {:.p$} ({})", m.mean, m.std, m.n, p = prec),
        None => "–".into(),
    }
}

/// `-0.0123 [-0.0456, +0.0210] (3)`.
fn fmt_diff(d: Option<&PairedDiff>, prec: usize) -> String {
    match d {
        Some(d) => match (d.ci_low, d.ci_high) {
            (Some(lo), Some(hi)) => format!("{:+.p$} [{:+.p$}, {:+.p$}] ({})", d.mean, lo, hi, d.n, p = prec),
            _ => format!("{:+.p$} [n/a] ({})", d.mean, d.n, p = prec),
        },
        None => "–".into(),
    }
}

fn fmt_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    }
}

fn fmt_count(c: &Counts) -> String {
    let mut s = format!("{}/{}", c.ok, c.runs);
    if c.diverged > 0 {
        s.push_str(&format!(", {} div.", c.diverged));
    }
    if c.failed > 0 {
        s.push_str(&format!(", {} failed", c.failed));
    }
    if c.incomplete + c.not_run > 0 {
        s.push_str(&format!(", {} pending", c.incomplete + c.not_run));
    }
    s
}

fn markdown(r: &Report) -> String {
    let lr = lr_label;
    let (q_key, q_name, q_prec) = if r.quality == "bleu" {
        ("bleu", "BLEU", 2)
    } else {
        ("ppl", "val ppl", 3)
    };
    let mut md = String::new();
    let title = r.config.as_ref().and_then(|c| c.file_stem()).map_or_else(
        || r.out_dir.display().to_string(),
        |s| s.to_string_lossy().to_string(),
    );
    md.push_str(&format!("# QK-norm ablation: {title}\n\n"));

    // What was run.
    let mut p = String::new();
    match &r.config {
        Some(c) => p.push_str(&format!("Trained `{}`", c.display())),
        None => p.push_str("Trained the runs under `runs/`"),
    }
    if !r.overrides.is_empty() {
        p.push_str(&format!(" with `--set {}`", r.overrides.join(" --set ")));
    }
    let params = r
        .cells
        .iter()
        .find(|c| c.variant == BASELINE)
        .or(r.cells.first())
        .and_then(|c| c.params);
    p.push_str(&format!(
        " ({}{}{}) for every QK-norm variant ({}) × seed ({}) × peak learning rate ({}): {} runs — {} finished, {} diverged, {} failed",
        r.arch.as_deref().unwrap_or("unknown architecture"),
        params.map_or(String::new(), |n| format!(", {n} parameters")),
        r.steps.map_or(String::new(), |s| format!(", {s} steps")),
        r.variants.join(", "),
        r.seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        r.lrs.iter().map(|&l| lr(l)).collect::<Vec<_>>().join(", "),
        r.counts.runs,
        r.counts.ok,
        r.counts.diverged,
        r.counts.failed,
    ));
    if r.counts.incomplete + r.counts.not_run > 0 {
        p.push_str(&format!(
            ", {} not finished yet",
            r.counts.incomplete + r.counts.not_run
        ));
    }
    p.push_str(". ");
    if let Some(h) = &r.hardware {
        p.push_str(&format!(
            "Hardware: {} ({} logical cores)",
            h.cpu, h.logical_cores
        ));
        if let (Some(j), Some(t)) = (r.jobs, r.threads) {
            p.push_str(&format!(
                ", {j} run{} at a time with {t} thread{} each",
                if j == 1 { "" } else { "s" },
                if t == 1 { "" } else { "s" }
            ));
            if j > 1 {
                p.push_str(" (tokens/s are measured with the runs sharing the machine)");
            }
        }
        p.push_str(". ");
    }
    if let Some(w) = r.wall_secs {
        p.push_str(&format!(
            "Wall time {} over {} invocation{}; ",
            fmt_duration(w),
            r.invocations,
            if r.invocations == 1 { "" } else { "s" }
        ));
    }
    p.push_str(&format!(
        "{} of training summed over runs. ",
        fmt_duration(r.train_secs)
    ));
    p.push_str(
        "For a given seed every variant starts from the same initial values of every parameter it shares \
         with the others and sees the same batches in the same order, so each variant is compared with \
         `none` seed by seed. Means ± sample standard deviations are over the seeds of finished runs \
         (n in parentheses); diverged runs are counted, not averaged.",
    );
    md.push_str(&p);
    md.push_str("\n\n");
    if let Some(cmd) = &r.base_command {
        // The base command ends with `--quiet --json`; the grid's keys go before them.
        let head = &cmd[..cmd.len().saturating_sub(2)];
        md.push_str(&format!(
            "Each run: `{} --set model.qk_norm=V --set train.seed=S --set train.lr=LR{} --run-dir {}/runs/V-lrLR-seedS --quiet --json`.\n",
            head.join(" "),
            r.threads.map_or(String::new(), |t| format!(" --set train.threads={t}")),
            r.out_dir.display()
        ));
    }
    for n in &r.notes {
        md.push_str(&format!("Note: {n}.\n"));
    }
    md.push('\n');

    // Results.
    md.push_str("## Results\n\n");
    md.push_str(&format!(
        "Final values per variant and peak learning rate, mean ± std (n seeds). Losses are per target \
         token in nats; the train loss is the training objective over the last logging window; max attn \
         logit is the largest |pre-softmax attention logit| over all attention modules and logged steps.\n\n\
         | variant | peak LR | finished | train loss | val loss | Δ val loss vs none [95% CI] | {q_name} | Δ {q_name} vs none [95% CI] | max attn logit | tokens/s |\n\
         |---|---|---|---|---|---|---|---|---|---|\n"
    ));
    for c in &r.cells {
        let q = if q_key == "bleu" { &c.bleu } else { &c.ppl };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.variant,
            lr(c.lr),
            fmt_count(&c.counts),
            fmt_ms(&c.train_loss, 4),
            fmt_ms(&c.val_loss, 4),
            if c.variant == BASELINE {
                "(baseline)".into()
            } else {
                fmt_diff(c.vs_none.get("val_loss"), 4)
            },
            fmt_ms(q, q_prec),
            if c.variant == BASELINE {
                "(baseline)".into()
            } else {
                fmt_diff(c.vs_none.get(q_key), q_prec)
            },
            fmt_ms(&c.max_attn_logit, 2),
            fmt_ms(&c.tokens_per_sec, 0),
        ));
    }
    md.push('\n');

    // Paired differences, every metric.
    if r.cells.iter().any(|c| !c.vs_none.is_empty()) {
        md.push_str(&format!(
            "## Paired differences vs `none`\n\n\
             Δ = variant − none on the same seed and learning rate: mean [95% CI] (n seeds with both runs \
             finished); two-sided t interval, df = n − 1. Lower is better for losses and {}; higher for {}.\n\n\
             | variant | peak LR | Δ train loss | Δ val loss | Δ {q_name} | Δ max attn logit | Δ final attn logit | Δ tokens/s |\n\
             |---|---|---|---|---|---|---|---|\n",
            if q_key == "ppl" { "perplexity" } else { "attention logits" },
            if q_key == "bleu" { "BLEU" } else { "tokens/s" },
        ));
        for c in r.cells.iter().filter(|c| c.variant != BASELINE) {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.variant,
                lr(c.lr),
                fmt_diff(c.vs_none.get("train_loss"), 4),
                fmt_diff(c.vs_none.get("val_loss"), 4),
                fmt_diff(c.vs_none.get(q_key), q_prec),
                fmt_diff(c.vs_none.get("max_attn_logit"), 2),
                fmt_diff(c.vs_none.get("final_attn_logit"), 2),
                fmt_diff(c.vs_none.get("tokens_per_sec"), 0),
            ));
        }
        md.push('\n');
    }

    // LR sensitivity.
    md.push_str("## LR sensitivity\n\n");
    if r.lr_sensitivity.is_empty() {
        md.push_str("Not computed: the sweep has a single learning rate.\n\n");
    } else {
        md.push_str(&format!(
            "As Wortsman et al. (2023) define it: the mean over the {} swept learning rates of \
             min(ℓ(η), ℓ₀) − ℓ*, where ℓ(η) is the final validation loss at peak learning rate η, ℓ* the \
             best of them, and ℓ₀ the loss at initialisation — here {}. A diverged run counts as \
             min(its final loss, ℓ₀). Computed per seed (seeds with a finished or diverged run at every \
             learning rate), then mean ± std over seeds; lower means less sensitive.\n\n\
             | variant | LR sensitivity | Δ vs none [95% CI] | best peak LR (mean val loss) |\n\
             |---|---|---|---|\n",
            r.lrs.len(),
            r.init_loss_source
        ));
        for s in &r.lr_sensitivity {
            md.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                s.variant,
                fmt_ms(&s.value, 4),
                if s.variant == BASELINE {
                    "(baseline)".into()
                } else {
                    fmt_diff(s.vs_none.as_ref(), 4)
                },
                match (s.best_lr, s.best_val_loss) {
                    (Some(l), Some(v)) => format!("{} ({v:.4})", lr(l)),
                    _ => "–".into(),
                }
            ));
        }
        md.push('\n');
    }

    // Runs that did not finish.
    let bad: Vec<&RunResult> = r.runs.iter().filter(|x| x.status != "ok").collect();
    if !bad.is_empty() {
        md.push_str("## Diverged, failed and unfinished runs\n\n");
        for x in bad {
            let what = match x.status.as_str() {
                "not_run" => "not run yet".to_string(),
                "incomplete" => format!(
                    "interrupted{} (re-running `ember ablate` resumes it)",
                    x.steps.map_or(String::new(), |s| format!(" at step {s}"))
                ),
                s => s.to_string(),
            };
            md.push_str(&format!(
                "- `{}`: {what}{}\n",
                x.name,
                x.detail.as_ref().map_or(String::new(), |d| format!(" — {d}"))
            ));
            if let Some(tail) = &x.stderr_tail {
                md.push_str("\n  ```text\n");
                for l in tail.lines() {
                    md.push_str(&format!("  {l}\n"));
                }
                md.push_str("  ```\n\n");
            }
        }
        md.push('\n');
    }

    // Every run, folded away.
    md.push_str(&format!(
        "<details><summary>Every run ({})</summary>\n\n\
         | run | status | steps | train loss | val loss | {q_name} | max attn logit | tokens/s | train time |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        r.runs.len()
    ));
    let opt = |v: Option<f64>, p: usize| {
        v.filter(|x| x.is_finite())
            .map_or("–".to_string(), |x| format!("{x:.p$}"))
    };
    for x in &r.runs {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x.name,
            x.status,
            match (x.steps, x.total_steps) {
                (Some(a), Some(b)) => format!("{a}/{b}"),
                _ => "–".into(),
            },
            opt(x.final_train_loss, 4),
            opt(x.val_loss, 4),
            opt(if q_key == "bleu" { x.bleu } else { x.val_ppl }, q_prec),
            opt(x.max_attn_logit, 2),
            opt(x.tokens_per_sec, 0),
            x.train_secs.map_or("–".into(), fmt_duration),
        ));
    }
    md.push_str("\n</details>\n\n");

    // Plots.
    if !r.plots.is_empty() {
        md.push_str("## Plots\n\nEach also as SVG beside the PNG. Lines: mean over seeds; shading: min–max over seeds.\n\n");
        for p in r.plots.iter().filter(|p| p.ends_with(".png")) {
            let stem = Path::new(p)
                .file_stem()
                .map_or(String::new(), |s| s.to_string_lossy().to_string());
            md.push_str(&format!("![{stem}]({p})\n\n"));
        }
    }
    md.push_str(&format!(
        "Regenerate this report (and report.json, plots/) without training: `ember report {}`.\n",
        r.out_dir.display()
    ));
    md
}
