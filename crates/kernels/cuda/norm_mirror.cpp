// The host mirror of the norm kernels (cuda/norm.cu): the same lane loops and per-element
// arithmetic (cuda/norm.cuh), with the warp's xor butterfly written out over 32 values, so the
// CPU suite compares what a warp computes for a vector with the Rust CPU kernel.
#include <vector>

#include "norm.cuh"

// The butterfly of ember_warp_sum: at offset o, lane l adds lane l ^ o's value to its own.
static float warp_sum(float lanes[EMBER_NORM_LANES]) {
    for (uint32_t o = 16; o > 0; o >>= 1) {
        float next[EMBER_NORM_LANES];
        for (uint32_t l = 0; l < EMBER_NORM_LANES; ++l) next[l] = lanes[l] + lanes[l ^ o];
        for (uint32_t l = 0; l < EMBER_NORM_LANES; ++l) lanes[l] = next[l];
    }
    return lanes[0];
}

// (mean, 1/σ) of one vector as the warp computes them.
template <typename X>
static void stats(const X* x, uint32_t d, int layer, float eps, float* mean, float* rstd) {
    float lanes[EMBER_NORM_LANES];
    *mean = 0.0f;
    if (layer) {
        for (uint32_t l = 0; l < EMBER_NORM_LANES; ++l) lanes[l] = ember_norm_lane_sum(x, d, l);
        *mean = ember_norm_mean(warp_sum(lanes), d);
    }
    for (uint32_t l = 0; l < EMBER_NORM_LANES; ++l) lanes[l] = ember_norm_lane_sumsq(x, d, l, *mean);
    *rstd = ember_norm_rstd(warp_sum(lanes), d, eps);
}

// ember_norm_fwd over `vectors` vectors of d; b may be null (no bias).
template <typename X, typename Y>
static void norm_forward(const X* x, const float* w, const float* b, uint64_t vectors, uint32_t d, int layer,
                         float eps, Y* y) {
    for (uint64_t v = 0; v < vectors; ++v) {
        float mean, rstd;
        stats(x + v * d, d, layer, eps, &mean, &rstd);
        for (uint32_t i = 0; i < d; ++i) {
            const float xi = ember_load(x, v * d + i);
            ember_store(y, v * d + i,
                        b ? ember_norm_value_bias(xi, mean, rstd, w[i], b[i]) : ember_norm_value(xi, mean, rstd, w[i]));
        }
    }
}

// ember_norm_bwd_dx, then ember_norm_bwd_partials with `per_chunk` vectors a chunk and
// ember_norm_bwd_reduce: dx (vectors × d), dw and db (d each).
template <typename X, typename Y>
static void norm_backward(const X* x, const float* w, const Y* g, uint64_t vectors, uint32_t d, int layer, float eps,
                          uint64_t per_chunk, X* dx, float* dw, float* db) {
    const float inv_d = ember_norm_inv_d(d);
    for (uint32_t j = 0; j < d; ++j) dw[j] = db[j] = 0.0f;
    std::vector<float> chunk_w(d, 0.0f), chunk_b(d, 0.0f);  // the current chunk's partials
    uint64_t in_chunk = 0;
    for (uint64_t v = 0; v < vectors; ++v) {
        const X* xv = x + v * d;
        const Y* gv = g + v * d;
        float mean, rstd;
        stats(xv, d, layer, eps, &mean, &rstd);
        float a[EMBER_NORM_LANES], s[EMBER_NORM_LANES];
        for (uint32_t l = 0; l < EMBER_NORM_LANES; ++l) ember_norm_lane_bwd_sums(xv, w, gv, d, l, mean, rstd, &a[l], &s[l]);
        const float m_gx_xhat = warp_sum(a) * inv_d;
        const float m_gx = layer ? warp_sum(s) * inv_d : 0.0f;
        for (uint32_t i = 0; i < d; ++i) {
            const float xi = ember_load(xv, i), gi = ember_load(gv, i);
            ember_store(dx, v * d + i, ember_norm_dx(xi, w[i], gi, mean, rstd, m_gx, m_gx_xhat));
            chunk_w[i] += ember_norm_dw_term(xi, gi, mean, rstd);
            chunk_b[i] += gi;
        }
        if (++in_chunk == per_chunk || v + 1 == vectors) {
            for (uint32_t j = 0; j < d; ++j) {
                dw[j] += chunk_w[j];
                db[j] += chunk_b[j];
                chunk_w[j] = chunk_b[j] = 0.0f;
            }
            in_chunk = 0;
        }
    }
}

// The mirrors of ember_norm_fwd##SUFFIX and the backward's kernels for inputs X and outputs Y.
#define EMBER_NORM_MIRRORS(SUFFIX, X, Y)                                                                          \
    extern "C" void ember_mirror_norm_forward##SUFFIX(const X* x, const float* w, const float* b, uint64_t vectors, \
                                                      uint32_t d, int layer, float eps, Y* y) {                  \
        norm_forward(x, w, b, vectors, d, layer, eps, y);                                                       \
    }                                                                                                           \
    extern "C" void ember_mirror_norm_backward##SUFFIX(const X* x, const float* w, const Y* g, uint64_t vectors, \
                                                       uint32_t d, int layer, float eps, uint64_t per_chunk,     \
                                                       X* dx, float* dw, float* db) {                            \
        norm_backward(x, w, g, vectors, d, layer, eps, per_chunk, dx, dw, db);                                  \
    }

EMBER_NORM_MIRRORS(, float, float)
EMBER_NORM_MIRRORS(_f32_bf16, float, ember_bf16)
EMBER_NORM_MIRRORS(_bf16_bf16, ember_bf16, ember_bf16)
EMBER_NORM_MIRRORS(_bf16_f32, ember_bf16, float)

extern "C" {

// One output element from given statistics (with a bias when has_bias).
float ember_mirror_norm_value(float x, float mean, float rstd, float w, float b, int has_bias) {
    return has_bias ? ember_norm_value_bias(x, mean, rstd, w, b) : ember_norm_value(x, mean, rstd, w);
}

// One input-gradient element from given statistics and means.
float ember_mirror_norm_dx(float x, float w, float g, float mean, float rstd, float m_gx, float m_gx_xhat) {
    return ember_norm_dx(x, w, g, mean, rstd, m_gx, m_gx_xhat);
}

}  // extern "C"
