//! Reading a sweep's run directories: each run's outcome, final numbers and per-step curves, from
//! its `config.yaml`, `summary.json`, `metrics.jsonl` and checkpoint `state.json`, and its record
//! in `status.json`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;
use ember_trainer::checkpoint;
use ember_trainer::metrics::{self, Record};
use ember_trainer::run_dir::{METRICS, RUN_CONFIG, STATE, SUMMARY};
use serde::Serialize;
use serde_json::Value;

use crate::layout::{
    disk_state, read_summary, variant_name, Axis, DiskState, Plan, RunRecord, SweepStatus, RUNS,
};

/// One run, as the report reads it.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub name: String,
    pub variant: String,
    pub seed: u64,
    pub lr: f64,
    /// Its value on each of the sweep's axes, in their order (empty without axes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    /// `ok`, `diverged`, `running`, `failed`, `incomplete` or `not_run`.
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
    /// What computed its steps (`AVX-512`, `AVX2`, `CUDA`), as its newest checkpoint records it;
    /// two when it was resumed on another unit, none for checkpoints from before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vector_units: Vec<String>,
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
/// A run as loaded, with what the report needs beyond [`RunResult`].
pub(crate) struct LoadedRun {
    pub result: RunResult,
    pub arch: Option<String>,
    pub planned_steps: Option<u64>,
    /// Files of the run that could not be read as what they should be, in words.
    pub warnings: Vec<String>,
}

impl std::ops::Deref for LoadedRun {
    type Target = RunResult;
    fn deref(&self) -> &RunResult {
        &self.result
    }
}

/// The planned runs (missing ones as `not_run`) and every other run directory found.
pub(crate) fn load_runs(
    out_dir: &Path,
    plan: Option<&Plan>,
    status: Option<&SweepStatus>,
) -> Result<Vec<LoadedRun>> {
    let mut out = vec![];
    let mut seen = BTreeSet::new();
    if let Some(plan) = plan {
        for p in &plan.runs {
            let dir = out_dir.join(RUNS).join(&p.name);
            seen.insert(p.name.clone());
            let mut run = load_run(&dir, &p.name, status, &[])?;
            if run.result.status == "not_run" || run.result.variant.is_empty() {
                run.result.variant = variant_name(p.variant);
                run.result.seed = p.seed;
                run.result.lr = p.lr;
            }
            run.result.levels = p.levels.clone();
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
            let axes: &[Axis] = plan.map_or(&[], |p| &p.axes);
            let run = load_run(&dir, &name, status, axes)?;
            if !run.result.variant.is_empty() {
                out.push(run);
            }
        }
    }
    Ok(out)
}

/// One run directory; `axes` are the keys whose values the run's own config gives as its levels
/// (a run the plan does not list).
fn load_run(dir: &Path, name: &str, status: Option<&SweepStatus>, axes: &[Axis]) -> Result<LoadedRun> {
    let cfg: Option<Value> = ember_data::io::read_own_to_string(dir.join(RUN_CONFIG))
        .ok()
        .and_then(|t| serde_saphyr::from_str(&t).ok());
    let at = |path: &[&str]| {
        let mut v = cfg.as_ref()?;
        for p in path {
            v = v.get(p)?;
        }
        Some(v.clone())
    };
    let mut warnings = vec![];
    let summary = read_summary(dir);
    let summary_path = dir.join(SUMMARY);
    if summary.is_none() && summary_path.is_file() {
        warnings.push(format!(
            "{} is not a summary ember wrote (not valid JSON): the run is reported from its \
             checkpoints and metrics.jsonl instead",
            summary_path.display()
        ));
    }
    let sum = |k: &str| {
        summary
            .as_ref()
            .and_then(|s| s.get(k).cloned())
            .filter(|v| !v.is_null())
    };
    let record = status.and_then(|s| s.runs.get(name));
    let (state_label, detail) = run_status(dir, record);
    let stderr_tail = (state_label == "failed")
        .then(|| record.and_then(|r| r.stderr_tail.clone()))
        .flatten();
    let progress = read_progress(dir)?;
    if progress.damaged_lines > 0 {
        warnings.push(format!(
            "{}: {} line(s) are not metrics records (the file is damaged or is not a metrics log); \
             the report uses the {} record(s) it could read",
            dir.join(METRICS).display(),
            progress.damaged_lines,
            progress.records
        ));
    }
    let f = |v: Option<Value>| v.and_then(|v| v.as_f64());
    let result = RunResult {
        name: name.to_string(),
        variant: at(&["model", "qk_norm"])
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        seed: at(&["train", "seed"]).and_then(|v| v.as_u64()).unwrap_or(0),
        lr: f(at(&["train", "lr"])).unwrap_or(f64::NAN),
        levels: axes
            .iter()
            .map(|a| {
                let path: Vec<&str> = a.key.split('.').collect();
                match at(&path) {
                    Some(Value::String(s)) => s,
                    Some(v) => v.to_string(),
                    None => "?".into(),
                }
            })
            .collect(),
        status: state_label.to_string(),
        detail,
        stderr_tail,
        steps: sum("steps").and_then(|v| v.as_u64()),
        total_steps: sum("total_steps").and_then(|v| v.as_u64()),
        params: sum("params").and_then(|v| v.as_u64()).map(|p| p as usize),
        final_train_loss: progress.final_train_loss.or_else(|| f(sum("final_train_loss"))),
        val_loss: progress.val_loss.or_else(|| f(sum("val_loss"))),
        val_ppl: progress.val_ppl.or_else(|| f(sum("val_ppl"))),
        bleu: progress.bleu,
        init_val_loss: initial_val_loss(dir),
        vector_units: vector_units(dir),
        vocab_size: at(&["model", "vocab_size"])
            .and_then(|v| v.as_u64())
            .map(|v| v as usize),
        max_attn_logit: progress.curves.max_logit.iter().map(|p| p.1).reduce(f64::max),
        final_attn_logit: progress.curves.max_logit.last().map(|p| p.1),
        tokens_per_sec: progress
            .tokens_per_sec
            .or_else(|| f(sum("tokens_per_sec")).filter(|t| *t > 0.0)),
        train_secs: f(sum("train_secs")),
        curves: progress.curves,
    };
    Ok(LoadedRun {
        result,
        arch: at(&["model", "arch"]).and_then(|v| v.as_str().map(str::to_string)),
        planned_steps: at(&["train", "steps"]).and_then(|v| v.as_u64()),
        warnings,
    })
}

/// `ok`, `diverged`, `running`, `failed`, `incomplete` or `not_run`, and why it diverged or failed: the run
/// directory's own files decide, then the sweep's record of a crash.
fn run_status(dir: &Path, record: Option<&RunRecord>) -> (&'static str, Option<String>) {
    match disk_state(dir) {
        DiskState::Finished => ("ok", None),
        DiskState::Diverged(reason) => ("diverged", Some(reason)),
        // A process holds the run directory: it is training now, whatever an earlier
        // attempt's record says.
        _ if ember_trainer::run_lock::holder(dir).is_some() => (
            "running",
            ember_trainer::run_lock::holder(dir).map(|h| format!("training now ({h})")),
        ),
        state => match record.map(|r| r.status.as_str()) {
            Some("failed") => ("failed", record.and_then(|r| r.detail.clone())),
            _ if state != DiskState::Empty || dir.join(METRICS).is_file() => ("incomplete", None),
            _ => ("not_run", None),
        },
    }
}

/// What a run's `metrics.jsonl` says.
struct Progress {
    curves: Curves,
    /// The training objective of the last logged window.
    final_train_loss: Option<f64>,
    /// Loss and perplexity of the last validation.
    val_loss: Option<f64>,
    val_ppl: Option<f64>,
    /// The last validation BLEU.
    bleu: Option<f64>,
    /// Median over logged windows.
    tokens_per_sec: Option<f64>,
    /// Records read, and complete lines that were not one.
    records: usize,
    damaged_lines: usize,
}

fn read_progress(dir: &Path) -> Result<Progress> {
    let (records, damaged_lines) = metrics::read_counting(&dir.join(METRICS))?;
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
                val = Some(e);
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
    Ok(Progress {
        final_train_loss: last_train.map(|t| t.loss),
        val_loss: val.map(|e| e.loss),
        val_ppl: val.map(|e| e.ppl),
        bleu,
        tokens_per_sec: rates.get(rates.len() / 2).copied(),
        curves,
        records: records.len(),
        damaged_lines,
    })
}

/// The units that computed the run's steps, as its newest checkpoint records them.
fn vector_units(dir: &Path) -> Vec<String> {
    let newest = checkpoint::list(dir).pop();
    newest
        .and_then(|(_, ckpt)| {
            let state: Value =
                serde_json::from_str(&ember_data::io::read_own_to_string(ckpt.join(STATE)).ok()?).ok()?;
            serde_json::from_value(state.get("vector_units")?.clone()).ok()
        })
        .unwrap_or_default()
}

/// The validation loss before training, as the newest checkpoint that recorded it says.
fn initial_val_loss(dir: &Path) -> Option<f64> {
    checkpoint::list(dir).iter().rev().find_map(|(_, ckpt)| {
        let state: Value =
            serde_json::from_str(&ember_data::io::read_own_to_string(ckpt.join(STATE)).ok()?).ok()?;
        state.get("initial_val_loss")?.as_f64()
    })
}
