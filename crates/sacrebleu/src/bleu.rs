//! BLEU as sacreBLEU computes it (`metrics/bleu.py`): preprocessing, clipped n-gram
//! statistics per segment summed over the corpus, smoothing, the brevity penalty, the
//! signature and the score line.

use std::fmt;

use serde::Serialize;

use crate::fxhash::FxMap;
use crate::python::{py_lower, py_rstrip, py_split};
use crate::{check_streams, SacreBleuError, Tokenize, SACREBLEU_VERSION};

/// BLEU's maximum n-gram order (sacreBLEU's `MAX_NGRAM_ORDER`).
pub const MAX_NGRAM_ORDER: usize = 4;

/// The tokens BLEU counts n-grams over, exactly as sacreBLEU gets them:
/// `BLEU._preprocess_segment` (optional `lower()`, then `rstrip()`, then the
/// tokenizer) followed by `extract_all_word_ngrams`' `line.split()`.
pub fn bleu_tokens(line: &str, tokenize: Tokenize, lowercase: bool) -> Vec<String> {
    let processed = preprocess_bleu(line, tokenize, lowercase);
    py_split(&processed).map(str::to_string).collect()
}

fn preprocess_bleu(line: &str, tokenize: Tokenize, lowercase: bool) -> String {
    if lowercase {
        tokenize.apply(py_rstrip(&py_lower(line)))
    } else {
        tokenize.apply(py_rstrip(line))
    }
}

/// BLEU smoothing (sacreBLEU's `--smooth-method` / `--smooth-value`; the
/// methods of Chen & Cherry, 2014).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Smooth {
    /// No smoothing: a zero n-gram precision makes BLEU 0.
    None,
    /// Method 1: a zero match count becomes this value (sacreBLEU default 0.1).
    Floor(f64),
    /// Method 2: add this to matches and totals of orders 2..4 (default 1).
    AddK(f64),
    /// Method 3, NIST/mteval-v13a's smoothing: the k-th order with zero
    /// matches gets precision 1 / (2^k * total).  sacreBLEU's default.
    #[default]
    Exp,
}

impl Smooth {
    /// sacreBLEU's default value for `floor`.
    pub const FLOOR_DEFAULT: f64 = 0.1;
    /// sacreBLEU's default value for `add-k`.
    pub const ADD_K_DEFAULT: f64 = 1.0;

    /// Build from sacreBLEU's CLI spelling; `value: None` takes sacreBLEU's
    /// default for `floor`/`add-k` and is ignored by `none`/`exp`.
    pub fn from_name(name: &str, value: Option<f64>) -> Result<Self, SacreBleuError> {
        match name {
            "none" => Ok(Self::None),
            "floor" => Ok(Self::Floor(value.unwrap_or(Self::FLOOR_DEFAULT))),
            "add-k" => Ok(Self::AddK(value.unwrap_or(Self::ADD_K_DEFAULT))),
            "exp" => Ok(Self::Exp),
            other => Err(SacreBleuError::UnknownSmoothing(other.to_string())),
        }
    }

    /// The method name sacreBLEU uses (`exp`, `floor`, `add-k`, `none`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Floor(_) => "floor",
            Self::AddK(_) => "add-k",
            Self::Exp => "exp",
        }
    }

    /// The signature's `smooth:` value: methods with a parameter append it
    /// with two decimals (`floor[0.10]`), as `BLEUSignature` does.
    fn signature(self) -> String {
        match self {
            Self::Floor(v) | Self::AddK(v) => format!("{}[{v:.2}]", self.name()),
            Self::None | Self::Exp => self.name().to_string(),
        }
    }
}

/// BLEU options.  `Default` is sacreBLEU's default corpus BLEU
/// (`13a`, mixed case, `exp` smoothing, no effective order).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BleuConfig {
    /// Tokenizer applied to hypotheses and references.
    pub tokenize: Tokenize,
    /// Lowercase everything first (signature `case:lc`).
    pub lowercase: bool,
    /// Smoothing of zero n-gram precisions.
    pub smooth: Smooth,
    /// Average only over n-gram orders the hypothesis has (signature
    /// `eff:yes`).  Meant for sentence-level BLEU; off for corpus BLEU.
    pub effective_order: bool,
}

impl BleuConfig {
    /// sacreBLEU's `sentence_bleu` defaults: as [`Default`] but with
    /// effective order, so short sentences are not scored 0 for lacking
    /// 4-grams.
    pub fn sentence() -> Self {
        Self {
            effective_order: true,
            ..Self::default()
        }
    }

    /// sacreBLEU's BLEU signature, e.g.
    /// `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`.
    pub fn signature(&self, nrefs: usize) -> String {
        format!(
            "nrefs:{nrefs}|case:{}|eff:{}|tok:{}|smooth:{}|version:{SACREBLEU_VERSION}",
            if self.lowercase { "lc" } else { "mixed" },
            if self.effective_order { "yes" } else { "no" },
            self.tokenize.name(),
            self.smooth.signature(),
        )
    }
}

/// A corpus BLEU result with sacreBLEU's sufficient statistics.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BleuScore {
    /// BLEU in [0, 100].
    pub score: f64,
    /// Clipped n-gram matches for orders 1..=4, before smoothing.  (sacreBLEU's
    /// `BLEUScore.counts` has `add-k`'s k already added for orders 2..4; the
    /// precisions here and there agree.)
    pub counts: Vec<u64>,
    /// Hypothesis n-grams for orders 1..=4, before smoothing.
    pub totals: Vec<u64>,
    /// Smoothed n-gram precisions in percent, as printed `66.1/41.9/...`.
    pub precisions: Vec<f64>,
    /// Brevity penalty.
    pub bp: f64,
    /// `sys_len / ref_len` (0 when `ref_len` is 0), as sacreBLEU prints it.
    pub ratio: f64,
    /// Total hypothesis length in tokens.
    pub sys_len: u64,
    /// Total effective reference length (closest reference per segment).
    pub ref_len: u64,
    /// sacreBLEU signature for the configuration and number of references.
    pub signature: String,
}

impl BleuScore {
    /// The score with sacreBLEU's default two decimals (`35.12`).
    pub fn score_string(&self) -> String {
        format!("{:.2}", self.score)
    }

    /// sacreBLEU's text score line (`BLEUScore.format()` with the signature):
    /// `BLEU|nrefs:1|...|version:2.6.0 = 35.12 66.1/41.9/28.0/19.3 (BP = 0.970
    /// ratio = 0.971 hyp_len = 1234 ref_len = 1271)`.
    pub fn format(&self) -> String {
        let precisions: Vec<String> = self.precisions.iter().map(|p| format!("{p:.1}")).collect();
        format!(
            "BLEU|{} = {:.2} {} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
            self.signature,
            self.score,
            precisions.join("/"),
            self.bp,
            self.ratio,
            self.sys_len,
            self.ref_len
        )
    }
}

impl fmt::Display for BleuScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format())
    }
}

/// The statistics sacreBLEU sums over segments before computing BLEU
/// (`[hyp_len, ref_len] + correct + total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BleuStats {
    sys_len: u64,
    ref_len: u64,
    counts: [u64; MAX_NGRAM_ORDER],
    totals: [u64; MAX_NGRAM_ORDER],
}

impl BleuStats {
    fn add(&mut self, other: &Self) {
        self.sys_len += other.sys_len;
        self.ref_len += other.ref_len;
        for n in 0..MAX_NGRAM_ORDER {
            self.counts[n] += other.counts[n];
            self.totals[n] += other.totals[n];
        }
    }
}

/// Key of an n-gram of per-segment token ids: each id + 1 in its own 32-bit
/// lane, so n-grams of different orders never collide (order = number of
/// non-zero lanes).
type NgramKey = u128;

/// Reusable buffers for per-segment BLEU statistics.
#[derive(Default)]
struct BleuSegmentScorer {
    ref_max: FxMap<NgramKey, u32>,
    one_ref: FxMap<NgramKey, u32>,
    hyp: FxMap<NgramKey, u32>,
}

fn count_word_ngrams(ids: &[u32], counts: &mut FxMap<NgramKey, u32>) {
    counts.clear();
    for start in 0..ids.len() {
        let mut key: NgramKey = 0;
        for &id in ids[start..].iter().take(MAX_NGRAM_ORDER) {
            key = (key << 32) | (NgramKey::from(id) + 1);
            *counts.entry(key).or_insert(0) += 1;
        }
    }
}

/// Split a preprocessed segment into tokens (`line.split()`) and map each to
/// a per-segment id, so n-grams become integer keys.  A segment would need
/// 2^32 - 1 distinct tokens to overflow the id space.
fn token_ids<'a>(text: &'a str, ids: &mut FxMap<&'a str, u32>) -> Vec<u32> {
    py_split(text)
        .map(|token| {
            let next = ids.len() as u32;
            *ids.entry(token).or_insert(next)
        })
        .collect()
}

fn ngram_order(key: NgramKey) -> usize {
    // Number of non-zero 32-bit lanes; lanes are filled from the bottom.
    let bits = 128 - key.leading_zeros() as usize;
    bits.div_ceil(32)
}

impl BleuSegmentScorer {
    /// `BLEU._extract_reference_info` + `_compute_segment_statistics` for one
    /// segment (inputs already preprocessed).
    fn segment(&mut self, hyp: &str, refs: &[String]) -> BleuStats {
        let mut ids: FxMap<&str, u32> = FxMap::default();
        // References: n-gram counts are the maximum over references
        // ("clipping" against the most generous reference).
        self.ref_max.clear();
        let mut ref_lens = Vec::with_capacity(refs.len());
        for reference in refs {
            let ref_ids = token_ids(reference, &mut ids);
            ref_lens.push(ref_ids.len() as u64);
            count_word_ngrams(&ref_ids, &mut self.one_ref);
            for (&key, &count) in &self.one_ref {
                let slot = self.ref_max.entry(key).or_insert(0);
                *slot = (*slot).max(count);
            }
        }

        let hyp_ids = token_ids(hyp, &mut ids);
        let hyp_len = hyp_ids.len() as u64;
        count_word_ngrams(&hyp_ids, &mut self.hyp);

        let mut stats = BleuStats {
            sys_len: hyp_len,
            ref_len: closest_ref_len(hyp_len, &ref_lens),
            ..BleuStats::default()
        };
        for (&key, &count) in &self.hyp {
            let n = ngram_order(key) - 1;
            stats.totals[n] += u64::from(count);
            if let Some(&ref_count) = self.ref_max.get(&key) {
                stats.counts[n] += u64::from(count.min(ref_count));
            }
        }
        stats
    }
}

/// `BLEU._get_closest_ref_len`: the reference length closest to the
/// hypothesis length; on a tie the shorter reference wins.
fn closest_ref_len(hyp_len: u64, ref_lens: &[u64]) -> u64 {
    let mut best: Option<(u64, u64)> = None; // (diff, len)
    for &len in ref_lens {
        let diff = hyp_len.abs_diff(len);
        best = match best {
            Some((best_diff, best_len)) if diff > best_diff || (diff == best_diff && len >= best_len) => {
                Some((best_diff, best_len))
            }
            _ => Some((diff, len)),
        };
    }
    best.map_or(0, |(_, len)| len)
}

/// sacreBLEU's `my_log`: log floored so that a zero precision gives a huge
/// negative number (and BLEU 0) instead of -inf.
fn my_log(x: f64) -> f64 {
    if x == 0.0 {
        -9_999_999_999.0
    } else {
        x.ln()
    }
}

/// `BLEU.compute_bleu`, operation for operation (the float results must be
/// identical, not merely close).  Returns (score, precisions, bp).
fn compute_bleu(
    stats: &BleuStats,
    smooth: Smooth,
    effective_order: bool,
) -> (f64, [f64; MAX_NGRAM_ORDER], f64) {
    let (sys_len, ref_len) = (stats.sys_len, stats.ref_len);
    let bp = if sys_len < ref_len {
        if sys_len > 0 {
            (1.0 - ref_len as f64 / sys_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };

    let mut precisions = [0.0; MAX_NGRAM_ORDER];
    // "Early stop if there are no matches (#141)".
    if stats.counts.iter().all(|&c| c == 0) {
        return (0.0, precisions, bp);
    }

    let mut smooth_mteval = 1.0;
    let mut eff_order = MAX_NGRAM_ORDER;
    for n in 1..=MAX_NGRAM_ORDER {
        let mut correct = stats.counts[n - 1] as f64;
        let mut total = stats.totals[n - 1] as f64;
        if let Smooth::AddK(k) = smooth {
            if n > 1 {
                correct += k;
                total += k;
            }
        }
        if total == 0.0 {
            break;
        }
        if effective_order {
            eff_order = n;
        }
        if correct == 0.0 {
            match smooth {
                Smooth::Exp => {
                    smooth_mteval *= 2.0;
                    precisions[n - 1] = 100.0 / (smooth_mteval * total);
                }
                Smooth::Floor(value) => precisions[n - 1] = 100.0 * value / total,
                Smooth::None | Smooth::AddK(_) => {}
            }
        } else {
            precisions[n - 1] = 100.0 * correct / total;
        }
    }

    let log_sum: f64 = precisions[..eff_order].iter().map(|&p| my_log(p)).sum();
    let score = bp * (log_sum / eff_order as f64).exp();
    (score, precisions, bp)
}

/// Corpus BLEU exactly as sacreBLEU's `BLEU(...).corpus_score(hyps, refs)`.
///
/// `refs[k][i]` is line `i` of the `k`-th reference stream (sacreBLEU's
/// layout); every stream must have `hyps.len()` lines.  Empty lines are
/// ordinary (zero-length) segments.
pub fn corpus_bleu<H, R, S>(hyps: &[H], refs: &[R], cfg: &BleuConfig) -> Result<BleuScore, SacreBleuError>
where
    H: AsRef<str>,
    R: AsRef<[S]>,
    S: AsRef<str>,
{
    check_streams(hyps.len(), refs)?;
    let mut scorer = BleuSegmentScorer::default();
    let mut total = BleuStats::default();
    let mut seg_refs: Vec<String> = Vec::with_capacity(refs.len());
    for (i, hyp) in hyps.iter().enumerate() {
        seg_refs.clear();
        for stream in refs {
            let line = stream.as_ref()[i].as_ref();
            seg_refs.push(preprocess_bleu(line, cfg.tokenize, cfg.lowercase));
        }
        let hyp = preprocess_bleu(hyp.as_ref(), cfg.tokenize, cfg.lowercase);
        total.add(&scorer.segment(&hyp, &seg_refs));
    }
    Ok(bleu_score(&total, cfg, refs.len()))
}

/// Sentence BLEU as sacreBLEU's `BLEU(...).sentence_score(hyp, refs)`.  Use
/// [`BleuConfig::sentence`] for the defaults of sacreBLEU's `sentence_bleu`.
pub fn sentence_bleu<S: AsRef<str>>(
    hyp: &str,
    refs: &[S],
    cfg: &BleuConfig,
) -> Result<BleuScore, SacreBleuError> {
    let streams: Vec<[&str; 1]> = refs.iter().map(|r| [r.as_ref()]).collect();
    corpus_bleu(&[hyp], &streams, cfg)
}

fn bleu_score(stats: &BleuStats, cfg: &BleuConfig, nrefs: usize) -> BleuScore {
    let (score, precisions, bp) = compute_bleu(stats, cfg.smooth, cfg.effective_order);
    BleuScore {
        score,
        counts: stats.counts.to_vec(),
        totals: stats.totals.to_vec(),
        precisions: precisions.to_vec(),
        bp,
        ratio: if stats.ref_len > 0 {
            stats.sys_len as f64 / stats.ref_len as f64
        } else {
            0.0
        },
        sys_len: stats.sys_len,
        ref_len: stats.ref_len,
        signature: cfg.signature(nrefs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_keys_encode_their_order() {
        let mut counts = FxMap::default();
        count_word_ngrams(&[0, 0, 1], &mut counts);
        let mut orders: Vec<usize> = counts.keys().map(|&k| ngram_order(k)).collect();
        orders.sort_unstable();
        // unigrams {0, 1}, bigrams {00, 01}, trigram {001}
        assert_eq!(orders, [1, 1, 2, 2, 3]);
    }

    #[test]
    fn closest_reference_length_prefers_shorter_on_ties() {
        assert_eq!(closest_ref_len(10, &[12, 8]), 8);
        assert_eq!(closest_ref_len(10, &[8, 12]), 8);
        assert_eq!(closest_ref_len(10, &[13, 11, 9]), 9);
        assert_eq!(closest_ref_len(0, &[3, 0]), 0);
    }
}
