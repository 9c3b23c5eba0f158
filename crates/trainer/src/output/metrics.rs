//! `metrics.jsonl` (one JSON object per logged step or evaluation), its CSV export, and what
//! the user sees while a run trains: a progress bar on a terminal, plain lines otherwise.

use crate::{say, tell};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::run_dir::{METRICS, METRICS_CSV};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Train(TrainRecord),
    Eval(EvalRecord),
}

impl Record {
    pub fn step(&self) -> u64 {
        match self {
            Record::Train(r) => r.step,
            Record::Eval(r) => r.step,
        }
    }
}

/// Training metrics, averaged over the steps since the previous record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    pub step: u64,
    pub epoch: u64,
    /// Training objective per target token (label smoothing and z-loss included); null when
    /// every step of the window was skipped for non-finite values.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Unsmoothed negative log-likelihood per target token.
    #[serde(deserialize_with = "nan_if_null")]
    pub nll: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    #[serde(deserialize_with = "nan_if_null")]
    pub grad_norm: f64,
    pub tokens_per_sec: f64,
    pub elapsed_secs: f64,
    /// Steps skipped so far because of a non-finite loss or gradient.
    pub skipped_steps: u64,
    /// Per attention module (forward order), max |pre-softmax logit| on this step's first micro-batch.
    pub attn_max_logit: Vec<f32>,
    /// Per attention module, mean attention entropy (nats).
    pub attn_entropy: Vec<f32>,
}

/// A validation result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub step: u64,
    pub split: String,
    /// Null when the model's outputs were not finite.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ppl: f64,
    pub tokens: u64,
    pub elapsed_secs: f64,
    /// Corpus BLEU (sacreBLEU default) of the decoded split, for translation runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bleu: Option<f64>,
}

/// JSON has no NaN: serde_json writes a non-finite number as null, which reads back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Appends records to `metrics.jsonl`, one flushed line each, so a killed run keeps its history.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Opens the log of `run_dir`, dropping records after `keep_through_step` (a resumed run
    /// re-logs the steps after its checkpoint; without this they would appear twice) and a line
    /// torn by a kill. The lines kept are kept byte for byte (numbers are never re-printed), and
    /// a log with nothing to drop is not rewritten at all.
    pub fn open(run_dir: &Path, keep_through_step: Option<u64>) -> Result<Self> {
        let path = run_dir.join(METRICS);
        if let Some(last) = keep_through_step {
            // Bytes that are not UTF-8 (a damaged file) become lines no record parses from,
            // which are dropped below like a torn one.
            let text = match ember_data::io::read_own(&path) {
                Ok(t) => String::from_utf8_lossy(&t).into_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            let keep = |line: &str| serde_json::from_str::<Record>(line).is_ok_and(|r| r.step() <= last);
            let lines: Vec<&str> = text.lines().collect();
            let kept: Vec<&str> = lines.iter().copied().filter(|l| keep(l)).collect();
            let complete = text.is_empty() || text.ends_with('\n');
            if kept.len() != lines.len() || !complete {
                let mut out = kept.join("\n");
                if !out.is_empty() {
                    out.push('\n');
                }
                crate::run::files::write_atomic(&path, out.as_bytes())?;
            }
        }
        // O_NOFOLLOW: the log is appended to in place, so a link put in its place would have
        // the records written into whatever it points at.
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => anyhow::anyhow!(
                    "{} is a symbolic link, not the metrics log ember keeps there; ember does not \
                     write through it. Remove it (`rm {}` removes only the link) and run again.",
                    path.display(),
                    path.display()
                ),
                _ => anyhow::Error::new(e).context(format!("opening {}", path.display())),
            })?;
        Ok(Self { path, file })
    }

    pub fn write(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Reads `metrics.jsonl`; a torn last line (the process was killed mid-write) is ignored.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    Ok(read_counting(path)?.0)
}

/// As [`read`], also counting the complete lines that are not a record (the file was damaged
/// or is not a metrics log); a missing file is an empty log.
pub fn read_counting(path: &Path) -> Result<(Vec<Record>, usize)> {
    let bytes = match ember_data::io::read_own(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], 0)),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let text = String::from_utf8_lossy(&bytes);
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut bad) = (vec![], 0);
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(r) => out.push(r),
            // The last line of a log a kill tore is expected; anything else is damage.
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(_) if line.trim().is_empty() => {}
            Err(_) => bad += 1,
        }
    }
    Ok((out, bad))
}

/// Writes `metrics.csv`: one row per record, train and eval columns side by side.
pub fn export_csv(run_dir: &Path) -> Result<()> {
    let records = read(&run_dir.join(METRICS))?;
    let mut out = String::from("kind,step,epoch,loss,nll,lr,grad_norm,tokens_per_sec,elapsed_secs,max_attn_logit,split,val_loss,val_ppl\n");
    for r in records {
        match r {
            Record::Train(t) => {
                let max_logit = t.attn_max_logit.iter().cloned().fold(f32::NAN, f32::max);
                out.push_str(&format!(
                    "train,{},{},{},{},{},{},{},{},{},,,\n",
                    t.step,
                    t.epoch,
                    t.loss,
                    t.nll,
                    t.lr,
                    t.grad_norm,
                    t.tokens_per_sec,
                    t.elapsed_secs,
                    max_logit
                ));
            }
            Record::Eval(e) => out.push_str(&format!(
                "eval,{},,,,,,,{},,{},{},{}\n",
                e.step, e.elapsed_secs, e.split, e.loss, e.ppl
            )),
        }
    }
    // Through a rename: a link put in its place is replaced, never written through.
    crate::run::files::write_atomic(&run_dir.join(METRICS_CSV), out.as_bytes())
}

/// How much the run prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    Quiet,
    Normal,
}

/// Progress display: an indicatif bar with loss, tokens/s and ETA on a terminal; plain log
/// lines otherwise (CI logs, pipes); nothing with `--quiet`.
pub struct Progress {
    bar: Option<ProgressBar>,
    verbosity: Verbosity,
}

impl Progress {
    pub fn new(total_steps: u64, start_step: u64, verbosity: Verbosity) -> Self {
        let bar = (verbosity == Verbosity::Normal && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::new(total_steps);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps {msg} [{elapsed_precise} < {eta_precise}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_position(start_step);
            bar
        });
        Self { bar, verbosity }
    }

    /// Plain lines even on a terminal: for rank 0 of a job, whose stdout `mpirun` makes a
    /// terminal while stderr, where a bar draws, is a pipe.
    pub fn plain(verbosity: Verbosity) -> Self {
        Self { bar: None, verbosity }
    }

    pub fn train(&self, r: &TrainRecord, total: u64) {
        let max_logit = r.attn_max_logit.iter().cloned().fold(0f32, f32::max);
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.step);
                bar.set_message(format!(
                    "loss {:.4} | {:.0} tok/s | lr {:.2e} | max logit {:.1}",
                    r.loss, r.tokens_per_sec, r.lr, max_logit
                ));
            }
            None if self.verbosity == Verbosity::Normal => say!(
                "step {:>6}/{total} | loss {:.4} | nll {:.4} | lr {:.3e} | grad {:.3} | {:.0} tok/s | max logit {:.2} | {:.1}s",
                r.step, r.loss, r.nll, r.lr, r.grad_norm, r.tokens_per_sec, max_logit, r.elapsed_secs
            ),
            None => {}
        }
    }

    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None if self.verbosity == Verbosity::Normal => say!("{text}"),
            None => {}
        }
    }

    /// Something the user must see even with `--quiet` (on stderr): changed config keys on
    /// resume, data that was skipped or truncated.
    pub fn warn(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| tell!("note: {text}")),
            None => tell!("note: {text}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
