//! The products in either [`Precision`]: f32 goes to [`sgemm`] and its kernels, bf16 to the
//! `vdpbf16ps` kernel ([`super::bf16`]), or where the CPU has no AVX512_BF16 and the user asked
//! for it, to its emulation ([`super::emulated`]). The ops call these and never look at the
//! precision themselves.

use super::emulated::{self, Packed as EmulatedB};
use super::{product, sgemm, sgemm_packed, Bits, Mat, Operand, PackedB};
use crate::Precision;

/// Whether the CPU runs bf16 products itself ([`super::bf16::supported`]).
pub(crate) fn bf16_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::bf16::supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether bf16 products run on AMX's tiles here ([`super::bf16::amx::state`]: the CPU has them, Linux
/// granted them and the start-up check passed).
pub(crate) fn bf16_on_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::bf16::amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether bf16 products run in software here: the CPU cannot run them and the user asked for
/// the emulation ([`BF16_ENV`](crate::BF16_ENV)).
pub fn bf16_emulated() -> bool {
    !bf16_supported() && emulated::asked()
}

/// Where this process's bf16 products run (the CPU's own instructions exist on x86-64 alone).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bf16On {
    #[cfg(target_arch = "x86_64")]
    Cpu,
    Emulation,
}

/// Where bf16 products run here; panics where they do not: the ops check
/// [`Precision::missing_cpu_feature`] first and return an error.
fn bf16_on() -> Bf16On {
    #[cfg(target_arch = "x86_64")]
    if bf16_supported() {
        return Bf16On::Cpu;
    }
    assert!(
        bf16_emulated(),
        "bf16 products need AVX512_BF16; the op should have refused"
    );
    Bf16On::Emulation
}

/// `A·B` for A (m×k) and B (k×n) into a new row-major (m×n) vector, in `precision`.
pub(crate) fn product_in(
    precision: Precision,
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
) -> Vec<f32> {
    match precision {
        Precision::F32 => product(m, k, n, a, b),
        Precision::Bf16 => {
            let mut c = Vec::with_capacity(m * n);
            sgemm_bf16(m, k, n, a, b, 0.0, c.spare_capacity_mut());
            // SAFETY: a β = 0 product writes every element of C (zeros for k = 0).
            unsafe { c.set_len(m * n) };
            c
        }
    }
}

/// `C = A·B + beta·C` for A (m×k), B (k×n) and a row-major C (m×n), in `precision`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_in(
    precision: Precision,
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: &mut [f32],
) {
    match precision {
        Precision::F32 => sgemm(m, k, n, a, b, beta, c),
        Precision::Bf16 => {
            // SAFETY: initialised floats are valid `MaybeUninit`s, and with β ≠ 0 C is read
            // only where it was initialised (the caller's slice).
            let c = unsafe { &mut *(c as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
            sgemm_bf16(m, k, n, a, b, beta, c)
        }
    }
}

/// `C = A·B + beta·C` through raw operands in `precision`: [`super::gemm`] or the bf16 kernel.
///
/// # Safety
/// As [`super::gemm`]; for bf16 the CPU runs bf16 products (asserted).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_in(
    precision: Precision,
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    match precision {
        Precision::F32 => super::gemm(m, k, n, a, b, beta, c, ldc),
        Precision::Bf16 => match bf16_on() {
            Bf16On::Emulation => emulated::gemm(m, k, n, a, b, beta, c, ldc),
            #[cfg(target_arch = "x86_64")]
            Bf16On::Cpu => super::bf16::gemm(m, k, n, a, b, beta, c, ldc),
        },
    }
}

/// [`sgemm_in`]'s bf16 half; C need not be initialised for β = 0.
#[allow(clippy::too_many_arguments)]
fn sgemm_bf16(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: &mut [std::mem::MaybeUninit<f32>],
) {
    assert!(
        a.fits(m, k) && b.fits(k, n) && c.len() >= m * n,
        "sgemm: operand out of bounds"
    );
    // SAFETY: operands in bounds (asserted), and C is exclusively borrowed, so it cannot alias
    // A or B; `gemm_in` asserts that bf16 products run here.
    unsafe {
        gemm_in(
            Precision::Bf16,
            m,
            k,
            n,
            a.operand(),
            b.operand(),
            beta,
            c.as_mut_ptr().cast(),
            n,
        )
    };
}

/// B (k×n) packed once for several products in a precision: the output layer multiplies every
/// block of rows by the same weight.
pub(crate) enum PackedIn<'a> {
    /// Packed for the in-place f32 kernel, or (`None`: no AVX-512) left where it lies.
    F32 {
        packed: Option<PackedB>,
        b: Mat<'a>,
        k: usize,
        n: usize,
    },
    #[cfg(target_arch = "x86_64")]
    Bf16(super::bf16::PackedPairs),
    Emulated(EmulatedB),
}

impl<'a> PackedIn<'a> {
    pub fn new(precision: Precision, k: usize, n: usize, b: Mat<'a>) -> Self {
        match precision {
            Precision::F32 => PackedIn::F32 {
                packed: PackedB::new(k, n, b),
                b,
                k,
                n,
            },
            Precision::Bf16 => {
                assert!(b.fits(k, n), "sgemm: operand out of bounds");
                match bf16_on() {
                    Bf16On::Emulation => PackedIn::Emulated(EmulatedB::of(k, n, b)),
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: B's k×n view is in bounds (asserted) and the CPU has AVX512_BF16.
                    Bf16On::Cpu => PackedIn::Bf16(unsafe { super::bf16::pack_b(k, n, b.operand()) }),
                }
            }
        }
    }

    /// `C = A·B + beta·C` for a row-major A (m×k) and C (m×n).
    pub fn product(&self, m: usize, a: Mat<'_>, beta: f32, c: &mut [f32]) {
        match self {
            PackedIn::F32 {
                packed: Some(packed), ..
            } => sgemm_packed(m, a, packed, beta, c),
            PackedIn::F32 {
                packed: None,
                b,
                k,
                n,
            } => sgemm(m, *k, *n, a, *b, beta, c),
            #[cfg(target_arch = "x86_64")]
            PackedIn::Bf16(packed) => {
                let (k, n) = packed.dims();
                assert!(a.fits(m, k) && c.len() >= m * n, "sgemm: operand out of bounds");
                // SAFETY: operands in bounds (asserted); C is exclusively borrowed.
                unsafe { super::bf16::gemm_packed(m, a.operand(), packed, beta, c.as_mut_ptr(), n) }
            }
            PackedIn::Emulated(packed) => {
                let (k, n) = packed.dims();
                assert!(a.fits(m, k) && c.len() >= m * n, "sgemm: operand out of bounds");
                // SAFETY: operands in bounds (asserted); C is exclusively borrowed.
                unsafe { emulated::gemm_packed(m, a.operand(), packed, beta, c.as_mut_ptr(), n) }
            }
        }
    }
}

/// B (k×n) for products over parts of it ([`Self::products`]): packed once in bf16; an f32 view
/// in f32, whose kernels pick their route per product as they do for a whole one.
pub(crate) enum PartsOf<'a> {
    F32 {
        b: Mat<'a>,
        k: usize,
        n: usize,
    },
    #[cfg(target_arch = "x86_64")]
    Bf16(super::bf16::PackedPairs),
    Emulated(EmulatedB),
}

impl<'a> PartsOf<'a> {
    pub fn new(precision: Precision, k: usize, n: usize, b: Mat<'a>) -> Self {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        match precision {
            Precision::F32 => PartsOf::F32 { b, k, n },
            Precision::Bf16 => match bf16_on() {
                Bf16On::Emulation => PartsOf::Emulated(EmulatedB::of(k, n, b)),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: B's k×n view is in bounds (asserted) and the CPU has AVX512_BF16.
                Bf16On::Cpu => PartsOf::Bf16(unsafe { super::bf16::pack_b(k, n, b.operand()) }),
            },
        }
    }

    /// B (k×n) held as bf16 bits, for bf16 products: packed from the bits where the CPU
    /// multiplies in bf16 (no f32 copy), rounded from them for the emulation.
    pub fn of_bits(k: usize, n: usize, b: Bits<'_>) -> Self {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        match bf16_on() {
            Bf16On::Emulation => PartsOf::Emulated(EmulatedB::of_bits(k, n, b)),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: B's k×n view is in bounds (asserted) and the CPU has AVX512_BF16.
            Bf16On::Cpu => PartsOf::Bf16(unsafe { super::bf16::pack_b_bits(k, n, b) }),
        }
    }

    /// `C = A·B + beta·C` over parts of C, each its rows × columns over k's elements `ks`
    /// alone, for an A (m×k, any strides) whose columns outside a part's `ks` are zero in its
    /// rows: the bits of the whole product's rows and columns, without the work of the zeros.
    /// A's columns past a part's `ks` are not read, so its view may end there.
    /// In bf16 a part's `ks` starts at a multiple of 32 and ends at one or at k, and its
    /// columns start at a multiple of 32; in f32 each part is one product.
    ///
    /// # Safety
    /// C's parts, rows `ldc` apart from `c` (element (0, 0)), are writable (readable for
    /// β ≠ 0) and touched by no one else meanwhile, and overlap neither A nor B.
    pub unsafe fn products(&self, a: Mat<'_>, parts: &[Part], beta: f32, c: *mut f32, ldc: usize) {
        let (k, n) = match self {
            PartsOf::F32 { k, n, .. } => (*k, *n),
            #[cfg(target_arch = "x86_64")]
            PartsOf::Bf16(p) => p.dims(),
            PartsOf::Emulated(p) => p.dims(),
        };
        for (rows, cols, ks) in parts {
            assert!(
                (rows.is_empty() || a.fits(rows.end, ks.end))
                    && cols.start <= cols.end
                    && cols.end <= n
                    && cols.end <= ldc
                    && ks.start <= ks.end
                    && ks.end <= k,
                "sgemm: operand part out of bounds"
            );
        }
        match self {
            PartsOf::F32 { b, .. } => {
                for (rows, cols, ks) in parts.iter().filter(|(r, c, _)| !r.is_empty() && !c.is_empty()) {
                    let c = c.add(rows.start * ldc + cols.start);
                    if ks.is_empty() {
                        // An empty sum: β·C, as every path of `gemm` gives for k = 0.
                        for r in 0..rows.len() {
                            for j in 0..cols.len() {
                                let x = c.add(r * ldc + j);
                                *x = if beta == 0.0 { 0.0 } else { beta * *x };
                            }
                        }
                        continue;
                    }
                    let a = a.operand().skip_rows(rows.start).skip_cols(ks.start);
                    let b = b.operand().skip_rows(ks.start).skip_cols(cols.start);
                    gemm_in(
                        Precision::F32,
                        rows.len(),
                        ks.len(),
                        cols.len(),
                        a,
                        b,
                        beta,
                        c,
                        ldc,
                    )
                }
            }
            #[cfg(target_arch = "x86_64")]
            PartsOf::Bf16(packed) => super::bf16::gemm_packed_parts(a.operand(), packed, parts, beta, c, ldc),
            PartsOf::Emulated(packed) => {
                emulated::gemm_packed_parts(a.operand().into(), packed, parts, beta, c, ldc)
            }
        }
    }
}

/// A part of a product for [`PartsOf::products`]: C's rows, C's columns, and the elements of k
/// its sums run over.
pub(crate) type Part = (
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
);

/// An activation kept for products in their precision: f32 as it is, or for bf16 products
/// rounded to bf16 once ([`super::bf16::Rounded`]), so that every product reading it reads half
/// the bytes and converts nothing, with the bits it would give from the f32 values.
pub(crate) enum Activation {
    F32(Vec<f32>),
    #[cfg(target_arch = "x86_64")]
    Bf16(super::bf16::Rounded),
    /// Rounded for emulated bf16 products.
    Emulated(emulated::Rounded),
}

impl Activation {
    /// A rows × cols activation for bf16 products made in blocks of rows by `fill(rows, out)`
    /// (`out`: the block's `rows.len()·cols` values, row-major, in scratch rows rounded as each
    /// block is made: [`super::bf16::Rounded::from_rows_with`]).
    pub fn rounded_with(
        rows: usize,
        cols: usize,
        fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<f32>]) + Sync + Send,
    ) -> Self {
        match bf16_on() {
            Bf16On::Emulation => Activation::Emulated(emulated::Rounded::from_rows_with(rows, cols, fill)),
            #[cfg(target_arch = "x86_64")]
            Bf16On::Cpu => Activation::Bf16(super::bf16::Rounded::from_rows_with(rows, cols, fill)),
        }
    }

    /// The f32 values, unless rounded.
    fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Activation::F32(v) => Some(v),
            #[cfg(target_arch = "x86_64")]
            Activation::Bf16(_) => None,
            Activation::Emulated(_) => None,
        }
    }

    /// An emulated bf16 activation read as a rows × cols operand (or its transpose).
    fn as_emulated(&self, dims: (usize, usize), transposed: bool) -> emulated::Lines<u16> {
        match self {
            Activation::Emulated(r) => r.lines(dims, transposed),
            _ => panic!("emulated bf16 product: an operand not rounded for it"),
        }
    }

    /// The rounded values, for a bf16 product (which never takes an f32 activation).
    #[cfg(target_arch = "x86_64")]
    fn as_rounded(&self) -> &super::bf16::Rounded {
        match self {
            Activation::Bf16(r) => r,
            _ => panic!("bf16 product: an f32 or emulated activation beside a bf16 one"),
        }
    }

    /// `x` (rows × cols, row-major) rounded for bf16 products.
    pub fn rounded(rows: usize, cols: usize, x: &[f32]) -> Self {
        match bf16_on() {
            Bf16On::Emulation => Activation::Emulated(emulated::Rounded::new(rows, cols, x)),
            #[cfg(target_arch = "x86_64")]
            Bf16On::Cpu => Activation::Bf16(super::bf16::Rounded::new(rows, cols, x)),
        }
    }
}

/// The A operand of [`product_from`]: an [`Activation`] read in rows, or its transpose.
#[derive(Clone, Copy)]
pub(crate) enum AFrom<'a> {
    Rows(&'a Activation),
    Transposed(&'a Activation),
}

/// A B operand of [`product_from`]: f32 (a view), an [`Activation`] in rows (k×n), or one
/// packed beforehand for several products ([`SharedB`]).
#[derive(Clone, Copy)]
pub(crate) enum BFrom<'a> {
    View(Mat<'a>),
    Rows(&'a Activation),
    #[cfg(target_arch = "x86_64")]
    Packed(&'a super::bf16::PackedPairs),
}

/// An activation that several products read as their B: x in the dW = gᵀ·x of each projection
/// that reads x (the attention block's q, k and v; SwiGLU's gate and up). In bf16 its strips are
/// packed once for all of them instead of once per product; f32 reads it where it lies.
pub(crate) enum SharedB<'a> {
    F32(&'a [f32]),
    #[cfg(target_arch = "x86_64")]
    Packed(super::bf16::PackedPairs),
    /// Emulated: each product rounds its B itself (the values are rounded already).
    Kept(&'a Activation),
}

impl<'a> SharedB<'a> {
    pub fn new(x: &'a Activation) -> Self {
        match x {
            Activation::F32(v) => SharedB::F32(v),
            #[cfg(target_arch = "x86_64")]
            Activation::Bf16(r) => SharedB::Packed(super::bf16::pack_b_rounded(r)),
            Activation::Emulated(_) => SharedB::Kept(x),
        }
    }
}

/// A product over blocks of the rows of an activation rounded for the CPU's bf16 kernel
/// ([`Activation::Bf16`]), its B (an f32 view) packed once, each block on the calling thread
/// ([`Self::rows_into`]): for an op that consumes the product a block of rows at a time while
/// the block is in cache, so the product's f32 output never goes to memory whole.
pub(crate) struct RowsOfProduct<'a> {
    #[cfg(target_arch = "x86_64")]
    a: &'a super::bf16::Rounded,
    #[cfg(target_arch = "x86_64")]
    b: super::bf16::PackedPairs,
    #[cfg(not(target_arch = "x86_64"))]
    _a: std::marker::PhantomData<&'a ()>,
}

impl<'a> RowsOfProduct<'a> {
    /// A·B for A (m×k) kept as `a` and B (k×n) the view `b`; `None` unless `a` is rounded for
    /// the CPU's bf16 kernel (an f32 or emulated activation multiplies whole).
    pub fn new(a: &'a Activation, k: usize, n: usize, b: Mat<'_>) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if let Activation::Bf16(a) = a {
            assert!(b.fits(k, n), "sgemm: operand out of bounds");
            assert_eq!(a.dims().1, k, "bf16 product: A does not fit B");
            // SAFETY: B's k×n view is in bounds (asserted); a rounded activation exists only
            // where the CPU has AVX512_BF16.
            let b = unsafe { super::bf16::pack_b(k, n, b.operand()) };
            return Some(Self { a, b });
        }
        let _ = (a, k, n, b);
        None
    }

    /// Rows `rows` of A·B into `out` (`rows.len()` × n, row-major), `rows.start` a multiple
    /// of 32: the bits of the same rows of the whole product.
    pub fn rows_into(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            let n = self.b.dims().1;
            assert!(out.len() >= rows.len() * n, "sgemm: output out of bounds");
            // SAFETY: `out` holds the rows (asserted) and is exclusively borrowed; the rows'
            // bounds are checked by `rows_of_product`; the CPU has AVX512_BF16 (as in `new`).
            unsafe { super::bf16::rows_of_product(self.a, &self.b, rows, out.as_mut_ptr(), n) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("off x86-64 `new` makes none ({rows:?}, {})", out.len())
    }
}

/// `A·B` (m×k times k×n) into a new row-major m×n vector, for operands kept as
/// [`Activation`]s: the precision is theirs (an f32 activation with an f32 B: [`product`]).
pub(crate) fn product_from(m: usize, k: usize, n: usize, a: AFrom<'_>, b: BFrom<'_>) -> Vec<f32> {
    let a_f32 = match a {
        AFrom::Rows(x) => x.as_f32().map(|v| Mat::rows(v, k)),
        AFrom::Transposed(x) => x.as_f32().map(|v| Mat::rows(v, m).t()),
    };
    let b_f32 = match b {
        BFrom::View(v) => Some(v),
        BFrom::Rows(x) => x.as_f32().map(|v| Mat::rows(v, n)),
        #[cfg(target_arch = "x86_64")]
        BFrom::Packed(_) => None,
    };
    if let (Some(a), Some(b)) = (a_f32, b_f32) {
        return product(m, k, n, a, b);
    }
    if bf16_emulated() {
        return emulated_product(m, k, n, a, b);
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::bf16::{gemm_packed_from, pack_b, pack_b_rounded, AInput};
        let a = match a {
            AFrom::Rows(x) => AInput::Rows(x.as_rounded()),
            AFrom::Transposed(x) => AInput::Transposed(x.as_rounded()),
        };
        let owned;
        let packed = match b {
            BFrom::View(v) => {
                assert!(v.fits(k, n), "sgemm: operand out of bounds");
                // SAFETY: B's k×n view is in bounds (asserted); a rounded activation exists
                // only where the CPU has AVX512_BF16.
                owned = unsafe { pack_b(k, n, v.operand()) };
                &owned
            }
            BFrom::Rows(x) => {
                assert_eq!(x.as_rounded().dims(), (k, n), "bf16 product: B of another shape");
                owned = pack_b_rounded(x.as_rounded());
                &owned
            }
            BFrom::Packed(p) => {
                assert_eq!(p.dims(), (k, n), "sgemm: B packed as another shape");
                p
            }
        };
        let mut c = Vec::with_capacity(m * n);
        // SAFETY: A fits B (asserted by `gemm_packed_from`), C has room for m×n and is this
        // function's alone; a β = 0 product writes every element of C.
        unsafe {
            gemm_packed_from(m, a, packed, 0.0, c.as_mut_ptr(), n);
            c.set_len(m * n);
        }
        c
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("off x86-64 only f32 and emulated activations exist")
}

/// [`product_from`] for emulated bf16 operands (and f32 views of weights beside them).
fn emulated_product(m: usize, k: usize, n: usize, a: AFrom<'_>, b: BFrom<'_>) -> Vec<f32> {
    let a = match a {
        AFrom::Rows(x) => x.as_emulated((m, k), false),
        AFrom::Transposed(x) => x.as_emulated((m, k), true),
    };
    // SAFETY (both products): `as_emulated` checked A's and a rounded B's shapes against the
    // product's; an f32 view of B is asserted in bounds.
    match b {
        BFrom::View(v) => {
            assert!(v.fits(k, n), "sgemm: operand out of bounds");
            unsafe { emulated::product(m, k, n, a, v.operand().into()) }
        }
        BFrom::Rows(x) => unsafe { emulated::product(m, k, n, a, x.as_emulated((k, n), false)) },
        #[cfg(target_arch = "x86_64")]
        BFrom::Packed(_) => panic!("emulated bf16 product: a B packed for the hardware kernel"),
    }
}

/// How many times longer a product takes in bf16 than in f32 on this machine, measured now, on
/// whichever bf16 kernel runs here (AMX's tiles, `vdpbf16ps`, or the emulation): the median of
/// three alternating pairs of a 256 × 256 × 256 product, on the kernels' threads. Not every CPU
/// that has bf16 instructions multiplies faster with them: on an AMX Xeon, `vdpbf16ps` alone
/// (the tiles turned off) took 1.1–1.5× f32's time at training shapes (2026-12-03).
pub fn bf16_slowdown() -> f64 {
    let (m, k, n) = (256, 256, 256);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0).collect();
    let (mut c, mut c_bf16) = (vec![0f32; m * n], vec![std::mem::MaybeUninit::uninit(); m * n]);
    let (am, bm) = (Mat::rows(&a, k), Mat::rows(&b, n));
    let mut timed = |bf16: bool| {
        let start = std::time::Instant::now();
        if bf16 {
            sgemm_bf16(m, k, n, am, bm, 0.0, &mut c_bf16);
        } else {
            super::sgemm(m, k, n, am, bm, 0.0, &mut c);
        }
        start.elapsed().as_secs_f64()
    };
    timed(false);
    timed(true);
    let mut ratios: Vec<f64> = (0..3)
        .map(|_| {
            let f32_time = timed(false);
            timed(true) / f32_time.max(1e-9)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[1]
}
