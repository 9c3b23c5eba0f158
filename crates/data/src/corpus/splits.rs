//! Tokenised splits: the ids of every split (through the token-id cache), with the length and
//! `<unk>` statistics a run report needs.

use std::path::Path;

use serde::Serialize;

use super::read::hash_groups;
use crate::cache::{self, ContentHash, Groups};
use crate::error::{DataError, Result};
use crate::raw::{RawCorpus, RawPairs, RawText, TokenShard};
use crate::tokenizer::{Tokenizer, UNK_ID};

/// One translation pair as token ids, without bos/eos (the batcher adds them).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Example {
    pub source: Vec<u32>,
    pub target: Vec<u32>,
}

/// What happened to the token-id cache during loading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum CacheStatus {
    /// No cache path was given.
    Disabled,
    /// Ids were read from the cache; nothing was tokenised.
    Hit,
    /// Ids were computed and stored.
    Written,
    /// Ids were computed but could not be stored (the run still works).
    WriteFailed(String),
}

/// Token ids of every split.
// One value per run, matched by reference: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Splits {
    Translation(TranslationSplits),
    Text(TextSplits),
}

impl Splits {
    pub fn translation(&self) -> Option<&TranslationSplits> {
        match self {
            Splits::Translation(t) => Some(t),
            Splits::Text(_) => None,
        }
    }
    pub fn text(&self) -> Option<&TextSplits> {
        match self {
            Splits::Text(t) => Some(t),
            Splits::Translation(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TranslationSplits {
    pub train: PairSplit,
    pub valid: PairSplit,
    pub test: Option<PairSplit>,
}

/// One translation split: ids plus the raw text they came from, index-aligned.
#[derive(Clone, Debug, PartialEq)]
pub struct PairSplit {
    pub examples: Vec<Example>,
    /// Raw source lines (input for decoding demos and for hypothesis files).
    pub sources: Vec<String>,
    /// Raw target lines: the references for BLEU.
    pub references: Vec<String>,
    /// The 1-based line of each example in its files (its index + 1 for the embedded task).
    pub lines: Vec<usize>,
    pub stats: SplitStats,
}

impl PairSplit {
    fn build(
        raw: &RawPairs,
        src: Vec<Vec<u32>>,
        tgt: Vec<Vec<u32>>,
        max_len: Option<(usize, usize)>,
    ) -> Self {
        let mut out = PairSplit {
            examples: Vec::with_capacity(src.len()),
            sources: Vec::with_capacity(src.len()),
            references: Vec::with_capacity(src.len()),
            lines: Vec::with_capacity(src.len()),
            stats: SplitStats {
                dropped_empty: raw.dropped_empty,
                ..SplitStats::default()
            },
        };
        for (i, (s, t)) in src.into_iter().zip(tgt).enumerate() {
            if let Some((ms, mt)) = max_len {
                if s.len() > ms || t.len() > mt {
                    out.stats.dropped_too_long += 1;
                    continue;
                }
            }
            out.sources.push(raw.sources[i].clone());
            out.references.push(raw.targets[i].clone());
            out.lines.push(raw.lines.get(i).copied().unwrap_or(i + 1));
            out.examples.push(Example { source: s, target: t });
        }
        out.stats.fill(&out.examples);
        out
    }

    /// Recomputes the statistics after examples were dropped or cut (counters of drops stay).
    pub(crate) fn refresh_stats(&mut self) {
        self.stats.fill(&self.examples);
    }
}

/// Size and length statistics of one translation split (lengths in tokens, without bos/eos).
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct SplitStats {
    /// Pairs kept.
    pub pairs: usize,
    pub dropped_empty: usize,
    /// Training pairs over `max_source_len`/`max_target_len` (always 0 for valid/test).
    pub dropped_too_long: usize,
    pub source_tokens: usize,
    pub target_tokens: usize,
    pub avg_source_len: f64,
    pub avg_target_len: f64,
    /// 97.5th percentile (nearest rank) of source / target lengths.
    pub p975_source_len: usize,
    pub p975_target_len: usize,
    pub max_source_len: usize,
    pub max_target_len: usize,
    /// `<unk>` tokens on either side (characters the tokenizer never saw).
    pub unk_tokens: usize,
}

impl SplitStats {
    fn fill(&mut self, examples: &[Example]) {
        let src: Vec<usize> = examples.iter().map(|e| e.source.len()).collect();
        let tgt: Vec<usize> = examples.iter().map(|e| e.target.len()).collect();
        self.pairs = examples.len();
        self.source_tokens = src.iter().sum();
        self.target_tokens = tgt.iter().sum();
        let n = self.pairs.max(1) as f64;
        self.avg_source_len = self.source_tokens as f64 / n;
        self.avg_target_len = self.target_tokens as f64 / n;
        self.p975_source_len = percentile(&src, 0.975);
        self.p975_target_len = percentile(&tgt, 0.975);
        self.max_source_len = src.iter().copied().max().unwrap_or(0);
        self.max_target_len = tgt.iter().copied().max().unwrap_or(0);
        self.unk_tokens = examples
            .iter()
            .flat_map(|e| e.source.iter().chain(&e.target))
            .filter(|&&i| i == UNK_ID)
            .count();
    }

    /// Mean tokens per sentence over both sides.
    pub fn avg_tokens_per_sentence(&self) -> f64 {
        (self.source_tokens + self.target_tokens) as f64 / (2 * self.pairs.max(1)) as f64
    }
}

/// Nearest-rank percentile (`q` in 0..=1) of unsorted values; 0 for an empty slice.
fn percentile(values: &[usize], q: f64) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Token streams for language modelling.
#[derive(Clone, Debug, PartialEq)]
pub struct TextSplits {
    pub train: Vec<u32>,
    pub valid: Vec<u32>,
    pub stats: TextStats,
}

#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct TextStats {
    pub train_tokens: usize,
    pub valid_tokens: usize,
    pub train_chars: usize,
    pub valid_chars: usize,
    pub train_unk_tokens: usize,
    pub valid_unk_tokens: usize,
}

impl RawCorpus {
    /// Tokenises every split, reusing `cache_path` when it holds ids for exactly this tokenizer
    /// and text. Training pairs longer than `max_source_len`/`max_target_len` tokens are dropped.
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        max_source_len: usize,
        max_target_len: usize,
        cache_path: Option<&Path>,
    ) -> Result<(Splits, CacheStatus)> {
        if let RawCorpus::Tokens { train, valid } = self {
            // Already ids: no tokenising, so nothing to cache.
            return Ok((shard_splits(train, valid, tokenizer)?, CacheStatus::Disabled));
        }
        let groups = self.groups();
        let key = cache_path.map(|_| -> Result<[u64; 2]> {
            let mut h = ContentHash::new();
            h.str(&tokenizer.to_json()?);
            hash_groups(&mut h, &groups);
            Ok(h.finish())
        });
        let key = key.transpose()?;
        let cached = match (cache_path, key) {
            (Some(p), Some(k)) => cache::load(p, k).filter(|c| {
                c.len() == groups.len() && c.iter().zip(&groups).all(|(a, b)| a.len() == b.len())
            }),
            _ => None,
        };
        let (ids, status) = match cached {
            Some(ids) => (ids, CacheStatus::Hit),
            None => {
                let ids = encode_groups(self, tokenizer, &groups)?;
                let status = match (cache_path, key) {
                    (Some(p), Some(k)) => match cache::store(p, k, &ids) {
                        Ok(()) => CacheStatus::Written,
                        Err(e) => CacheStatus::WriteFailed(format!("{}: {e}", p.display())),
                    },
                    _ => CacheStatus::Disabled,
                };
                (ids, status)
            }
        };
        let unk = tokenizer.special_tokens().unk;
        let splits = self.assemble(ids, max_source_len, max_target_len, unk)?;
        Ok((splits, status))
    }

    fn assemble(
        &self,
        ids: Groups,
        max_source_len: usize,
        max_target_len: usize,
        unk: Option<u32>,
    ) -> Result<Splits> {
        let mut ids = ids.into_iter();
        let mut next = || ids.next().unwrap_or_default();
        match self {
            RawCorpus::Translation { train, valid, test } => {
                let train = PairSplit::build(train, next(), next(), Some((max_source_len, max_target_len)));
                let valid = PairSplit::build(valid, next(), next(), None);
                let test = test.as_ref().map(|t| PairSplit::build(t, next(), next(), None));
                Ok(Splits::Translation(TranslationSplits { train, valid, test }))
            }
            RawCorpus::Text { train, valid } => {
                let tr: Vec<u32> = next().concat();
                let va: Vec<u32> = next().concat();
                let chars = |s: &[RawText]| s.iter().map(|t| t.text.chars().count()).sum();
                Ok(text_splits(tr, va, chars(train), chars(valid), unk))
            }
            RawCorpus::Tokens { .. } => unreachable!("token shards are not tokenised"),
        }
    }
}

/// The token streams of shard splits, after checking every id against the tokenizer.
fn shard_splits(train: &[TokenShard], valid: &[TokenShard], tokenizer: &Tokenizer) -> Result<Splits> {
    let vocab = tokenizer.vocab_size();
    for shard in train.iter().chain(valid) {
        if let Some((pos, id)) = shard.ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(DataError::config(
                "data.corpus.tokenizer",
                format!(
                    "{} holds id {id} at token {pos}, but the tokenizer has only {vocab} tokens; \
                     the shards were written with another tokenizer (name the one `ember \
                     tokenize` used)",
                    shard.path.display()
                ),
            ));
        }
    }
    let concat = |s: &[TokenShard]| -> Vec<u32> { s.iter().flat_map(|s| s.ids.iter().copied()).collect() };
    let (tr, va) = (concat(train), concat(valid));
    // No text was read: characters are unknown (0).
    Ok(text_splits(tr, va, 0, 0, tokenizer.special_tokens().unk))
}

/// Token streams of a language-model corpus with their statistics; `unk` is the tokenizer's
/// unknown token (a byte-level tokenizer has none).
fn text_splits(
    train: Vec<u32>,
    valid: Vec<u32>,
    train_chars: usize,
    valid_chars: usize,
    unk: Option<u32>,
) -> Splits {
    let count_unk = |v: &[u32]| v.iter().filter(|&&i| Some(i) == unk).count();
    let stats = TextStats {
        train_tokens: train.len(),
        valid_tokens: valid.len(),
        train_chars,
        valid_chars,
        train_unk_tokens: count_unk(&train),
        valid_unk_tokens: count_unk(&valid),
    };
    Splits::Text(TextSplits { train, valid, stats })
}

fn encode_groups(raw: &RawCorpus, tokenizer: &Tokenizer, groups: &[Vec<&str>]) -> Result<Groups> {
    match raw {
        // Sentences: the HF pipeline encodes them in parallel.
        RawCorpus::Translation { .. } => groups.iter().map(|g| tokenizer.encode_batch(g)).collect(),
        // Whole documents: one call each, so BPE sees the text exactly as it will be decoded.
        RawCorpus::Text { .. } | RawCorpus::Tokens { .. } => groups
            .iter()
            .map(|g| g.iter().map(|t| tokenizer.encode(t)).collect::<Result<Vec<_>>>())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<usize> = (1..=40).collect();
        assert_eq!(percentile(&v, 0.975), 39);
        assert_eq!(percentile(&v, 1.0), 40);
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[5], 0.975), 5);
    }
}
