// RMSNorm and LayerNorm over vectors of d elements (ember_kernels::norm): a (B, T, D) tensor with a
// gain of D, or a (B, T, H·d) projection with a gain of d (QK-norm, each head's vector).
//
// The forward pass and the input gradient take one warp per vector (warps of a block take
// consecutive vectors; a grid-stride loop covers any count), with the per-vector arithmetic of
// norm.cuh. The gain's and bias's gradients are sums over every vector: ember_norm_bwd_partials
// sums fixed chunks of vectors per column, in vector order, into a (chunks × d) buffer, and
// ember_norm_bwd_reduce sums those partials per column in chunk order. The chunking depends only
// on the shapes, so the sums have the same bits on every run (no atomics).
//
// The input x and the output y may each be f32 or bf16 (X, Y: float or ember_bf16; the output's
// gradient g comes in Y, the input's gradient dx goes out in X); the gain, the bias, their
// gradients and all arithmetic are f32. All-f32 kernels have the plain names; the others end in
// _X_Y, e.g. ember_norm_fwd_f32_bf16 (a residual stream's norm feeding bf16 products).
#include "norm.cuh"

// y = norm(x)·w (+ b): `layer` selects LayerNorm (centred) over RMSNorm; without a bias, `b` is
// any valid pointer and is not read.
template <typename X, typename Y>
__device__ __forceinline__ void ember_norm_fwd_body(const X* __restrict__ x, const float* __restrict__ w,
                                                    const float* __restrict__ b, Y* __restrict__ y, uint64_t vectors,
                                                    uint32_t d, int layer, int has_bias, float eps) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps;
    // v is the same in every lane of a warp, so the whole warp takes each loop turn (the
    // shuffles below need all 32 lanes).
    for (uint64_t v = (uint64_t)blockIdx.x * warps + (threadIdx.x >> 5); v < vectors; v += stride) {
        const X* xv = x + v * d;
        Y* yv = y + v * d;
        float mean = 0.0f;
        if (layer) mean = ember_norm_mean(ember_warp_sum(ember_norm_lane_sum(xv, d, lane)), d);
        const float rstd = ember_norm_rstd(ember_warp_sum(ember_norm_lane_sumsq(xv, d, lane, mean)), d, eps);
        if (has_bias) {
            for (uint32_t i = lane; i < d; i += 32u)
                ember_store(yv, i, ember_norm_value_bias(ember_load(xv, i), mean, rstd, w[i], b[i]));
        } else {
            for (uint32_t i = lane; i < d; i += 32u) ember_store(yv, i, ember_norm_value(ember_load(xv, i), mean, rstd, w[i]));
        }
    }
}

// dx of each vector from x, w and the output gradient g, and the vector's (mean, 1/σ) into
// stats[2v], stats[2v + 1] for the parameter gradients.
template <typename X, typename Y>
__device__ __forceinline__ void ember_norm_bwd_dx_body(const X* __restrict__ x, const float* __restrict__ w,
                                                       const Y* __restrict__ g, X* __restrict__ dx,
                                                       float* __restrict__ stats, uint64_t vectors, uint32_t d,
                                                       int layer, float eps) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps;
    const float inv_d = ember_norm_inv_d(d);
    for (uint64_t v = (uint64_t)blockIdx.x * warps + (threadIdx.x >> 5); v < vectors; v += stride) {
        const X* xv = x + v * d;
        const Y* gv = g + v * d;
        X* dxv = dx + v * d;
        float mean = 0.0f;
        if (layer) mean = ember_norm_mean(ember_warp_sum(ember_norm_lane_sum(xv, d, lane)), d);
        const float rstd = ember_norm_rstd(ember_warp_sum(ember_norm_lane_sumsq(xv, d, lane, mean)), d, eps);
        float gx_xhat, gx_sum;
        ember_norm_lane_bwd_sums(xv, w, gv, d, lane, mean, rstd, &gx_xhat, &gx_sum);
        const float m_gx_xhat = ember_warp_sum(gx_xhat) * inv_d;
        const float m_gx = layer ? ember_warp_sum(gx_sum) * inv_d : 0.0f;
        for (uint32_t i = lane; i < d; i += 32u) {
            const float dxi = ember_norm_dx(ember_load(xv, i), w[i], ember_load(gv, i), mean, rstd, m_gx, m_gx_xhat);
            ember_store(dxv, i, dxi);
        }
        if (lane == 0) {
            stats[2 * v] = mean;
            stats[2 * v + 1] = rstd;
        }
    }
}

// Chunk c = blockIdx.x of the vectors [c·per_chunk, (c + 1)·per_chunk): per column j (blockIdx.y
// and the thread), Σ g·x̂ into pw[c·d + j] and Σ g into pb[c·d + j], in vector order. A chunk past
// the last vector writes zeros (0 vectors: one chunk of zeros).
template <typename X, typename Y>
__device__ __forceinline__ void ember_norm_bwd_partials_body(const X* __restrict__ x, const Y* __restrict__ g,
                                                             const float* __restrict__ stats, float* __restrict__ pw,
                                                             float* __restrict__ pb, uint64_t vectors, uint32_t d,
                                                             uint64_t per_chunk) {
    const uint32_t j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= d) return;
    const uint64_t c = blockIdx.x;
    const uint64_t first = c * per_chunk;
    const uint64_t end = first + per_chunk < vectors ? first + per_chunk : vectors;
    float aw = 0.0f, ab = 0.0f;
    for (uint64_t v = first; v < end; ++v) {
        const uint64_t at = v * d + j;
        const float gi = ember_load(g, at);
        aw += ember_norm_dw_term(ember_load(x, at), gi, stats[2 * v], stats[2 * v + 1]);
        ab += gi;
    }
    pw[c * d + j] = aw;
    pb[c * d + j] = ab;
}

// The three kernels above for inputs X and outputs Y, named with SUFFIX.
#define EMBER_NORM_KERNELS(SUFFIX, X, Y)                                                                         \
    extern "C" __global__ void ember_norm_fwd##SUFFIX(const X* __restrict__ x, const float* __restrict__ w,      \
                                                      const float* __restrict__ b, Y* __restrict__ y,            \
                                                      uint64_t vectors, uint32_t d, int layer, int has_bias,     \
                                                      float eps) {                                               \
        ember_norm_fwd_body(x, w, b, y, vectors, d, layer, has_bias, eps);                                      \
    }                                                                                                           \
    extern "C" __global__ void ember_norm_bwd_dx##SUFFIX(const X* __restrict__ x, const float* __restrict__ w,   \
                                                         const Y* __restrict__ g, X* __restrict__ dx,            \
                                                         float* __restrict__ stats, uint64_t vectors, uint32_t d, \
                                                         int layer, float eps) {                                 \
        ember_norm_bwd_dx_body(x, w, g, dx, stats, vectors, d, layer, eps);                                     \
    }                                                                                                           \
    extern "C" __global__ void ember_norm_bwd_partials##SUFFIX(                                                  \
        const X* __restrict__ x, const Y* __restrict__ g, const float* __restrict__ stats, float* __restrict__ pw, \
        float* __restrict__ pb, uint64_t vectors, uint32_t d, uint64_t per_chunk) {                             \
        ember_norm_bwd_partials_body(x, g, stats, pw, pb, vectors, d, per_chunk);                               \
    }

EMBER_NORM_KERNELS(, float, float)
EMBER_NORM_KERNELS(_f32_bf16, float, ember_bf16)
EMBER_NORM_KERNELS(_bf16_bf16, ember_bf16, ember_bf16)
EMBER_NORM_KERNELS(_bf16_f32, ember_bf16, float)

// dw[j] = Σ_c pw[c·d + j] and db[j] = Σ_c pb[c·d + j], in chunk order.
extern "C" __global__ void ember_norm_bwd_reduce(const float* __restrict__ pw, const float* __restrict__ pb,
                                                 float* __restrict__ dw, float* __restrict__ db, uint64_t chunks,
                                                 uint32_t d) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < d; j += stride) {
        float sw = 0.0f, sb = 0.0f;
        for (uint64_t c = 0; c < chunks; ++c) {
            sw += pw[c * d + j];
            sb += pb[c * d + j];
        }
        dw[j] = sw;
        db[j] = sb;
    }
}
