// The host mirror of the activation kernels' arithmetic (cuda/activation.cuh), for the CPU suite.
#include "activation.cuh"

extern "C" {

float ember_mirror_gelu(float x) { return ember_gelu(x); }

float ember_mirror_gelu_slope(float x) { return ember_gelu_slope(x); }

float ember_mirror_swiglu(float a, float u) { return ember_swiglu(a, u); }

void ember_mirror_swiglu_bwd(float a, float u, float g, float* da, float* du) { ember_swiglu_bwd(a, u, g, da, du); }

// The kernels' bodies over n elements, f32 (`_f32`) and bf16 (`_bf16`) buffers.
#define EMBER_ACTIVATION_MIRRORS(SUFFIX, T)                                                                  \
    void ember_mirror_gelu_fwd##SUFFIX(const T* x, T* y, uint64_t n) {                                       \
        for (uint64_t i = 0; i < n; ++i) ember_gelu_fwd_at(x, y, i);                                         \
    }                                                                                                        \
    void ember_mirror_gelu_bwd##SUFFIX(const T* x, const T* g, T* dx, uint64_t n) {                          \
        for (uint64_t i = 0; i < n; ++i) ember_gelu_bwd_at(x, g, dx, i);                                     \
    }                                                                                                        \
    void ember_mirror_swiglu_fwd##SUFFIX(const T* a, const T* u, T* y, uint64_t n) {                         \
        for (uint64_t i = 0; i < n; ++i) ember_swiglu_fwd_at(a, u, y, i);                                    \
    }                                                                                                        \
    void ember_mirror_swiglu_bwd##SUFFIX(const T* a, const T* u, const T* g, T* da, T* du, uint64_t n) {     \
        for (uint64_t i = 0; i < n; ++i) ember_swiglu_bwd_at(a, u, g, da, du, i);                            \
    }

EMBER_ACTIVATION_MIRRORS(_f32, float)
EMBER_ACTIVATION_MIRRORS(_bf16, ember_bf16)

}  // extern "C"
