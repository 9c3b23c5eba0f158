// The host mirror of the activation kernels' arithmetic (cuda/activation.cuh), for the CPU suite.
#include "activation.cuh"

extern "C" {

float ember_mirror_gelu(float x) { return ember_gelu(x); }

float ember_mirror_gelu_slope(float x) { return ember_gelu_slope(x); }

float ember_mirror_swiglu(float a, float u) { return ember_swiglu(a, u); }

void ember_mirror_swiglu_bwd(float a, float u, float g, float* da, float* du) { ember_swiglu_bwd(a, u, g, da, du); }

}  // extern "C"
