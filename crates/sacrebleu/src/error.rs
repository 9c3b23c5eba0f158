//! Why a score could not be computed: sacreBLEU's own failures (an empty corpus, no
//! references, an unknown option name) plus the line-count mismatch that sacreBLEU lets
//! through and we refuse.

use std::fmt;

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
