//! The heap's live bytes: what the allocator has handed out and not yet taken back, now and at
//! most so far in this process, counted in blocks of [`COUNTED_BLOCK`] bytes or more (tensors,
//! gradients, optimizer moments, the kernels' buffers). The many small blocks (names, shapes, a
//! tokenizer's maps) are left out: counting every block from every thread on one shared counter
//! cost the quickstart model's step 4% (docs/performance.md, 2026-12-02).
//!
//! The `ember` binary's global allocator reports its blocks here; `ember bench` reports the
//! peak beside the peak RSS. The two differ by what the allocator keeps after it is freed
//! (glibc's arenas hold their high-water marks: `keep_freed_memory` in src/allocator.rs), by memory
//! not from the heap (the binary, thread stacks, mapped files) and by pages handed out but never
//! touched. So a change that frees memory earlier shows in the live peak even where the
//! allocator keeps RSS where it was. A process whose allocator reports nothing (a test, another
//! program linking the library) has no live peak: [`peak_mib`] is `None`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The smallest block counted.
pub const COUNTED_BLOCK: usize = 64 << 10;

static COUNTED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Declares that the process's global allocator reports every block it hands out and takes
/// back to [`allocated`] and [`freed`], from its first (they count the blocks of
/// [`COUNTED_BLOCK`] bytes or more).
pub fn count_from_now() {
    COUNTED.store(true, Ordering::Relaxed);
}

/// A block of `bytes` is in use.
#[inline]
pub fn allocated(bytes: usize) {
    if bytes < COUNTED_BLOCK {
        return;
    }
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    // The peak is written only when passed: most allocations leave it alone.
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

/// A block of `bytes` handed out earlier is free again.
#[inline]
pub fn freed(bytes: usize) {
    if bytes < COUNTED_BLOCK {
        return;
    }
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

/// The most bytes in use at once so far in blocks of [`COUNTED_BLOCK`] or more, in MiB; `None`
/// where the allocator does not report.
pub fn peak_mib() -> Option<f64> {
    COUNTED
        .load(Ordering::Relaxed)
        .then(|| PEAK.load(Ordering::Relaxed) as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak follows the largest sum of blocks in use at once, not the sum of all blocks,
    /// and small blocks are not counted.
    #[test]
    fn the_peak_is_the_most_in_use_at_once() {
        // The counters are the process's: this test alone moves them (nothing else in the
        // test binary reports), so it reads them relative to where they stand.
        let (live0, peak0) = (LIVE.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed));
        let base = live0.max(peak0);
        allocated(base - live0 + (3 << 20));
        allocated(1 << 20);
        freed(2 << 20);
        allocated(COUNTED_BLOCK - 1);
        allocated(1 << 20);
        freed(COUNTED_BLOCK - 1);
        assert_eq!(PEAK.load(Ordering::Relaxed), base + (4 << 20));
        assert_eq!(LIVE.load(Ordering::Relaxed), base + (3 << 20));
        assert_eq!(peak_mib(), None, "not counted until the allocator says so");
        count_from_now();
        assert_eq!(peak_mib(), Some((base + (4 << 20)) as f64 / (1 << 20) as f64));
        freed(base - live0 + (3 << 20));
    }
}
