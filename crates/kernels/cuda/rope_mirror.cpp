// The host mirror of the rope kernel (cuda/rope.cu): its body (cuda/rope.cuh) for every pair, for
// the CPU suite.
#include "rope.cuh"

extern "C" {

void ember_mirror_rope(const float* x, const float* cos, const float* sin, const double* ln_pos, float* y,
                       uint64_t pairs, uint32_t half, uint32_t heads, uint32_t t, uint64_t offset, uint32_t stride,
                       double scale, uint64_t logn_length, double ln_m, float sign) {
    for (uint64_t p = 0; p < pairs; ++p) {
        ember_rope_at(x, cos, sin, ln_pos, y, p, half, heads, t, offset, stride, scale, logn_length, ln_m, sign);
    }
}

// The same over bf16 activations (ember_rope_bf16).
void ember_mirror_rope_bf16(const ember_bf16* x, const float* cos, const float* sin, const double* ln_pos,
                            ember_bf16* y, uint64_t pairs, uint32_t half, uint32_t heads, uint32_t t, uint64_t offset,
                            uint32_t stride, double scale, uint64_t logn_length, double ln_m, float sign) {
    for (uint64_t p = 0; p < pairs; ++p) {
        ember_rope_at(x, cos, sin, ln_pos, y, p, half, heads, t, offset, stride, scale, logn_length, ln_m, sign);
    }
}

float ember_mirror_rope_factor(double scale, uint64_t position, uint64_t logn_length, double ln_n, double ln_m) {
    return ember_rope_factor(scale, position, logn_length, ln_n, ln_m);
}

}  // extern "C"
