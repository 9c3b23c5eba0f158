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

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::corpus::Example;
use crate::error::{DataError, Result};
use crate::tokenizer::SpecialIds;
use ember_rng::{derive_seed, SplitMix64};

// Stream tags keep the RNG streams of different decisions independent.
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

/// Token-budget batching for translation (see the module docs).
///
/// A batch of `B` rows costs `B × max(src_len, tgt_len)` padded tokens, where `tgt_len` counts
/// the bos/eos position; every batch keeps this at or below `max_tokens`. A training example
/// that cannot fit even alone is an error naming it (the loader's `max_source_len` /
/// `max_target_len` filter is the place to drop such pairs), so the budget is a hard guarantee.
#[derive(Clone, Debug)]
pub struct TokenBudgetBatcher {
    examples: Arc<[Example]>,
    max_tokens: usize,
    specials: SpecialIds,
    seed: u64,
    /// Example indices sorted by (source length, target length, index).
    sorted: Vec<usize>,
    /// Runs `[start, end)` of `sorted` sharing one (source, target) length: shuffled per epoch.
    runs: Vec<(usize, usize)>,
    /// Batches as ranges `[start, end)` of the (per-epoch tie-broken) sorted order.
    bounds: Vec<(usize, usize)>,
    efficiency: f64,
    cursor: Cursor,
    /// The epoch `order` and `batch_order` were built for.
    plan_epoch: Option<u64>,
    order: Vec<usize>,
    batch_order: Vec<usize>,
}

impl TokenBudgetBatcher {
    /// Plans the batches of `examples` under `max_tokens`; shuffling is derived from `seed`.
    /// Errors on `max_tokens == 0`, an empty example list, an example with an empty source, or
    /// an example too long for `max_tokens`.
    pub fn new(
        examples: impl Into<Arc<[Example]>>,
        max_tokens: usize,
        specials: SpecialIds,
        seed: u64,
    ) -> Result<Self> {
        let examples: Arc<[Example]> = examples.into();
        if max_tokens == 0 {
            return Err(DataError::arg("train.max_tokens", "must be > 0"));
        }
        if examples.is_empty() {
            return Err(DataError::arg(
                "examples",
                "the training split is empty; nothing to batch",
            ));
        }
        let sorted = sort_by_length(&examples)?;
        check_fits(&examples, max_tokens)?;
        let key = |i: usize| (examples[i].source.len(), examples[i].target.len());
        let mut runs = Vec::new();
        let mut start = 0;
        for k in 1..=sorted.len() {
            if k == sorted.len() || key(sorted[k]) != key(sorted[start]) {
                runs.push((start, k));
                start = k;
            }
        }
        let bounds = chunk(&examples, &sorted, max_tokens, false);
        let efficiency = efficiency(&examples, &sorted, &bounds);
        Ok(Self {
            examples,
            max_tokens,
            specials,
            seed,
            sorted,
            runs,
            bounds,
            efficiency,
            cursor: Cursor::default(),
            plan_epoch: None,
            order: Vec::new(),
            batch_order: Vec::new(),
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn num_examples(&self) -> usize {
        self.examples.len()
    }

    fn plan(&mut self, epoch: u64) {
        if self.plan_epoch == Some(epoch) {
            return;
        }
        self.order.clone_from(&self.sorted);
        let mut rng = SplitMix64::from_parts(&[self.seed, epoch, TAG_TIE_BREAK]);
        for &(s, e) in &self.runs {
            rng.shuffle(&mut self.order[s..e]);
        }
        self.batch_order = (0..self.bounds.len()).collect();
        SplitMix64::from_parts(&[self.seed, epoch, TAG_BATCH_ORDER]).shuffle(&mut self.batch_order);
        self.plan_epoch = Some(epoch);
    }

    /// The example indices of batch `position` of `epoch` (no state change besides the plan cache).
    pub fn batch_indices(&mut self, cursor: Cursor) -> Result<Vec<usize>> {
        let c = normalize_cursor(cursor, self.batches_per_epoch())?;
        self.plan(c.epoch);
        let (s, e) = self.bounds[self.batch_order[c.position as usize]];
        Ok(self.order[s..e].to_vec())
    }

    /// The next batch, typed.
    pub fn next_seq2seq(&mut self) -> Seq2SeqBatch {
        let c = self.cursor;
        self.plan(c.epoch);
        let (s, e) = self.bounds[self.batch_order[c.position as usize]];
        let batch = Seq2SeqBatch::build(&self.examples, self.order[s..e].to_vec(), self.specials);
        self.cursor = Cursor {
            epoch: c.epoch,
            position: c.position + 1,
        };
        if self.cursor.position == self.batches_per_epoch() {
            self.cursor = Cursor {
                epoch: c.epoch.wrapping_add(1),
                position: 0,
            };
        }
        batch
    }
}

impl Batcher for TokenBudgetBatcher {
    fn next_batch(&mut self) -> Batch {
        Batch::Seq2Seq(self.next_seq2seq())
    }
    fn cursor(&self) -> Cursor {
        self.cursor
    }
    fn restore(&mut self, cursor: Cursor) -> Result<()> {
        self.cursor = normalize_cursor(cursor, self.batches_per_epoch())?;
        Ok(())
    }
    fn batches_per_epoch(&self) -> u64 {
        self.bounds.len() as u64
    }
    /// Real tokens (source + target + eos) / padded tokens (both sides), over one epoch; the
    /// same for every epoch.
    fn padding_efficiency(&self) -> f64 {
        self.efficiency
    }
}

/// Indices sorted by (source length, target length, index); rejects empty sources, which
/// would leave a row with nothing to attend to.
fn sort_by_length(examples: &[Example]) -> Result<Vec<usize>> {
    if let Some(i) = examples.iter().position(|e| e.source.is_empty()) {
        return Err(DataError::arg(
            format!("examples[{i}].source"),
            "is empty; an empty source leaves the encoder nothing to attend to (the corpus loader drops blank lines)",
        ));
    }
    let mut sorted: Vec<usize> = (0..examples.len()).collect();
    sorted.sort_by_key(|&i| (examples[i].source.len(), examples[i].target.len(), i));
    Ok(sorted)
}

fn cost(e: &Example) -> usize {
    e.source.len().max(e.target.len() + 1)
}

fn check_fits(examples: &[Example], max_tokens: usize) -> Result<()> {
    if let Some((index, e)) = examples.iter().enumerate().find(|(_, e)| cost(e) > max_tokens) {
        return Err(DataError::ExampleTooLong {
            index,
            src_len: e.source.len(),
            tgt_len: e.target.len(),
            needed: cost(e),
            max_tokens,
        });
    }
    Ok(())
}

/// Greedy chunking of `order` into ranges whose padded size stays within `max_tokens`. The
/// padded size depends only on the length keys along `order`, so any tie-break of equal keys
/// yields the same ranges. With `allow_oversize`, an example over budget gets a batch of its own.
fn chunk(
    examples: &[Example],
    order: &[usize],
    max_tokens: usize,
    allow_oversize: bool,
) -> Vec<(usize, usize)> {
    let mut bounds = Vec::new();
    let mut start = 0;
    let mut width = 0;
    for (k, &i) in order.iter().enumerate() {
        let w = width.max(cost(&examples[i]));
        let rows = k - start + 1;
        if rows > 1 && rows.saturating_mul(w) > max_tokens {
            bounds.push((start, k));
            start = k;
            width = cost(&examples[i]);
        } else {
            width = w;
        }
        debug_assert!(allow_oversize || (k - start + 1) * width <= max_tokens);
    }
    if start < order.len() {
        bounds.push((start, order.len()));
    }
    bounds
}

fn efficiency(examples: &[Example], order: &[usize], bounds: &[(usize, usize)]) -> f64 {
    let (mut real, mut padded) = (0usize, 0usize);
    for &(s, e) in bounds {
        let rows = &order[s..e];
        let sl = rows.iter().map(|&i| examples[i].source.len()).max().unwrap_or(0);
        let tl = rows
            .iter()
            .map(|&i| examples[i].target.len() + 1)
            .max()
            .unwrap_or(0);
        real += rows
            .iter()
            .map(|&i| examples[i].source.len() + examples[i].target.len() + 1)
            .sum::<usize>();
        padded += rows.len() * (sl + tl);
    }
    if padded == 0 {
        1.0
    } else {
        real as f64 / padded as f64
    }
}

/// Batches of an evaluation split in a fixed, length-sorted order (no shuffling, no state), so
/// every evaluation sees identical batches. `indices` map rows back to references. An example
/// over `max_tokens` gets a batch of its own here rather than an error: evaluation must cover
/// every pair.
#[derive(Clone, Debug)]
pub struct EvalBatches<'a> {
    examples: &'a [Example],
    specials: SpecialIds,
    sorted: Vec<usize>,
    bounds: Vec<(usize, usize)>,
    next: usize,
}

impl<'a> EvalBatches<'a> {
    pub fn new(examples: &'a [Example], max_tokens: usize, specials: SpecialIds) -> Result<Self> {
        if max_tokens == 0 {
            return Err(DataError::arg("max_tokens", "must be > 0"));
        }
        let sorted = sort_by_length(examples)?;
        let bounds = chunk(examples, &sorted, max_tokens, true);
        Ok(Self {
            examples,
            specials,
            sorted,
            bounds,
            next: 0,
        })
    }

    /// Number of batches in a full pass.
    pub fn num_batches(&self) -> usize {
        self.bounds.len()
    }

    /// Padding efficiency of the pass.
    pub fn padding_efficiency(&self) -> f64 {
        efficiency(self.examples, &self.sorted, &self.bounds)
    }
}

impl Iterator for EvalBatches<'_> {
    type Item = Seq2SeqBatch;
    fn next(&mut self) -> Option<Seq2SeqBatch> {
        let &(s, e) = self.bounds.get(self.next)?;
        self.next += 1;
        Some(Seq2SeqBatch::build(
            self.examples,
            self.sorted[s..e].to_vec(),
            self.specials,
        ))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.bounds.len() - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for EvalBatches<'_> {}

/// How [`LmWindowBatcher`] picks windows.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WindowMode {
    /// Independent uniform offsets per row (nanoGPT's `get_batch`); offsets are a function of
    /// `(seed, epoch, position, row)`. An "epoch" is `⌈len / (batch_size × block_size)⌉` batches.
    #[default]
    Sampled,
    /// Non-overlapping windows at multiples of `block_size`, visited in a per-epoch shuffled
    /// order; an epoch sees each window once; its last batch may have fewer rows.
    Sweep,
}

/// Fixed-length windows from one token stream, for language modelling.
#[derive(Clone, Debug)]
pub struct LmWindowBatcher {
    stream: Arc<[u32]>,
    batch_size: usize,
    block_size: usize,
    seed: u64,
    mode: WindowMode,
    cursor: Cursor,
    per_epoch: u64,
    plan_epoch: Option<u64>,
    /// Sweep mode: window numbers in this epoch's order.
    windows: Vec<usize>,
}

impl LmWindowBatcher {
    /// Errors if a size is 0 or the stream has fewer than `block_size + 1` tokens.
    pub fn new(
        stream: impl Into<Arc<[u32]>>,
        batch_size: usize,
        block_size: usize,
        seed: u64,
        mode: WindowMode,
    ) -> Result<Self> {
        let stream: Arc<[u32]> = stream.into();
        check_lm_args(stream.len(), batch_size, block_size, "training")?;
        let tokens_per_batch = batch_size.checked_mul(block_size).ok_or_else(|| {
            DataError::arg(
                "train.batch_size",
                "batch_size × block_size overflows; use realistic sizes",
            )
        })?;
        let per_epoch = match mode {
            WindowMode::Sampled => stream.len().div_ceil(tokens_per_batch) as u64,
            WindowMode::Sweep => num_windows(stream.len(), block_size).div_ceil(batch_size) as u64,
        };
        Ok(Self {
            stream,
            batch_size,
            block_size,
            seed,
            mode,
            cursor: Cursor::default(),
            per_epoch,
            plan_epoch: None,
            windows: Vec::new(),
        })
    }

    fn offsets(&mut self, c: Cursor) -> Vec<usize> {
        match self.mode {
            WindowMode::Sampled => {
                let mut rng = SplitMix64::new(derive_seed(&[self.seed, c.epoch, c.position, TAG_WINDOWS]));
                let n = (self.stream.len() - self.block_size) as u64;
                (0..self.batch_size).map(|_| rng.below(n) as usize).collect()
            }
            WindowMode::Sweep => {
                if self.plan_epoch != Some(c.epoch) {
                    self.windows = (0..num_windows(self.stream.len(), self.block_size)).collect();
                    SplitMix64::from_parts(&[self.seed, c.epoch, TAG_WINDOWS]).shuffle(&mut self.windows);
                    self.plan_epoch = Some(c.epoch);
                }
                let s = c.position as usize * self.batch_size;
                let e = (s + self.batch_size).min(self.windows.len());
                self.windows[s..e].iter().map(|w| w * self.block_size).collect()
            }
        }
    }

    pub fn next_lm(&mut self) -> LmBatch {
        let c = self.cursor;
        let offsets = self.offsets(c);
        self.cursor = Cursor {
            epoch: c.epoch,
            position: c.position + 1,
        };
        if self.cursor.position == self.per_epoch {
            self.cursor = Cursor {
                epoch: c.epoch.wrapping_add(1),
                position: 0,
            };
        }
        LmBatch::build(&self.stream, offsets, self.block_size)
    }

    pub fn mode(&self) -> WindowMode {
        self.mode
    }
}

impl Batcher for LmWindowBatcher {
    fn next_batch(&mut self) -> Batch {
        Batch::Lm(self.next_lm())
    }
    fn cursor(&self) -> Cursor {
        self.cursor
    }
    fn restore(&mut self, cursor: Cursor) -> Result<()> {
        self.cursor = normalize_cursor(cursor, self.per_epoch)?;
        Ok(())
    }
    fn batches_per_epoch(&self) -> u64 {
        self.per_epoch
    }
    /// Always 1.0: windows are never padded.
    fn padding_efficiency(&self) -> f64 {
        1.0
    }
}

/// Number of non-overlapping windows (each needs `block_size + 1` tokens, sharing the boundary).
fn num_windows(len: usize, block_size: usize) -> usize {
    len.saturating_sub(1) / block_size
}

fn check_lm_args(len: usize, batch_size: usize, block_size: usize, split: &str) -> Result<()> {
    if batch_size == 0 {
        return Err(DataError::arg("train.batch_size", "must be > 0"));
    }
    if block_size == 0 {
        return Err(DataError::arg("train.block_size", "must be > 0"));
    }
    if len < block_size + 1 {
        return Err(DataError::StreamTooShort {
            split: split.into(),
            len,
            block_size,
        });
    }
    Ok(())
}

/// Non-overlapping windows of a validation stream from its start, in order, `batch_size` per
/// batch (the last batch may be smaller), optionally capped at `max_batches`.
#[derive(Clone, Debug)]
pub struct LmEvalBatches<'a> {
    stream: &'a [u32],
    batch_size: usize,
    block_size: usize,
    next_window: usize,
    end_window: usize,
}

impl<'a> LmEvalBatches<'a> {
    pub fn new(
        stream: &'a [u32],
        batch_size: usize,
        block_size: usize,
        max_batches: Option<usize>,
    ) -> Result<Self> {
        check_lm_args(stream.len(), batch_size, block_size, "validation")?;
        let mut end_window = num_windows(stream.len(), block_size);
        if let Some(m) = max_batches {
            end_window = end_window.min(m.saturating_mul(batch_size));
        }
        Ok(Self {
            stream,
            batch_size,
            block_size,
            next_window: 0,
            end_window,
        })
    }

    pub fn num_batches(&self) -> usize {
        self.end_window.div_ceil(self.batch_size)
    }
}

impl Iterator for LmEvalBatches<'_> {
    type Item = LmBatch;
    fn next(&mut self) -> Option<LmBatch> {
        if self.next_window >= self.end_window {
            return None;
        }
        let end = (self.next_window + self.batch_size).min(self.end_window);
        let offsets = (self.next_window..end).map(|w| w * self.block_size).collect();
        self.next_window = end;
        Some(LmBatch::build(self.stream, offsets, self.block_size))
    }
}
