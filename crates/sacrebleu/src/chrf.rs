//! chrF and chrF++ as sacreBLEU computes them (`metrics/chrf.py`): character (and word)
//! n-gram statistics per segment against the best-matching reference, summed over the corpus,
//! and the F-score with sacreBLEU 2.x's effective-order averaging or epsilon smoothing.

use std::fmt;
use std::hash::Hash;

use serde::Serialize;

use crate::fxhash::FxMap;
use crate::python::{is_py_space, py_lower, py_split};
use crate::{check_streams, SacreBleuError, SACREBLEU_VERSION};

/// chrF options.  `Default` is sacreBLEU's default `CHRF()`: character
/// 6-grams, no word n-grams, beta 2, whitespace removed, case-sensitive and
/// sacreBLEU 2.x's default *effective-order* averaging (`eff:yes`), not
/// chrF++.py's epsilon smoothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChrfConfig {
    /// Character n-gram order (`nc`).
    pub char_order: usize,
    /// Word n-gram order (`nw`); 2 gives chrF++.
    pub word_order: usize,
    /// Recall weight.
    pub beta: u32,
    /// Lowercase everything first (signature `case:lc`).
    pub lowercase: bool,
    /// Keep whitespace inside character n-grams (signature `space:yes`).
    pub whitespace: bool,
    /// chrF++.py/Moses/NLTK-style epsilon smoothing over all orders
    /// (signature `eff:no`) instead of averaging over effective orders.
    pub eps_smoothing: bool,
}

impl Default for ChrfConfig {
    fn default() -> Self {
        Self {
            char_order: 6,
            word_order: 0,
            beta: 2,
            lowercase: false,
            whitespace: false,
            eps_smoothing: false,
        }
    }
}

impl ChrfConfig {
    /// chrF++ (sacreBLEU's `--chrf-word-order 2`).
    pub fn chrf_plus_plus() -> Self {
        Self {
            word_order: 2,
            ..Self::default()
        }
    }

    /// The metric name sacreBLEU prints: `chrF2`, `chrF2++`, ...
    pub fn name(&self) -> String {
        format!("chrF{}{}", self.beta, "+".repeat(self.word_order))
    }

    /// sacreBLEU's chrF signature, e.g.
    /// `nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0`.
    pub fn signature(&self, nrefs: usize) -> String {
        format!(
            "nrefs:{nrefs}|case:{}|eff:{}|nc:{}|nw:{}|space:{}|version:{SACREBLEU_VERSION}",
            if self.lowercase { "lc" } else { "mixed" },
            if self.eps_smoothing { "no" } else { "yes" },
            self.char_order,
            self.word_order,
            if self.whitespace { "yes" } else { "no" },
        )
    }

    fn order(&self) -> usize {
        self.char_order + self.word_order
    }
}

/// Summed statistics of one chrF n-gram order (sacreBLEU's
/// `[hyp, ref, match]` triple).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChrfOrderStats {
    /// Hypothesis n-grams (counted only where the reference has n-grams of
    /// this order, as sacreBLEU does).
    pub hyp: u64,
    /// Reference n-grams.
    #[serde(rename = "ref")]
    pub reference: u64,
    /// Matched (clipped) n-grams.
    #[serde(rename = "match")]
    pub matched: u64,
}

/// A corpus chrF result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChrfScore {
    /// `chrF2`, `chrF2++`, ...
    pub name: String,
    /// chrF in [0, 100].
    pub score: f64,
    /// Per-order statistics: character orders 1..=nc, then word orders 1..=nw.
    pub stats: Vec<ChrfOrderStats>,
    /// sacreBLEU signature for the configuration and number of references.
    pub signature: String,
}

impl ChrfScore {
    /// The score with sacreBLEU's default two decimals.
    pub fn score_string(&self) -> String {
        format!("{:.2}", self.score)
    }

    /// sacreBLEU's text score line: `chrF2|nrefs:1|...|version:2.6.0 = 55.12`.
    pub fn format(&self) -> String {
        format!("{}|{} = {:.2}", self.name, self.signature, self.score)
    }
}

impl fmt::Display for ChrfScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format())
    }
}

/// `CHRF._remove_punctuation`: split on whitespace, then detach one ASCII
/// punctuation character from the end of a word, or else from its start
/// (so `(hi)` becomes `(hi` and `)`, sacreBLEU issue #124).
fn remove_punctuation(sent: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for word in py_split(sent) {
        let mut chars = word.chars();
        let (Some(first), Some(last)) = (chars.next(), chars.next_back()) else {
            // A single character stays as it is.
            words.push(word);
            continue;
        };
        if last.is_ascii_punctuation() {
            let cut = word.len() - last.len_utf8();
            words.extend([&word[..cut], &word[cut..]]);
        } else if first.is_ascii_punctuation() {
            let cut = first.len_utf8();
            words.extend([&word[..cut], &word[cut..]]);
        } else {
            words.push(word);
        }
    }
    words
}

/// One order's n-gram counts and their total (`sum(counter.values())`).
struct Counts<'a, T> {
    map: FxMap<&'a [T], u32>,
    total: u64,
}

fn count_slices<T: Hash + Eq>(items: &[T], n: usize) -> Counts<'_, T> {
    let capacity = (items.len() + 1).saturating_sub(n);
    let mut map: FxMap<&[T], u32> = FxMap::with_capacity_and_hasher(capacity, Default::default());
    let mut total = 0;
    if n > 0 && items.len() >= n {
        for window in items.windows(n) {
            *map.entry(window).or_insert(0) += 1;
            total += 1;
        }
    }
    Counts { map, total }
}

/// `CHRF._get_match_statistics`.
fn match_stats<T: Hash + Eq>(hyp: &Counts<'_, T>, reference: &Counts<'_, T>) -> ChrfOrderStats {
    let mut matched = 0;
    for (ngram, &count) in &hyp.map {
        if let Some(&ref_count) = reference.map.get(ngram) {
            matched += u64::from(count.min(ref_count));
        }
    }
    ChrfOrderStats {
        // "Don't count hits if no reference exists for that n-gram".
        hyp: if reference.map.is_empty() { 0 } else { hyp.total },
        reference: reference.total,
        matched,
    }
}

/// The n-grams of one segment side: characters (`extract_all_char_ngrams`)
/// and, for chrF++, words (`extract_word_ngrams` over
/// `_remove_punctuation`).
struct ChrfSide {
    chars: Vec<char>,
    words: Vec<String>,
}

impl ChrfSide {
    fn new(text: &str, cfg: &ChrfConfig) -> Self {
        let text = if cfg.lowercase {
            py_lower(text)
        } else {
            text.to_string()
        };
        // Without `whitespace`, sacreBLEU joins `line.split()`: all Python
        // whitespace disappears before character n-grams are taken.
        let chars = if cfg.whitespace {
            text.chars().collect()
        } else {
            text.chars().filter(|&c| !is_py_space(c)).collect()
        };
        let words = if cfg.word_order > 0 {
            remove_punctuation(&text)
                .into_iter()
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };
        Self { chars, words }
    }
}

/// `CHRF._compute_f_score`, operation for operation.
fn chrf_f_score(stats: &[ChrfOrderStats], beta: u32, eps_smoothing: bool) -> f64 {
    const EPS: f64 = 1e-16;
    let factor = f64::from(beta) * f64::from(beta);
    let mut score = 0.0;
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (0.0, 0.0);

    for s in stats {
        // chrF++.py-style epsilon smoothing (also Moses and NLTK).
        let prec = if s.hyp > 0 {
            s.matched as f64 / s.hyp as f64
        } else {
            EPS
        };
        let rec = if s.reference > 0 {
            s.matched as f64 / s.reference as f64
        } else {
            EPS
        };
        let denom = factor * prec + rec;
        score += if denom > 0.0 {
            (1.0 + factor) * prec * rec / denom
        } else {
            EPS
        };
        // sacreBLEU < 2.0 style effective-order averaging (the 2.x default).
        if s.hyp > 0 && s.reference > 0 {
            avg_prec += prec;
            avg_rec += rec;
            effective_order += 1;
        }
    }

    if eps_smoothing {
        return 100.0 * score / stats.len() as f64;
    }
    if effective_order == 0 {
        avg_prec = 0.0;
        avg_rec = 0.0;
    } else {
        avg_prec /= effective_order as f64;
        avg_rec /= effective_order as f64;
    }
    if avg_prec + avg_rec != 0.0 {
        let mut score = (1.0 + factor) * avg_prec * avg_rec;
        score /= factor * avg_prec + avg_rec;
        100.0 * score
    } else {
        0.0
    }
}

/// `CHRF._compute_segment_statistics`: the statistics of the reference with
/// the best segment-level F-score (the first one on ties).
fn chrf_segment(hyp: &ChrfSide, refs: &[ChrfSide], cfg: &ChrfConfig) -> Vec<ChrfOrderStats> {
    let hyp_chars: Vec<_> = (1..=cfg.char_order)
        .map(|n| count_slices(&hyp.chars, n))
        .collect();
    let hyp_word_counts: Vec<_> = (1..=cfg.word_order)
        .map(|n| count_slices(&hyp.words, n))
        .collect();

    let mut best: Vec<ChrfOrderStats> = Vec::new();
    let mut best_f = -1.0;
    for reference in refs {
        let mut stats = Vec::with_capacity(cfg.order());
        for (n, hyp_counts) in (1..=cfg.char_order).zip(&hyp_chars) {
            stats.push(match_stats(hyp_counts, &count_slices(&reference.chars, n)));
        }
        for (n, hyp_counts) in (1..=cfg.word_order).zip(&hyp_word_counts) {
            stats.push(match_stats(hyp_counts, &count_slices(&reference.words, n)));
        }
        let f = chrf_f_score(&stats, cfg.beta, cfg.eps_smoothing);
        if f > best_f {
            best_f = f;
            best = stats;
        }
    }
    best
}

/// Corpus chrF exactly as sacreBLEU's `CHRF(...).corpus_score(hyps, refs)`.
///
/// `refs[k][i]` is line `i` of the `k`-th reference stream; every stream must
/// have `hyps.len()` lines.
pub fn corpus_chrf<H, R, S>(hyps: &[H], refs: &[R], cfg: &ChrfConfig) -> Result<ChrfScore, SacreBleuError>
where
    H: AsRef<str>,
    R: AsRef<[S]>,
    S: AsRef<str>,
{
    check_streams(hyps.len(), refs)?;
    if cfg.order() == 0 {
        return Err(SacreBleuError::ZeroChrfOrder);
    }
    let mut total = vec![ChrfOrderStats::default(); cfg.order()];
    let mut seg_refs: Vec<ChrfSide> = Vec::with_capacity(refs.len());
    for (i, hyp) in hyps.iter().enumerate() {
        seg_refs.clear();
        for stream in refs {
            seg_refs.push(ChrfSide::new(stream.as_ref()[i].as_ref(), cfg));
        }
        let hyp = ChrfSide::new(hyp.as_ref(), cfg);
        for (sum, s) in total.iter_mut().zip(chrf_segment(&hyp, &seg_refs, cfg)) {
            sum.hyp += s.hyp;
            sum.reference += s.reference;
            sum.matched += s.matched;
        }
    }
    Ok(ChrfScore {
        name: cfg.name(),
        score: chrf_f_score(&total, cfg.beta, cfg.eps_smoothing),
        stats: total,
        signature: cfg.signature(refs.len()),
    })
}

/// Sentence chrF as sacreBLEU's `CHRF(...).sentence_score(hyp, refs)`.
pub fn sentence_chrf<S: AsRef<str>>(
    hyp: &str,
    refs: &[S],
    cfg: &ChrfConfig,
) -> Result<ChrfScore, SacreBleuError> {
    let streams: Vec<[&str; 1]> = refs.iter().map(|r| [r.as_ref()]).collect();
    corpus_chrf(&[hyp], &streams, cfg)
}
