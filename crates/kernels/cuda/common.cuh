// The arithmetic Ember's CUDA kernels share, written once for the device and the host.
//
// Every function marked EMBER_HD compiles as CUDA device code (nvcc, the kernels) and as plain
// C++ (the host mirror, cuda/host_mirror.cpp, which the CPU test suite links and compares with the
// Rust CPU kernels). So the per-element math of a GPU kernel is checked on every machine, GPU or
// not. Reductions across threads (warp shuffles) are device-only and are tested on a GPU.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define EMBER_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#include <string.h>
#define EMBER_HD static inline
#endif

// The bits of an f32, and an f32 from bits.
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

// x rounded to bf16 (8 bits of mantissa) and widened back: round to nearest, ties to even, as
// candle's casts (the half crate's bf16::from_f32) round, so Precision::round's bits; a NaN stays
// a NaN, made quiet as there. The CPU's bf16 GEMMs (vcvtneps2bf16, vdpbf16ps) also flush
// subnormals to zero, which this keeps: the two differ only on operands below 1.2e-38.
EMBER_HD float ember_round_bf16(float x) {
    const uint32_t u = ember_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ember_f32_from_bits((u | 0x00400000u) & 0xffff0000u);
    const uint32_t round_bit = 0x00008000u;
    const uint32_t up = (u & round_bit) != 0 && (u & (3u * round_bit - 1u)) != 0;
    return ember_f32_from_bits(((u >> 16) + up) << 16);
}

// A bf16 element as stored: the upper 16 bits of an f32 (candle's and the half crate's bf16).
typedef uint16_t ember_bf16;

// Element i of an f32 or a bf16 buffer as f32 (a bf16 widens exactly), and v into element i of
// one (rounded once, by ember_round_bf16, into a bf16). The kernels with bf16 variants are
// written over these: the f32 kernel's arithmetic on the widened inputs, each output rounded
// once, which is what the CPU ops compute on bf16 activations (ember_kernels::host).
EMBER_HD float ember_load(const float* p, uint64_t i) { return p[i]; }
EMBER_HD float ember_load(const ember_bf16* p, uint64_t i) { return ember_f32_from_bits((uint32_t)p[i] << 16); }
EMBER_HD void ember_store(float* p, uint64_t i, float v) { p[i] = v; }
EMBER_HD void ember_store(ember_bf16* p, uint64_t i, float v) {
    p[i] = (ember_bf16)(ember_f32_bits(ember_round_bf16(v)) >> 16);
}

// -inf, without relying on INFINITY being defined in device code.
EMBER_HD float ember_neg_inf(void) { return ember_f32_from_bits(0xff800000u); }

// e^x as the CPU kernels' simd::exp_fast computes it: Cody-Waite reduction x = n ln2 + r, a
// degree-6 Taylor polynomial in r, 2^n from the bits of the rounding constant's sum; exactly 0
// below -87.3 (masked logits rely on it), NaN kept (the clamp is Rust's f32::clamp, through which
// NaN passes). Every operation is rounded on its own (--fmad=false on the device,
// -ffp-contract=off on the host), as in Rust, so the softmax and the cross-entropy take the CPU's
// exponentials bit for bit.
EMBER_HD float ember_exp_fast(float x) {
    const float ln2_hi = 0.69314575f;
    const float ln2_lo = 1.4286068e-6f;
    const float round = 12582912.0f;  // 1.5 * 2^23
    float xc = x;
    if (xc < -87.3f) xc = -87.3f;
    if (xc > 88.0f) xc = 88.0f;
    const float shifted = xc * 1.44269504088896340736f + round;
    const float n = shifted - round;
    const float r = (xc - n * ln2_hi) - n * ln2_lo;
    const float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (1.0f / 6.0f + r * (1.0f / 24.0f + r * (1.0f / 120.0f + r * (1.0f / 720.0f))))));
    // Unsigned arithmetic: the bits of the CPU's wrapping i32 operations, without C's
    // signed-overflow rules.
    const uint32_t n_int = ember_f32_bits(shifted) - ember_f32_bits(round);
    const float scale = ember_f32_from_bits((n_int + 127u) << 23);
    return x < -87.3f ? 0.0f : p * scale;
}

// SplitMix64 (ember_rng): the constant the state steps by, and the output mix of one state.
#define EMBER_GAMMA 0x9E3779B97F4A7C15ull

EMBER_HD uint64_t ember_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Draw i (counting from 1) of the generator at `state` (ember_rng::draw_at).
EMBER_HD uint64_t ember_draw_at(uint64_t state, uint64_t i) {
    return ember_mix64(state + i * EMBER_GAMMA);
}

// Inverted dropout (ember_kernels::dropout): element i (row-major) is dropped when draw i + 1 is
// below p, i.e. when (draw >> 11) < threshold = ceil(p * 2^53) (an exact integer comparison).
EMBER_HD bool ember_dropped(uint64_t state, uint64_t threshold, uint64_t i) {
    return (ember_draw_at(state, i + 1) >> 11) < threshold;
}

// The element's value after dropout: a select, not v * factor, so that a dropped NaN or -0.0
// becomes +0.0 exactly as on the CPU.
EMBER_HD float ember_dropout_value(float v, uint64_t state, uint64_t threshold, float keep, uint64_t i) {
    return ember_dropped(state, threshold, i) ? 0.0f : v * keep;
}

// The scalars of one AdamW update, rounded to f32 once (ember_kernels::adamw::UpdateConsts).
struct EmberAdamW {
    float grad_scale;
    float beta1;
    float one_minus_beta1;
    float beta2;
    float one_minus_beta2;
    float inv_bc1;
    float inv_bc2;
    float eps;
    float decay;
    float lr;
};

// One AdamW step of one element, operation for operation the CPU kernel's (adamw::update).
// `#pragma`-free: nvcc is told not to contract these into FMAs (build.rs: --fmad=false), so the
// device computes the same roundings as the host.
EMBER_HD void ember_adamw_element(float* theta, float g, float* m, float* v, struct EmberAdamW c) {
    g = g * c.grad_scale;
    *m = *m * c.beta1 + g * c.one_minus_beta1;
    *v = *v * c.beta2 + (g * g) * c.one_minus_beta2;
    float denom = sqrtf(*v * c.inv_bc2) + c.eps;
    *theta = *theta * c.decay - (*m * c.inv_bc1) / denom * c.lr;
}

// The step ledger: what a training step decides on the device (clip factor, whether the update
// is applied, AdamW's bias corrections) and what the host reads back only at logged steps (the
// window's loss sums, skipped and spiked steps). Doubles at these indices; the Rust side's
// `ember_kernels::adamw::ledger` names the same slots.
enum EmberLedger {
    EMBER_L_NORM = 0,        // this step's global gradient norm
    EMBER_L_SCALE,           // this step's clip factor (1 without clipping or when not finite)
    EMBER_L_APPLY,           // 1 when this step's update is applied, 0 when it is skipped
    EMBER_L_INV_BC1,         // 1 / (1 - beta1^t), t = updates applied including this one
    EMBER_L_INV_BC2,         // 1 / (1 - beta2^t)
    EMBER_L_UPDATES,         // updates applied so far (AdamW's t)
    EMBER_L_SKIPPED,         // steps skipped so far for non-finite values
    EMBER_L_W_LOSS,          // window: sum of the finite steps' summed objectives
    EMBER_L_W_NLL,           // window: sum of their summed NLLs
    EMBER_L_W_TOKENS,        // window: their target tokens
    EMBER_L_W_GRAD_NORM,     // window: sum of the finite gradient norms
    EMBER_L_W_SKIPPED,       // window: steps skipped
    EMBER_L_W_FIRST_BAD,     // window: the first skipped step's number, 0 if none
    EMBER_L_W_FIRST_WHAT,    // window: what was not finite there: -1 the loss, else the parameter's index
    EMBER_L_W_FIRST_LOSS,    // window: that step's loss per token
    EMBER_L_W_SPIKED,        // window: 1 once a step's loss was NaN or above the spike threshold
    EMBER_L_STOPPED,         // train.on_nonfinite: stop: the first non-finite step's number, 0 if none
    EMBER_L_LEN
};

// Closes one step after its gradients' sums of squares are in `partials` (one per parameter,
// in the optimizer's order): the global norm, the clip factor, whether the update is applied,
// the bias corrections, and the window's sums. `max_norm <= 0` clips nothing, `spike_loss < 0`
// checks no spike (the host has no initial validation loss to compare with); `stop` is
// train.on_nonfinite: stop (after the first non-finite step every later update is held back
// too, so that the weights stay those of the step before it, until the host reads the ledger
// at its next logged step and ends the run without saving).
EMBER_HD void ember_finish_step(double* L, const double* partials, uint32_t count, double objective,
                                double nll, double tokens, double max_norm, double spike_loss,
                                int stop, double beta1, double beta2, uint64_t step) {
    double total = 0.0;
    int64_t bad = 0;  // 1 + the first parameter whose gradient is not finite
    for (uint32_t i = 0; i < count; ++i) {
        if (!isfinite(partials[i]) && bad == 0) bad = (int64_t)i + 1;
        total += partials[i];
    }
    const double norm = sqrt(total);
    const double loss = objective / (tokens > 1.0 ? tokens : 1.0);
    const bool loss_ok = isfinite(loss);
    const bool ok = loss_ok && bad == 0;
    L[EMBER_L_NORM] = norm;
    L[EMBER_L_SCALE] = (max_norm > 0.0 && bad == 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0;
    if (spike_loss >= 0.0 && (isnan(loss) || loss > spike_loss)) L[EMBER_L_W_SPIKED] = 1.0;
    if (loss_ok) {
        L[EMBER_L_W_LOSS] += objective;
        L[EMBER_L_W_NLL] += nll;
        L[EMBER_L_W_TOKENS] += tokens;
    }
    if (isfinite(norm)) L[EMBER_L_W_GRAD_NORM] += norm;
    if (!ok) {
        if (L[EMBER_L_W_FIRST_BAD] == 0.0) {
            L[EMBER_L_W_FIRST_BAD] = (double)step;
            L[EMBER_L_W_FIRST_WHAT] = loss_ok ? (double)(bad - 1) : -1.0;
            L[EMBER_L_W_FIRST_LOSS] = loss;
        }
        if (stop) {
            if (L[EMBER_L_STOPPED] == 0.0) L[EMBER_L_STOPPED] = (double)step;
        } else {
            L[EMBER_L_SKIPPED] += 1.0;
            L[EMBER_L_W_SKIPPED] += 1.0;
        }
    }
    const bool apply = ok && L[EMBER_L_STOPPED] == 0.0;
    L[EMBER_L_APPLY] = apply ? 1.0 : 0.0;
    if (apply) {
        const double t = L[EMBER_L_UPDATES] + 1.0;
        L[EMBER_L_UPDATES] = t;
        L[EMBER_L_INV_BC1] = 1.0 / (1.0 - pow(beta1, t));
        L[EMBER_L_INV_BC2] = 1.0 / (1.0 - pow(beta2, t));
    }
}
