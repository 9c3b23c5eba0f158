// The host mirror of the cross-entropy kernels (cuda/cross_entropy.cu): cross_entropy.cuh compiled
// as plain C++, and the kernels' rows run on the host with the same lane loops and the same
// block reduction, so that the CPU suite (ember_kernels::cross_entropy's tests) can compare what
// the GPU computes with the Rust CPU kernel on a machine without a GPU.
#include "cross_entropy.cuh"

namespace {

// A warp's xor butterfly over offsets 16, 8, 4, 2, 1, as __shfl_xor_sync runs it: every lane l
// combines its value with lane l ^ o's at once.
void butterfly(float* lanes, int is_max) {
    for (uint32_t o = 16; o > 0; o >>= 1) {
        float next[32];
        for (uint32_t l = 0; l < 32; ++l) {
            const float other = lanes[l ^ o];
            next[l] = is_max ? ember_ce_max(lanes[l], other) : lanes[l] + other;
        }
        memcpy(lanes, next, sizeof next);
    }
}

// ember_ce_block_reduce over the EMBER_CE_THREADS threads' values.
float block_reduce(const float* parts, int is_max) {
    float partial[EMBER_CE_WARPS];
    for (uint32_t w = 0; w < EMBER_CE_WARPS; ++w) {
        float lanes[32];
        memcpy(lanes, parts + 32 * w, sizeof lanes);
        butterfly(lanes, is_max);
        partial[w] = lanes[0];
    }
    float lanes[32];
    for (uint32_t l = 0; l < 32; ++l) lanes[l] = l < EMBER_CE_WARPS ? partial[l] : (is_max ? ember_neg_inf() : 0.0f);
    butterfly(lanes, is_max);
    return lanes[0];
}

}  // namespace

extern "C" {


void ember_mirror_ce_row_losses(float x_t, float row_sum, uint32_t v, float max, float lse, float eps, float z,
                                float* objective, float* nll) {
    ember_ce_row_losses(x_t, row_sum, v, max, lse, eps, z, objective, nll);
}

}  // extern "C"

namespace {

// ember_ce_forward on one row x (v): out = (mask·objective, mask·NLL, max, lse); with `probs`
// (v floats, else null), the row's probabilities there.
template <typename T>
void forward_row(const T* x, uint32_t v, uint32_t target, float mask, float eps, float z, float* out, float* probs) {
    float parts[EMBER_CE_THREADS], raw[EMBER_CE_THREADS];
    for (uint32_t t = 0; t < EMBER_CE_THREADS; ++t) parts[t] = ember_ce_lane_max(x, v, t);
    const float max = block_reduce(parts, 1);
    for (uint32_t t = 0; t < EMBER_CE_THREADS; ++t) ember_ce_lane_sums(x, v, t, max, &parts[t], &raw[t]);
    const float total = block_reduce(parts, 0);
    const float row_sum = block_reduce(raw, 0);
    const float lse = logf(total);
    const float x_t = target < v ? ember_load(x, target) : ember_f32_from_bits(0x7fc00000u);
    float objective, nll;
    ember_ce_row_losses(x_t, row_sum, v, max, lse, eps, z, &objective, &nll);
    out[0] = objective * mask;
    out[1] = nll * mask;
    out[2] = max;
    out[3] = lse;
    if (probs) {
        for (uint32_t j = 0; j < v; ++j) probs[j] = ember_ce_prob(ember_load(x, j), max + lse);
    }
}

// ember_ce_backward on one row x (v) in place: x holds logits, or probabilities (`from_probs`).
template <typename T>
void gradient_row(T* x, uint32_t v, uint32_t target, float g_obj, float g_nll, float mask, float max, float lse,
                  float eps, float z, int from_probs) {
    const struct EmberCeGradient c = ember_ce_gradient_setup(g_obj, g_nll, mask, max, lse, v, eps, z);
    for (uint32_t j = 0; j < v; ++j) ember_store(x, j, ember_ce_gradient_at(c, ember_load(x, j), from_probs, j == target));
}

}  // namespace

extern "C" {

void ember_mirror_ce_forward_row(const float* x, uint32_t v, uint32_t target, float mask, float eps, float z,
                                 float* out, float* probs) {
    forward_row(x, v, target, mask, eps, z, out, probs);
}

// ember_ce_forward_bf16's row: bf16 logits, read widened (the Rust side never writes bf16
// probabilities, so `probs` here are f32, for comparison).
void ember_mirror_ce_forward_row_bf16(const ember_bf16* x, uint32_t v, uint32_t target, float mask, float eps,
                                      float z, float* out, float* probs) {
    forward_row(x, v, target, mask, eps, z, out, probs);
}

void ember_mirror_ce_gradient_row(float* x, uint32_t v, uint32_t target, float g_obj, float g_nll, float mask,
                                  float max, float lse, float eps, float z, int from_probs) {
    gradient_row(x, v, target, g_obj, g_nll, mask, max, lse, eps, z, from_probs);
}

// ember_ce_backward_bf16's row: bf16 logits replaced by their gradient, rounded once.
void ember_mirror_ce_gradient_row_bf16(ember_bf16* x, uint32_t v, uint32_t target, float g_obj, float g_nll,
                                       float mask, float max, float lse, float eps, float z, int from_probs) {
    gradient_row(x, v, target, g_obj, g_nll, mask, max, lse, eps, z, from_probs);
}

}  // extern "C"
