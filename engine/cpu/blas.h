// Row-major GEMM through CBLAS (OpenBLAS), float and double. The one place
// segtape talks to BLAS on the CPU.
#pragma once
#include <cstdint>

namespace segtape::cpu {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. lda/ldb/ldc: row strides as stored.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

}  // namespace segtape::cpu
