// attention: not yet written (the op takes candle's unfused composition on CUDA).
#include "common.cuh"
