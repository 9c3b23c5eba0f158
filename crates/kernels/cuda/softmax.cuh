// Softmax over the last dimension (ember_kernels::softmax): the per-element arithmetic, shared by
// the kernels (softmax.cu, and attention.cu's masked rows) and the host mirror
// (softmax_mirror.cpp), which the CPU suite compares with the Rust kernel.
//
// The exponential is the CPU kernel's own (simd::exp_fast) operation for operation, so a
// probability differs from the CPU's only through the order of its row's sum.
#pragma once

#include <string.h>

#include "common.cuh"

EMBER_HD uint32_t ember_f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

EMBER_HD float ember_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// -inf, without relying on INFINITY being defined in device code.
EMBER_HD float ember_neg_inf(void) { return ember_f32_from_bits(0xff800000u); }

// e^x as simd::exp_fast computes it: Cody-Waite reduction x = n ln2 + r, a degree-6 Taylor
// polynomial in r, 2^n from the bits of the rounding sum; exactly 0 below -87.3. Every operation
// is rounded on its own (--fmad=false on the device, -ffp-contract=off on the host), as in Rust.
EMBER_HD float ember_exp_fast(float x) {
    const float ln2_hi = 0.69314575f;
    const float ln2_lo = 1.4286068e-6f;
    const float round = 12582912.0f;  // 1.5 * 2^23
    // Rust's clamp: NaN passes through (fminf/fmaxf would replace it).
    float xc = x;
    if (xc < -87.3f) xc = -87.3f;
    if (xc > 88.0f) xc = 88.0f;
    const float shifted = xc * 1.44269504088896340736f + round;
    const float n = shifted - round;
    const float r = (xc - n * ln2_hi) - n * ln2_lo;
    const float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (1.0f / 6.0f + r * (1.0f / 24.0f + r * (1.0f / 120.0f + r * (1.0f / 720.0f))))));
    const int32_t n_int = (int32_t)ember_f32_bits(shifted) - (int32_t)ember_f32_bits(round);
    const float scale = ember_f32_from_bits((uint32_t)(n_int + 127) << 23);
    return x < -87.3f ? 0.0f : p * scale;
}

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
