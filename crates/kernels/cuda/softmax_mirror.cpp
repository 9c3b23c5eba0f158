// The host mirror of softmax.cuh: the device's per-element softmax arithmetic compiled as plain
// C++ and exported with C linkage, for the CPU suite's comparison with the Rust kernel
// (ember_kernels::softmax's tests).
#include "softmax.cuh"

extern "C" {

void ember_mirror_softmax_rows(const float* x, float* y, uint64_t rows, uint32_t n) {
    for (uint64_t r = 0; r < rows; ++r) ember_softmax_row(x + r * n, y + r * n, n);
}

void ember_mirror_softmax_rows_bwd(const float* p, const float* g, float* dx, uint64_t rows, uint32_t n) {
    for (uint64_t r = 0; r < rows; ++r) ember_softmax_row_bwd(p + r * n, g + r * n, dx + r * n, n);
}

void ember_mirror_softmax_rows_bf16(const ember_bf16* x, ember_bf16* y, uint64_t rows, uint32_t n) {
    for (uint64_t r = 0; r < rows; ++r) ember_softmax_row(x + r * n, y + r * n, n);
}

void ember_mirror_softmax_rows_bwd_bf16(const ember_bf16* p, const ember_bf16* g, ember_bf16* dx, uint64_t rows,
                                        uint32_t n) {
    for (uint64_t r = 0; r < rows; ++r) ember_softmax_row_bwd(p + r * n, g + r * n, dx + r * n, n);
}

}  // extern "C"
