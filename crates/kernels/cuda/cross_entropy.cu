// The loss of ember_kernels::linear_cross_entropy on the device: log-softmax, label-smoothed
// cross-entropy, z-loss and padding over logits (N × V) that cuBLAS has made, one block of
// EMBER_CE_THREADS threads per row. The row math is cuda/cross_entropy.cuh's; the reductions run
// in a fixed order (see there), so every run gives the same bits. Nothing is read back to the
// host: targets and mask are device buffers.
//
// A target outside the vocabulary (which the CPU op refuses up front, by reading the targets)
// makes its row's losses NaN and leaves the target term out of its gradient, rather than read
// or write outside the row.
#include "cross_entropy.cuh"

// The block's reduction of each thread's `v`: the sum, or (`is_max`) the NaN-winning max.
// Every thread gets lane 0's result. `partial` holds EMBER_CE_WARPS floats.
__device__ __forceinline__ float ember_ce_block_reduce(float v, int is_max, float* partial) {
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? ember_ce_max(v, other) : v + other;
    }
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < EMBER_CE_WARPS ? partial[lane] : (is_max ? ember_neg_inf() : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? ember_ce_max(v, other) : v + other;
    }
    v = __shfl_sync(0xffffffffu, v, 0);
    // `partial` is reused by the next reduction.
    __syncthreads();
    return v;
}

// Row r of x (n × v, row-major): out[r] = mask·objective, out[n + r] = mask·NLL, stats[2r] = max,
// stats[2r + 1] = lse. With `write_probs`, the row is then replaced by its probabilities
// exp(x − max − lse), which ember_ce_backward turns into the gradient for any upstream gradient.
// T: float, or ember_bf16 for bf16 logits (`_bf16`: read widened, the math f32; the Rust side
// keeps such logits and passes write_probs = 0, so that the backward pass computes each
// probability in f32 from the logit, as the f32 kernels do, and rounds only the gradient;
// write_probs = 1 would round the probabilities into the bf16 row, which nothing asks for).
// Launch: grid (n), block (EMBER_CE_THREADS).
template <typename T>
__device__ __forceinline__ void ember_ce_forward_row(T* __restrict__ x, const uint32_t* __restrict__ targets,
                                                     const float* __restrict__ mask, float* __restrict__ out,
                                                     float* __restrict__ stats, uint32_t n, uint32_t v, float eps,
                                                     float z, int write_probs) {
    __shared__ float partial[EMBER_CE_WARPS];
    const uint32_t row = blockIdx.x;
    if (row >= n) return;
    T* xr = x + (uint64_t)row * v;
    const uint32_t t = targets[row];
    // Read before the first reduction's barrier, so before any thread overwrites the row.
    const float x_t = (threadIdx.x == 0 && t < v) ? ember_load(xr, t) : ember_f32_from_bits(0x7fc00000u);

    const float max = ember_ce_block_reduce(ember_ce_lane_max(xr, v, threadIdx.x), 1, partial);
    float exp_part, raw_part;
    ember_ce_lane_sums(xr, v, threadIdx.x, max, &exp_part, &raw_part);
    const float total = ember_ce_block_reduce(exp_part, 0, partial);
    const float row_sum = ember_ce_block_reduce(raw_part, 0, partial);
    const float lse = logf(total);

    if (threadIdx.x == 0) {
        float objective, nll;
        ember_ce_row_losses(x_t, row_sum, v, max, lse, eps, z, &objective, &nll);
        const float m = mask[row];
        out[row] = objective * m;
        out[(uint64_t)n + row] = nll * m;
        stats[2 * (uint64_t)row] = max;
        stats[2 * (uint64_t)row + 1] = lse;
    }
    if (write_probs) {
        const float shift = max + lse;
        for (uint32_t j = threadIdx.x; j < v; j += EMBER_CE_THREADS)
            ember_store(xr, j, ember_ce_prob(ember_load(xr, j), shift));
    }
}

// Row r of x (n × v) replaced by the gradient of Σ g[r]·out[r] + g[n + r]·out[n + r] with respect
// to its logits. x holds the logits, or (`from_probs`) the probabilities ember_ce_forward left;
// stats are ember_ce_forward's. Each gradient is rounded once into a bf16 x.
// Launch: grid (n), block (EMBER_CE_THREADS).
template <typename T>
__device__ __forceinline__ void ember_ce_backward_row(T* __restrict__ x, const float* __restrict__ g,
                                                      const float* __restrict__ stats,
                                                      const uint32_t* __restrict__ targets,
                                                      const float* __restrict__ mask, uint32_t n, uint32_t v,
                                                      float eps, float z, int from_probs) {
    const uint32_t row = blockIdx.x;
    if (row >= n) return;
    T* xr = x + (uint64_t)row * v;
    const struct EmberCeGradient c =
        ember_ce_gradient_setup(g[row], g[(uint64_t)n + row], mask[row], stats[2 * (uint64_t)row],
                                stats[2 * (uint64_t)row + 1], v, eps, z);
    const uint32_t t = targets[row];
    for (uint32_t j = threadIdx.x; j < v; j += EMBER_CE_THREADS) {
        ember_store(xr, j, ember_ce_gradient_at(c, ember_load(xr, j), from_probs, j == t));
    }
}

#define EMBER_CE_KERNELS(SUFFIX, T)                                                                              \
    extern "C" __global__ void ember_ce_forward##SUFFIX(                                                         \
        T* __restrict__ x, const uint32_t* __restrict__ targets, const float* __restrict__ mask,                 \
        float* __restrict__ out, float* __restrict__ stats, uint32_t n, uint32_t v, float eps, float z,          \
        int write_probs) {                                                                                       \
        ember_ce_forward_row(x, targets, mask, out, stats, n, v, eps, z, write_probs);                           \
    }                                                                                                            \
    extern "C" __global__ void ember_ce_backward##SUFFIX(                                                        \
        T* __restrict__ x, const float* __restrict__ g, const float* __restrict__ stats,                         \
        const uint32_t* __restrict__ targets, const float* __restrict__ mask, uint32_t n, uint32_t v, float eps, \
        float z, int from_probs) {                                                                               \
        ember_ce_backward_row(x, g, stats, targets, mask, n, v, eps, z, from_probs);                            \
    }

EMBER_CE_KERNELS(, float)
EMBER_CE_KERNELS(_bf16, ember_bf16)
