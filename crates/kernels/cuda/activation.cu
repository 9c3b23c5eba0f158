// GELU (erf form) and SwiGLU, forward and backward (ember_kernels::activation), elementwise with
// the arithmetic of activation.cuh. Each thread handles elements i, i + stride, ... (a grid-stride
// loop). GELU's backward recomputes the derivative from x: the CPU kernel keeps it from the
// forward pass, which saves its erf there; on the GPU the erf is cheaper than the extra buffer's
// write and read.
//
// Each kernel comes for f32 buffers (its plain name) and for bf16 activations (`_bf16`: every
// buffer bf16, the arithmetic f32, each output rounded once).
#include "activation.cuh"

#define EMBER_ELEMENTS(i, n) \
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (uint64_t)gridDim.x * blockDim.x)

#define EMBER_ACTIVATION_KERNELS(SUFFIX, T)                                                                        \
    extern "C" __global__ void ember_gelu_fwd##SUFFIX(const T* __restrict__ x, T* __restrict__ y, uint64_t n) {   \
        EMBER_ELEMENTS(i, n) ember_gelu_fwd_at(x, y, i);                                                          \
    }                                                                                                             \
    /* dx = g·gelu'(x). */                                                                                        \
    extern "C" __global__ void ember_gelu_bwd##SUFFIX(const T* __restrict__ x, const T* __restrict__ g,           \
                                                      T* __restrict__ dx, uint64_t n) {                           \
        EMBER_ELEMENTS(i, n) ember_gelu_bwd_at(x, g, dx, i);                                                      \
    }                                                                                                             \
    /* y = silu(a)·u. */                                                                                          \
    extern "C" __global__ void ember_swiglu_fwd##SUFFIX(const T* __restrict__ a, const T* __restrict__ u,         \
                                                        T* __restrict__ y, uint64_t n) {                          \
        EMBER_ELEMENTS(i, n) ember_swiglu_fwd_at(a, u, y, i);                                                     \
    }                                                                                                             \
    /* (da, du) for the gradient g at silu(a)·u. */                                                               \
    extern "C" __global__ void ember_swiglu_bwd##SUFFIX(const T* __restrict__ a, const T* __restrict__ u,         \
                                                        const T* __restrict__ g, T* __restrict__ da,              \
                                                        T* __restrict__ du, uint64_t n) {                         \
        EMBER_ELEMENTS(i, n) ember_swiglu_bwd_at(a, u, g, da, du, i);                                             \
    }

EMBER_ACTIVATION_KERNELS(, float)
EMBER_ACTIVATION_KERNELS(_bf16, ember_bf16)
