// The host mirror of attention.cuh: the fused kernels' algorithm (attention.cu) row by row, in
// order, on the host, from the same index and element functions, exported with C linkage for the
// CPU suite's comparison with the Rust kernel (ember_kernels::attention's tests). Where the device
// splits a row's max and sums across a warp, this sums in order; everything else (indices, mask
// strides, dropout counter, the order of dk's and dv's sums over heads and rows) is the device's.
#include <vector>

#include "attention.cuh"

// x[0..n) as the products read it (ember_attn_operand).
static std::vector<float> operands(const float* x, uint64_t n, int round) {
    std::vector<float> out(x, x + n);
    for (float& e : out) e = ember_attn_operand(e, round);
    return out;
}

extern "C" {

float ember_mirror_attn_factor(uint64_t state, uint64_t threshold, float keep, uint64_t idx) {
    return ember_attn_factor(state, threshold, keep, idx);
}

uint64_t ember_mirror_attn_prob_index(uint64_t b, uint64_t h, uint64_t t, uint64_t s, uint64_t H, uint64_t T,
                                      uint64_t S) {
    return ember_attn_row(b, h, t, H, T) * S + s;
}

void ember_mirror_attention_fwd(const float* q, const float* k, const float* v, const float* mask, uint32_t B,
                                uint32_t H, uint32_t Hkv, uint32_t T, uint32_t S, uint32_t D, int has_mask,
                                uint64_t ms_b, uint64_t ms_h, uint64_t ms_t, uint64_t ms_s, int has_dropout,
                                uint64_t state, uint64_t threshold, float keep, int round, float* out,
                                float* row_max, float* row_ent) {
    const uint64_t nq = (uint64_t)B * T * H * D, nkv = (uint64_t)B * S * Hkv * D;
    const std::vector<float> qr = operands(q, nq, round), kr = operands(k, nkv, round), vr = operands(v, nkv, round);
    q = qr.data(), k = kr.data(), v = vr.data();
    std::vector<float> p(S);
    for (uint32_t b = 0; b < B; ++b) {
        for (uint32_t h = 0; h < H; ++h) {
            const uint32_t kh = ember_attn_kv_head(h, H, Hkv);
            for (uint32_t t = 0; t < T; ++t) {
                const uint64_t qo = ember_attn_q_offset(b, t, h, T, H, D);
                for (uint32_t s = 0; s < S; ++s) p[s] = ember_attn_dot(q + qo, k + ember_attn_kv_offset(b, s, kh, S, Hkv, D), D);
                const uint64_t row = ember_attn_row(b, h, t, H, T);
                ember_attn_softmax_row_seq(p.data(), p.data(), S, mask, has_mask != 0,
                                           ember_attn_mask_base(b, h, t, ms_b, ms_h, ms_t), ms_s, true, &row_max[row],
                                           &row_ent[row]);
                if (has_dropout) {
                    for (uint32_t s = 0; s < S; ++s) p[s] = p[s] * ember_attn_factor(state, threshold, keep, row * S + s);
                }
                for (uint32_t s = 0; s < S; ++s) p[s] = ember_attn_operand(p[s], round);
                const float* v0 = v + ember_attn_kv_offset(b, 0, kh, S, Hkv, D);
                for (uint32_t j = 0; j < D; ++j) out[qo + j] = ember_attn_weighted(p.data(), v0 + j, (uint64_t)Hkv * D, S);
            }
        }
    }
}

void ember_mirror_attention_bwd(const float* q, const float* k, const float* v, const float* o, const float* go,
                                const float* mask, uint32_t B, uint32_t H, uint32_t Hkv, uint32_t T, uint32_t S,
                                uint32_t D, int has_mask, uint64_t ms_b, uint64_t ms_h, uint64_t ms_t, uint64_t ms_s,
                                int has_dropout, uint64_t state, uint64_t threshold, float keep, int round, float* dq,
                                float* dk, float* dv) {
    // delta = <dO, O> reads go as given; every product reads the operands.
    const uint64_t nq = (uint64_t)B * T * H * D, nkv = (uint64_t)B * S * Hkv * D;
    const std::vector<float> qr = operands(q, nq, round), kr = operands(k, nkv, round), vr = operands(v, nkv, round),
                             gr = operands(go, nq, round);
    q = qr.data(), k = kr.data(), v = vr.data();
    std::vector<float> ds(S), used(S);
    const uint32_t group = H / Hkv;
    for (uint32_t b = 0; b < B; ++b) {
        for (uint32_t kh = 0; kh < Hkv; ++kh) {
            for (uint32_t s = 0; s < S; ++s) {
                const uint64_t at = ember_attn_kv_offset(b, s, kh, S, Hkv, D);
                for (uint32_t j = 0; j < D; ++j) dk[at + j] = dv[at + j] = 0.0f;
            }
            for (uint32_t gi = 0; gi < group; ++gi) {
                const uint32_t h = kh * group + gi;
                for (uint32_t t = 0; t < T; ++t) {
                    const uint64_t qo = ember_attn_q_offset(b, t, h, T, H, D);
                    const float delta = ember_attn_dot(go + qo, o + qo, D);
                    for (uint32_t s = 0; s < S; ++s) ds[s] = ember_attn_dot(q + qo, k + ember_attn_kv_offset(b, s, kh, S, Hkv, D), D);
                    float unused_max = 0.0f, unused_ent = 0.0f;
                    ember_attn_softmax_row_seq(ds.data(), ds.data(), S, mask, has_mask != 0,
                                               ember_attn_mask_base(b, h, t, ms_b, ms_h, ms_t), ms_s, false,
                                               &unused_max, &unused_ent);
                    const uint64_t row = ember_attn_row(b, h, t, H, T);
                    for (uint32_t s = 0; s < S; ++s) {
                        const float dp = ember_attn_dot(gr.data() + qo, v + ember_attn_kv_offset(b, s, kh, S, Hkv, D), D);
                        float g, u;
                        ember_attn_grad(ds[s], dp, delta, has_dropout != 0, state, threshold, keep, row * S + s, &g, &u);
                        ds[s] = ember_attn_operand(g, round);
                        used[s] = ember_attn_operand(u, round);
                    }
                    const float* k0 = k + ember_attn_kv_offset(b, 0, kh, S, Hkv, D);
                    for (uint32_t j = 0; j < D; ++j) dq[qo + j] = ember_attn_weighted(ds.data(), k0 + j, (uint64_t)Hkv * D, S);
                    for (uint32_t s = 0; s < S; ++s) {
                        const uint64_t at = ember_attn_kv_offset(b, s, kh, S, Hkv, D);
                        for (uint32_t j = 0; j < D; ++j) {
                            dk[at + j] += ds[s] * q[qo + j];
                            dv[at + j] += used[s] * gr[qo + j];
                        }
                    }
                }
            }
        }
    }
}

}  // extern "C"
