//! Examples that do not fit the model's positions, found when the data is loaded rather than at
//! the first evaluation that meets them (after the training time is spent).
//!
//! A translation pair fits when its source has at most `max_seq_len` tokens and its target at
//! most `max_seq_len - 1` (the decoder reads bos + target and predicts target + eos). What
//! happens to one that does not is `data.too_long`: an error naming the file and line (the
//! default), or skip, or truncate.

use std::path::Path;

use crate::config::{CorpusConfig, DataConfig, TooLong};
use crate::corpus::{PairSplit, Splits};
use crate::error::{DataError, Result};

/// What [`fit_to_positions`] did, split by split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LengthReport {
    /// (split name, pairs dropped or cut) for every split that had any.
    pub changed: Vec<(String, usize)>,
    pub policy: Option<TooLong>,
}

impl LengthReport {
    /// `valid: 3 pairs skipped (longer than model.max_seq_len = 128)`, or `None` if nothing changed.
    pub fn describe(&self, max_seq_len: usize) -> Option<String> {
        if self.changed.is_empty() {
            return None;
        }
        let verb = match self.policy {
            Some(TooLong::Truncate) => "truncated",
            _ => "skipped",
        };
        Some(format!(
            "data.too_long: {} pairs {verb} (longer than model.max_seq_len = {max_seq_len})",
            self.changed
                .iter()
                .map(|(s, n)| format!("{s}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Applies `cfg.too_long` to every translation split against `max_seq_len` positions. Language
/// model streams are cut into windows by the batcher and are not affected.
pub fn fit_to_positions(splits: &mut Splits, cfg: &DataConfig, max_seq_len: usize) -> Result<LengthReport> {
    let mut report = LengthReport {
        changed: vec![],
        policy: Some(cfg.too_long),
    };
    let Splits::Translation(t) = splits else {
        return Ok(report);
    };
    let files = |split: &str| -> Option<(&Path, &Path)> {
        let CorpusConfig::Parallel(p) = &cfg.corpus else {
            return None;
        };
        let pair = match split {
            "train" => Some(&p.train),
            "valid" => Some(&p.valid),
            _ => p.test.as_ref(),
        }?;
        Some((pair.source.as_path(), pair.target.as_path()))
    };
    let mut splits: Vec<(&str, &mut PairSplit)> = vec![("train", &mut t.train), ("valid", &mut t.valid)];
    if let Some(test) = t.test.as_mut() {
        splits.push(("test", test));
    }
    for (name, split) in splits {
        let n = fit_split(split, name, files(name), cfg.too_long, max_seq_len)?;
        if n > 0 {
            report.changed.push((name.to_string(), n));
        }
    }
    Ok(report)
}

/// Fits one split; returns how many pairs were skipped or truncated.
fn fit_split(
    split: &mut PairSplit,
    name: &str,
    files: Option<(&Path, &Path)>,
    policy: TooLong,
    max_seq_len: usize,
) -> Result<usize> {
    let max_target = max_seq_len.saturating_sub(1);
    let too_long: Vec<usize> = (0..split.examples.len())
        .filter(|&i| {
            let e = &split.examples[i];
            e.source.len() > max_seq_len || e.target.len() > max_target
        })
        .collect();
    let Some(&first) = too_long.first() else {
        return Ok(0);
    };
    match policy {
        TooLong::Error => {
            let e = &split.examples[first];
            let line = split.lines.get(first).copied().unwrap_or(first + 1);
            let (file, side, tokens, positions) = if e.source.len() > max_seq_len {
                (files.map(|f| f.0), "source", e.source.len(), e.source.len())
            } else {
                (files.map(|f| f.1), "target", e.target.len(), e.target.len() + 1)
            };
            let location = match file {
                Some(f) => format!("{}:{line}", f.display()),
                None => format!("the embedded task's {name} split, pair {line}"),
            };
            Err(DataError::TooLongForModel {
                location,
                side: side.into(),
                tokens,
                positions,
                max_seq_len,
                others: too_long.len() - 1,
                split: name.into(),
            })
        }
        TooLong::Truncate => {
            for &i in &too_long {
                let e = &mut split.examples[i];
                e.source.truncate(max_seq_len);
                e.target.truncate(max_target);
            }
            split.refresh_stats();
            Ok(too_long.len())
        }
        TooLong::Skip => {
            let mut keep = vec![true; split.examples.len()];
            for &i in &too_long {
                keep[i] = false;
            }
            let mut k = keep.iter();
            split.examples.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            split.sources.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            split.references.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            split.lines.retain(|_| *k.next().unwrap_or(&true));
            split.stats.dropped_too_long += too_long.len();
            split.refresh_stats();
            if split.examples.is_empty() {
                return Err(DataError::config(
                    "data.too_long",
                    format!(
                        "skip leaves the {name} split empty: all of its {} pairs are longer than \
                         model.max_seq_len = {max_seq_len}; raise model.max_seq_len or use truncate",
                        too_long.len()
                    ),
                ));
            }
            Ok(too_long.len())
        }
    }
}
