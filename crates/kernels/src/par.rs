//! The kernels' worker threads: one pool per process, sized by `train.threads`.
//!
//! Every kernel splits its work into tasks whose number and boundaries depend only on the
//! shapes (never on the thread count), and each task writes outputs no other task touches —
//! rows of a product, (batch, head) blocks of attention, chunks of an elementwise op. Which
//! thread runs which task then cannot change a single bit: a run gives the same losses and
//! weights at 1, 2 or 16 threads (tested).
//!
//! The pool is rayon's (candle already depends on it): idle workers sleep on a condition
//! variable after a short spin, so a process whose other work is serial does not burn the
//! cores it does not use. candle's own elementwise pool (its ops outside Ember's kernels) gets
//! the same thread count from the trainer, but parked between ops instead of spinning
//! (`CANDLE_BARRIER_POOL_SPIN_LIMIT=0`): spinning, it fought this pool for the cores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

/// The pool's thread count, read without the lock: the GEMM asks for it on every product, and
/// attention runs tens of thousands of tiny products a step from both threads at once, where the
/// lock's reader count and the pool's reference count were cache lines the threads fought over.
static THREADS: AtomicUsize = AtomicUsize::new(1);

/// Runs the kernels on `n` threads from now on (1: on the caller's thread, no pool at all).
pub fn set_threads(n: usize) -> Result<(), String> {
    let pool = if n <= 1 {
        None
    } else {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("ember-kernels-{i}"))
            .build()
            .map_err(|e| format!("cannot start {n} kernel threads: {e}"))?;
        Some(Arc::new(pool))
    };
    let threads = pool.as_ref().map_or(1, |p| p.current_num_threads());
    *POOL.write().unwrap_or_else(|e| e.into_inner()) = pool;
    THREADS.store(threads, Ordering::Relaxed);
    Ok(())
}

/// Threads the kernels run on.
pub fn threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

fn pool() -> Option<Arc<rayon::ThreadPool>> {
    POOL.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs `task(i)` for every i in `0..n`, on the pool's threads when there is a pool and more
/// than one task. Tasks must write disjoint outputs (see the module docs).
pub(crate) fn for_each(n: usize, task: impl Fn(usize) + Sync + Send) {
    if n <= 1 {
        // One task (most of attention's products): no pool to look up.
        return (0..n).for_each(task);
    }
    match pool() {
        Some(pool) => pool.install(|| {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each(&task)
        }),
        _ => (0..n).for_each(task),
    }
}

/// Runs `task(range)` over `0..len` cut into pieces of `chunk` elements (the last may be shorter).
pub(crate) fn for_each_chunk(len: usize, chunk: usize, task: impl Fn(std::ops::Range<usize>) + Sync + Send) {
    let chunk = chunk.max(1);
    for_each(len.div_ceil(chunk), |i| task(i * chunk..len.min((i + 1) * chunk)));
}

/// A raw pointer that tasks share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);

// SAFETY: tasks only write disjoint ranges through it (each use site says why its ranges are
// disjoint), and the buffer outlives the parallel region that uses it.
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer to element `at` (a method, so that closures capture the whole `SharedMut`,
    /// which is `Sync`, rather than its raw pointer field, which is not).
    pub fn at(&self, at: usize) -> *mut T {
        self.0.wrapping_add(at)
    }

    /// Elements `at..at + len`.
    ///
    /// # Safety
    /// In bounds of the buffer, and no other task touches them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(at), len)
    }
}

/// Elements per task of an elementwise op: large enough to amortise a task, small enough to
/// balance two to sixteen threads on the activations of small models.
pub(crate) const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Rows of `row_len` elements per task of a row-wise op: about [`ELEMENTS_PER_TASK`], at least one.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (ELEMENTS_PER_TASK / row_len.max(1)).max(1)
}

/// A new vector of `len` elements whose pieces of `chunk` elements `fill(range, piece)` writes
/// in full, in parallel.
pub(crate) fn fill<T: Send>(
    len: usize,
    chunk: usize,
    fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<T>]) + Sync + Send,
) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(len);
    let ptr = SharedMut(out.as_mut_ptr().cast::<std::mem::MaybeUninit<T>>());
    for_each_chunk(len, chunk, |r| {
        // SAFETY: the elements `r` belong to this task alone.
        let piece = unsafe { ptr.slice(r.start, r.len()) };
        fill(r, piece)
    });
    // SAFETY: the pieces cover 0..len and `fill` writes every element of its piece.
    unsafe { out.set_len(len) };
    out
}

/// [`fill`] for two vectors written together.
#[allow(clippy::type_complexity)]
pub(crate) fn fill2(
    len: usize,
    chunk: usize,
    fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<f32>], &mut [std::mem::MaybeUninit<f32>])
        + Sync
        + Send,
) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::with_capacity(len), Vec::with_capacity(len));
    let (pa, pb) = (
        SharedMut(a.as_mut_ptr().cast::<std::mem::MaybeUninit<f32>>()),
        SharedMut(b.as_mut_ptr().cast::<std::mem::MaybeUninit<f32>>()),
    );
    for_each_chunk(len, chunk, |r| {
        // SAFETY: the elements `r` of both vectors belong to this task alone.
        let (x, y) = unsafe { (pa.slice(r.start, r.len()), pb.slice(r.start, r.len())) };
        fill(r, x, y)
    });
    // SAFETY: as in `fill`, for both vectors.
    unsafe {
        a.set_len(len);
        b.set_len(len);
    }
    (a, b)
}

/// Runs every task at once on the pool's threads (in turn on the caller's without a pool) and
/// returns their results in task order. A task's own kernels then run on the worker that runs
/// it, other workers joining in only when idle.
pub fn join_all<T: Send>(tasks: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    match pool() {
        Some(pool) if tasks.len() > 1 => {
            let mut out: Vec<Option<T>> = (0..tasks.len()).map(|_| None).collect();
            pool.scope(|s| {
                for (task, slot) in tasks.into_iter().zip(out.iter_mut()) {
                    s.spawn(move |_| *slot = Some(task()));
                }
            });
            out.into_iter().map(|r| r.expect("every task ran")).collect()
        }
        _ => tasks.into_iter().map(|t| t()).collect(),
    }
}
