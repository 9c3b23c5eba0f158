//! The process's allocator: glibc's, with what training's big blocks (tensors, gradients, the
//! kernels' buffers) need added around it. Each big block starts on a cache line
//! ([`LinedBlocks`]) and is counted ([`ember_trainer::heap`]: `ember bench` reports the peak),
//! the biggest ask for transparent huge pages, and freed memory stays in the heap
//! ([`keep_freed_memory`]).
//!
//! Hand-written because no allocator crate does the first: glibc aligns its blocks to 16 bytes,
//! and `posix_memalign` splits a free chunk around each aligned block, which fragmented the heap
//! here (peak RSS 1.34× at nanoGPT's standard shape, docs/performance.md). jemalloc and mimalloc
//! would align big blocks, but replace the arenas whose behaviour the memory figures rest on.

use std::alloc::{GlobalAlloc, Layout, System};

use ember_trainer::heap;

/// A cache line on the x86-64 CPUs Ember's kernels are written for (and on most AArch64 ones).
const LINE: usize = 64;

/// The smallest block that starts on a cache line: the 64 bytes each lined block costs are then
/// under 0.1% of it. Lining smaller blocks too (from 4 KiB: the small configs' attention
/// buffers) measured within the noise, 1.008–1.019×, with 8% more peak RSS at one config
/// (docs/performance.md, 2026-12-04).
const MIN_LINED: usize = 64 << 10;

const HUGE_PAGE: usize = 2 << 20;
const MIN_HUGE: usize = 4 << 20;

/// glibc's allocator with every block of [`MIN_LINED`] bytes or more starting on a cache line,
/// huge pages asked for on every block of 4 MiB or more, and every block's bytes counted.
///
/// Lined: a row of a product's output or of an activation then lies on whole lines, where from
/// glibc's 16-byte alignment each 64-byte row of AMX's tile stores and each AVX-512 vector
/// straddled two. On the AMX Xeon a product's tile steps with C 16 bytes past a line took
/// 1.04–1.21× as long (`gemm::bf16::timing::amx_product_parts_at_the_standard_shape`); with big
/// blocks lined nanoGPT's standard shape's bf16 step was 1.095× faster (1.069–1.177, 8 pairs)
/// at 0.981× the peak RSS, its f32 step 1.009× (docs/performance.md, 2026-12-04).
/// A lined block is glibc's block of 64 bytes more, handed out from its first line boundary
/// past 8 bytes, with glibc's own pointer kept in the 8 bytes before.
///
/// Huge pages (`madvise(MADV_HUGEPAGE)` on a block's 2 MiB-aligned interior): a big activation
/// faults in 2 MiB at a time instead of 4 KiB, the first time; [`keep_freed_memory`] makes that
/// the only time. glibc's own `glibc.malloc.hugetlb` tunable does this, but a tunable is read at
/// process start, from the environment, so Ember cannot set it for itself.
pub struct LinedBlocks;

/// Whether a block of `layout` is lined: big, and asking for no more than a line's alignment
/// (a larger one goes to glibc as asked).
fn lined(layout: Layout) -> bool {
    layout.size() >= MIN_LINED && layout.align() <= LINE
}

/// The glibc block that holds a lined block of `size` bytes (`None` past `isize::MAX`).
fn outer(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(LINE)?, 16).ok()
}

/// The lined block inside glibc's block at `p` (null stays null), glibc's pointer written
/// before it.
///
/// # Safety
/// `p` is null or a block of at least the lined size plus [`LINE`] bytes, 16-byte aligned.
unsafe fn line_up(p: *mut u8) -> *mut u8 {
    if p.is_null() {
        return p;
    }
    // The first line boundary at least 8 bytes past p: at most LINE past it (p is 16-byte
    // aligned), so the block's bytes and the pointer before them lie inside glibc's block.
    let skip = (p.addr() + 8).next_multiple_of(LINE) - p.addr();
    // SAFETY: within glibc's block (above); q - 8 lies at p or after, 8-byte aligned.
    unsafe {
        let q = p.add(skip);
        q.sub(8).cast::<*mut u8>().write(p);
        q
    }
}

/// glibc's block around the lined block at `q`.
///
/// # Safety
/// `q` came from [`line_up`].
unsafe fn glibc_block(q: *mut u8) -> *mut u8 {
    // SAFETY: `line_up` wrote the pointer there.
    unsafe { q.sub(8).cast::<*mut u8>().read() }
}

/// Asks for huge pages on the whole 2 MiB pages inside a block of `size` bytes at `p`.
fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < MIN_HUGE {
        return;
    }
    let start = p.addr().next_multiple_of(HUGE_PAGE);
    let end = (p.addr() + size) & !(HUGE_PAGE - 1);
    if end > start {
        let at = p.wrapping_add(start - p.addr());
        // SAFETY: the range lies inside a block the allocator just handed out; MADV_HUGEPAGE
        // changes how its pages are backed, never their contents. A failure (no THP) is
        // harmless and ignored.
        unsafe { libc::madvise(at.cast(), end - start, libc::MADV_HUGEPAGE) };
    }
}

/// A block of `size` bytes at `p` handed out: huge pages asked for, its bytes counted.
fn handed_out(p: *mut u8, size: usize) -> *mut u8 {
    if !p.is_null() {
        advise(p, size);
        heap::allocated(size);
    }
    p
}

/// A block of `layout` from System's `take` (`alloc` or `alloc_zeroed`): its `outer` block lined
/// up where [`lined`], else as asked; handed out.
///
/// # Safety
/// `layout` has a non-zero size (GlobalAlloc's contract).
#[inline(always)]
unsafe fn taken(layout: Layout, take: unsafe fn(&System, Layout) -> *mut u8) -> *mut u8 {
    let p = match lined(layout) {
        true => match outer(layout.size()) {
            // SAFETY: a non-zero size; glibc's block holds the lined one (`line_up`).
            Some(o) => unsafe { line_up(take(&System, o)) },
            None => std::ptr::null_mut(),
        },
        // SAFETY: the caller's layout, as System takes it.
        false => unsafe { take(&System, layout) },
    };
    handed_out(p, layout.size())
}

// SAFETY: every block comes from System (glibc's malloc) and goes back to it with the layout it
// was taken with: a lined block as its `outer` block, recognised by its layout, which the caller
// passes back unchanged; a lined block is at least `layout.size()` bytes on a line boundary,
// which satisfies any alignment up to LINE. `advise` only adds a paging hint, and the counts
// touch no memory of the blocks.
unsafe impl GlobalAlloc for LinedBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout (non-zero size), as `alloc` takes it.
        unsafe { taken(layout, <System as GlobalAlloc>::alloc) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`; a lined block's bytes lie inside the zeroed outer block.
        unsafe { taken(layout, <System as GlobalAlloc>::alloc_zeroed) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match lined(layout) {
            // SAFETY: a lined block's layout: `alloc` made it with `line_up` from this outer
            // block (which exists: it was allocated).
            true => unsafe { System.dealloc(glibc_block(p), outer(layout.size()).unwrap_unchecked()) },
            // SAFETY: the caller's block, taken from System with this layout.
            false => unsafe { System.dealloc(p, layout) },
        }
        heap::freed(layout.size());
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        // SAFETY (all three): the caller's block and layout, and a new size valid with its
        // alignment (GlobalAlloc::realloc's contract).
        let new = unsafe { Layout::from_size_align_unchecked(size, layout.align()) };
        if !lined(layout) && !lined(new) {
            let q = unsafe { System.realloc(p, layout, size) };
            if !q.is_null() {
                heap::freed(layout.size());
                handed_out(q, size);
            }
            return q;
        }
        // To, from or between lined blocks: glibc's realloc would hand back a 16-byte boundary
        // (so a lined block is copied even where glibc could have grown it in place).
        let q = unsafe { self.alloc(new) };
        if !q.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, layout.size().min(size));
                self.dealloc(p, layout);
            }
        }
        q
    }
}

/// Keeps freed memory in the heap instead of handing it back to the kernel. glibc serves blocks
/// above its mmap threshold (at most 32 MiB) with fresh mappings and unmaps them on free, so
/// every training step faulted its logits and activations in again page by page: 9% of a
/// multi30k-tiny step went to page faults. Turning those mappings off left peak RSS where it
/// was (the same bytes are live at the peak); they are simply reused.
///
/// The kernels' worker threads allocate from glibc's per-thread arenas, which grow in heaps of
/// at most 64 MiB. When the last heap of an arena empties, glibc unmaps it whatever the trim
/// threshold, unless the heap before it would then keep less than `M_TOP_PAD` free (glibc
/// 2.36 `heap_trim`); the default pad is 128 KiB, so each step unmapped heaps and faulted them
/// in again (16.7k page faults a step at nanoGPT's standard shape in bf16, 8 with a 64 MiB pad).
/// The pad is address space, never touched until used. Memory kept this way serves only its own
/// arena, so the process holds each arena's high-water mark: fine-tuning SmolLM2-135M's shape
/// in bf16 peaked at 4,663–4,685 MiB against 4,242–4,556 before, for a 1.07× faster step.
/// One arena per core instead of glibc's eight kept the peak where it was but cost the smallest
/// models 7–20% a step (docs/performance.md), and they are what Ember is mostly used for.
pub fn keep_freed_memory() {
    // SAFETY: mallopt only adjusts allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, ARENA_HEAP_MAX as i32);
    }
}

/// The largest heap of a glibc per-thread arena on 64-bit Linux (`HEAP_MAX_SIZE`, twice the
/// 32 MiB ceiling of the mmap threshold): a pad this large keeps every heap mapped.
const ARENA_HEAP_MAX: usize = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn on_a_line(p: *const u8) -> bool {
        (p as usize).is_multiple_of(LINE)
    }

    #[test]
    fn big_vectors_start_on_a_cache_line() {
        // Through the global allocator, as the kernels' outputs are made.
        for len in [MIN_LINED / 4, 1 << 20, (1 << 20) + 3] {
            let v: Vec<f32> = Vec::with_capacity(len);
            assert!(on_a_line(v.as_ptr().cast()), "{len} floats at {:p}", v.as_ptr());
        }
    }

    #[test]
    fn blocks_hold_their_bytes_through_realloc_across_the_threshold() {
        let a = LinedBlocks;
        let small = Layout::from_size_align(1000, 4).unwrap();
        let big = Layout::from_size_align(MIN_LINED + 100, 4).unwrap();
        let bigger = Layout::from_size_align(3 * MIN_LINED, 4).unwrap();
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..small.size() {
                *p.add(i) = i as u8;
            }
            // small → big → bigger → small, each keeping what fits.
            let p = a.realloc(p, small, big.size());
            assert!(!p.is_null() && on_a_line(p));
            for i in small.size()..big.size() {
                *p.add(i) = (i * 7) as u8;
            }
            let p = a.realloc(p, big, bigger.size());
            assert!(!p.is_null() && on_a_line(p));
            for i in 0..big.size() {
                let expected = if i < small.size() { i as u8 } else { (i * 7) as u8 };
                assert_eq!(*p.add(i), expected, "byte {i}");
            }
            let p = a.realloc(p, bigger, small.size());
            assert!(!p.is_null());
            for i in 0..small.size() {
                assert_eq!(*p.add(i), i as u8, "byte {i}");
            }
            a.dealloc(p, small);
        }
    }

    #[test]
    fn zeroed_big_blocks_are_zero_and_lined() {
        let a = LinedBlocks;
        // Below glibc's mmap threshold (128 KiB), so that the block comes back from the heap.
        let layout = Layout::from_size_align(MIN_LINED + 12, 8).unwrap();
        unsafe {
            // A freed block of glibc's, dirtied first, so that zeros are not the fresh page's;
            // a block after it keeps it from merging into the heap's top, which glibc may hand
            // back to the kernel (and get fresh zeroed pages for).
            let dirty = a.alloc(layout);
            let fence = a.alloc(layout);
            assert!(!dirty.is_null() && !fence.is_null());
            std::ptr::write_bytes(dirty, 0xab, layout.size());
            a.dealloc(dirty, layout);
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null() && on_a_line(p));
            assert!((0..layout.size()).all(|i| *p.add(i) == 0));
            a.dealloc(p, layout);
            a.dealloc(fence, layout);
        }
    }

    #[test]
    fn an_alignment_above_a_line_is_glibcs_to_give() {
        let a = LinedBlocks;
        let layout = Layout::from_size_align(MIN_LINED * 2, 4096).unwrap();
        unsafe {
            let p = a.alloc(layout);
            assert!((p as usize).is_multiple_of(4096));
            a.dealloc(p, layout);
        }
    }
}
