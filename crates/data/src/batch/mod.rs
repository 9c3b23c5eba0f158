//! Batches as plain row-major id arrays, and the batchers that cut them.
//!
//! Both training batchers are pure functions of `(seed, epoch, position)`: the batch at a given
//! position of a given epoch is recomputed from scratch rather than drawn from RNG state, so a
//! [`Cursor`] of two integers is the whole resumable state. Restoring a cursor reproduces the
//! remaining batches of the epoch, and every later epoch, bit for bit.
//!
//! * [`TokenBudgetBatcher`] (translation, fairseq-style `max_tokens`): examples are sorted by
//!   (source length, target length) so a batch holds similar lengths and little padding; equal
//!   lengths are shuffled per epoch, so batch *composition* varies between epochs while batch
//!   *shapes* (and hence the number of batches and the padding efficiency) do not; the order of
//!   batches is shuffled per `(seed, epoch)`.
//! * [`LmWindowBatcher`] (language modelling): `batch_size` windows of `block_size` tokens, either
//!   sampled at random offsets (nanoGPT) or swept without overlap in a shuffled order.
//!
//! [`EvalBatches`] and [`LmEvalBatches`] walk a validation/test split once in a fixed order.
//!
//! The batch types and the [`Batcher`] interface live here; `token_budget` and `windows` hold
//! the batchers of each kind.

mod token_budget;
mod windows;

use serde::{Deserialize, Serialize};

use crate::corpus::Example;
use crate::error::{DataError, Result};
use crate::tokenizer::SpecialIds;

pub use token_budget::{EvalBatches, TokenBudgetBatcher};
pub use windows::{LmEvalBatches, LmWindowBatcher, WindowMode};

// Stream tags keep the RNG streams of different decisions independent (kept side by side here
// so that they stay distinct).
const TAG_TIE_BREAK: u64 = 0x7469_6562_7265_616b; // "tiebreak"
const TAG_BATCH_ORDER: u64 = 0x6261_7463_686f_7264; // "batchord"
const TAG_WINDOWS: u64 = 0x77696e_646f7773; // "windows"

/// A translation batch. All arrays are row-major `batch_size × len`, right-padded with `pad`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seq2SeqBatch {
    pub batch_size: usize,
    pub src_len: usize,
    /// Length of the `tgt_in` / `tgt_out` rows (longest target + 1).
    pub tgt_len: usize,
    /// Source ids (no bos/eos).
    pub src: Vec<u32>,
    /// 1 where `src` is a real token, 0 where it is padding.
    pub src_mask: Vec<u8>,
    /// Decoder input: `[bos] + target`.
    pub tgt_in: Vec<u32>,
    /// Decoder labels: `target + [eos]`; padding positions hold `pad` and must be ignored by the loss.
    pub tgt_out: Vec<u32>,
    /// 1 where `tgt_out` is a real label (same positions are real in `tgt_in`).
    pub tgt_mask: Vec<u8>,
    /// Real (non-pad) tokens in `src`.
    pub n_src_tokens: usize,
    /// Real (non-pad) labels in `tgt_out`: the loss normaliser.
    pub n_tgt_tokens: usize,
    /// Index of each row's example in the split, to align hypotheses with references.
    pub indices: Vec<usize>,
}

impl Seq2SeqBatch {
    /// Real (unpadded) source and target lengths of row `r`.
    fn row_lens(&self, r: usize) -> (usize, usize) {
        let real = |mask: &[u8], len: usize| mask[r * len..(r + 1) * len].iter().filter(|&&m| m != 0).count();
        (
            real(&self.src_mask, self.src_len),
            real(&self.tgt_mask, self.tgt_len),
        )
    }

    /// At most `shares` contiguous blocks of rows, in order and covering the batch, whose
    /// largest padded size — rows × (longest source + longest target) — is the least possible
    /// (any shares beyond them get no rows).
    ///
    /// A block's padded size only grows as it takes in another row, so the least feasible
    /// largest size is found by bisection, testing each candidate greedily: fill a block while
    /// it fits, then start the next; the candidate is feasible if at most `shares` blocks do.
    fn balanced_shares(&self, shares: usize) -> Vec<std::ops::Range<usize>> {
        let lens: Vec<(usize, usize)> = (0..self.batch_size).map(|r| self.row_lens(r)).collect();
        let greedy = |limit: usize| -> Option<Vec<std::ops::Range<usize>>> {
            let mut blocks = Vec::new();
            let mut start = 0;
            while start < lens.len() {
                let (mut src, mut tgt, mut end) = (0, 0, start);
                while end < lens.len() {
                    let (s, t) = (src.max(lens[end].0), tgt.max(lens[end].1));
                    if (end + 1 - start) * (s + t) > limit {
                        break;
                    }
                    (src, tgt, end) = (s, t, end + 1);
                }
                if end == start || blocks.len() == shares {
                    return None; // a row alone is over the limit, or too many blocks
                }
                blocks.push(start..end);
                start = end;
            }
            Some(blocks)
        };
        let whole = lens.len() * (self.src_len + self.tgt_len);
        let (mut lo, mut hi) = (0, whole);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if greedy(mid).is_some() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        greedy(lo).expect("the whole batch in one block always fits")
    }

    /// Padded tokens of the larger side: the quantity `max_tokens` bounds.
    pub fn padded_tokens(&self) -> usize {
        self.batch_size * self.src_len.max(self.tgt_len)
    }

    fn build(examples: &[Example], indices: Vec<usize>, sp: SpecialIds) -> Self {
        let b = indices.len();
        let src_len = indices
            .iter()
            .map(|&i| examples[i].source.len())
            .max()
            .unwrap_or(0);
        let tgt_len = indices
            .iter()
            .map(|&i| examples[i].target.len() + 1)
            .max()
            .unwrap_or(1);
        let mut batch = Seq2SeqBatch {
            batch_size: b,
            src_len,
            tgt_len,
            src: vec![sp.pad; b * src_len],
            src_mask: vec![0; b * src_len],
            tgt_in: vec![sp.pad; b * tgt_len],
            tgt_out: vec![sp.pad; b * tgt_len],
            tgt_mask: vec![0; b * tgt_len],
            n_src_tokens: 0,
            n_tgt_tokens: 0,
            indices,
        };
        for (row, &i) in batch.indices.iter().enumerate() {
            let ex = &examples[i];
            let s = row * src_len;
            batch.src[s..s + ex.source.len()].copy_from_slice(&ex.source);
            batch.src_mask[s..s + ex.source.len()].fill(1);
            let t = row * tgt_len;
            let n = ex.target.len();
            batch.tgt_in[t] = sp.bos;
            batch.tgt_in[t + 1..t + 1 + n].copy_from_slice(&ex.target);
            batch.tgt_out[t..t + n].copy_from_slice(&ex.target);
            batch.tgt_out[t + n] = sp.eos;
            batch.tgt_mask[t..t + n + 1].fill(1);
            batch.n_src_tokens += ex.source.len();
            batch.n_tgt_tokens += n + 1;
        }
        batch
    }
}

impl Seq2SeqBatch {
    /// Rows `rows` of this batch, padded to their own longest source and target.
    fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        let lens: Vec<(usize, usize)> = rows.clone().map(|r| self.row_lens(r)).collect();
        let src_len = lens.iter().map(|l| l.0).max().unwrap_or(0);
        let tgt_len = lens.iter().map(|l| l.1).max().unwrap_or(1);
        let take = |v: &[u32], len: usize, keep: usize| -> Vec<u32> {
            rows.clone()
                .flat_map(|r| v[r * len..r * len + keep].iter().copied())
                .collect()
        };
        let take_mask = |v: &[u8], len: usize, keep: usize| -> Vec<u8> {
            rows.clone()
                .flat_map(|r| v[r * len..r * len + keep].iter().copied())
                .collect()
        };
        let src_mask = take_mask(&self.src_mask, self.src_len, src_len);
        let tgt_mask = take_mask(&self.tgt_mask, self.tgt_len, tgt_len);
        Seq2SeqBatch {
            batch_size: rows.len(),
            src_len,
            tgt_len,
            src: take(&self.src, self.src_len, src_len),
            n_src_tokens: src_mask.iter().filter(|&&m| m != 0).count(),
            n_tgt_tokens: tgt_mask.iter().filter(|&&m| m != 0).count(),
            src_mask,
            tgt_in: take(&self.tgt_in, self.tgt_len, tgt_len),
            tgt_out: take(&self.tgt_out, self.tgt_len, tgt_len),
            tgt_mask,
            indices: self.indices[rows].to_vec(),
        }
    }
}

/// A language-modelling batch: `target` is `input` shifted left by one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LmBatch {
    pub batch_size: usize,
    pub block_size: usize,
    /// Row-major `batch_size × block_size`.
    pub input: Vec<u32>,
    /// Row-major `batch_size × block_size`.
    pub target: Vec<u32>,
    /// Stream offset of each row's first input token.
    pub offsets: Vec<usize>,
}

impl LmBatch {
    fn build(stream: &[u32], offsets: Vec<usize>, block_size: usize) -> Self {
        let mut input = Vec::with_capacity(offsets.len() * block_size);
        let mut target = Vec::with_capacity(offsets.len() * block_size);
        for &o in &offsets {
            input.extend_from_slice(&stream[o..o + block_size]);
            target.extend_from_slice(&stream[o + 1..o + block_size + 1]);
        }
        LmBatch {
            batch_size: offsets.len(),
            block_size,
            input,
            target,
            offsets,
        }
    }
}

/// Either kind of batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Batch {
    Seq2Seq(Seq2SeqBatch),
    Lm(LmBatch),
}

impl Batch {
    /// Rows in the batch (sentences or windows).
    pub fn batch_size(&self) -> usize {
        match self {
            Batch::Seq2Seq(b) => b.batch_size,
            Batch::Lm(b) => b.batch_size,
        }
    }

    /// Real target tokens: what the loss is normalised by.
    pub fn target_tokens(&self) -> usize {
        match self {
            Batch::Seq2Seq(b) => b.n_tgt_tokens,
            Batch::Lm(b) => b.target.len(),
        }
    }

    /// The rows of share `share` of `shares` (see [`share`](Self::share)), without copying them.
    pub fn share_rows(&self, share: usize, shares: usize) -> std::ops::Range<usize> {
        assert!(shares > 0 && share < shares, "share {share} of {shares}");
        let n = self.batch_size();
        match self {
            Batch::Seq2Seq(b) => b.balanced_shares(shares).get(share).cloned().unwrap_or(n..n),
            Batch::Lm(_) => share * n / shares..(share + 1) * n / shares,
        }
    }

    /// Share `share` of `shares` for data-parallel training: a contiguous block of rows, so the
    /// shares in order are the batch row for row. A language-model batch's blocks differ in size
    /// by at most one window. A translation batch is split so that the largest share's padded
    /// tokens (rows × (longest source + longest target)) are as few as any contiguous split can
    /// make them, and each share is padded to its own longest sentence (padding is masked, so the
    /// loss is the same): its rows are sorted by length, and equal row counts gave the share of
    /// the longest sentences 5% (2 shares) to 13% (16 shares) more work than an even split of
    /// the cost on Multi30k, which every other share then waited for. `None` when the share has
    /// no rows (fewer rows than shares, or sentences too uneven to give every share some).
    pub fn share(&self, share: usize, shares: usize) -> Option<Batch> {
        let rows = self.share_rows(share, shares);
        if rows.is_empty() {
            return None;
        }
        Some(match self {
            Batch::Seq2Seq(b) => Batch::Seq2Seq(b.rows(rows)),
            Batch::Lm(b) => {
                let t = b.block_size;
                Batch::Lm(LmBatch {
                    batch_size: rows.len(),
                    block_size: t,
                    input: b.input[rows.start * t..rows.end * t].to_vec(),
                    target: b.target[rows.start * t..rows.end * t].to_vec(),
                    offsets: b.offsets[rows].to_vec(),
                })
            }
        })
    }
}

/// Where a batcher stands: the next batch it will produce is number `position` (0-based) of
/// epoch `epoch`. Saved in checkpoints.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Cursor {
    pub epoch: u64,
    pub position: u64,
}

/// The interface the trainer drives; both training batchers implement it.
pub trait Batcher: Send {
    /// The batch at the cursor; advances it, rolling into the next epoch forever.
    fn next_batch(&mut self) -> Batch;
    /// Position of the next batch. Right after the last batch of epoch `e` it is `(e + 1, 0)`.
    fn cursor(&self) -> Cursor;
    /// Jumps to `cursor`. `position == batches_per_epoch` is accepted as "epoch finished";
    /// anything larger is an error.
    fn restore(&mut self, cursor: Cursor) -> Result<()>;
    fn batches_per_epoch(&self) -> u64;
    /// Real tokens / padded tokens over an epoch (1.0 for LM windows).
    fn padding_efficiency(&self) -> f64;
}

fn normalize_cursor(c: Cursor, batches_per_epoch: u64) -> Result<Cursor> {
    let out_of_range = || DataError::CursorOutOfRange {
        epoch: c.epoch,
        position: c.position,
        batches_per_epoch,
    };
    if c.position < batches_per_epoch {
        Ok(c)
    } else if c.position == batches_per_epoch {
        Ok(Cursor {
            epoch: c.epoch.checked_add(1).ok_or_else(out_of_range)?,
            position: 0,
        })
    } else {
        Err(out_of_range())
    }
}
