// Softmax over the last dimension (ember_kernels::softmax), forward and backward: one warp per row
// of n (any n), the rows of a block's warps side by side and the grid striding over the rest.
// Lane l handles elements l, l + 32, ...; the row's max and sums are combined across the warp by
// an xor butterfly in a fixed order, so the same input gives the same bits every run. Each kernel
// comes for f32 rows (its plain name) and bf16 ones (`_bf16`).
#include "softmax.cuh"

// y = softmax(x) per row: the max, the sum of e^(x - max), then e^(x - max) / sum, recomputing
// the exponential in the last pass rather than storing it (one read more, no scratch). T: float,
// or ember_bf16 (the `_bf16` kernels: read widened, each probability rounded once).
template <typename T>
__device__ __forceinline__ void ember_softmax_fwd_rows(const T* __restrict__ x, T* __restrict__ y, uint64_t rows,
                                                       uint32_t n) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps_per_block = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps_per_block;
    for (uint64_t r = (uint64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        float m = ember_neg_inf();
        for (uint32_t i = lane; i < n; i += 32) m = ember_softmax_max(m, ember_load(xr, i));
        m = ember_softmax_warp_max(m);
        float sum = 0.0f;
        for (uint32_t i = lane; i < n; i += 32) sum += ember_softmax_exp(ember_load(xr, i), m);
        sum = ember_softmax_warp_sum(sum);
        const float inv = 1.0f / sum;
        for (uint32_t i = lane; i < n; i += 32) ember_store(yr, i, ember_softmax_exp(ember_load(xr, i), m) * inv);
    }
}

// dx = p (g - sum_j p_j g_j) per row, from the forward pass's output p and the gradient g.
template <typename T>
__device__ __forceinline__ void ember_softmax_bwd_rows(const T* __restrict__ p, const T* __restrict__ g,
                                                       T* __restrict__ dx, uint64_t rows, uint32_t n) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps_per_block = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps_per_block;
    for (uint64_t r = (uint64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
        const T* pr = p + r * n;
        const T* gr = g + r * n;
        T* dr = dx + r * n;
        float dot = 0.0f;
        for (uint32_t i = lane; i < n; i += 32) dot += ember_load(pr, i) * ember_load(gr, i);
        dot = ember_softmax_warp_sum(dot);
        for (uint32_t i = lane; i < n; i += 32)
            ember_store(dr, i, ember_softmax_grad(ember_load(pr, i), ember_load(gr, i), dot));
    }
}

#define EMBER_SOFTMAX_KERNELS(SUFFIX, T)                                                                       \
    extern "C" __global__ void ember_softmax_fwd##SUFFIX(const T* __restrict__ x, T* __restrict__ y,          \
                                                         uint64_t rows, uint32_t n) {                         \
        ember_softmax_fwd_rows(x, y, rows, n);                                                                \
    }                                                                                                         \
    extern "C" __global__ void ember_softmax_bwd##SUFFIX(const T* __restrict__ p, const T* __restrict__ g,    \
                                                         T* __restrict__ dx, uint64_t rows, uint32_t n) {     \
        ember_softmax_bwd_rows(p, g, dx, rows, n);                                                            \
    }

EMBER_SOFTMAX_KERNELS(, float)
EMBER_SOFTMAX_KERNELS(_bf16, ember_bf16)
