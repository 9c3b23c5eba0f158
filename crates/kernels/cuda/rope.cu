// Rotary position embeddings with a folded-in scale (ember_kernels::rope), forward (sign = 1) and
// backward (the transposed rotation: sign = −1, the same scale): one thread per rotated pair,
// i, i + stride, ... (a grid-stride loop), with the arithmetic of rope.cuh. The cos/sin tables and
// the log table stay on the device, owned by RopeTables; nothing is uploaded per call.
#include "rope.cuh"

#define EMBER_ROPE_KERNEL(SUFFIX, T)                                                                               \
    extern "C" __global__ void ember_rope##SUFFIX(                                                                 \
        const T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,                     \
        const double* __restrict__ ln_pos, T* __restrict__ y, uint64_t pairs, uint32_t half, uint32_t heads,       \
        uint32_t t, uint64_t offset, uint32_t stride, double scale, uint64_t logn_length, double ln_m, float sign) { \
        const uint64_t step = (uint64_t)gridDim.x * blockDim.x;                                                    \
        for (uint64_t p = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += step) {                 \
            ember_rope_at(x, cos, sin, ln_pos, y, p, half, heads, t, offset, stride, scale, logn_length, ln_m, sign); \
        }                                                                                                          \
    }

// f32 x and y (ember_rope), and bf16 activations (ember_rope_bf16: x and y bf16, the tables f32).
EMBER_ROPE_KERNEL(, float)
EMBER_ROPE_KERNEL(_bf16, ember_bf16)
