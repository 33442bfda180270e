// Engine-internal: SEGTAPE_HD marks a function compiled for the host and, by
// nvcc, for the device too (the formulas of update_math.h and ops/elementwise.h).
#pragma once

#if defined(__CUDACC__)
#define SEGTAPE_HD __host__ __device__ inline
#else
#define SEGTAPE_HD inline
#endif
