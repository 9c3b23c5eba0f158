//! How training micro-batches are formed, resolved once from the `train:` keys that describe
//! them.
//!
//! The YAML keeps `train.max_tokens` (translation) and `train.batch_size` with
//! `train.block_size` (language models) as keys of their own, each optional because which ones
//! a config needs depends on its corpus. [`RunConfig::batching`] checks them against each other,
//! the corpus and the model, and gives the one [`Batching`] that the batcher, the memory
//! estimate and validation read.

use ember_data::{Splits, TextSplits, TranslationSplits};

use super::validate::{bad, Invalid};
use super::RunConfig;

/// How training micro-batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// Translation: sentence pairs up to `max_tokens` padded tokens per micro-batch
    /// (`train.max_tokens`, fairseq's `--max-tokens`).
    TokenBudget { max_tokens: usize },
    /// Language modelling: `batch_size` windows of `block_size` tokens per micro-batch
    /// (`train.batch_size`, `train.block_size`).
    Windows { batch_size: usize, block_size: usize },
}

/// A corpus's splits with the batching that forms their micro-batches.
pub(crate) enum Batched<'a> {
    Translation {
        splits: &'a TranslationSplits,
        max_tokens: usize,
    },
    Text {
        splits: &'a TextSplits,
        batch_size: usize,
        block_size: usize,
    },
}

impl Batching {
    /// [`RunConfig::batching`] for code that reports errors with `anyhow`.
    pub(crate) fn of(cfg: &RunConfig) -> anyhow::Result<Self> {
        cfg.batching()
            .map_err(|(key, message)| anyhow::anyhow!("{key}: {message}"))
    }

    /// `cfg`'s batching with the splits of its data. The corpus decides both, so they agree
    /// for every config that passed validation; a mismatch is refused, not a panic.
    pub(crate) fn of_data<'a>(cfg: &RunConfig, splits: &'a Splits) -> anyhow::Result<Batched<'a>> {
        match (splits, Self::of(cfg)?) {
            (Splits::Translation(splits), Batching::TokenBudget { max_tokens }) => {
                Ok(Batched::Translation { splits, max_tokens })
            }
            (
                Splits::Text(splits),
                Batching::Windows {
                    batch_size,
                    block_size,
                },
            ) => Ok(Batched::Text {
                splits,
                batch_size,
                block_size,
            }),
            (_, batching) => anyhow::bail!(
                "the data's splits do not fit the batching {batching:?} of the config \
                 (translation needs train.max_tokens, a text corpus batch_size and block_size)"
            ),
        }
    }
}

impl RunConfig {
    /// The batching that fits the corpus: token budgets for translation, windows for language
    /// models. This is the check [`validate`](Self::validate) runs, so it fails only for a
    /// config that was never validated.
    pub fn batching(&self) -> Result<Batching, Invalid> {
        let t = &self.train;
        if self.data.corpus.is_translation() {
            if self.model.arch != ember_model::Arch::Seq2seq {
                return bad(
                    "model.arch",
                    "a translation corpus (data.corpus.kind: embedded | parallel, or hf_dataset with source/target columns) needs model.arch: seq2seq"
                        .into(),
                );
            }
            let max_tokens = match t.max_tokens {
                None | Some(0) => {
                    return bad(
                        "train.max_tokens",
                        "translation needs train.max_tokens (e.g. 4096)".into(),
                    )
                }
                Some(max_tokens) => max_tokens,
            };
            if t.batch_size.is_some() || t.block_size.is_some() {
                return bad(
                    "train.batch_size",
                    "batch_size/block_size are for language models; use train.max_tokens".into(),
                );
            }
            Ok(Batching::TokenBudget { max_tokens })
        } else {
            if self.model.arch != ember_model::Arch::Lm {
                return bad(
                    "model.arch",
                    "a text corpus (data.corpus.kind: text | token_shards, or hf_dataset with a text column) needs model.arch: lm".into(),
                );
            }
            let (batch_size, block_size) = match (t.batch_size, t.block_size) {
                (Some(b), Some(s)) if b > 0 && s > 0 => {
                    if s > self.model.max_seq_len {
                        return bad(
                            "train.block_size",
                            format!("{s} exceeds model.max_seq_len = {}", self.model.max_seq_len),
                        );
                    }
                    (b, s)
                }
                _ => {
                    return bad(
                        "train.batch_size",
                        "language models need train.batch_size and train.block_size (both ≥ 1)".into(),
                    )
                }
            };
            if t.max_tokens.is_some() {
                return bad(
                    "train.max_tokens",
                    "max_tokens is for translation; use batch_size and block_size".into(),
                );
            }
            Ok(Batching::Windows {
                batch_size,
                block_size,
            })
        }
    }
}
