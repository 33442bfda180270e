// Row-major GEMM through CBLAS (OpenBLAS), float and double. The one place
// segtape talks to BLAS on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace segtape::cpu {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. lda/ldb/ldc: row strides as stored.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// Precision::Bf16 (TapeOptions::precision) for this thread's float32 GEMMs:
// while a Bf16Products is alive, gemm(float) rounds its operands and its
// product to bfloat16 (segtape/precision.h), in `scratch`'s buffers. The CPU
// backend owns one Bf16Scratch per tape (freed with it) and opens a
// Bf16Products around each op's forward and backward on a bf16 tape; with
// none open, gemm is OpenBLAS's.
struct Bf16Scratch {
  std::vector<float> a, b, p;  // the rounded operands, a product added into C (grown to the largest, then reused)
  size_t bytes() const { return (a.capacity() + b.capacity() + p.capacity()) * sizeof(float); }
};
bool bf16_products();
class Bf16Products {
 public:
  explicit Bf16Products(Bf16Scratch* scratch);  // nullptr: float32 (a scope that changes nothing)
  ~Bf16Products();
  Bf16Products(const Bf16Products&) = delete;
  Bf16Products& operator=(const Bf16Products&) = delete;

 private:
  Bf16Scratch* was_;
};

}  // namespace segtape::cpu
