// GELU (erf form) and SwiGLU (ember_kernels::activation): the arithmetic of one element, shared by
// the kernels (cuda/activation.cu) and the host mirror (cuda/activation_mirror.cpp).
//
// The formulas are the CPU kernel's (candle's): only erf and exp differ, CUDA's erff/expf (a few
// ulp) on the device and the C library's in the mirror, where the CPU kernel has a polynomial erf
// (|error| < 1.5·10⁻⁷) and its own exp. So device and CPU agree to those functions' accuracy,
// not bit for bit.
#pragma once

#include "common.cuh"

#define EMBER_FRAC_1_SQRT_2 0.70710678118654752f  // 1/√2 rounded to f32, as Rust's FRAC_1_SQRT_2

// gelu(x) = (erf(x/√2) + 1)·0.5·x.
EMBER_HD float ember_gelu(float x) { return (erff(x * EMBER_FRAC_1_SQRT_2) + 1.0f) * 0.5f * x; }

// gelu'(x) = 0.5 + 0.398942·e^(−x²/2)·x + 0.5·erf(x/√2), with e^(−x²/2) as exp(−(x/√2)²).
EMBER_HD float ember_gelu_slope(float x) {
    const float z = x * EMBER_FRAC_1_SQRT_2;
    const float e = expf(-z * z);
    return 0.5f + 0.398942f * e * x + 0.5f * erff(z);
}

// silu(a)·u = a/(1 + e^(−a))·u.
EMBER_HD float ember_swiglu(float a, float u) { return (a / (1.0f + expf(-a))) * u; }

// The gradients at a (gate) and u (up) for the gradient g at silu(a)·u.
EMBER_HD void ember_swiglu_bwd(float a, float u, float g, float* da, float* du) {
    const float sig = 1.0f / (1.0f + expf(-a));
    const float silu = a * sig;
    *du = g * silu;
    // d/da silu = σ(a)·(1 − silu(a)) + silu(a)
    *da = g * u * (sig * (1.0f - silu) + silu);
}

// The kernels' bodies for element i of f32 or bf16 buffers (T: float or ember_bf16; common.cuh's
// ember_load and ember_store), with the arithmetic above in f32.
template <typename T>
EMBER_HD void ember_gelu_fwd_at(const T* x, T* y, uint64_t i) {
    ember_store(y, i, ember_gelu(ember_load(x, i)));
}

// dx = g·gelu'(x).
template <typename T>
EMBER_HD void ember_gelu_bwd_at(const T* x, const T* g, T* dx, uint64_t i) {
    ember_store(dx, i, ember_load(g, i) * ember_gelu_slope(ember_load(x, i)));
}

template <typename T>
EMBER_HD void ember_swiglu_fwd_at(const T* a, const T* u, T* y, uint64_t i) {
    ember_store(y, i, ember_swiglu(ember_load(a, i), ember_load(u, i)));
}

template <typename T>
EMBER_HD void ember_swiglu_bwd_at(const T* a, const T* u, const T* g, T* da, T* du, uint64_t i) {
    float dai, dui;
    ember_swiglu_bwd(ember_load(a, i), ember_load(u, i), ember_load(g, i), &dai, &dui);
    ember_store(da, i, dai);
    ember_store(du, i, dui);
}
