//! sacreBLEU's BLEU tokenizers: `none`, `13a` (mteval-v13a, the default) and `intl`
//! (mteval-v14's international tokenizer), each producing the same tokens as sacreBLEU's
//! tokenizer objects.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

use crate::python::join_py_tokens;
use crate::SacreBleuError;

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
    /// line; [`bleu_tokens`](crate::bleu_tokens) does the whole pipeline.
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
