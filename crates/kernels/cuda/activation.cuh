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
