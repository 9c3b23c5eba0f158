// GELU (erf form) and SwiGLU, forward and backward (ember_kernels::activation), elementwise with
// the arithmetic of activation.cuh. Each thread handles elements i, i + stride, ... (a grid-stride
// loop). GELU's backward recomputes the derivative from x: the CPU kernel keeps it from the
// forward pass, which saves its erf there; on the GPU the erf is cheaper than the extra buffer's
// write and read.
#include "activation.cuh"

extern "C" __global__ void ember_gelu_fwd(const float* __restrict__ x, float* __restrict__ y, uint64_t n) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = ember_gelu(x[i]);
}

// dx = g·gelu'(x).
extern "C" __global__ void ember_gelu_bwd(const float* __restrict__ x, const float* __restrict__ g,
                                          float* __restrict__ dx, uint64_t n) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dx[i] = g[i] * ember_gelu_slope(x[i]);
    }
}

// y = silu(a)·u.
extern "C" __global__ void ember_swiglu_fwd(const float* __restrict__ a, const float* __restrict__ u,
                                            float* __restrict__ y, uint64_t n) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = ember_swiglu(a[i], u[i]);
    }
}

// (da, du) for the gradient g at silu(a)·u.
extern "C" __global__ void ember_swiglu_bwd(const float* __restrict__ a, const float* __restrict__ u,
                                            const float* __restrict__ g, float* __restrict__ da,
                                            float* __restrict__ du, uint64_t n) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        ember_swiglu_bwd(a[i], u[i], g[i], &da[i], &du[i]);
    }
}
