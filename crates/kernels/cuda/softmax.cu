// Softmax over the last dimension (ember_kernels::softmax), forward and backward: one warp per row
// of n (any n), the rows of a block's warps side by side and the grid striding over the rest.
// Lane l handles elements l, l + 32, ...; the row's max and sums are combined across the warp by
// an xor butterfly in a fixed order, so the same input gives the same bits every run.
#include "softmax.cuh"

// y = softmax(x) per row: the max, the sum of e^(x - max), then e^(x - max) / sum, recomputing
// the exponential in the last pass rather than storing it (one read more, no scratch).
extern "C" __global__ void ember_softmax_fwd(const float* __restrict__ x, float* __restrict__ y, uint64_t rows,
                                             uint32_t n) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps_per_block = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps_per_block;
    for (uint64_t r = (uint64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        float m = ember_neg_inf();
        for (uint32_t i = lane; i < n; i += 32) m = ember_softmax_max(m, xr[i]);
        m = ember_softmax_warp_max(m);
        float sum = 0.0f;
        for (uint32_t i = lane; i < n; i += 32) sum += ember_softmax_exp(xr[i], m);
        sum = ember_softmax_warp_sum(sum);
        const float inv = 1.0f / sum;
        for (uint32_t i = lane; i < n; i += 32) yr[i] = ember_softmax_exp(xr[i], m) * inv;
    }
}

// dx = p (g - sum_j p_j g_j) per row, from the forward pass's output p and the gradient g.
extern "C" __global__ void ember_softmax_bwd(const float* __restrict__ p, const float* __restrict__ g,
                                             float* __restrict__ dx, uint64_t rows, uint32_t n) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps_per_block = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps_per_block;
    for (uint64_t r = (uint64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
        const float* pr = p + r * n;
        const float* gr = g + r * n;
        float* dr = dx + r * n;
        float dot = 0.0f;
        for (uint32_t i = lane; i < n; i += 32) dot += pr[i] * gr[i];
        dot = ember_softmax_warp_sum(dot);
        for (uint32_t i = lane; i < n; i += 32) dr[i] = ember_softmax_grad(pr[i], gr[i], dot);
    }
}
