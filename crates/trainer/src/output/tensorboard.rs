//! A run's TensorBoard log (`log.tensorboard`, on by default): event files in the run
//! directory beside `metrics.jsonl`, holding the same numbers under TensorBoard tags, so that
//! `tensorboard --logdir runs/` shows every run, and an ablation's runs side by side.
//!
//! Tags: `train/loss`, `train/nll`, `train/lr`, `train/grad_norm`, `train/tokens_per_sec`,
//! `attn/max_logit/<module>` and `attn/entropy/<module>` per attention module (e.g.
//! `decoder.layers.0.self_attn`), `eval/loss`, `eval/ppl`, and `eval/bleu` for translation.
//!
//! Each invocation of `ember train` writes a new file (the writer is in `ember-tensorboard`); a
//! resumed run starts its file with a restart marker at its first step, so TensorBoard drops what
//! the interrupted process logged after its last checkpoint, as `metrics.jsonl` does. Only values
//! already computed for `metrics.jsonl` are written: nothing here touches the training numbers.

use std::path::Path;

use anyhow::{Context, Result};
use ember_model::AttentionStats;
use ember_tensorboard::{now, EventWriter};

use crate::metrics::{EvalRecord, TrainRecord};

/// The TensorBoard side of a run's metrics; does nothing when switched off.
pub struct RunEvents {
    writer: Option<EventWriter>,
}

impl RunEvents {
    /// A new event file in `run_dir` when `enabled`. `resumed_after` is the checkpoint step a
    /// resumed run continues from.
    pub fn open(run_dir: &Path, enabled: bool, resumed_after: Option<u64>) -> Result<Self> {
        if !enabled {
            return Ok(Self { writer: None });
        }
        let mut writer = EventWriter::create(run_dir)
            .with_context(|| format!("creating a TensorBoard event file in {}", run_dir.display()))?;
        if let Some(step) = resumed_after {
            writer
                .session_start(step as i64 + 1, now())
                .and_then(|()| writer.flush())
                .with_context(|| format!("writing {}", writer.path().display()))?;
        }
        Ok(Self { writer: Some(writer) })
    }

    /// A training record; `attention` names the modules of its per-module statistics.
    pub fn train(&mut self, r: &TrainRecord, attention: &[AttentionStats]) -> Result<()> {
        let Some(w) = &mut self.writer else {
            return Ok(());
        };
        let mut tags: Vec<(String, f32)> = vec![
            ("train/loss".into(), r.loss as f32),
            ("train/nll".into(), r.nll as f32),
            ("train/lr".into(), r.lr as f32),
            ("train/grad_norm".into(), r.grad_norm as f32),
            ("train/tokens_per_sec".into(), r.tokens_per_sec as f32),
        ];
        for (i, a) in attention.iter().enumerate() {
            if let (Some(&max_logit), Some(&entropy)) = (r.attn_max_logit.get(i), r.attn_entropy.get(i)) {
                tags.push((format!("attn/max_logit/{}", a.module), max_logit));
                tags.push((format!("attn/entropy/{}", a.module), entropy));
            }
        }
        write(w, r.step, &tags)
    }

    pub fn eval(&mut self, r: &EvalRecord) -> Result<()> {
        let Some(w) = &mut self.writer else {
            return Ok(());
        };
        let mut tags: Vec<(String, f32)> = vec![
            ("eval/loss".into(), r.loss as f32),
            ("eval/ppl".into(), r.ppl as f32),
        ];
        if let Some(bleu) = r.bleu {
            tags.push(("eval/bleu".into(), bleu as f32));
        }
        write(w, r.step, &tags)
    }
}

/// One event per record, flushed, so a killed run keeps everything logged before it died.
fn write(w: &mut EventWriter, step: u64, tags: &[(String, f32)]) -> Result<()> {
    let values: Vec<(&str, f32)> = tags.iter().map(|(t, v)| (t.as_str(), *v)).collect();
    w.scalars(step as i64, now(), &values)
        .and_then(|()| w.flush())
        .with_context(|| format!("writing {}", w.path().display()))
}
