//! Corpus BLEU and chrF that reproduce sacreBLEU 2.x bit for bit.
//!
//! Translation papers report sacreBLEU numbers, so Ember's evaluation must
//! produce the *same* numbers, not "a BLEU".  Every step mirrors a named
//! piece of sacreBLEU ([`SACREBLEU_VERSION`]): `metrics/bleu.py`,
//! `metrics/chrf.py`, `metrics/helpers.py` and the `13a`/`intl` tokenizers.
//! Where Python semantics differ from Rust's defaults (what `str.split()`
//! treats as whitespace, how `re.sub` scans, the order of float operations)
//! the code follows Python, and the doc comment says so.
//!
//! One module per piece: `tokenize` (the BLEU tokenizers), `bleu`, `chrf`,
//! `python` (Python's string semantics) and `fxhash` (the n-gram maps'
//! hasher); `error` says why a score could not be computed.
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

mod bleu;
mod chrf;
mod error;
mod fxhash;
mod python;
mod tokenize;

pub use bleu::{bleu_tokens, corpus_bleu, sentence_bleu, BleuConfig, BleuScore, Smooth, MAX_NGRAM_ORDER};
pub use chrf::{corpus_chrf, sentence_chrf, ChrfConfig, ChrfOrderStats, ChrfScore};
pub use error::SacreBleuError;
pub use tokenize::Tokenize;

/// The sacreBLEU release this crate reproduces; it ends every signature
/// (`...|version:2.6.0`), as sacreBLEU's own signatures do.
pub const SACREBLEU_VERSION: &str = "2.6.0";

/// Check the corpus layout shared by BLEU and chrF: `refs[k][i]` is line `i` of reference
/// stream `k`, and every stream has one line per hypothesis.
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
