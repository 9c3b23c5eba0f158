//! Language-model batching: fixed-length windows of one token stream, sampled or swept for
//! training and walked in order for evaluation.

use std::sync::Arc;

use ember_rng::{derive_seed, SplitMix64};
use serde::{Deserialize, Serialize};

use super::{normalize_cursor, Batch, Batcher, Cursor, LmBatch, TAG_WINDOWS};
use crate::error::{DataError, Result};

/// How [`LmWindowBatcher`] picks windows.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
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
