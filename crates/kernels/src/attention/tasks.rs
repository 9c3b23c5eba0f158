//! The CPU work of one task — a (batch row, KV head) and the query heads of its group — forward
//! and backward, over the live blocks of each head's probabilities ([`Live`]).

use super::live::Live;
use super::{AttnDims, MaskView};
use std::cell::RefCell;

use crate::dropout::DropoutOp;
use crate::gemm::{Bits, Blocks, Element, Mat, Part, PartsOf};
use crate::held::Held;
use crate::precision::Precision;
use crate::simd::{dot, simd_dispatch};
use crate::softmax::softmax_rows_in_place;

/// Per-task telemetry: the largest unmasked |logit|, and the entropy summed over rows, in all
/// and per query position (`by_position`: T sums over the task's heads).
#[derive(Clone, Default)]
pub(super) struct Measured {
    pub(super) max_abs: f32,
    pub(super) entropy_sum: f64,
    pub(super) by_position: Vec<f64>,
}

/// A head's blocks of query rows, each with the end of its live columns.
type RowBlocks = [(std::ops::Range<usize>, usize)];

/// How a head's probabilities lie in a buffer: `Whole`, T×S with rows S apart and zeros in each
/// block's dead columns; or `Live`, each block's live columns alone, its rows `end` apart, the
/// blocks one after the other (as [`Forward::kept`] keeps them). Where every block is whole the
/// two are the same.
#[derive(Clone, Copy)]
enum Layout {
    Whole,
    Live,
}

/// Each block of `blocks` as it lies in `layout`: its rows, the end of its live columns, its
/// first row's offset and the distance between its rows.
fn placed(
    blocks: &RowBlocks,
    layout: Layout,
    s: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, usize, usize, usize)> + '_ {
    let mut at = 0;
    blocks.iter().map(move |(rows, end)| {
        let placed = match layout {
            Layout::Whole => (rows.clone(), *end, rows.start * s, s),
            Layout::Live => (rows.clone(), *end, at, *end),
        };
        at += rows.len() * end;
        placed
    })
}

/// Head `hq`'s probabilities of batch `bi` in `p` (laid out as `layout`, holding q·kᵀ in each
/// block's live columns, as [`logits`] leaves it): adds the mask and takes the softmax of each
/// row's live columns in place, measuring the logits first and the rows after when `measure`
/// is given. The live columns end at a multiple of 32 (or S), so each row's sums run in the same
/// lanes as over the whole row, the dead columns adding exact zeros there.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_head(
    dims: AttnDims,
    p: &mut [f32],
    layout: Layout,
    blocks: &RowBlocks,
    mask: MaskView<'_>,
    bi: usize,
    hq: usize,
    mut measure: Option<&mut Measured>,
) {
    for (rows, end, first, stride) in placed(blocks, layout, dims.s) {
        let row_at = |ti: usize| first + (ti - rows.start) * stride;
        for ti in rows.clone() {
            let row = &mut p[row_at(ti)..row_at(ti) + end];
            let mask_row = mask.map(|(m, st, off)| (m, st[3], off + bi * st[0] + hq * st[1] + ti * st[2]));
            if let Some(m) = measure.as_deref_mut() {
                for (si, &x) in row.iter().enumerate() {
                    let unmasked = mask_row.is_none_or(|(mv, stride, base)| mv[base + si * stride] >= -1.0);
                    if unmasked && x.abs() > m.max_abs {
                        m.max_abs = x.abs();
                    }
                }
            }
            if let Some((m, stride, base)) = mask_row {
                if stride == 1 {
                    for (x, &mv) in row.iter_mut().zip(&m[base..base + end]) {
                        *x += mv;
                    }
                } else {
                    for (si, x) in row.iter_mut().enumerate() {
                        *x += m[base + si * stride];
                    }
                }
            }
            if stride != end {
                softmax_rows_in_place(row, end);
            }
        }
        if stride == end {
            // The block's rows in one call, where they lie one after the other: its
            // exponentials run as one loop over the block, which rows of a dozen keys (the
            // translation models') need to vectorise.
            softmax_rows_in_place(&mut p[first..first + rows.len() * end], end);
        }
        if let Some(m) = measure.as_deref_mut() {
            for ti in rows.clone() {
                let h: f32 = p[row_at(ti)..row_at(ti) + end]
                    .iter()
                    .map(|&p| -p * p.max(1e-30).ln())
                    .sum();
                m.entropy_sum += h as f64;
                m.by_position[ti] += h as f64;
            }
        }
    }
}

/// The dropped-out probabilities of head `hq` of batch `bi` into `out`, both laid out as
/// [`Layout::Live`].
#[inline(always)]
fn drop_head(
    dims: AttnDims,
    drop: &DropoutOp,
    p: &[f32],
    out: &mut [f32],
    blocks: &RowBlocks,
    bi: usize,
    hq: usize,
) {
    let (first, s) = (dims.probs_block(bi, hq), dims.s);
    for (rows, end, at, _) in placed(blocks, Layout::Live, s) {
        let (p, out) = (&p[at..at + rows.len() * end], &mut out[at..at + rows.len() * end]);
        for (ti, (p, out)) in rows.zip(p.chunks_exact(end).zip(out.chunks_exact_mut(end))) {
            for (si, (o, &x)) in out.iter_mut().zip(p).enumerate() {
                *o = x * drop.factor(first + ti * s + si);
            }
        }
    }
}

/// q rows of head `hq` in batch `bi` as a T×d matrix (rows H·d apart).
fn q_mat<'a>(dims: AttnDims, x: &'a [f32], bi: usize, hq: usize) -> Mat<'a> {
    Mat {
        data: &x[dims.q_row(bi, 0, hq)..],
        row_stride: dims.h * dims.d,
        col_stride: 1,
    }
}

/// k or v rows of KV head `kh` in batch `bi` as an S×d matrix (rows H_kv·d apart).
fn kv_mat<'a>(dims: AttnDims, x: &'a [f32], bi: usize, kh: usize) -> Mat<'a> {
    Mat {
        data: &x[dims.kv_row(bi, 0, kh)..],
        row_stride: dims.hkv * dims.d,
        col_stride: 1,
    }
}

/// `rows` rows of `d` values of held `x`, row r from `x[first + r·stride]`, as a matrix: f32
/// values where they lie (as [`q_mat`] and [`kv_mat`] view them), bf16's widened into `scratch`
/// (row-major). For q as A of q·kᵀ where the backward pass computes the probabilities again
/// (B operands are packed from the bits themselves: [`held_parts`]). The product rounds the
/// widened values to their own bits, so it gives what it gave from the f32 values before these
/// were held.
fn held_rows<'a>(
    x: &'a Held<'_>,
    (first, stride): (usize, usize),
    (rows, d): (usize, usize),
    scratch: &'a mut Vec<f32>,
) -> Mat<'a> {
    match x {
        Held::F32(values) => Mat {
            data: &values[first..],
            row_stride: stride,
            col_stride: 1,
        },
        Held::Bf16(bits) => {
            scratch.resize(rows * d, 0.0);
            for (r, out) in scratch.chunks_exact_mut(d).take(rows).enumerate() {
                let at = first + r * stride;
                for (o, &b) in out.iter_mut().zip(&bits[at..at + d]) {
                    *o = b.widen();
                }
            }
            Mat::rows(&scratch[..rows * d], d)
        }
    }
}

/// Held `x`'s `rows` × `d` matrix from `first` (rows `stride` apart), or its transpose, as B
/// of bf16 or f32 products in `precision`: f32 values viewed where they lie, bf16's bits packed
/// as they are ([`PartsOf::of_bits`]: the pairs rounding their widened values would give, with
/// no f32 copy made; widening them a task's rows at a time first was 2.1–2.4% of the standard
/// shape's bf16 step on AMX).
fn held_parts<'a>(
    precision: Precision,
    x: &'a Held<'_>,
    (first, stride): (usize, usize),
    (rows, d): (usize, usize),
    transposed: bool,
) -> PartsOf<'a> {
    let (k, n) = if transposed { (d, rows) } else { (rows, d) };
    match x {
        Held::F32(values) => {
            let m = Mat {
                data: &values[first..],
                row_stride: stride,
                col_stride: 1,
            };
            PartsOf::new(precision, k, n, if transposed { m.t() } else { m })
        }
        Held::Bf16(bits) => {
            debug_assert_eq!(precision, Precision::Bf16, "values held in bf16 for f32 products");
            let b = Bits {
                data: &bits[first..],
                row_stride: stride,
                col_stride: 1,
            };
            PartsOf::of_bits(k, n, if transposed { b.t() } else { b })
        }
    }
}

/// q·kᵀ in each block's live columns from `c`, laid out as `layout` (`Whole`: zeros in the
/// dead columns).
///
/// # Safety
/// `c` has room for the layout's floats (T×S for `Whole`), which no one else touches meanwhile.
unsafe fn logits(
    k_t: &PartsOf<'_>,
    q: Mat<'_>,
    blocks: &RowBlocks,
    dims: AttnDims,
    layout: Layout,
    c: *mut f32,
) {
    let (s, d) = (dims.s, dims.d);
    match layout {
        Layout::Whole => {
            let parts: Vec<Part> = blocks
                .iter()
                .map(|(rows, end)| (rows.clone(), 0..*end, 0..d))
                .collect();
            k_t.products(q, &parts, 0.0, c, s);
            for (rows, end) in blocks {
                for ti in rows.clone() {
                    std::ptr::write_bytes(c.add(ti * s + end), 0, s - end);
                }
            }
        }
        Layout::Live => {
            for (rows, end, at, _) in placed(blocks, layout, s) {
                let q = q.skip_rows(rows.start);
                k_t.products(q, &[(0..rows.len(), 0..end, 0..d)], 0.0, c.add(at), end);
            }
        }
    }
}

/// A head's probabilities as the forward pass kept them (`kept`, [`Layout::Live`]), unfolded
/// into `p` (T×S, rows S apart), the dead columns exact zeros: dk's and dv's products
/// over a block of keys read them where a later block of rows sees fewer keys than an earlier
/// one (a mask whose live ends do not grow), while the buffer holds an earlier head's values.
fn unfold_live(kept: &[f32], p: &mut [f32], blocks: &RowBlocks, s: usize) {
    let mut from = 0;
    for (rows, end) in blocks {
        for ti in rows.clone() {
            let (live, dead) = p[ti * s..(ti + 1) * s].split_at_mut(*end);
            live.copy_from_slice(&kept[from..from + end]);
            dead.fill(0.0);
            from += end;
        }
    }
}

/// Each block of query rows × all d columns over its live keys (`A·B` for A's rows T×S).
fn by_queries(blocks: &RowBlocks, d: usize) -> Vec<Part> {
    blocks
        .iter()
        .map(|(rows, end)| (rows.clone(), 0..d, 0..*end))
        .collect()
}

/// Everything one task of the forward pass reads and writes.
pub(super) struct Forward<'a> {
    pub(super) dims: AttnDims,
    pub(super) precision: Precision,
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) mask: MaskView<'a>,
    pub(super) live: &'a Live,
    pub(super) dropout: Option<DropoutOp>,
    pub(super) out: &'a Blocks,
    /// Where the probabilities are kept for the backward pass (the live blocks alone), each
    /// head's from `kept_at[bi·H + hq]` ([`Live::kept_offsets`]).
    pub(super) kept: Option<&'a Blocks>,
    pub(super) kept_at: &'a [usize],
    pub(super) measure: bool,
}

simd_dispatch!(pub(super) forward_task => forward_task_generic(f: &Forward<'_>, bi: usize, kh: usize) -> Measured);

/// A task's T×S buffers: the probabilities (where they are not computed in, or read from, the
/// kept ones in place), the dropped-out probabilities (under dropout) and, in the backward
/// pass, dS; and there, where it computes the probabilities again, q's rows widened where they
/// are held in bf16 ([`held_rows`]).
#[derive(Default)]
struct Buffers {
    probs: Vec<f32>,
    dropped: Vec<f32>,
    ds: Vec<f32>,
    q_rows: Vec<f32>,
}

thread_local! {
    /// Each thread's buffers, handed from task to task: a fresh T×S vector per task was a
    /// zero-fill and a page fault per 4 KiB, for 96 tasks a layer and pass at nanoGPT's
    /// standard shape. A thread keeps the largest it has needed (3 × T×S floats).
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// A task's [`Buffers`], taken from its thread's and handed back when the task ends. Every
/// element a task reads it has written first (the products with β = 0 and the zero fills of
/// the dead columns), so what an earlier task left in them is never read.
struct TaskBuffers(Buffers);

impl TaskBuffers {
    /// Buffers of `len` for the probabilities (`probs`), the dropped-out ones (`dropped`) and
    /// dS (`ds`), each where needed (empty otherwise).
    fn take(len: usize, probs: bool, dropped: bool, ds: bool) -> Self {
        // Taken out, not borrowed: a task that waited on parallel work could have this thread
        // run another task meanwhile, which then makes buffers of its own.
        let mut b = BUFFERS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        for (buffer, needed) in [(&mut b.probs, probs), (&mut b.dropped, dropped), (&mut b.ds, ds)] {
            if needed {
                buffer.resize(len, 0.0);
            }
        }
        Self(b)
    }
}

impl Drop for TaskBuffers {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.0);
        // (A thread being torn down has no buffers to keep.)
        let _ = BUFFERS.try_with(|cell| *cell.borrow_mut() = b);
    }
}

/// The output rows of the query heads of KV head `kh` in batch `bi`: kᵀ and v packed once for
/// the group's heads, each block of query rows multiplied over its live keys alone.
#[inline(always)]
fn forward_task_generic(f: &Forward<'_>, bi: usize, kh: usize) -> Measured {
    let dims = f.dims;
    let (t, s, d) = (dims.t, dims.s, dims.d);
    let mut measured = Measured {
        by_position: if f.measure { vec![0.0; t] } else { Vec::new() },
        ..Measured::default()
    };
    // The probabilities are computed where the backward pass will read them, if it keeps
    // them: the live blocks alone, one after the other (copied there from a T×S buffer before,
    // 1.3% of the standard shape's bf16 step on AMX with the dead columns' zero fill).
    let mut buffers = TaskBuffers::take(t * s, f.kept.is_none(), f.dropout.is_some(), false);
    let Buffers {
        probs: scratch,
        dropped,
        ..
    } = &mut buffers.0;
    let (k, v) = (kv_mat(dims, f.k, bi, kh), kv_mat(dims, f.v, bi, kh));
    let (k_t, v) = (
        PartsOf::new(f.precision, d, s, k.t()),
        PartsOf::new(f.precision, s, d, v),
    );
    for hq in kh * dims.group()..(kh + 1) * dims.group() {
        let q = q_mat(dims, f.q, bi, hq);
        let blocks = f.live.row_blocks(bi, hq);
        let head = bi * dims.h + hq;
        let p: &mut [f32] = match f.kept {
            // SAFETY: head hq's live blocks of batch bi belong to this task alone; `logits`
            // writes all of them.
            Some(all) => unsafe {
                let (at, len) = (f.kept_at[head], f.kept_at[head + 1] - f.kept_at[head]);
                all.write_ld(at, len, 1, len, |c| {
                    logits(&k_t, q, &blocks, dims, Layout::Live, c)
                });
                all.written(at, len)
            },
            None => {
                // SAFETY: the scratch holds T×S floats, more than the live blocks.
                unsafe { logits(&k_t, q, &blocks, dims, Layout::Live, scratch.as_mut_ptr()) };
                &mut scratch[..]
            }
        };
        softmax_head(
            dims,
            p,
            Layout::Live,
            &blocks,
            f.mask,
            bi,
            hq,
            f.measure.then_some(&mut measured),
        );
        let p: &[f32] = match &f.dropout {
            Some(drop) => {
                drop_head(dims, drop, p, dropped, &blocks, bi, hq);
                &dropped[..]
            }
            None => p,
        };
        // SAFETY: head hq's output rows of batch bi belong to this task alone, and the blocks
        // cover all T of them.
        unsafe {
            f.out.write_ld(dims.q_row(bi, 0, hq), dims.h * d, t, d, |c| {
                for (rows, end, at, _) in placed(&blocks, Layout::Live, s) {
                    let block = Mat::rows(&p[at..at + rows.len() * end], end);
                    let c = c.add(rows.start * dims.h * d);
                    v.products(block, &[(0..rows.len(), 0..d, 0..end)], 0.0, c, dims.h * d);
                }
            })
        };
    }
    measured
}

/// Everything one task of the backward pass reads and writes.
pub(super) struct Backward<'a> {
    pub(super) dims: AttnDims,
    pub(super) precision: Precision,
    pub(super) q: &'a Held<'a>,
    pub(super) k: &'a Held<'a>,
    pub(super) v: &'a Held<'a>,
    pub(super) o: &'a [f32],
    pub(super) go: &'a [f32],
    pub(super) mask: MaskView<'a>,
    pub(super) live: &'a Live,
    pub(super) dropout: Option<DropoutOp>,
    /// The forward pass's probabilities, as [`Forward::kept`] keeps them.
    pub(super) kept: Option<&'a [f32]>,
    pub(super) kept_at: &'a [usize],
    pub(super) dq: &'a Blocks,
    pub(super) dk: &'a Blocks,
    pub(super) dv: &'a Blocks,
}

simd_dispatch!(pub(super) backward_task => backward_task_generic(f: &Backward<'_>, bi: usize, kh: usize) -> ());

/// dS = P ⊙ (dP − δ) of head `hq` in batch `bi` in place of dP (`ds`, T×S), each block's live
/// columns; under dropout dP is dO·vᵀ before the mask, and the dropped-out probabilities P̃
/// go to `dropped` (zeros in the dead columns), one mask draw per element serving both.
#[inline(always)]
fn scores_gradient(
    f: &Backward<'_>,
    p: &[f32],
    ds: &mut [f32],
    dropped: &mut [f32],
    blocks: &RowBlocks,
    bi: usize,
    hq: usize,
) {
    let (s, d) = (f.dims.s, f.dims.d);
    let first = f.dims.probs_block(bi, hq);
    for (rows, end) in blocks {
        for ti in rows.clone() {
            let row = f.dims.q_row(bi, ti, hq);
            let delta = dot(&f.go[row..row + d], &f.o[row..row + d]);
            let (pr, dr) = (&p[ti * s..ti * s + end], &mut ds[ti * s..ti * s + end]);
            match &f.dropout {
                Some(drop) => {
                    let (dropped_row, dead) = dropped[ti * s..(ti + 1) * s].split_at_mut(*end);
                    for (si, ((x, &pv), dp)) in dr.iter_mut().zip(pr).zip(dropped_row).enumerate() {
                        let factor = drop.factor(first + ti * s + si);
                        *dp = pv * factor;
                        *x = pv * (*x * factor - delta);
                    }
                    dead.fill(0.0);
                }
                None => {
                    for (x, &pv) in dr.iter_mut().zip(pr) {
                        *x = pv * (*x - delta);
                    }
                }
            }
        }
    }
}

/// With P the probabilities, P̃ = P ⊙ M the dropped-out ones and δ_t = ⟨dO_t, O_t⟩:
/// dP = (dO·vᵀ) ⊙ M, dS = P ⊙ (dP − δ), dq = dS·k, dk = Σ_heads dSᵀ·q, dv = Σ_heads P̃ᵀ·dO, the
/// query heads of the group summed in order (the first writes, the others add), each over the
/// live blocks alone (dS and P̃ hold zeros in the rest).
#[inline(always)]
fn backward_task_generic(f: &Backward<'_>, bi: usize, kh: usize) {
    let dims = f.dims;
    let (t, s, d) = (dims.t, dims.s, dims.d);
    let in_place = f.live.is_whole();
    // Every element of dS is written by `logits` below (the live columns by a β = 0 product,
    // the dead ones zeroed) before anything reads it.
    let mut buffers = TaskBuffers::take(t * s, !(f.kept.is_some() && in_place), f.dropout.is_some(), true);
    let Buffers {
        probs: scratch,
        dropped,
        ds,
        q_rows,
    } = &mut buffers.0;
    let kv_at = dims.kv_row(bi, 0, kh);
    let kv_ld = dims.hkv * d;
    let kv_rows = ((kv_at, kv_ld), (s, d));
    let k_t = f
        .kept
        .is_none()
        .then(|| held_parts(f.precision, f.k, kv_rows.0, kv_rows.1, true));
    let (v_t, k) = (
        held_parts(f.precision, f.v, kv_rows.0, kv_rows.1, true),
        held_parts(f.precision, f.k, kv_rows.0, kv_rows.1, false),
    );
    for (gi, hq) in (kh * dims.group()..(kh + 1) * dims.group()).enumerate() {
        let q_rows_at = ((dims.q_row(bi, 0, hq), dims.h * d), (t, d));
        let go = q_mat(dims, f.go, bi, hq);
        let blocks = f.live.row_blocks(bi, hq);
        let head = bi * dims.h + hq;
        let p: &[f32] = match f.kept {
            Some(all) if in_place => &all[f.kept_at[head]..][..t * s],
            Some(all) => {
                unfold_live(&all[f.kept_at[head]..f.kept_at[head + 1]], scratch, &blocks, s);
                &scratch[..]
            }
            None => {
                let k_t = k_t
                    .as_ref()
                    .expect("kᵀ packed where the probabilities were not kept");
                let q = held_rows(f.q, q_rows_at.0, q_rows_at.1, q_rows);
                // SAFETY: the scratch holds T×S floats.
                unsafe { logits(k_t, q, &blocks, dims, Layout::Whole, scratch.as_mut_ptr()) };
                softmax_head(dims, scratch, Layout::Whole, &blocks, f.mask, bi, hq, None);
                &scratch[..]
            }
        };
        // SAFETY: ds holds T×S floats, and `logits` writes all of them.
        unsafe { logits(&v_t, go, &blocks, dims, Layout::Whole, ds.as_mut_ptr()) };
        scores_gradient(f, p, ds, dropped, &blocks, bi, hq);
        let p_used: &[f32] = if f.dropout.is_some() { dropped } else { p };
        let (q, go) = (
            held_parts(f.precision, f.q, q_rows_at.0, q_rows_at.1, false),
            PartsOf::new(f.precision, t, d, go),
        );
        // dk and dv for each block of keys, over the query rows that see it (the rows before
        // hold zeros in its columns of dS and P̃).
        let by_keys: Vec<Part> = (f.live.column_blocks(bi, hq).into_iter())
            .map(|(keys, from)| (keys, 0..d, from..t))
            .collect();
        // SAFETY: head hq's rows of dq, and KV head kh's rows of dk and dv, in batch bi belong to
        // this task alone; the blocks cover all of them (the first head's products write them,
        // the others add).
        unsafe {
            f.dq.write_ld(dims.q_row(bi, 0, hq), dims.h * d, t, d, |c| {
                k.products(Mat::rows(ds, s), &by_queries(&blocks, d), 0.0, c, dims.h * d)
            });
            let (ds_t, p_t) = (Mat::rows(ds, s).t(), Mat::rows(p_used, s).t());
            if gi == 0 {
                f.dk.write_ld(kv_at, kv_ld, s, d, |c| q.products(ds_t, &by_keys, 0.0, c, kv_ld));
                f.dv.write_ld(kv_at, kv_ld, s, d, |c| go.products(p_t, &by_keys, 0.0, c, kv_ld));
            } else {
                f.dk.update_ld(kv_at, kv_ld, s, d, |c| q.products(ds_t, &by_keys, 1.0, c, kv_ld));
                f.dv.update_ld(kv_at, kv_ld, s, d, |c| go.products(p_t, &by_keys, 1.0, c, kv_ld));
            }
        }
    }
}
