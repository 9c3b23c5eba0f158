// The attention core softmax(q k^T + mask) v (ember_kernels::attention): the index arithmetic of
// the projections' layout, the mask's strides and the dropout counter, and the per-element math,
// shared by the kernels (attention.cu) and the host mirror (attention_mirror.cpp), which the CPU
// suite compares with the Rust kernel.
//
// Layout: q and its gradient (B, T, H*D), k, v and theirs (B, S, Hkv*D): the heads of a position
// side by side. Query head h reads key/value head h / (H / Hkv). The probabilities are indexed as
// the (B, H, T, S) tensor the unfused composition builds: row (b, h, t) = (b*H + h)*T + t, and
// element (b, h, t, s) = row*S + s, which is also its dropout counter index.
#pragma once

#include "softmax.cuh"

// Element offset of (batch b, position t, query head h) in q, o and their gradients.
EMBER_HD uint64_t ember_attn_q_offset(uint64_t b, uint64_t t, uint64_t h, uint64_t T, uint64_t H, uint64_t D) {
    return ((b * T + t) * H + h) * D;
}

// Element offset of (batch b, position s, key/value head kh) in k, v and their gradients.
EMBER_HD uint64_t ember_attn_kv_offset(uint64_t b, uint64_t s, uint64_t kh, uint64_t S, uint64_t Hkv, uint64_t D) {
    return ((b * S + s) * Hkv + kh) * D;
}

// The key/value head that query head h reads.
EMBER_HD uint32_t ember_attn_kv_head(uint32_t h, uint32_t H, uint32_t Hkv) { return h / (H / Hkv); }

// Row (b, h, t) of the (B, H, T, S) probabilities.
EMBER_HD uint64_t ember_attn_row(uint64_t b, uint64_t h, uint64_t t, uint64_t H, uint64_t T) {
    return (b * H + h) * T + t;
}

// Offset of the mask's element (b, h, t, 0), the mask broadcast to (B, H, T, S) by strides (0
// along a broadcast dimension).
EMBER_HD uint64_t ember_attn_mask_base(uint64_t b, uint64_t h, uint64_t t, uint64_t ms_b, uint64_t ms_h,
                                       uint64_t ms_t) {
    return b * ms_b + h * ms_h + t * ms_t;
}

// A pair takes part in the telemetry's max |logit| when its additive mask is 0, not -1e9.
EMBER_HD bool ember_attn_unmasked(float m) { return m >= -1.0f; }

// One probability's share of its row's entropy, -p ln max(p, 1e-30), as the CPU kernel writes it.
EMBER_HD float ember_attn_entropy_term(float p) { return -p * logf(p > 1e-30f ? p : 1e-30f); }

// The dropout mask's factor of probability `idx`: 0 when dropped, else 1/(1 - p).
EMBER_HD float ember_attn_factor(uint64_t state, uint64_t threshold, float keep, uint64_t idx) {
    return ember_dropped(state, threshold, idx) ? 0.0f : keep;
}

// A product's operand as the kernels read it: x, or with `round` (Precision::Bf16) x rounded to
// bf16.
EMBER_HD float ember_attn_operand(float x, int round) { return round ? ember_round_bf16(x) : x; }

// sum_j a[j] b[j] in order.
EMBER_HD float ember_attn_dot(const float* a, const float* b, uint32_t n) {
    float acc = 0.0f;
    for (uint32_t j = 0; j < n; ++j) acc += a[j] * b[j];
    return acc;
}

// sum_s p[s] x[s * stride] in order: one column of P x (x = v for the output, k for dq).
EMBER_HD float ember_attn_weighted(const float* p, const float* x, uint64_t stride, uint32_t n) {
    float acc = 0.0f;
    for (uint32_t s = 0; s < n; ++s) acc += p[s] * x[s * stride];
    return acc;
}

// The backward pass at one probability p with dp = <dO_t, v_s> and delta = <dO_t, O_t>: the
// logit's gradient ds = p (dp * m - delta) and the probability the output used, p * m, where m is
// the dropout factor (1 without dropout), as the CPU kernel computes them.
EMBER_HD void ember_attn_grad(float p, float dp, float delta, bool dropout, uint64_t state, uint64_t threshold,
                              float keep, uint64_t idx, float* ds, float* used) {
    if (dropout) {
        const float f = ember_attn_factor(state, threshold, keep, idx);
        *used = p * f;
        *ds = p * (dp * f - delta);
    } else {
        *used = p;
        *ds = p * (dp - delta);
    }
}

// One row's logits `in` (n of them, q k^T before the mask) to probabilities before dropout in
// `out` (may be `in`), in order (the mirror's reference; the kernels split the row across a warp).
// With `measure`, the largest unmasked |logit| and the row's entropy.
EMBER_HD void ember_attn_softmax_row_seq(const float* in, float* out, uint32_t n, const float* mask, bool has_mask,
                                         uint64_t mask_base, uint64_t ms_s, bool measure, float* max_abs,
                                         float* entropy) {
    float mx = 0.0f, m = ember_neg_inf();
    for (uint32_t s = 0; s < n; ++s) {
        float x = in[s];
        if (has_mask) {
            const float mv = mask[mask_base + s * ms_s];
            if (measure && ember_attn_unmasked(mv) && fabsf(x) > mx) mx = fabsf(x);
            x = x + mv;
        } else if (measure && fabsf(x) > mx) {
            mx = fabsf(x);
        }
        out[s] = x;
        m = ember_softmax_max(m, x);
    }
    float sum = 0.0f;
    for (uint32_t s = 0; s < n; ++s) {
        out[s] = ember_softmax_exp(out[s], m);
        sum += out[s];
    }
    const float inv = 1.0f / sum;
    float ent = 0.0f;
    for (uint32_t s = 0; s < n; ++s) {
        out[s] = out[s] * inv;
        if (measure) ent += ember_attn_entropy_term(out[s]);
    }
    if (measure) {
        *max_abs = mx;
        *entropy = ent;
    }
}
