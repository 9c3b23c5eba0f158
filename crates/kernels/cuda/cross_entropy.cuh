// Label-smoothed cross-entropy with z-loss and padding (ember_kernels::cross_entropy, the loss of
// ember_kernels::linear_cross_entropy): the arithmetic of one row of logits, shared by the
// kernels (cuda/cross_entropy.cu) and the host mirror (cuda/cross_entropy_mirror.cpp).
//
// A row is one block of EMBER_CE_THREADS threads. Thread t reads the elements t, t + THREADS,
// t + 2·THREADS, ... in index order (ember_ce_lane_*); a block reduction then combines the
// threads' parts in a fixed order (each warp's xor butterfly over offsets 16, 8, 4, 2, 1, then
// the same butterfly over the warps' results, lane 0's value taken), so a row's result depends on
// its length alone. The mirror runs the same lane loops and the same reduction on the host.
//
// The per-element math is the CPU kernel's operation for operation (build.rs: --fmad=false on the
// device, -ffp-contract=off on the host): eˣ is the CPU's exp_fast, not expf, so that the
// probabilities and gradients of a row, given its max and lse, are the CPU's bits.
#pragma once

#include "common.cuh"

#define EMBER_CE_THREADS 256u
#define EMBER_CE_WARPS (EMBER_CE_THREADS / 32u)

// The larger of two values, NaN winning (simd::max_in_lanes): a diverged row stays visibly so.
EMBER_HD float ember_ce_max(float m, float x) { return (m > x || m != m) ? m : x; }


// Thread `lane`'s part of the row's max. T: float, or ember_bf16 for bf16 logits (read widened;
// the `_bf16` kernels).
template <typename T>
EMBER_HD float ember_ce_lane_max(const T* x, uint32_t v, uint32_t lane) {
    float m = ember_neg_inf();
    for (uint32_t j = lane; j < v; j += EMBER_CE_THREADS) m = ember_ce_max(m, ember_load(x, j));
    return m;
}

// Thread `lane`'s parts of Σ exp(x − max) and of Σ x (the latter for the smoothing term).
template <typename T>
EMBER_HD void ember_ce_lane_sums(const T* x, uint32_t v, uint32_t lane, float max, float* exp_sum,
                                 float* raw_sum) {
    float s = 0.0f, r = 0.0f;
    for (uint32_t j = lane; j < v; j += EMBER_CE_THREADS) {
        const float xj = ember_load(x, j);
        s += ember_exp_fast(xj - max);
        r += xj;
    }
    *exp_sum = s;
    *raw_sum = r;
}

// (objective, NLL) of a row, unmasked (cross_entropy.rs: row_losses), from the target's logit
// x_t, the row's sum Σx, its length v, max and lse = log Σ exp(x − max). The smoothing and z
// terms are left out when ε or z is 0.
EMBER_HD void ember_ce_row_losses(float x_t, float row_sum, uint32_t v, float max, float lse, float eps, float z,
                                  float* objective, float* nll) {
    const float l = -((x_t - max) - lse);
    float o = l;
    if (eps > 0.0f) {
        // mean_v(−log p) = lse − mean_v(x − max)
        const float mean_lp = (row_sum / (float)v - max) - lse;
        o = l * (1.0f - eps) + (-mean_lp) * eps;
    }
    if (z > 0.0f) {
        const float log_z = lse + max;
        o += log_z * log_z * z;
    }
    *objective = o;
    *nll = l;
}

// The weights of a row's gradient (cross_entropy.rs: gradient_weights) under the upstream
// gradients g_obj (of the masked objective) and g_nll: the gradient is p·w_p − w_unif/V, minus
// w_nll at the target.
EMBER_HD void ember_ce_gradient_weights(float g_obj, float g_nll, float max, float lse, float eps, float z,
                                        float* w_nll, float* w_unif, float* w_p) {
    const float e = eps > 0.0f ? eps : 0.0f;  // Rust's eps.max(0.0), NaN included
    const float wn = g_obj * (1.0f - e) + g_nll;
    const float wu = eps > 0.0f ? g_obj * eps : 0.0f;
    const float wz = z > 0.0f ? g_obj * 2.0f * z * (lse + max) : 0.0f;
    *w_nll = wn;
    *w_unif = wu;
    *w_p = wn + wu + wz;
}

// What a row's gradient needs, from the upstream gradients of its objective and NLL, its mask
// entry and its (max, lse).
struct EmberCeGradient {
    int zero;     // no upstream gradient reaches the row (padding): its gradient is 0
    float shift;  // max + lse: p = exp(x − shift)
    float w_p;
    float offset;  // w_unif / V
    float w_nll;
};

EMBER_HD struct EmberCeGradient ember_ce_gradient_setup(float g_obj, float g_nll, float mask, float max, float lse,
                                                        uint32_t v, float eps, float z) {
    struct EmberCeGradient c;
    const float go = g_obj * mask, gn = g_nll * mask;
    c.zero = go == 0.0f && gn == 0.0f;
    float w_unif;
    ember_ce_gradient_weights(go, gn, max, lse, eps, z, &c.w_nll, &w_unif, &c.w_p);
    c.shift = max + lse;
    c.offset = w_unif * (1.0f / (float)v);
    return c;
}

// The probability of a logit in a row with shift = max + lse (what the forward pass leaves for
// the backward pass when a gradient will be needed).
EMBER_HD float ember_ce_prob(float x, float shift) { return ember_exp_fast(x - shift); }

// The gradient at one element: `x` is the logit, or its probability when `from_probs`.
EMBER_HD float ember_ce_gradient_at(struct EmberCeGradient c, float x, int from_probs, int is_target) {
    if (c.zero) return 0.0f;
    const float p = from_probs ? x : ember_ce_prob(x, c.shift);
    const float d = p * c.w_p - c.offset;
    return is_target ? d - c.w_nll : d;
}
