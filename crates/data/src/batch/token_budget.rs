//! Translation batching under a token budget: the resumable training batcher and the fixed
//! evaluation pass, both over examples sorted by length.

use std::sync::Arc;

use ember_rng::SplitMix64;

use super::{normalize_cursor, Batch, Batcher, Cursor, Seq2SeqBatch, TAG_BATCH_ORDER, TAG_TIE_BREAK};
use crate::corpus::Example;
use crate::error::{DataError, Result};
use crate::tokenizer::SpecialIds;

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
