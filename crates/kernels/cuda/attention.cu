// The attention core softmax(q k^T + mask) v with grouped-query heads, attention-probability
// dropout and telemetry (ember_kernels::attention), on q (B, T, H*D) and k, v (B, S, Hkv*D) as
// the projections produce them: no head split, no copies.
//
// - ember_attn_fwd / ember_attn_bwd (and their _bf16 variants): the fused forward and backward
//   passes for sequences whose keys and values fit in shared memory (the host checks the sizes,
//   see src/attention/cuda.rs). One warp
//   per query row; a row's logits, probabilities and gradients live in shared memory.
// - ember_attn_softmax: the mask, softmax and telemetry of (B, H, T, S) logits that cuBLAS
//   computed, one warp per row (the path for longer sequences).
//
// The additive mask is read through its broadcast strides (0 along broadcast dimensions), never
// expanded. The dropout mask is element (b, h, t, s)'s counter draw, as everywhere in Ember, and
// the backward pass recomputes both the probabilities and the mask. Every sum runs in a fixed
// order (no atomics), so the kernels give the same bits every run.
//
// `round` (Precision::Bf16): the operands of the four products (q k^T and P v, and the backward
// pass's dO v^T, dS k, dS^T q and P~^T dO) are rounded to bf16 as they are read, the sums stay f32,
// as the CPU kernel's bf16 products compute them (but for subnormal operands, which the CPU's
// flush to zero); the softmax, the mask, the dropout, the telemetry and delta = <dO, O> take the
// unrounded values, as there.
//
// q, k, v and the output (and in the backward pass o, go, dq, dk, dv) are f32 (ember_attn_fwd,
// ember_attn_bwd) or bf16 activations (the `_bf16` kernels: widened as they are read, every
// output rounded once as it is written); the mask, the telemetry and shared memory are f32.
#include "attention.cuh"

// One row (b, h, t) by one warp: `in` (n logits q k^T before the mask) to the probabilities before
// dropout in `out` (may be `in`). Lane l handles elements l, l + 32, ... in every pass, so a lane
// reads only what it wrote itself. With `measure`, *max_abs and *entropy receive the row's
// largest unmasked |logit| and entropy (on every lane). All 32 lanes must call it.
__device__ __forceinline__ void ember_attn_softmax_row(const float* in, float* out, uint32_t n, const float* mask,
                                                       bool has_mask, uint64_t mask_base, uint64_t ms_s,
                                                       bool measure, float* max_abs, float* entropy) {
    const uint32_t lane = threadIdx.x & 31u;
    float mx = 0.0f, m = ember_neg_inf();
    for (uint32_t s = lane; s < n; s += 32) {
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
    m = ember_softmax_warp_max(m);
    float sum = 0.0f;
    for (uint32_t s = lane; s < n; s += 32) {
        const float e = ember_softmax_exp(out[s], m);
        out[s] = e;
        sum += e;
    }
    sum = ember_softmax_warp_sum(sum);
    const float inv = 1.0f / sum;
    float ent = 0.0f;
    for (uint32_t s = lane; s < n; s += 32) {
        const float p = out[s] * inv;
        out[s] = p;
        if (measure) ent += ember_attn_entropy_term(p);
    }
    if (measure) {
        *max_abs = ember_softmax_warp_max(mx);
        *entropy = ember_softmax_warp_sum(ent);
    }
}

// The forward pass. Grid (B*H, ceil(T / rows_per_block)), blockDim a multiple of 32; block
// (b*H + h, y) computes query rows y*rows_per_block .. of head h in batch b, warp w its rows
// w, w + warps, ... Dynamic shared memory, in floats (kp = D | 1, an odd row stride, so that the
// lanes of a warp reading K[s][j] for 32 different s hit 32 different banks):
//   K: S*kp | V: S*D | per warp: q row D | per warp: probability row S
// out (B, T, H*D). With `measure`, row_max and row_ent (B*H*T) receive each row's largest
// unmasked |logit| and entropy; otherwise they are not touched. With `round`, q, k, v and the
// probabilities P v reads are rounded to bf16.
template <typename E>
__device__ __forceinline__ void ember_attn_fwd_body(const E* __restrict__ q, const E* __restrict__ k,
                                                    const E* __restrict__ v, const float* __restrict__ mask,
                                                    E* __restrict__ out, float* __restrict__ row_max,
                                                    float* __restrict__ row_ent, uint32_t H, uint32_t Hkv, uint32_t T,
                                                    uint32_t S, uint32_t D, uint32_t rows_per_block, int has_mask,
                                                    uint64_t ms_b, uint64_t ms_h, uint64_t ms_t, uint64_t ms_s,
                                                    int has_dropout, uint64_t state, uint64_t threshold, float keep,
                                                    int measure, int round) {
    extern __shared__ float smem[];
    const uint32_t warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const uint32_t kp = D | 1u;
    float* ks = smem;
    float* vs = ks + (size_t)S * kp;
    float* qw = vs + (size_t)S * D + (size_t)warp * D;
    float* pw = vs + (size_t)S * D + (size_t)warps * D + (size_t)warp * S;

    const uint32_t h = blockIdx.x % H;
    const uint64_t b = blockIdx.x / H;
    const uint32_t kh = ember_attn_kv_head(h, H, Hkv);
    for (uint32_t i = threadIdx.x; i < S * D; i += blockDim.x) {
        const uint32_t s = i / D, j = i % D;
        const uint64_t src = ember_attn_kv_offset(b, s, kh, S, Hkv, D) + j;
        ks[s * kp + j] = ember_attn_operand(ember_load(k, src), round);
        vs[i] = ember_attn_operand(ember_load(v, src), round);
    }
    __syncthreads();

    const uint32_t first = blockIdx.y * rows_per_block;
    const uint32_t end = min(T, first + rows_per_block);
    // Warp-uniform bounds: every lane of a warp runs the same rows.
    for (uint32_t t = first + warp; t < end; t += warps) {
        const uint64_t qo = ember_attn_q_offset(b, t, h, T, H, D);
        for (uint32_t j = lane; j < D; j += 32) qw[j] = ember_attn_operand(ember_load(q, qo + j), round);
        __syncwarp();
        for (uint32_t s = lane; s < S; s += 32) pw[s] = ember_attn_dot(qw, ks + (size_t)s * kp, D);
        const uint64_t row = ember_attn_row(b, h, t, H, T);
        float mx = 0.0f, ent = 0.0f;
        ember_attn_softmax_row(pw, pw, S, mask, has_mask != 0, ember_attn_mask_base(b, h, t, ms_b, ms_h, ms_t), ms_s,
                               measure != 0, &mx, &ent);
        if (measure && lane == 0) {
            row_max[row] = mx;
            row_ent[row] = ent;
        }
        if (has_dropout) {
            for (uint32_t s = lane; s < S; s += 32) pw[s] = pw[s] * ember_attn_factor(state, threshold, keep, row * S + s);
        }
        if (round) {
            for (uint32_t s = lane; s < S; s += 32) pw[s] = ember_round_bf16(pw[s]);
        }
        __syncwarp();
        for (uint32_t j = lane; j < D; j += 32) ember_store(out, qo + j, ember_attn_weighted(pw, vs + j, D, S));
        // The next row overwrites qw and pw.
        __syncwarp();
    }
}

// The backward pass: dq, dk, dv from q, k, v, the forward output o and its gradient go. Grid
// (B*Hkv), blockDim a multiple of 32; block b*Hkv + kh handles key/value head kh of batch b and
// the query heads of its group, in order. Rounds of `warps` query rows: warp w recomputes row
// t0 + w's probabilities and writes its dq row; then the block adds the round's rows to dK and dV
// (held in shared memory), each element summing the rows in order, so that dk and dv are the sum
// over the group's heads and the rows in one fixed order. With `round`, q, k, v, go and the rows
// dS and P~ are rounded to bf16 where a product reads them (delta reads go unrounded). Dynamic
// shared memory, in floats:
//   K: S*kp | V: S*kp | dK: S*D | dV: S*D | per warp: q row D | per warp: go row D |
//   per warp: ds row S | per warp: used-probability row S
template <typename E>
__device__ __forceinline__ void ember_attn_bwd_body(const E* __restrict__ q, const E* __restrict__ k,
                                                    const E* __restrict__ v, const E* __restrict__ o,
                                                    const E* __restrict__ go, const float* __restrict__ mask,
                                                    E* __restrict__ dq, E* __restrict__ dk, E* __restrict__ dv,
                                                    uint32_t H, uint32_t Hkv, uint32_t T, uint32_t S, uint32_t D,
                                                    int has_mask, uint64_t ms_b, uint64_t ms_h, uint64_t ms_t,
                                                    uint64_t ms_s, int has_dropout, uint64_t state, uint64_t threshold,
                                                    float keep, int round) {
    extern __shared__ float smem[];
    const uint32_t warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const uint32_t kp = D | 1u;
    float* ks = smem;
    float* vs = ks + (size_t)S * kp;
    float* dks = vs + (size_t)S * kp;
    float* dvs = dks + (size_t)S * D;
    float* qr = dvs + (size_t)S * D;
    float* gr = qr + (size_t)warps * D;
    float* dsr = gr + (size_t)warps * D;
    float* pr = dsr + (size_t)warps * S;

    const uint32_t kh = blockIdx.x % Hkv;
    const uint64_t b = blockIdx.x / Hkv;
    const uint32_t group = H / Hkv;
    for (uint32_t i = threadIdx.x; i < S * D; i += blockDim.x) {
        const uint32_t s = i / D, j = i % D;
        const uint64_t src = ember_attn_kv_offset(b, s, kh, S, Hkv, D) + j;
        ks[s * kp + j] = ember_attn_operand(ember_load(k, src), round);
        vs[s * kp + j] = ember_attn_operand(ember_load(v, src), round);
        dks[i] = 0.0f;
        dvs[i] = 0.0f;
    }
    __syncthreads();

    float* qw = qr + (size_t)warp * D;
    float* gw = gr + (size_t)warp * D;
    float* dsw = dsr + (size_t)warp * S;
    float* pw = pr + (size_t)warp * S;
    for (uint32_t gi = 0; gi < group; ++gi) {
        const uint32_t h = kh * group + gi;
        for (uint32_t t0 = 0; t0 < T; t0 += warps) {
            const uint32_t t = t0 + warp;
            if (t < T) {  // warp-uniform
                const uint64_t qo = ember_attn_q_offset(b, t, h, T, H, D);
                float partial = 0.0f;
                for (uint32_t j = lane; j < D; j += 32) {
                    qw[j] = ember_attn_operand(ember_load(q, qo + j), round);
                    const float g = ember_load(go, qo + j);
                    gw[j] = ember_attn_operand(g, round);
                    partial += g * ember_load(o, qo + j);
                }
                const float delta = ember_softmax_warp_sum(partial);
                __syncwarp();
                for (uint32_t s = lane; s < S; s += 32) dsw[s] = ember_attn_dot(qw, ks + (size_t)s * kp, D);
                float unused_max = 0.0f, unused_ent = 0.0f;
                ember_attn_softmax_row(dsw, dsw, S, mask, has_mask != 0,
                                       ember_attn_mask_base(b, h, t, ms_b, ms_h, ms_t), ms_s, false, &unused_max,
                                       &unused_ent);
                const uint64_t row = ember_attn_row(b, h, t, H, T);
                for (uint32_t s = lane; s < S; s += 32) {
                    const float dp = ember_attn_dot(gw, vs + (size_t)s * kp, D);
                    float ds, used;
                    ember_attn_grad(dsw[s], dp, delta, has_dropout != 0, state, threshold, keep, row * S + s, &ds,
                                    &used);
                    dsw[s] = ember_attn_operand(ds, round);
                    pw[s] = ember_attn_operand(used, round);
                }
                __syncwarp();
                for (uint32_t j = lane; j < D; j += 32) ember_store(dq, qo + j, ember_attn_weighted(dsw, ks + j, kp, S));
            }
            __syncthreads();
            const uint32_t rows = min(warps, T - t0);
            for (uint32_t i = threadIdx.x; i < S * D; i += blockDim.x) {
                const uint32_t s = i / D, j = i % D;
                float a = dks[i], c = dvs[i];
                for (uint32_t r = 0; r < rows; ++r) {
                    a += dsr[(size_t)r * S + s] * qr[(size_t)r * D + j];
                    c += pr[(size_t)r * S + s] * gr[(size_t)r * D + j];
                }
                dks[i] = a;
                dvs[i] = c;
            }
            // The next round overwrites the row buffers.
            __syncthreads();
        }
    }
    for (uint32_t i = threadIdx.x; i < S * D; i += blockDim.x) {
        const uint32_t s = i / D, j = i % D;
        const uint64_t dst = ember_attn_kv_offset(b, s, kh, S, Hkv, D) + j;
        ember_store(dk, dst, dks[i]);
        ember_store(dv, dst, dvs[i]);
    }
}

// The two passes above for activations of E, named with SUFFIX.
#define EMBER_ATTN_KERNELS(SUFFIX, E)                                                                              \
    extern "C" __global__ void ember_attn_fwd##SUFFIX(                                                             \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, const float* __restrict__ mask, \
        E* __restrict__ out, float* __restrict__ row_max, float* __restrict__ row_ent, uint32_t H, uint32_t Hkv,   \
        uint32_t T, uint32_t S, uint32_t D, uint32_t rows_per_block, int has_mask, uint64_t ms_b, uint64_t ms_h,   \
        uint64_t ms_t, uint64_t ms_s, int has_dropout, uint64_t state, uint64_t threshold, float keep, int measure, \
        int round) {                                                                                               \
        ember_attn_fwd_body(q, k, v, mask, out, row_max, row_ent, H, Hkv, T, S, D, rows_per_block, has_mask, ms_b, \
                            ms_h, ms_t, ms_s, has_dropout, state, threshold, keep, measure, round);                \
    }                                                                                                              \
    extern "C" __global__ void ember_attn_bwd##SUFFIX(                                                             \
        const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, const E* __restrict__ o,        \
        const E* __restrict__ go, const float* __restrict__ mask, E* __restrict__ dq, E* __restrict__ dk,          \
        E* __restrict__ dv, uint32_t H, uint32_t Hkv, uint32_t T, uint32_t S, uint32_t D, int has_mask,            \
        uint64_t ms_b, uint64_t ms_h, uint64_t ms_t, uint64_t ms_s, int has_dropout, uint64_t state,               \
        uint64_t threshold, float keep, int round) {                                                               \
        ember_attn_bwd_body(q, k, v, o, go, mask, dq, dk, dv, H, Hkv, T, S, D, has_mask, ms_b, ms_h, ms_t, ms_s,    \
                            has_dropout, state, threshold, keep, round);                                           \
    }

EMBER_ATTN_KERNELS(, float)
EMBER_ATTN_KERNELS(_bf16, ember_bf16)

// Mask, softmax and telemetry of contiguous (B, H, T, S) logits into probabilities (before
// dropout), one warp per row, the grid striding over rows. With `measure`, row_max and row_ent
// (B*H*T) receive each row's largest unmasked |logit| and entropy.
extern "C" __global__ void ember_attn_softmax(const float* __restrict__ logits, float* __restrict__ probs,
                                              const float* __restrict__ mask, float* __restrict__ row_max,
                                              float* __restrict__ row_ent, uint64_t rows, uint32_t H, uint32_t T,
                                              uint32_t S, int has_mask, uint64_t ms_b, uint64_t ms_h, uint64_t ms_t,
                                              uint64_t ms_s, int measure) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warps_per_block = blockDim.x >> 5;
    const uint64_t stride = (uint64_t)gridDim.x * warps_per_block;
    for (uint64_t r = (uint64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
        const uint64_t t = r % T, bh = r / T;
        const uint64_t h = bh % H, b = bh / H;
        float mx = 0.0f, ent = 0.0f;
        ember_attn_softmax_row(logits + r * S, probs + r * S, S, mask, has_mask != 0,
                               ember_attn_mask_base(b, h, t, ms_b, ms_h, ms_t), ms_s, measure != 0, &mx, &ent);
        if (measure && lane == 0) {
            row_max[r] = mx;
            row_ent[r] = ent;
        }
    }
}
