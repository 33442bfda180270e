// Precision::Bf16's kernels around cuBLAS's bfloat16 GEMM (kernels.h;
// CudaBackend::gemm): operands rounded to bfloat16 and packed, then the
// float32 product rounded to bfloat16 and scaled into C. The CPU's
// cpu::gemm_bf16 (engine/cpu/blas.cpp) is the same arithmetic except for
// the order in which the GEMM adds its exact products. Compiled in every
// CUDA build; not yet run on a GPU (docs/precision.md).
#include <cuda_bf16.h>

#include "device_math.cuh"
#include "kernels.h"

namespace segtape::cuda {

void round_to_bf16(cudaStream_t s, int64_t rows, int64_t cols, const float* src, int64_t ld, void* dst) {
  auto* out = static_cast<__nv_bfloat16*>(dst);
  each(s, rows * cols, [=] __device__(int64_t k) { out[k] = __float2bfloat16_rn(src[(k / cols) * ld + k % cols]); }, "round_to_bf16");
}

void finish_bf16(cudaStream_t s, int64_t M, int64_t N, float alpha, const float* P, int64_t ldp, float beta, float* C, int64_t ldc,
                 bool in_place) {
  each(s, M * N, [=] __device__(int64_t k) {
    const int64_t i = k / N, j = k % N;
    // (explicit roundings: no fused multiply-add, as the CPU's loop)
    const float v = __fmul_rn(alpha, __bfloat162float(__float2bfloat16_rn(P[i * ldp + j])));
    float& c = C[i * ldc + j];
    c = in_place ? v : __fadd_rn(v, __fmul_rn(beta, c));
  }, "finish_bf16");
}

}  // namespace segtape::cuda
