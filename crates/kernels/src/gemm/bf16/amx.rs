//! AMX-BF16 for the bf16 products' inner loop, where the CPU has it: `tdpbf16ps` multiplies a
//! 16×32 tile of A's bf16 by a 32×16 tile of B's into a 16×16 tile of f32 sums, 16 times the
//! multiply-adds of one `vdpbf16ps`.
//!
//! The products keep [`super`]'s blocks, pieces and packed B; only the step that turns a
//! piece of A and a strip of B into sums changes. A step holds 32 rows × 32 columns of C in
//! four tile registers (tmm0–3), loads two 16-row tiles of A (tmm4–5) and the strip's two
//! 16-column halves (tmm6–7) for every 16 pairs of k, and multiplies each A tile by each B tile.
//! Tiles read rows at a stride, so both operands are read where the packers put them, with two
//! differences from the `vdpbf16ps` layout:
//! - k is padded with zero pairs to a multiple of 16 in both operands (a tile always spans 16
//!   pairs), and
//! - A always comes as rows of pairs, padded with zero rows to a multiple of 32; a column-major A
//!   (gᵀ in dW = gᵀ·x) is converted 16 rows × 16 pairs at a time and transposed, as B's strips
//!   are (the packers are [`super::pack`]'s).
//!
//! Each element of C is summed as Intel's SDM defines `tdpbf16ps`: per instruction (16 pairs of k),
//! the even elements' products and the odd elements' products in two chains of fused multiply-adds
//! starting from zero, the two chains added, and that added to C's sum; every result rounded to
//! nearest even, tiny results flushed and denormal inputs read as zero. The instructions follow k's
//! pairs in order from the first, and β·C is added once at the end. The bits therefore differ from
//! the `vdpbf16ps` kernel's (one chain of pairs, the odd element first) in the last places, and do
//! not depend on the threads.
//!
//! **Written on an emulator, verified on hardware.** Most development machines have no AMX, and no
//! maintained crate or emulator on the registries runs these instructions. So the kernel is written
//! once against [`TileUnit`], and runs either on the tile registers ([`Hardware`], through `asm!`:
//! stable Rust has no AMX intrinsics) or on [`Emulated`], a model of the same instructions in Rust
//! that follows Intel's definition. The unit tests drive every layout, edge and thread count
//! through the emulated unit and check the bits against a scalar model of the same sums. On an AMX
//! Xeon (2026-11-30 and 2026-12-03) the hardware gave the emulator's bits in every product of
//! `amx_hardware_gives_the_emulated_products` and at the flushing's edge
//! (`a_sum_just_below_the_smallest_normal_gives_the_hardwares_bits`, which corrected the emulator's
//! reading of "flushed"). On a CPU with AMX the first bf16 product runs a [start-up
//! check](self_check): the hardware's result against the emulated one; unless it is within
//! rounding, AMX stays off and the products run on `vdpbf16ps`, with a warning. Linux gives a
//! process the tiles' 8 KiB of state only when asked (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`), which is done here before any tile instruction runs.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{Kernel, NR};
use crate::gemm::emulated::fma_flushed;
use crate::gemm::x86::avx512::{lane_mask as lanes, start_sums, store_sums};
use crate::gemm::Operand;

/// Pairs of k per tile product: a tile row is 64 bytes, 16 pairs of bf16.
pub(in crate::gemm) const KQ_STEP: usize = 16;

/// Rows of C per step: two A tiles of 16 rows.
pub(super) const ROWS: usize = 32;

/// The tile instructions a step uses, on the tile registers or on their model. Tile numbers
/// are constants, as the instructions encode them.
pub(super) trait TileUnit {
    /// Loads the tile configuration: every tile 16 rows of 64 bytes.
    unsafe fn configure(&mut self);
    /// Gives the tile state back (`tilerelease`).
    unsafe fn release(&mut self);
    /// Tile `T` = 0.
    unsafe fn zero<const T: u8>(&mut self);
    /// Tile `T`'s 16 rows of 64 bytes from `ptr`, row r at `ptr + r·stride` bytes.
    unsafe fn load<const T: u8>(&mut self, ptr: *const u32, stride: usize);
    /// Tile `T` into 16 rows of 64 bytes at `ptr`, row r at `ptr + r·stride` bytes.
    unsafe fn store<const T: u8>(&mut self, ptr: *mut f32, stride: usize);
    /// `tdpbf16ps`: tile C (f32) += tile A (bf16 pairs, 16×16) · tile B (bf16 pairs, 16×16).
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self);
    /// Asks for the cache line at `ptr` in L1, to be written (`prefetchw`): a hint, with no
    /// effect on any value.
    unsafe fn prefetch_for_writing(&mut self, _ptr: *const f32) {}
}

/// The configuration [`TileUnit::configure`] loads: palette 1, tiles 0–7 of 16 rows × 64 bytes.
fn config() -> [u8; 64] {
    let mut cfg = [0u8; 64];
    cfg[0] = 1;
    for t in 0..8 {
        cfg[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        cfg[48 + t] = 16;
    }
    cfg
}

/// The tile registers themselves.
pub(super) struct Hardware;

impl TileUnit for Hardware {
    #[inline(always)]
    unsafe fn configure(&mut self) {
        let cfg = config();
        asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly));
    }
    #[inline(always)]
    unsafe fn release(&mut self) {
        asm!("tilerelease", options(nostack, nomem));
    }
    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        asm!("tilezero tmm{t}", t = const T, options(nostack, nomem));
    }
    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, ptr: *const u32, stride: usize) {
        asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) ptr, s = in(reg) stride,
             options(nostack, readonly));
    }
    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, ptr: *mut f32, stride: usize) {
        asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) ptr, s = in(reg) stride,
             options(nostack));
    }
    #[inline(always)]
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
             options(nostack, nomem));
    }
    /// Every CPU with AMX has `prefetchw` (PRFCHW); `asm!` because the crate is not built for it.
    #[inline(always)]
    unsafe fn prefetch_for_writing(&mut self, ptr: *const f32) {
        asm!("prefetchw [{}]", in(reg) ptr, options(nostack, readonly, preserves_flags));
    }
}

/// The tile instructions modelled in Rust, as Intel's SDM defines them: for each element of a
/// `tdpbf16ps`'s destination, the 16 even elements' products (A's row pairs against B's
/// column pairs) summed by fused multiply-adds from zero, the odd elements' likewise, the two
/// sums added, and the result added to the destination; every result rounded to nearest even
/// and flushed to zero when tiny ([`fma_flushed`]), denormal inputs read as zero.
pub(super) struct Emulated {
    tiles: [[[u32; 16]; 16]; 8],
}

impl Emulated {
    pub(super) fn new() -> Self {
        Self {
            tiles: [[[0; 16]; 16]; 8],
        }
    }
}

/// The f32 of bf16 bits, a denormal read as a zero of its sign.
fn bf16_in(h: u32) -> f32 {
    let h = if h & 0x7f80 == 0 { h & 0x8000 } else { h };
    f32::from_bits(h << 16)
}

/// `x`, a denormal flushed to a zero of its sign: a sum of two normal numbers that is not one is
/// exact, so an addition's result is tiny exactly when it is a denormal (a fused multiply-add's
/// need not be: [`fma_flushed`]).
pub(in crate::gemm) fn flushed(x: f32) -> f32 {
    if x.is_subnormal() {
        0f32.copysign(x)
    } else {
        x
    }
}

impl TileUnit for Emulated {
    unsafe fn configure(&mut self) {}
    unsafe fn release(&mut self) {}
    unsafe fn zero<const T: u8>(&mut self) {
        self.tiles[T as usize] = [[0; 16]; 16];
    }
    unsafe fn load<const T: u8>(&mut self, ptr: *const u32, stride: usize) {
        for (r, row) in self.tiles[T as usize].iter_mut().enumerate() {
            let at = ptr.cast::<u8>().add(r * stride).cast::<u32>();
            for (c, x) in row.iter_mut().enumerate() {
                *x = at.add(c).read_unaligned();
            }
        }
    }
    unsafe fn store<const T: u8>(&mut self, ptr: *mut f32, stride: usize) {
        for (r, row) in self.tiles[T as usize].iter().enumerate() {
            let at = ptr.cast::<u8>().add(r * stride).cast::<u32>();
            for (c, x) in row.iter().enumerate() {
                at.add(c).write_unaligned(*x);
            }
        }
    }
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (a, b) = (self.tiles[A as usize], self.tiles[B as usize]);
        let c = &mut self.tiles[C as usize];
        for (m, a_row) in a.iter().enumerate() {
            for n in 0..16 {
                let (mut even, mut odd) = (0f32, 0f32);
                for (k, &pair) in a_row.iter().enumerate() {
                    let b_pair = b[k][n];
                    even = fma_flushed(bf16_in(pair & 0xffff), bf16_in(b_pair & 0xffff), even);
                    odd = fma_flushed(bf16_in(pair >> 16), bf16_in(b_pair >> 16), odd);
                }
                let dst = flushed(f32::from_bits(c[m][n]));
                c[m][n] = flushed(dst + flushed(even + odd)).to_bits();
            }
        }
    }
}

/// The emulated tiles with one wrong instruction, for the start-up check's tests: every product
/// into tile 0 is added twice.
#[cfg(test)]
pub(super) struct Faulty(pub Emulated);

#[cfg(test)]
impl TileUnit for Faulty {
    unsafe fn configure(&mut self) {}
    unsafe fn release(&mut self) {}
    unsafe fn zero<const T: u8>(&mut self) {
        self.0.zero::<T>()
    }
    unsafe fn load<const T: u8>(&mut self, ptr: *const u32, stride: usize) {
        self.0.load::<T>(ptr, stride)
    }
    unsafe fn store<const T: u8>(&mut self, ptr: *mut f32, stride: usize) {
        self.0.store::<T>(ptr, stride)
    }
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.0.dot::<C, A, B>();
        if C == 0 {
            self.0.dot::<C, A, B>();
        }
    }
}

/// One step: C's `rows` × `width` (at most [`ROWS`] × [`NR`]) at `c` from `kq` pairs (a
/// multiple of [`KQ_STEP`]) of A's rows at `a` (row stride `lda` u32, 32 rows readable, zero past
/// k and past the rows that exist) and of a strip of B at `b` (pair rows of [`NR`] u32, zero past
/// k and n). With `resume` the sums start from C's values (β not applied), else from zero with
/// β·C added at the end. `next`: where the step after this one stores its sums, a whole 32 × 32
/// (rows `ldc` apart; null if unknown or not whole), whose lines this one asks for while its
/// products run; `asked`: whether the step before asked for this one's lines so.
pub(super) struct Step {
    pub kq: usize,
    pub a: *const u32,
    pub lda: usize,
    pub b: *const u32,
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub width: usize,
    pub beta: f32,
    pub resume: bool,
    pub next: *const f32,
    pub asked: bool,
}

/// C's 32 rows × 32 columns as 64 cache lines: line `i`'s first element, rows `ldc` apart.
#[inline(always)]
unsafe fn c_line(c: *const f32, ldc: usize, i: usize) -> *const f32 {
    c.add((i / 2) * ldc + (i % 2) * 16)
}

/// Runs a [`Step`] on `unit`, configured beforehand. A whole 32×32 tile of C with nothing to add
/// is loaded and stored where it lies; an edge tile, or one with β·C to add, goes through a
/// buffer of 32×32 sums, so nothing outside C's view is read or written.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn step<U: TileUnit>(unit: &mut U, s: Step) {
    let direct = s.rows == ROWS && s.width == NR && (s.beta == 0.0 || s.resume);
    // Written before it is read (by the tiles' stores, or below where the sums resume), so not
    // zeroed: a whole step's C is 4 KiB.
    let mut buffer = [std::mem::MaybeUninit::<f32>::uninit(); ROWS * NR];
    let masks = (lanes(s.width), lanes(s.width.saturating_sub(16)));
    let (c, ldc) = if direct {
        (s.c, s.ldc)
    } else {
        (buffer.as_mut_ptr().cast::<f32>(), NR)
    };
    if s.resume {
        if !direct {
            for r in 0..ROWS {
                let (lo, hi) = if r < s.rows {
                    start_sums::<1, true>(s.c.add(r * s.ldc), s.ldc, masks, true)
                } else {
                    ([_mm512_setzero_ps()], [_mm512_setzero_ps()])
                };
                _mm512_storeu_ps(c.add(r * NR), lo[0]);
                _mm512_storeu_ps(c.add(r * NR + 16), hi[0]);
            }
        }
        unit.load::<0>(c.cast(), 4 * ldc);
        unit.load::<1>(c.add(16).cast(), 4 * ldc);
        unit.load::<2>(c.add(16 * ldc).cast(), 4 * ldc);
        unit.load::<3>(c.add(16 * ldc + 16).cast(), 4 * ldc);
    } else {
        if direct && !s.asked {
            // C's lines asked for, for writing, before the products: the stores at the end
            // then find them in L1 rather than each tile row waiting for its own lines.
            for i in 0..2 * ROWS {
                unit.prefetch_for_writing(c_line(c, ldc, i));
            }
        }
        unit.zero::<0>();
        unit.zero::<1>();
        unit.zero::<2>();
        unit.zero::<3>();
    }
    // The next step's 64 lines of C, asked for a share at a time among this step's products,
    // so that they arrive while the tiles multiply. Attention's products (k = d = 64: two
    // `tdpbf16ps` per tile of C) spent half their steps' time waiting on the stores of C's
    // lines otherwise (docs/performance.md, 2026-12-01).
    let per_k = (2 * ROWS).div_ceil(s.kq.div_ceil(KQ_STEP).max(1));
    let mut line = 0;
    // Each operand tile of the next 16 pairs is loaded as soon as the last product reading its
    // register has been issued, so that its load runs beside the products still to come: the
    // tile registers are not renamed, so a load waits for the products before it that read
    // its register. With both operands in L1 a step over 192 pairs ran 10–20% faster than
    // with the four loads at the top of each 16 pairs (`amx_tiles_in_l1`); where the operands
    // come from L2 and beyond, as in training, the gain is within this machine's noise (the
    // training step 1.007× and 1.019×; docs/performance.md, 2026-12-01).
    if s.kq > 0 {
        unit.load::<4>(s.a, 4 * s.lda);
        unit.load::<6>(s.b, 4 * NR);
        unit.load::<5>(s.a.add(16 * s.lda), 4 * s.lda);
        unit.load::<7>(s.b.add(16), 4 * NR);
    }
    for q in (0..s.kq).step_by(KQ_STEP) {
        let (n, more) = (q + KQ_STEP, q + KQ_STEP < s.kq);
        unit.dot::<0, 4, 6>();
        unit.dot::<1, 4, 7>();
        if more {
            unit.load::<4>(s.a.add(n), 4 * s.lda);
        }
        unit.dot::<2, 5, 6>();
        if more {
            unit.load::<6>(s.b.add(n * NR), 4 * NR);
        }
        unit.dot::<3, 5, 7>();
        if more {
            unit.load::<5>(s.a.add(16 * s.lda + n), 4 * s.lda);
            unit.load::<7>(s.b.add(n * NR + 16), 4 * NR);
        }
        if !s.next.is_null() {
            for i in line..(line + per_k).min(2 * ROWS) {
                unit.prefetch_for_writing(c_line(s.next, s.ldc, i));
            }
            line += per_k;
        }
    }
    unit.store::<0>(c, 4 * ldc);
    unit.store::<1>(c.add(16), 4 * ldc);
    unit.store::<2>(c.add(16 * ldc), 4 * ldc);
    unit.store::<3>(c.add(16 * ldc + 16), 4 * ldc);
    if !direct {
        for r in 0..s.rows {
            let sums = (
                [_mm512_loadu_ps(c.add(r * NR))],
                [_mm512_loadu_ps(c.add(r * NR + 16))],
            );
            store_sums::<1, true>(sums, s.c.add(r * s.ldc), s.ldc, masks, s.beta, s.resume);
        }
    }
}

/// Whether the bf16 products' steps run on AMX here, decided on the first call: the CPU has
/// AMX-BF16, the vector unit is not capped below it ([`crate::VECTOR_UNIT_ENV`]), Linux grants
/// the tile state, and the [start-up check](self_check) passes. Every reason it does not is
/// kept for the reports ([`state`]).
pub(in crate::gemm) fn available() -> bool {
    matches!(state(), State::Active)
}

/// Where AMX stands in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::gemm) enum State {
    /// No AMX-BF16 on this CPU (or no AVX512_BF16 in use, which the packers need).
    Absent,
    /// The CPU has it but [`crate::VECTOR_UNIT_ENV`] caps the unit at AVX-512 or below.
    CappedByEnv,
    /// The CPU has it but the OS does not give the process the tile state: why.
    Refused(String),
    /// The start-up check found the hardware's products wrong: how far off.
    FailedCheck(String),
    /// The products' steps run on AMX.
    Active,
}

/// AMX's [`State`] in this process, decided once.
pub(in crate::gemm) fn state() -> &'static State {
    static STATE: std::sync::OnceLock<State> = std::sync::OnceLock::new();
    STATE.get_or_init(|| {
        let state = detect();
        match &state {
            State::Refused(why) => {
                eprintln!("warning: this CPU has AMX, but {why}; bf16 products run on AVX512_BF16")
            }
            State::FailedCheck(why) => eprintln!(
                "warning: AMX's bf16 products failed their start-up check ({why}); they run on \
                 AVX512_BF16. Please report this CPU (its /proc/cpuinfo model name)."
            ),
            _ => {}
        }
        state
    })
}

fn detect() -> State {
    if !super::supported() || !cpu_has_amx_bf16() {
        return State::Absent;
    }
    if crate::simd::unit_capped_by_env() {
        return State::CappedByEnv;
    }
    if let Err(why) = request_tile_state() {
        return State::Refused(why);
    }
    match self_check() {
        Ok(()) => State::Active,
        Err(why) => State::FailedCheck(why),
    }
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24).
fn cpu_has_amx_bf16() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state (XFEATURE_XTILEDATA, 18), after checking that the OS
/// enables the tile state in XCR0 (bits 17 and 18).
fn request_tile_state() -> Result<(), String> {
    if __cpuid(1).ecx & (1 << 27) == 0 {
        return Err("the OS has not enabled XSAVE".into());
    }
    // SAFETY: OSXSAVE (above) says XGETBV exists.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return Err("the OS does not enable the tile state (XCR0 bits 17 and 18)".into());
    }
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes the process's XSAVE permissions.
        let done = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        if done != 0 {
            return Err(format!(
                "Linux refused the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM): {})",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    Err("Ember asks for the tile state on Linux only".into())
}

#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    _xgetbv(0)
}

/// The start-up check: [`check`] on the hardware.
fn self_check() -> Result<(), String> {
    check(Kernel::Amx)
}

/// A product with ragged edges on every side, a long k in pieces and a column-major A, on
/// `kernel` and on the emulator, on the calling thread alone: the check runs inside
/// [`state`]'s initialisation, which a task of the thread pool may be the first to reach, and a
/// pool task waiting for others could be handed another product that reaches it again. The same bits pass; so does a result within rounding of the
/// emulated one (Intel's definition may leave the hardware some room, e.g. in how a pair's two
/// products are added); anything else fails, naming the largest error.
pub(in crate::gemm) fn check(kernel: Kernel) -> Result<(), String> {
    let (m, k, n) = (50, 601, 45);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    };
    let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
    let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
    // A column-major (as gᵀ is), B row-major.
    let ao = Operand {
        ptr: a.as_ptr(),
        row_stride: 1,
        col_stride: m,
    };
    let bo = Operand {
        ptr: b.as_ptr(),
        row_stride: n,
        col_stride: 1,
    };
    let product = |kernel| {
        let mut c = vec![0f32; m * n];
        // B is small enough to be packed on this thread too.
        assert!(k * n < super::pack::PAR_MIN_PACK);
        // SAFETY: the operands and C hold these shapes; AMX's state was granted by the caller.
        unsafe {
            let b = super::pack_b_for(kernel, k, n, bo);
            super::product_on_this_thread(m, ao, &b, c.as_mut_ptr(), n);
        }
        c
    };
    let (got, emulated) = (product(kernel), product(Kernel::AmxEmulated));
    let worst = worst_error(
        &got,
        &emulated,
        |i, p| a[p * m + i],
        |p, j| b[p * n + j],
        (m, k, n),
    );
    // The chain's own rounding: k sums of at most half an ulp (2⁻²⁴) each, relative to Σ|a·b|.
    let allowed = k as f64 * 2f64.powi(-24);
    if worst <= allowed {
        Ok(())
    } else {
        Err(format!(
            "largest error {worst:.2e} of Σ|a·b| against the emulated tiles, where rounding allows {allowed:.2e}"
        ))
    }
}

/// The largest |got − want| of an element of an m×n product, relative to its Σ|a·b|.
pub(in crate::gemm) fn worst_error(
    got: &[f32],
    want: &[f32],
    a: impl Fn(usize, usize) -> f32,
    b: impl Fn(usize, usize) -> f32,
    (m, k, n): (usize, usize, usize),
) -> f64 {
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let scale: f64 = (0..k).map(|p| (a(i, p) as f64 * b(p, j) as f64).abs()).sum();
            let error = (got[i * n + j] as f64 - want[i * n + j] as f64).abs();
            // A NaN or an infinity where the other is finite is the worst error there is
            // (`f64::max` would pass over a NaN).
            let relative = if error.is_finite() {
                error / scale.max(f64::MIN_POSITIVE)
            } else if got[i * n + j].to_bits() == want[i * n + j].to_bits() {
                0.0
            } else {
                f64::INFINITY
            };
            worst = worst.max(relative);
        }
    }
    worst
}
