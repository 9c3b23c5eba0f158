// The host mirror of the CUDA kernels' shared arithmetic: common.cuh compiled as plain C++ and
// exported with C linkage, so that the CPU test suite (crate::cuda_mirror) can compare the exact
// code the GPU runs with the Rust CPU kernels, on a machine without a GPU.
#include "common.cuh"

extern "C" {

uint64_t ember_mirror_draw_at(uint64_t state, uint64_t i) { return ember_draw_at(state, i); }

float ember_mirror_exp_fast(float x) { return ember_exp_fast(x); }

float ember_mirror_round_bf16(float x) { return ember_round_bf16(x); }

uint16_t ember_mirror_store_bf16(float x) {
    ember_bf16 out;
    ember_store(&out, 0, x);
    return out;
}

float ember_mirror_load_bf16(uint16_t x) { return ember_load(&x, 0); }

float ember_mirror_dropout_value(float v, uint64_t state, uint64_t threshold, float keep, uint64_t i) {
    return ember_dropout_value(v, state, threshold, keep, i);
}

void ember_mirror_adamw(float* theta, const float* g, float* m, float* v, uint64_t n, struct EmberAdamW c) {
    for (uint64_t i = 0; i < n; ++i) ember_adamw_element(&theta[i], g[i], &m[i], &v[i], c);
}

// ember_adamw_bf16's loop: the gradient read as the kernel reads it.
void ember_mirror_adamw_bf16(float* theta, const ember_bf16* g, float* m, float* v, uint64_t n,
                             struct EmberAdamW c) {
    for (uint64_t i = 0; i < n; ++i) ember_adamw_element(&theta[i], ember_load(g, i), &m[i], &v[i], c);
}

// ember_dropout_bf16's loop.
void ember_mirror_dropout_bf16(const ember_bf16* x, ember_bf16* y, uint64_t n, uint64_t state, uint64_t threshold,
                               float keep) {
    for (uint64_t i = 0; i < n; ++i) ember_store(y, i, ember_dropout_value(ember_load(x, i), state, threshold, keep, i));
}

}  // extern "C"

extern "C" void ember_mirror_finish_step(double* ledger, const double* partials, uint32_t count, double objective,
                                         double nll, double tokens, double max_norm, double spike_loss, int stop,
                                         double beta1, double beta2, uint64_t step) {
    ember_finish_step(ledger, partials, count, objective, nll, tokens, max_norm, spike_loss, stop, beta1, beta2, step);
}
