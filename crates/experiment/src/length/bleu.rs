//! BLEU by source length of the translation runs beside the study: `DIR/multi30k/` holds
//! `ember bleu --source --json` of each run, and each variant is paired with `none` by seed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{variant_order, BleuBucket};
use crate::report::stats::{mean_std, paired_diff};

/// BLEU per variant and source-length bucket from `ember bleu --source --json` files named after
/// their runs (`none-lr5e-3-seed1.json`); empty when `dir` does not exist.
pub(super) fn bleu_buckets(dir: &Path) -> Result<Vec<BleuBucket>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    // (variant, (first, last)) -> seed -> (BLEU, sentences)
    type Scores = BTreeMap<(String, (usize, Option<usize>)), BTreeMap<u64, (f64, usize)>>;
    let mut scores: Scores = BTreeMap::new();
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|f| f.ok().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for file in files {
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let (Some(variant), Some(seed)) = (
            stem.split("-lr").next(),
            stem.rsplit("-seed").next().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            bail!("{}: expected a run name like none-lr5e-3-seed1", file.display());
        };
        let text = ember_data::io::read_small_text(&file, 1 << 28)
            .with_context(|| format!("reading {}", file.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not `ember bleu --json` output", file.display()))?;
        let buckets = json["bleu_by_source_length"].as_array().with_context(|| {
            format!(
                "{} has no bleu_by_source_length (run ember bleu with --source)",
                file.display()
            )
        })?;
        for b in buckets {
            let (Some(first), Some(bleu), Some(sentences)) = (
                b["first"].as_u64(),
                b["score"]["score"].as_f64(),
                b["sentences"].as_u64(),
            ) else {
                bail!("{}: a bucket without first, score or sentences", file.display());
            };
            let key = (
                variant.to_string(),
                (first as usize, b["last"].as_u64().map(|l| l as usize)),
            );
            scores
                .entry(key)
                .or_default()
                .insert(seed, (bleu, sentences as usize));
        }
    }
    let variants = variant_order(scores.keys().map(|(v, _)| v.clone()));
    let ranges: BTreeSet<(usize, Option<usize>)> = scores.keys().map(|(_, r)| *r).collect();
    let mut out = Vec::new();
    for v in &variants {
        for &range in &ranges {
            let Some(by_seed) = scores.get(&(v.clone(), range)) else {
                continue;
            };
            let xs: Vec<f64> = by_seed.values().map(|x| x.0).collect();
            let Some(ms) = mean_std(&xs) else { continue };
            let vs_none = match scores.get(&("none".to_string(), range)) {
                Some(base) if v != "none" => {
                    let seeds: BTreeSet<u64> = by_seed.keys().chain(base.keys()).copied().collect();
                    let a: Vec<Option<f64>> = seeds.iter().map(|s| by_seed.get(s).map(|x| x.0)).collect();
                    let b: Vec<Option<f64>> = seeds.iter().map(|s| base.get(s).map(|x| x.0)).collect();
                    paired_diff(&a, &b, 0.95)
                }
                _ => None,
            };
            out.push(BleuBucket {
                variant: v.clone(),
                first: range.0,
                last: range.1,
                sentences: by_seed.values().next().map_or(0, |x| x.1),
                bleu: ms.mean,
                seeds: ms.n,
                vs_none,
            });
        }
    }
    Ok(out)
}
