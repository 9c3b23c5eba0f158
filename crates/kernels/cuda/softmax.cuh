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
// max and sum across a warp's lanes), over f32 or bf16 rows (T: float or ember_bf16; the math
// f32, each probability rounded once). The exponential is recomputed in the last pass, as the
// kernel does, so a bf16 row needs no f32 scratch.
template <typename T>
EMBER_HD void ember_softmax_row(const T* x, T* y, uint32_t n) {
    float m = ember_neg_inf();
    for (uint32_t i = 0; i < n; ++i) m = ember_softmax_max(m, ember_load(x, i));
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; ++i) sum += ember_softmax_exp(ember_load(x, i), m);
    const float inv = 1.0f / sum;
    for (uint32_t i = 0; i < n; ++i) ember_store(y, i, ember_softmax_exp(ember_load(x, i), m) * inv);
}

// The backward pass of one row, in order.
template <typename T>
EMBER_HD void ember_softmax_row_bwd(const T* p, const T* g, T* dx, uint32_t n) {
    float dot = 0.0f;
    for (uint32_t i = 0; i < n; ++i) dot += ember_load(p, i) * ember_load(g, i);
    for (uint32_t i = 0; i < n; ++i) ember_store(dx, i, ember_softmax_grad(ember_load(p, i), ember_load(g, i), dot));
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
