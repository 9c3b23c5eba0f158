//! The one error type of the data crate.
//!
//! Every variant that comes from user input says *where* (file and line, or the config key path)
//! and *what to do about it*, because these errors surface as the last line a person reads
//! before a training run refuses to start.

use std::path::PathBuf;

/// Convenience alias used throughout the crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// Everything that can go wrong between a config file and a batch of token ids.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A config value is out of range or inconsistent; `key` is the YAML path (`data.tokenizer.vocab_size`).
    #[error("{key}: {message}")]
    Config { key: String, message: String },

    /// A file could not be opened, read or decompressed.
    #[error("{}{}: {source}; {hint}", key_prefix(key), path.display())]
    Io {
        path: PathBuf,
        /// The config key that named this path, when there is one.
        key: Option<String>,
        #[source]
        source: std::io::Error,
        hint: String,
    },

    /// A text file is not valid UTF-8; `line` is 1-based.
    #[error("{}:{line}: invalid UTF-8 (byte offset {byte_offset}); re-encode the file as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8`", path.display())]
    InvalidUtf8 {
        path: PathBuf,
        line: usize,
        byte_offset: usize,
    },

    /// A corpus file has no text at all.
    #[error("{}{}: the file is empty (no non-blank line); check the path or re-run scripts/get-data.sh", key_prefix(key), path.display())]
    EmptyFile { path: PathBuf, key: Option<String> },

    /// Source and target of a parallel corpus have different numbers of lines.
    #[error(
        "parallel corpus is misaligned: {} has {source_lines} lines but {} has {target_lines}; \
         source and target must be line-aligned translations of each other{}",
        source_path.display(),
        target_path.display(),
        first_difference_hint(*source_lines, *target_lines)
    )]
    Misaligned {
        source_path: PathBuf,
        source_lines: usize,
        target_path: PathBuf,
        target_lines: usize,
    },

    /// Building, training, loading or running the HF tokenizer failed.
    #[error("tokenizer{}: {message}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Tokenizer { path: Option<PathBuf>, message: String },

    /// A saved tokenizer does not match the model it is supposed to feed.
    #[error(
        "tokenizer {} has {actual} tokens but the model config expects vocab_size {expected}; \
         use the tokenizer.json that belongs to this run (or delete it to retrain) and set \
         model.vocab_size to {actual}",
        path.display()
    )]
    VocabSizeMismatch {
        path: PathBuf,
        actual: usize,
        expected: usize,
    },

    /// A training example cannot fit in one batch of `max_tokens` padded tokens.
    #[error(
        "training example {index} needs {needed} padded tokens (source length {src_len}, target \
         length {tgt_len} + 1 for bos/eos) but train.max_tokens is {max_tokens}; raise \
         train.max_tokens or lower data.max_source_len / data.max_target_len so it is filtered out"
    )]
    ExampleTooLong {
        index: usize,
        src_len: usize,
        tgt_len: usize,
        needed: usize,
        max_tokens: usize,
    },

    /// A pair does not fit the model's positions (`data.too_long: error`).
    #[error(
        "{location}: the {side} has {tokens} tokens{}, more than model.max_seq_len = {max_seq_len}{}; \
         set data.too_long: skip (drop such pairs) or truncate (cut them to fit), or raise \
         model.max_seq_len",
        if side == "target" { format!(" ({positions} positions with its end-of-sentence token)") } else { String::new() },
        if *others > 0 { format!(" ({others} more pair(s) of the {split} split are too long as well)") } else { String::new() }
    )]
    TooLongForModel {
        location: String,
        side: String,
        tokens: usize,
        positions: usize,
        max_seq_len: usize,
        others: usize,
        split: String,
    },

    /// A token stream is too short to cut even one window of `block_size + 1` tokens.
    #[error(
        "the {split} token stream has {len} tokens, fewer than block_size + 1 = {}; use a smaller \
         train.block_size or more text (for a fraction split, a larger data.corpus.val_fraction)",
        block_size + 1
    )]
    StreamTooShort {
        split: String,
        len: usize,
        block_size: usize,
    },

    /// A cursor does not describe a position in this batcher's epochs.
    #[error(
        "cursor (epoch {epoch}, position {position}) is out of range: an epoch has \
         {batches_per_epoch} batches; the checkpoint was probably written for different data or \
         batch settings"
    )]
    CursorOutOfRange {
        epoch: u64,
        position: u64,
        batches_per_epoch: u64,
    },

    /// An argument passed by the caller (batch sizes, split sizes) is unusable.
    #[error("{name}: {message}")]
    InvalidArgument { name: String, message: String },
}

fn key_prefix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!("{k} = ")).unwrap_or_default()
}

fn first_difference_hint(source_lines: usize, target_lines: usize) -> String {
    let diff = source_lines.abs_diff(target_lines);
    format!(" ({diff} line(s) differ; a missing final line or an extra blank line is the usual cause)")
}

impl DataError {
    pub(crate) fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        DataError::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    pub(crate) fn tokenizer(path: Option<&std::path::Path>, message: impl std::fmt::Display) -> Self {
        DataError::Tokenizer {
            path: path.map(|p| p.to_path_buf()),
            message: message.to_string(),
        }
    }

    pub(crate) fn arg(name: impl Into<String>, message: impl Into<String>) -> Self {
        DataError::InvalidArgument {
            name: name.into(),
            message: message.into(),
        }
    }
}
