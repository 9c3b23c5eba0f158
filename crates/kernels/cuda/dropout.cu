// Inverted dropout with the mask of a SplitMix64 counter (ember_kernels::dropout): element i of a
// tensor, in row-major order, uses draw i + 1 of the generator at `state`. The mask is computed
// where it is used, in the forward and again in the backward pass: never drawn on the host,
// uploaded or stored. Each thread handles elements i, i + stride, ... (a grid-stride loop).
#include "common.cuh"

// y = dropout(x), for f32 (`ember_dropout`) or bf16 (`ember_dropout_bf16`: read widened, each
// output rounded once) activations.
template <typename T>
__device__ __forceinline__ void ember_dropout_at(const T* __restrict__ x, T* __restrict__ y, uint64_t n,
                                                 uint64_t state, uint64_t threshold, float keep) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        ember_store(y, i, ember_dropout_value(ember_load(x, i), state, threshold, keep, i));
    }
}

extern "C" __global__ void ember_dropout(const float* __restrict__ x, float* __restrict__ y, uint64_t n,
                                         uint64_t state, uint64_t threshold, float keep) {
    ember_dropout_at(x, y, n, state, threshold, keep);
}

extern "C" __global__ void ember_dropout_bf16(const ember_bf16* __restrict__ x, ember_bf16* __restrict__ y,
                                              uint64_t n, uint64_t state, uint64_t threshold, float keep) {
    ember_dropout_at(x, y, n, state, threshold, keep);
}

// out = x + dropout(y): a residual connection around a dropped branch, in one pass (f32: the
// residual stream is f32 in both precisions).
extern "C" __global__ void ember_add_dropout(const float* __restrict__ x, const float* __restrict__ y,
                                             float* __restrict__ out, uint64_t n, uint64_t state,
                                             uint64_t threshold, float keep) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = x[i] + ember_dropout_value(y[i], state, threshold, keep, i);
    }
}
