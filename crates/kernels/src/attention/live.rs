//! Which blocks of a head's T×S probabilities the mask leaves alive.
//!
//! A causal mask kills the upper triangle: there the logits get −1e9 and the probabilities are
//! exactly 0, so every product term and every softmax element there is an exact zero. At
//! nanoGPT's standard shape (T = S = 256) that is 44% of attention's work in blocks of 32 rows.
//! [`Live`] says, per block of [`ROWS`] query rows, up to which column (a multiple of [`COLS`],
//! or S) any of its rows can see, and per block of [`COLS`] key columns from which query row
//! on any row sees one; the tasks compute those parts alone. Skipping exact zeros leaves every
//! sum's bits as they were.
//!
//! A column is dead for a row where the mask is at most [`DEAD`], and the blocks are used only
//! where every other mask value is above [`LIVE`] (Ember's masks hold 0 and −1e9): a dead
//! logit then lies more than 9·10⁷ below the row's largest for any logits short of 4·10⁷, so
//! its probability underflows to exactly 0 (an f32 exponent below −87.3 is 0 in
//! [`crate::simd::exp_fast`]). A mask with values between gets every block computed. A row
//! with no live column has a softmax over its dead logits, which is not zero; its block is
//! computed whole.
//!
//! Where the tasks skip the dead blocks (bf16), the probabilities kept between the passes are
//! the live blocks alone ([`Live::kept_offsets`]); the backward pass writes the dead ones again
//! as zeros.

use std::ops::Range;

use super::{AttnDims, MaskView};

/// Query rows per block (AMX's tile rows, four of the vector kernel's).
pub(super) const ROWS: usize = 32;

/// Key columns per block: the bf16 products take k and strips in 32s.
pub(super) const COLS: usize = 32;

/// Keys below which every block is computed: with a few blocks of keys there is little to skip,
/// and finding the live blocks (a pass over the mask, per batch row for a padding mask) and
/// the parts' smaller products cost more than they save — multi30k-tiny's bf16 step (sentences
/// of ~40 tokens) measured 0.932× (0.823–1.028, 4 pairs) with live blocks at any length.
const MIN_KEYS: usize = 4 * COLS;

/// Mask values at or below which a logit's probability is exactly 0 ...
const DEAD: f32 = -1e8;

/// ... where every other value of the mask is above this.
const LIVE: f32 = -1e6;

/// The live parts of every head's probabilities.
pub(super) enum Live {
    /// Everything: one block of all rows and columns (no mask, or not asked for).
    Whole { t: usize, s: usize },
    /// Per group of heads sharing a mask (the mask's broadcast (batch, head) pairs), the end
    /// column of each block of [`ROWS`] rows.
    Blocks {
        t: usize,
        s: usize,
        /// Heads per batch row in `ends` (1 where the mask is the same for every head).
        heads: usize,
        /// Whether the mask differs between batch rows.
        per_batch: bool,
        ends: Vec<usize>,
    },
}

impl Live {
    /// The live blocks under `mask`, or [`Live::Whole`] when `skip` is false, there is no mask,
    /// the keys are fewer than [`MIN_KEYS`] or no block is dead.
    pub(super) fn of(dims: AttnDims, mask: MaskView<'_>, skip: bool) -> Self {
        let (t, s) = (dims.t, dims.s);
        let Some((data, strides, offset)) = mask.filter(|_| skip && t > 0 && s >= MIN_KEYS) else {
            return Live::Whole { t, s };
        };
        let per_batch = strides[0] != 0 && dims.b > 1;
        let heads = if strides[1] != 0 { dims.h } else { 1 };
        let row_blocks = t.div_ceil(ROWS);
        let mut ends = Vec::with_capacity(if per_batch { dims.b } else { 1 } * heads * row_blocks);
        for bi in 0..if per_batch { dims.b } else { 1 } {
            for hq in 0..heads {
                let at = |ti: usize, si: usize| {
                    data[offset + bi * strides[0] + hq * strides[1] + ti * strides[2] + si * strides[3]]
                };
                for rb in 0..row_blocks {
                    let mut end = 0;
                    for ti in rb * ROWS..t.min((rb + 1) * ROWS) {
                        // The last live column + 1; a row with none sees its dead logits.
                        let mut last = None;
                        for si in 0..s {
                            let m = at(ti, si);
                            if m > LIVE || m.is_nan() {
                                last = Some(si);
                            } else if m > DEAD {
                                return Live::Whole { t, s };
                            }
                        }
                        end = end.max(last.map_or(s, |si| si + 1));
                    }
                    ends.push(end.next_multiple_of(COLS).min(s));
                }
            }
        }
        if ends.iter().all(|&end| end == s) {
            return Live::Whole { t, s };
        }
        Live::Blocks {
            t,
            s,
            heads,
            per_batch,
            ends,
        }
    }

    /// Head `hq` of batch row `bi`'s blocks of query rows, each with the end of its live
    /// columns.
    pub(super) fn row_blocks(&self, bi: usize, hq: usize) -> Vec<(Range<usize>, usize)> {
        match self {
            Live::Whole { t, s } => vec![(0..*t, *s)],
            Live::Blocks { t, .. } => self
                .ends(bi, hq)
                .iter()
                .enumerate()
                .map(|(rb, &end)| (rb * ROWS..(*t).min((rb + 1) * ROWS), end))
                .collect(),
        }
    }

    /// Head `hq` of batch row `bi`'s blocks of key columns, each with the first query row that
    /// sees any of them (T where none does): the rows before it hold zeros in those columns.
    pub(super) fn column_blocks(&self, bi: usize, hq: usize) -> Vec<(Range<usize>, usize)> {
        match self {
            Live::Whole { s, .. } => vec![(0..*s, 0)],
            Live::Blocks { t, s, .. } => {
                let ends = self.ends(bi, hq);
                (0..s.div_ceil(COLS))
                    .map(|cb| {
                        let first = ends.iter().position(|&end| end > cb * COLS);
                        (
                            cb * COLS..(*s).min((cb + 1) * COLS),
                            first.map_or(*t, |rb| rb * ROWS),
                        )
                    })
                    .collect()
            }
        }
    }

    /// Where each head's probabilities start when only their live parts are kept, head by head
    /// ((batch row, query head) in row-major order), each head's blocks of query rows one after
    /// the other, rows of a block as long as its live columns: B·H + 1 offsets, the last the
    /// total. [`Live::Whole`] keeps every head whole (T·S each), as (B, H, T, S) lays them out.
    pub(super) fn kept_offsets(&self, dims: AttnDims) -> Vec<usize> {
        let mut offsets = Vec::with_capacity(dims.b * dims.h + 1);
        let mut at = 0;
        offsets.push(at);
        for bi in 0..dims.b {
            for hq in 0..dims.h {
                at += self.live_len(bi, hq);
                offsets.push(at);
            }
        }
        offsets
    }

    /// How many probabilities of head `hq` of batch row `bi` lie in its live blocks.
    fn live_len(&self, bi: usize, hq: usize) -> usize {
        self.row_blocks(bi, hq)
            .iter()
            .map(|(rows, end)| rows.len() * end)
            .sum()
    }

    /// Whether every head's probabilities are live whole.
    pub(super) fn is_whole(&self) -> bool {
        matches!(self, Live::Whole { .. })
    }

    fn ends(&self, bi: usize, hq: usize) -> &[usize] {
        match self {
            Live::Whole { .. } => &[],
            Live::Blocks {
                t,
                heads,
                per_batch,
                ends,
                ..
            } => {
                let row_blocks = t.div_ceil(ROWS);
                let group = if *per_batch { bi * heads } else { 0 } + if *heads > 1 { hq } else { 0 };
                &ends[group * row_blocks..(group + 1) * row_blocks]
            }
        }
    }
}
