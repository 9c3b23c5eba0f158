// Rotary position embeddings (ember_kernels::rope): the arithmetic of one rotated pair, shared by
// the kernel (cuda/rope.cu) and the host mirror (cuda/rope_mirror.cpp).
//
// x is (B, T, H·d) with d = 2·half, every run of d elements one head's vector; dimension i of a
// head pairs with i + half. Pair p (row-major over rows, heads, i) sits at row q / heads of head
// vector q = p / half, at position offset + row mod T. The tables are the (max_len, stride) cos
// and sin tensors of RopeTables (the first half of each row holds the angles of i = 0..half), and
// ln_pos[n] = ln(n + 1) in f64 (the log-n factor's numerator, computed once on the host).
#pragma once

#include "common.cuh"

// The factor of a vector at `position`: scale·max(1, ln n / ln m) with n = position + 1 and m the
// training length (0: no log-n scaling), in f64 and rounded to f32 once, as the CPU kernel's
// PositionScale::at(position) as f32.
EMBER_HD float ember_rope_factor(double scale, uint64_t position, uint64_t logn_length, double ln_n, double ln_m) {
    const double f = (position + 1 > logn_length && logn_length >= 2) ? ln_n / ln_m : 1.0;
    return (float)(scale * f);
}

// One pair (x1, x2) rotated by the angle of (c, s), s negated for the transposed rotation
// (sign = −1), and scaled.
EMBER_HD void ember_rope_pair(float x1, float x2, float c, float s, float sign, float scale, float* y1, float* y2) {
    s = s * sign;
    *y1 = (x1 * c - x2 * s) * scale;
    *y2 = (x2 * c + x1 * s) * scale;
}

// Pair p of x into y (the kernel's body for one index); x and y f32 or bf16 (T: float or
// ember_bf16), the rotation in f32, each output rounded once.
template <typename T>
EMBER_HD void ember_rope_at(const T* x, const float* cos, const float* sin, const double* ln_pos, T* y,
                            uint64_t p, uint32_t half, uint32_t heads, uint32_t t, uint64_t offset,
                            uint32_t stride, double scale, uint64_t logn_length, double ln_m, float sign) {
    const uint64_t i = p % half;
    const uint64_t q = p / half;
    const uint64_t position = offset + (q / heads) % t;
    const uint64_t at = q * (2 * (uint64_t)half) + i;
    const uint64_t angle = position * stride + i;
    const float factor = ember_rope_factor(scale, position, logn_length, ln_pos[position], ln_m);
    float y1, y2;
    ember_rope_pair(ember_load(x, at), ember_load(x, at + half), cos[angle], sin[angle], sign, factor, &y1, &y2);
    ember_store(y, at, y1);
    ember_store(y, at + half, y2);
}
