//! Ember's data pipeline: text in, plain `u32` id batches out.
//!
//! The crate deliberately knows nothing about tensors: batches are row-major `Vec<u32>` plus
//! shapes and masks, and the trainer turns them into candle tensors. That keeps data loading,
//! batching and resumption testable without a model and lets the data flow one way
//! (config → data → model → trainer).
//!
//! Typical use by a trainer:
//!
//! ```
//! use ember_data::{Batcher, CorpusConfig, DataConfig, Dataset, EmbeddedConfig, Splits, TokenBudgetBatcher};
//! # fn main() -> ember_data::Result<()> {
//! let mut cfg = DataConfig::default(); // the embedded English→German task, a BPE tokenizer
//! cfg.corpus = CorpusConfig::Embedded(EmbeddedConfig { train_size: 300, val_size: 20, test_size: 0, seed: 1 });
//! cfg.tokenizer.vocab_size = Some(200);
//! let data = Dataset::prepare(&cfg, None)?; // Some(run_dir) would also cache the token ids
//! let Splits::Translation(splits) = &data.splits else { unreachable!() };
//! let mut batcher = TokenBudgetBatcher::new(
//!     splits.train.examples.clone(), 512, data.tokenizer.specials(), 42)?;
//! let batch = batcher.next_seq2seq();
//! assert!(batch.batch_size > 0 && batch.batch_size * batch.src_len <= 512);
//! let resume_point = batcher.cursor(); // store in the checkpoint; `restore` it later
//! # let _ = resume_point; Ok(()) }
//! ```
//!
//! Modules: `config` (the YAML `data:` section), `tokenizer` (HF `tokenizers` BPE / char),
//! `raw` (the corpus as read), `corpus` (reading, tokenising, statistics, the token cache), `batch` (token-budget and
//! window batchers with a resumable [`Cursor`]), [`embedded`] (the built-in translation task),
//! [`hf_dataset`] and [`parquet`] (Hugging Face datasets' parquet files), [`shards`] (llama2.c
//! token shards).

mod batch;
pub mod cache;
mod config;
mod corpus;
pub mod embedded;
mod error;
pub mod hf_dataset;
#[cfg(feature = "hf-hub")]
pub mod hub;
pub mod io;
mod lengths;
pub mod parquet;
mod raw;
pub mod shards;
mod tokenizer;

pub use batch::{
    Batch, Batcher, Cursor, EvalBatches, LmBatch, LmEvalBatches, LmWindowBatcher, Seq2SeqBatch,
    TokenBudgetBatcher, WindowMode,
};
pub use config::{
    CorpusConfig, DataConfig, EmbeddedConfig, HfColumns, HfDatasetConfig, HfSplits, PairPaths,
    ParallelConfig, TextConfig, TokenShardsConfig, TokenizerConfig, TokenizerKind, TooLong,
    DEFAULT_VAL_FRACTION,
};
pub use corpus::{
    CacheStatus, Dataset, Example, LoadReport, PairSplit, SplitStats, Splits, TextSplits, TextStats,
    TokenizerOrigin, TranslationSplits, TOKEN_CACHE_FILE,
};
pub use error::{DataError, Result};
pub use lengths::{fit_to_positions, LengthReport};
pub use raw::{RawCorpus, RawPairs, RawText, TokenShard};
pub use tokenizer::{
    SpecialIds, SpecialTokens, Tokenizer, BOS_ID, BOS_TOKEN, EOS_ID, EOS_TOKEN, PAD_ID, PAD_TOKEN,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, UNK_ID, UNK_TOKEN,
};

/// Locates the data folder for data-dependent tests and examples: `$EMBER_SHARED_DATA` when set
/// (authoritative: pointing it at an empty place makes those tests skip), else
/// `<workspace>/../shared/data`, else `<workspace>/data` (filled by `scripts/get-data.sh`).
/// `None` when no candidate holds `multi30k/` or `tinyshakespeare/`; callers then skip.
pub fn find_shared_data() -> Option<std::path::PathBuf> {
    let has_data = |p: &std::path::Path| p.join("multi30k").is_dir() || p.join("tinyshakespeare").is_dir();
    if let Some(p) = std::env::var_os("EMBER_SHARED_DATA") {
        let p = std::path::PathBuf::from(p);
        return has_data(&p).then_some(p);
    }
    // crates/data → workspace root.
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [workspace.join("../shared/data"), workspace.join("data")]
        .into_iter()
        .find(|p| has_data(p))
        .map(|p| p.canonicalize().unwrap_or(p))
}
