// Softmax over the last dimension (ember_kernels::softmax): the per-element arithmetic, shared by
// the kernels (softmax.cu, and attention.cu's masked rows) and the host mirror
// (softmax_mirror.cpp), which the CPU suite compares with the Rust kernel.
//
// The exponential is the CPU kernel's own (simd::exp_fast) operation for operation, so a
// probability differs from the CPU's only through the order of its row's sum.
#pragma once

#include "common.cuh"

// The larger of a running maximum and x, as the CPU's max_of keeps it.
EMBER_HD float ember_softmax_max(float m, float x) { return x > m ? x : m; }

// One probability before normalisation: e^(x - max).
EMBER_HD float ember_softmax_exp(float x, float max) { return ember_exp_fast(x - max); }

// One element of the backward pass: dx = p (g - sum_j p_j g_j).
EMBER_HD float ember_softmax_grad(float p, float g, float dot) { return p * (g - dot); }

// The softmax of one row of n, in order (the mirror's reference; the kernels split the row's
// max and sum across a warp's lanes).
EMBER_HD void ember_softmax_row(const float* x, float* y, uint32_t n) {
    float m = ember_neg_inf();
    for (uint32_t i = 0; i < n; ++i) m = ember_softmax_max(m, x[i]);
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; ++i) {
        y[i] = ember_softmax_exp(x[i], m);
        sum += y[i];
    }
    const float inv = 1.0f / sum;
    for (uint32_t i = 0; i < n; ++i) y[i] = y[i] * inv;
}

// The backward pass of one row, in order.
EMBER_HD void ember_softmax_row_bwd(const float* p, const float* g, float* dx, uint32_t n) {
    float dot = 0.0f;
    for (uint32_t i = 0; i < n; ++i) dot += p[i] * g[i];
    for (uint32_t i = 0; i < n; ++i) dx[i] = ember_softmax_grad(p[i], g[i], dot);
}

#ifdef __CUDACC__
// A warp's sum and maximum by an xor butterfly: every lane ends with the same bits (each step
// adds the same two values on both lanes of a pair, and a + b == b + a exactly), in a fixed
// order. All 32 lanes must call it.
__device__ __forceinline__ float ember_softmax_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float ember_softmax_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = ember_softmax_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
#endif
