// The optimizer's part of a training step on the device: each gradient's sum of squares, the
// step's verdict (norm, clip factor, applied or skipped: ember_finish_step in common.cuh), and
// AdamW's in-place update of θ, m and v, one launch per parameter, reading the clip factor and
// bias corrections from the ledger. Nothing is read back to the host between steps.
#include "common.cuh"

// Threads of the sum-of-squares block: fixed, because the order of the sum (and so its bits)
// depends on it.
#define EMBER_SQUARES_THREADS 512

// partials[slot] = sum of g[i]^2 in f64, by one block in a fixed order: thread j sums elements
// j, j + 512, ... and the block adds the threads' sums as a tree. G: float, or ember_bf16 for a
// bf16 gradient (`_bf16`, widened as it is read: the sum of its f32 widening, bit for bit).
template <typename G>
__device__ __forceinline__ void ember_sum_squares_of(const G* __restrict__ g, uint64_t n, double* partials,
                                                     uint32_t slot) {
    __shared__ double sums[EMBER_SQUARES_THREADS];
    double acc = 0.0;
    for (uint64_t i = threadIdx.x; i < n; i += EMBER_SQUARES_THREADS) {
        const double v = (double)ember_load(g, i);
        acc += v * v;
    }
    sums[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned half = EMBER_SQUARES_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[slot] = sums[0];
}

extern "C" __global__ void __launch_bounds__(EMBER_SQUARES_THREADS)
ember_sum_squares(const float* __restrict__ g, uint64_t n, double* partials, uint32_t slot) {
    ember_sum_squares_of(g, n, partials, slot);
}

extern "C" __global__ void __launch_bounds__(EMBER_SQUARES_THREADS)
ember_sum_squares_bf16(const ember_bf16* __restrict__ g, uint64_t n, double* partials, uint32_t slot) {
    ember_sum_squares_of(g, n, partials, slot);
}

// The step's verdict, by one thread (see ember_finish_step). `objective` and `nll` are the
// step's summed losses as device scalars (f64).
extern "C" __global__ void ember_finish_step_kernel(double* ledger, const double* partials, uint32_t count,
                                                    const double* objective, const double* nll, double tokens,
                                                    double max_norm, double spike_loss, int stop, double beta1,
                                                    double beta2, uint64_t step) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ember_finish_step(ledger, partials, count, *objective, *nll, tokens, max_norm, spike_loss, stop, beta1,
                          beta2, step);
    }
}

// One AdamW update of a parameter, in place, when the ledger says this step's update is applied.
// The host's scalars come as arguments; the clip factor and the bias corrections from the ledger,
// rounded to f32 as the CPU kernel rounds them. θ and the moments are f32; the gradient G is f32,
// or bf16 (`ember_adamw_bf16`: mixed precision's gradients, widened as they are read).
template <typename G>
__device__ __forceinline__ void ember_adamw_of(float* __restrict__ theta, const G* __restrict__ g,
                                               float* __restrict__ m, float* __restrict__ v, uint64_t n,
                                               const double* __restrict__ ledger, float lr, float beta1,
                                               float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
                                               float decay) {
    if (ledger[EMBER_L_APPLY] == 0.0) return;
    struct EmberAdamW c;
    c.grad_scale = (float)ledger[EMBER_L_SCALE];
    c.beta1 = beta1;
    c.one_minus_beta1 = one_minus_beta1;
    c.beta2 = beta2;
    c.one_minus_beta2 = one_minus_beta2;
    c.inv_bc1 = (float)ledger[EMBER_L_INV_BC1];
    c.inv_bc2 = (float)ledger[EMBER_L_INV_BC2];
    c.eps = eps;
    c.decay = decay;
    c.lr = lr;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        ember_adamw_element(&theta[i], ember_load(g, i), &m[i], &v[i], c);
    }
}

#define EMBER_ADAMW_KERNEL(SUFFIX, G)                                                                           \
    extern "C" __global__ void ember_adamw##SUFFIX(                                                             \
        float* __restrict__ theta, const G* __restrict__ g, float* __restrict__ m, float* __restrict__ v,        \
        uint64_t n, const double* __restrict__ ledger, float lr, float beta1, float one_minus_beta1, float beta2, \
        float one_minus_beta2, float eps, float decay) {                                                         \
        ember_adamw_of(theta, g, m, v, n, ledger, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay); \
    }

EMBER_ADAMW_KERNEL(, float)
EMBER_ADAMW_KERNEL(_bf16, ember_bf16)
