//! Corpus BLEU and chrF that reproduce sacreBLEU 2.x bit for bit.
//!
//! Translation papers report sacreBLEU numbers, so Ember's evaluation must
//! produce the *same* numbers, not "a BLEU".  Every step below mirrors a named
//! piece of sacreBLEU ([`SACREBLEU_VERSION`]): `metrics/bleu.py`,
//! `metrics/chrf.py`, `metrics/helpers.py` and the `13a`/`intl` tokenizers.
//! Where Python semantics differ from Rust's defaults (what `str.split()`
//! treats as whitespace, how `re.sub` scans, the order of float operations)
//! the code follows Python, and the doc comment says so.
//!
//! The fixtures in `crates/sacrebleu/tests/fixtures/` (made by
//! `scripts/make-bleu-fixtures.py` with sacreBLEU itself) pin scores, n-gram
//! statistics, signatures and formatted score lines; on x86-64 Linux the
//! scores are bit-identical to sacreBLEU's.
//!
//! Known limits, all outside what MT output contains in practice:
//! * Unicode tables: lowercasing uses Rust's tables and `intl` the `regex`
//!   crate's, while sacreBLEU uses the Python interpreter's (Unicode 14 for
//!   Python 3.11) and the `regex` module's.  They differ only on characters
//!   assigned in recent Unicode versions.
//! * Only the `none`, `13a` and `intl` tokenizers; no per-segment variable
//!   number of references (sacreBLEU's `None` reference lines).
//! * With `add-k`, [`BleuScore::counts`]/[`BleuScore::totals`] are the raw
//!   statistics; sacreBLEU reports them with k added (precisions agree).
//!
//! ```
//! use ember_sacrebleu::{corpus_bleu, corpus_chrf, BleuConfig, ChrfConfig};
//! let hyps = vec!["The cat sat on the mat.".to_string()];
//! // refs[k][i]: line i of reference stream k.
//! let refs = vec![vec!["The cat sat on a mat.".to_string()]];
//! let bleu = corpus_bleu(&hyps, &refs, &BleuConfig::default())?;
//! assert_eq!(
//!     bleu.format(),
//!     "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 = 48.89 \
//!      85.7/66.7/40.0/25.0 (BP = 1.000 ratio = 1.000 hyp_len = 7 ref_len = 7)"
//! );
//! let chrf = corpus_chrf(&hyps, &refs, &ChrfConfig::default())?;
//! assert_eq!(chrf.signature, "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0");
//! # Ok::<(), ember_sacrebleu::SacreBleuError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

/// The sacreBLEU release this module reproduces; it ends every signature
/// (`...|version:2.6.0`), as sacreBLEU's own signatures do.
pub const SACREBLEU_VERSION: &str = "2.6.0";

/// BLEU's maximum n-gram order (sacreBLEU's `MAX_NGRAM_ORDER`).
pub const MAX_NGRAM_ORDER: usize = 4;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a score could not be computed.
#[derive(Debug, Clone, PartialEq)]
pub enum SacreBleuError {
    /// No hypothesis lines: sacreBLEU itself fails on an empty corpus.
    EmptyCorpus,
    /// No reference stream was given.
    NoReferences,
    /// A reference stream does not have one line per hypothesis line.
    /// sacreBLEU's Python API silently truncates (`zip`); we refuse, because a
    /// truncated test set gives a plausible-looking but wrong score.
    LineCountMismatch {
        /// Index of the offending reference stream (0-based).
        stream: usize,
        /// Number of hypothesis lines.
        hyps: usize,
        /// Number of lines in that reference stream.
        refs: usize,
    },
    /// `Tokenize::from_str` got a name other than `none`, `13a` or `intl`.
    UnknownTokenizer(String),
    /// `Smooth::from_name` got a name other than `none`, `floor`, `add-k`, `exp`.
    UnknownSmoothing(String),
    /// chrF needs at least one character or word n-gram order.
    ZeroChrfOrder,
}

impl fmt::Display for SacreBleuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyCorpus => write!(f, "cannot score an empty corpus (0 hypothesis lines)"),
            Self::NoReferences => write!(f, "no reference stream given"),
            Self::LineCountMismatch { stream, hyps, refs } => write!(
                f,
                "line count mismatch: {hyps} hypothesis lines but reference stream {stream} has \
                 {refs} lines"
            ),
            Self::UnknownTokenizer(name) => {
                write!(f, "unknown BLEU tokenizer {name:?} (expected none, 13a or intl)")
            }
            Self::UnknownSmoothing(name) => write!(
                f,
                "unknown BLEU smoothing method {name:?} (expected none, floor, add-k or exp)"
            ),
            Self::ZeroChrfOrder => {
                write!(f, "chrF needs char_order + word_order > 0")
            }
        }
    }
}

impl std::error::Error for SacreBleuError {}

// ---------------------------------------------------------------------------
// Python string semantics
// ---------------------------------------------------------------------------

/// Python's `str.isspace()`, which `str.split()` and `str.rstrip()` use.
///
/// It is Rust's `char::is_whitespace` plus U+001C..U+001F (the information
/// separators, which Python counts as whitespace by their bidi class).  A
/// sentence containing one of them must split where sacreBLEU splits it.
fn is_py_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// Python's `s.split()` (no argument): runs of whitespace separate, no empty
/// tokens.
fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|t| !t.is_empty())
}

/// Python's `s.rstrip()` (no argument).
fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_space)
}

/// Python's `str.lower()`: full Unicode lowercase mapping including the
/// final-sigma rule, which Rust's `str::to_lowercase` also implements.
fn py_lower(s: &str) -> String {
    s.to_lowercase()
}

// ---------------------------------------------------------------------------
// A fast hasher for the per-segment n-gram maps
// ---------------------------------------------------------------------------

/// FxHash (rustc's hasher): n-gram counting is hashing-bound and the keys are
/// not attacker-controlled, so SipHash's DoS resistance buys nothing here.
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

// ---------------------------------------------------------------------------
// Tokenizers
// ---------------------------------------------------------------------------

/// BLEU tokenizer (sacreBLEU's `--tokenize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum Tokenize {
    /// `none`: split on whitespace only.
    #[serde(rename = "none")]
    None,
    /// `13a`: mteval-v13a.pl's tokenizer, sacreBLEU's (and WMT's) default.
    #[default]
    #[serde(rename = "13a")]
    Mteval13a,
    /// `intl`: mteval-v14.pl's international tokenizer
    /// (`TokenizerV14International`), splitting on Unicode punctuation and
    /// symbol categories.
    #[serde(rename = "intl")]
    Intl,
}

impl Tokenize {
    /// The name sacreBLEU uses on the command line and in signatures (`tok:13a`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Mteval13a => "13a",
            Self::Intl => "intl",
        }
    }

    /// Apply the tokenizer exactly as sacreBLEU's tokenizer object's
    /// `__call__` does: `13a` and `intl` return tokens joined by single
    /// spaces, `none` returns its input unchanged.
    ///
    /// BLEU calls this on the already lowercased (if asked) and `rstrip()`ped
    /// line; [`bleu_tokens`] does the whole pipeline.
    pub fn apply(self, line: &str) -> String {
        match self {
            Self::None => line.to_string(),
            Self::Mteval13a => tokenize_13a(line),
            Self::Intl => tokenize_intl(line),
        }
    }
}

impl fmt::Display for Tokenize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tokenize {
    type Err = SacreBleuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "13a" => Ok(Self::Mteval13a),
            "intl" => Ok(Self::Intl),
            other => Err(SacreBleuError::UnknownTokenizer(other.to_string())),
        }
    }
}

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

/// sacreBLEU's `Tokenizer13a` followed by `TokenizerRegexp`.
///
/// The four regular expressions of `TokenizerRegexp` are applied as explicit
/// byte scans instead of regexes: each is a fixed two-character pattern, and
/// scanning left to right, consuming both characters on a match, is exactly
/// `re.sub`'s leftmost, non-overlapping matching.  Working on bytes is safe
/// because every pattern character is ASCII, the only non-ASCII test is
/// "not an ASCII digit" (true of every byte of a multi-byte character), and
/// spaces are only ever inserted next to an ASCII byte, i.e. at a character
/// boundary.
fn tokenize_13a(line: &str) -> String {
    // Language-independent part of mteval-v13a.
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        // Order matters ("&amp;lt;" becomes "<"), as in sacreBLEU.
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }

    // `([\{-\~\[-\` -\&\(-\+\:-\@\/])` -> ` \1 ` on f" {line} ".
    let mut buf = Vec::with_capacity(line.len() * 2 + 2);
    buf.push(b' ');
    for &b in line.as_bytes() {
        if matches!(b, b'{'..=b'~' | b'['..=b'`' | b' '..=b'&' | b'('..=b'+' | b':'..=b'@' | b'/') {
            buf.extend_from_slice(&[b' ', b, b' ']);
        } else {
            buf.push(b);
        }
    }
    buf.push(b' ');

    let is_sep = |b: u8| b == b'.' || b == b',';
    // "tokenize period and comma unless preceded by a digit":
    // `([^0-9])([\.,])` -> `\1 \2 `
    let buf = substitute_pairs(
        &buf,
        |a, b| !a.is_ascii_digit() && is_sep(b),
        |out, a, b| out.extend_from_slice(&[a, b' ', b, b' ']),
    );
    // "tokenize period and comma unless followed by a digit":
    // `([\.,])([^0-9])` -> ` \1 \2`
    let buf = substitute_pairs(
        &buf,
        |a, b| is_sep(a) && !b.is_ascii_digit(),
        |out, a, b| out.extend_from_slice(&[b' ', a, b' ', b]),
    );
    // "tokenize dash when preceded by a digit": `([0-9])(-)` -> `\1 \2 `
    let buf = substitute_pairs(
        &buf,
        |a, b| a.is_ascii_digit() && b == b'-',
        |out, a, b| out.extend_from_slice(&[a, b' ', b, b' ']),
    );

    // Spaces were inserted at character boundaries only, so this is valid
    // UTF-8; the lossy fallback just avoids a panic path.
    let text = String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    // `' '.join(line.split())`
    join_py_tokens(&text)
}

/// `re.sub` for a two-character pattern: leftmost match first, matches do not
/// overlap, and scanning resumes after a match.
fn substitute_pairs(
    input: &[u8],
    matches: impl Fn(u8, u8) -> bool,
    emit: impl Fn(&mut Vec<u8>, u8, u8),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + input.len() / 4 + 4);
    let mut i = 0;
    while i < input.len() {
        if i + 1 < input.len() && matches(input[i], input[i + 1]) {
            emit(&mut out, input[i], input[i + 1]);
            i += 2;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    out
}

fn join_py_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for token in py_split(text) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(token);
    }
    out
}

/// sacreBLEU's `TokenizerV14International` (mteval-v14.pl's
/// `tokenization_international`).  Unicode general categories come from the
/// `regex` crate, as they come from the `regex` module in sacreBLEU.
///
/// As in mteval-v14 (and sacreBLEU), a number followed by a sentence-final
/// period keeps the period ("in 2019." stays one token).
fn tokenize_intl(line: &str) -> String {
    static RULES: OnceLock<[(Regex, &'static str); 3]> = OnceLock::new();
    let rules = RULES.get_or_init(|| {
        let re = |pattern: &str| Regex::new(pattern).expect("constant intl tokenizer regex");
        [
            // Separate out punctuations preceded by a non-digit.
            (re(r"(\P{N})(\p{P})"), "${1} ${2} "),
            // Separate out punctuations followed by a non-digit.
            (re(r"(\p{P})(\P{N})"), " ${1} ${2}"),
            // Separate out symbols.
            (re(r"(\p{S})"), " ${1} "),
        ]
    });
    let mut text = line.to_string();
    for (re, replacement) in rules {
        text = re.replace_all(&text, *replacement).into_owned();
    }
    join_py_tokens(&text)
}

// ---------------------------------------------------------------------------
// BLEU
// ---------------------------------------------------------------------------

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

/// Check that every reference stream has one line per hypothesis.
fn check_streams<R, S>(n_hyps: usize, refs: &[R]) -> Result<(), SacreBleuError>
where
    R: AsRef<[S]>,
{
    if n_hyps == 0 {
        return Err(SacreBleuError::EmptyCorpus);
    }
    if refs.is_empty() {
        return Err(SacreBleuError::NoReferences);
    }
    for (stream, lines) in refs.iter().enumerate() {
        let n_refs = lines.as_ref().len();
        if n_refs != n_hyps {
            return Err(SacreBleuError::LineCountMismatch {
                stream,
                hyps: n_hyps,
                refs: n_refs,
            });
        }
    }
    Ok(())
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

// ---------------------------------------------------------------------------
// chrF
// ---------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_includes_information_separators() {
        assert_eq!(
            py_split("a\u{1c}b\u{a0}c\u{3000}d \t").collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert!(
            !is_py_space('\u{200b}'),
            "zero-width space is not whitespace in Python"
        );
        assert_eq!(py_rstrip("x \u{1f}\u{2003}"), "x");
    }

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
