// RMSNorm and LayerNorm (ember_kernels::norm): the arithmetic of one vector, shared by the kernels
// (cuda/norm.cu) and the host mirror (cuda/norm_mirror.cpp).
//
// A vector is normalised by one warp. Lane l sums the elements l, l + 32, l + 64, ... in index
// order (ember_norm_lane_*), then the warp adds its 32 partial sums by an xor butterfly (offsets
// 16, 8, 4, 2, 1: lane l adds lane l ^ o's value to its own). Every lane ends with the same
// bits, and the order is fixed by d alone, so a vector's result never depends on the launch.
// The mirror runs the same lane loops and the same butterfly on the host.
#pragma once

#include "common.cuh"

#define EMBER_NORM_LANES 32u

// The sum of the lane's elements of x[0..d) (X: float, or ember_bf16 widened as it is read).
template <typename X>
EMBER_HD float ember_norm_lane_sum(const X* x, uint32_t d, uint32_t lane) {
    float s = 0.0f;
    for (uint32_t i = lane; i < d; i += EMBER_NORM_LANES) s += ember_load(x, i);
    return s;
}

// The sum of the lane's (x - mean)²: the centred second moment, as the CPU kernel takes it (two
// passes, the mean first).
template <typename X>
EMBER_HD float ember_norm_lane_sumsq(const X* x, uint32_t d, uint32_t lane, float mean) {
    float s = 0.0f;
    for (uint32_t i = lane; i < d; i += EMBER_NORM_LANES) {
        const float v = ember_load(x, i) - mean;
        s += v * v;
    }
    return s;
}

// The mean from the vector's sum (LayerNorm; RMSNorm's is 0).
EMBER_HD float ember_norm_mean(float sum, uint32_t d) { return sum / (float)d; }

// 1/σ = 1 / sqrt(ss/d + eps), rounded step by step as the CPU kernel does.
EMBER_HD float ember_norm_rstd(float ss, uint32_t d, float eps) {
    const float var = ss / (float)d;
    return 1.0f / sqrtf(var + eps);
}

// One output element: (x − mean)·(1/σ)·w, plus b with a bias.
EMBER_HD float ember_norm_value(float x, float mean, float rstd, float w) { return (x - mean) * rstd * w; }
EMBER_HD float ember_norm_value_bias(float x, float mean, float rstd, float w, float b) {
    return (x - mean) * rstd * w + b;
}

// The lane's parts of the backward sums: Σ gx·x̂ and Σ gx, with gx = g·w and x̂ = (x − mean)/σ
// (x in the input's type X, the output's gradient g in the output's type G).
template <typename X, typename G>
EMBER_HD void ember_norm_lane_bwd_sums(const X* x, const float* w, const G* g, uint32_t d, uint32_t lane,
                                       float mean, float rstd, float* gx_xhat, float* gx_sum) {
    float a = 0.0f, b = 0.0f;
    for (uint32_t i = lane; i < d; i += EMBER_NORM_LANES) {
        const float xhat = (ember_load(x, i) - mean) * rstd;
        const float gx = ember_load(g, i) * w[i];
        a += gx * xhat;
        b += gx;
    }
    *gx_xhat = a;
    *gx_sum = b;
}

// 1/d, which the backward's means multiply by (as the CPU kernel's do).
EMBER_HD float ember_norm_inv_d(uint32_t d) { return 1.0f / (float)d; }

// One input-gradient element: (1/σ)·(gx − mean(gx) − x̂·mean(gx·x̂)); RMSNorm's mean(gx) is 0.
EMBER_HD float ember_norm_dx(float x, float w, float g, float mean, float rstd, float m_gx, float m_gx_xhat) {
    const float xhat = (x - mean) * rstd;
    const float gx = g * w;
    return rstd * (gx - m_gx - xhat * m_gx_xhat);
}

// The gain gradient's term of one element: g·x̂ (the bias's is g itself).
EMBER_HD float ember_norm_dw_term(float x, float g, float mean, float rstd) { return g * ((x - mean) * rstd); }

#ifdef __CUDACC__
// The sum of the warp's 32 values, the same bits in every lane (the butterfly above).
__device__ __forceinline__ float ember_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#endif
