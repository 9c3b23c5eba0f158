//! The raw corpus: every split's text (or, for token shards, ids) as read, before tokenisation.
//!
//! Only the types live here, so that the readers of each source (`corpus` for text files,
//! `hf_dataset` for parquet) can build them without importing each other.

use std::path::PathBuf;

/// Line-aligned raw pairs of one split, blank pairs already removed.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RawPairs {
    pub sources: Vec<String>,
    pub targets: Vec<String>,
    /// Pairs skipped because the source or the target line was blank.
    pub dropped_empty: usize,
    /// The 1-based line number of each kept pair in its files (for errors that name a line).
    pub lines: Vec<usize>,
}

/// A monolingual text file (or the part of one) that becomes one run of the token stream.
#[derive(Clone, Debug, PartialEq)]
pub struct RawText {
    /// Where it came from, for reports (`input.txt[0..90%]`).
    pub name: String,
    pub text: String,
    /// Windows line endings (CRLF) the file had, read as plain newlines (the model and a char
    /// vocabulary never see the `\r`).
    pub crlf: usize,
}

impl RawText {
    /// The text of `name` with its Windows line endings read as plain newlines, counted.
    pub fn plain_newlines(name: String, text: String) -> Self {
        let crlf = text.matches("\r\n").count();
        let text = if crlf > 0 {
            text.replace("\r\n", "\n")
        } else {
            text
        };
        Self { name, text, crlf }
    }
}

/// The ids of one llama2.c shard file.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenShard {
    pub path: PathBuf,
    pub ids: Vec<u32>,
}

/// Raw text of every split, before tokenisation (or, for token shards, the ids themselves).
#[derive(Clone, Debug, PartialEq)]
pub enum RawCorpus {
    Translation {
        train: RawPairs,
        valid: RawPairs,
        test: Option<RawPairs>,
    },
    Text {
        train: Vec<RawText>,
        valid: Vec<RawText>,
    },
    /// Already tokenised (`kind: token_shards`): the shards of each split, in order.
    Tokens {
        train: Vec<TokenShard>,
        valid: Vec<TokenShard>,
    },
}
