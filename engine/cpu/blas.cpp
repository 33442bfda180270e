#include "blas.h"
#include "packed.h"

#include "segtape/blas.h"
#include "segtape/kernels.h"
#include "segtape/precision.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

namespace segtape {

std::string blas_kernels() {
  std::string core = openblas_get_corename();
  while (!core.empty() && core.back() == ' ') core.pop_back();
  return core;
}

std::string packed_kernel() { return cpu::packed_kernel(); }
bool packs_weight(int64_t M, int64_t N, int64_t K) { return cpu::packed_worthwhile(M, N, K); }
int blas_threads() { return openblas_get_num_threads(); }

std::string blas_better_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return {};
  // OpenBLAS's x86 kernel sets without AVX2 (its DYNAMIC_ARCH names).
  static const char* const generic[] = {"Prescott", "Core2",  "Penryn", "Dunnington", "Nehalem",   "Atom",     "Sandybridge",
                                        "Katmai",   "Coppermine", "Northwood", "Banias", "Barcelona", "Opteron", "Opteron(SSE3)",
                                        "Bobcat",   "Bulldozer", "Piledriver", "Steamroller", "Nano"};
  const std::string core = blas_kernels();
  if (std::find(std::begin(generic), std::end(generic), core) == std::end(generic)) return {};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return {};
}

}  // namespace segtape

namespace segtape::cpu {

namespace {

// CBLAS's GEMM and GEMV for float and double under one name.
void xgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha, const float* A, blasint lda,
           const float* B, blasint ldb, float beta, float* C, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void xgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, double alpha, const double* A, blasint lda,
           const double* B, blasint ldb, double beta, double* C, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void xgemv(CBLAS_TRANSPOSE t, blasint rows, blasint cols, float alpha, const float* A, blasint lda, const float* x, blasint incx,
           float beta, float* y, blasint incy) {
  cblas_sgemv(CblasRowMajor, t, rows, cols, alpha, A, lda, x, incx, beta, y, incy);
}
void xgemv(CBLAS_TRANSPOSE t, blasint rows, blasint cols, double alpha, const double* A, blasint lda, const double* x, blasint incx,
           double beta, double* y, blasint incy) {
  cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, A, lda, x, incx, beta, y, incy);
}

// A product with one row (M = 1) or one column (N = 1) is a matrix-vector
// product. OpenBLAS's GEMM copies (packs) its whole matrix operand into a
// blocked layout on every call, which at B = 1 costs more than the product
// (callgrind at B = 1, H = 128 with the Haswell kernels: 62 % of an inference
// step in sgemm_incopy); GEMV reads the matrix once, in place. The exception
// is OpenBLAS's AVX-512 kernels (SkylakeX, Cooperlake), whose GEMM has a path
// for small products without packing that beats their GEMV (docs/benchmarks.md
// has the measurements). kernels::Options::gemv (segtape/kernels.h) may
// choose instead; Auto is this choice, made once from OpenBLAS's kernel set.
bool use_gemv() {
  switch (kernels::options().gemv) {
    case kernels::Gemv::On: return true;
    case kernels::Gemv::Off: return false;
    case kernels::Gemv::Auto: break;
  }
  static const bool by_kernels = [] {
    // Compared without case: an OpenBLAS built for one CPU may name it in
    // capitals. SapphireRapids is 0.3.22's name for kernels with the same
    // AVX-512 GEMM (0.3.21 maps that CPU to Cooperlake); not measured here.
    std::string core = blas_kernels();
    for (char& c : core) c = char(std::tolower(static_cast<unsigned char>(c)));
    return core != "skylakex" && core != "cooperlake" && core != "sapphirerapids";
  }();
  return by_kernels;
}

template <class T>
void gemm_impl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb, T beta,
               T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  lda = std::max<int64_t>(lda, 1), ldb = std::max<int64_t>(ldb, 1);
  const bool vector = K > 0 && (M == 1 || N == 1) && use_gemv();
  if (!vector) {
    xgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B,
          blasint(ldb), beta, C, blasint(ldc));
    return;
  }
  // GEMM with beta = 0 never reads C; GEMV scales y by beta, and 0 * NaN is
  // NaN. C may hold anything (a fresh arena block), so it is zeroed first.
  const int64_t len = M == 1 ? N : M, inc = M == 1 ? 1 : ldc;
  if (beta == T(0))
    for (int64_t i = 0; i < len; ++i) C[i * inc] = T(0);
  if (M == 1) {
    // C[1,N] = alpha a op(B) + beta C, a = op(A)'s one row: y = alpha op(B)^T a + beta y.
    // op(B)^T is B itself (N x K) when tb, else B^T (B is K x N).
    const int64_t inca = ta ? lda : 1;
    if (tb) xgemv(CblasNoTrans, blasint(N), blasint(K), alpha, B, blasint(ldb), A, blasint(inca), beta, C, blasint(1));
    else xgemv(CblasTrans, blasint(K), blasint(N), alpha, B, blasint(ldb), A, blasint(inca), beta, C, blasint(1));
  } else {
    // C[M,1] = alpha op(A) b + beta C, b = op(B)'s one column.
    const int64_t incb = tb ? 1 : ldb;
    if (ta) xgemv(CblasTrans, blasint(K), blasint(M), alpha, A, blasint(lda), B, blasint(incb), beta, C, blasint(ldc));
    else xgemv(CblasNoTrans, blasint(M), blasint(K), alpha, A, blasint(lda), B, blasint(incb), beta, C, blasint(ldc));
  }
}

thread_local Bf16Scratch* t_bf16 = nullptr;  // the open Bf16Products scope's

// The rows x cols matrix at `src` (leading dimension ld) rounded to bfloat16,
// packed (leading dimension cols) into `dst`.
void round_into(std::vector<float>& dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  dst.resize(size_t(rows * cols));  // (grows, then reused: no allocation once the largest product has run)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[size_t(r * cols + c)] = bf16_round(src[r * ld + c]);
}

// Precision::Bf16: C = alpha bf16(op(bf16(A)) op(bf16(B))) + beta C. The
// product of two bfloat16 values is exact in float32, so the GEMM below
// accumulates exact products in float32, as a bfloat16 tensor core does; the
// product is rounded before it is added to C (a gradient's sum stays float32).
// With beta = 0 (C may hold anything) the product is made in C and rounded
// there; otherwise in the scratch's p first.
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  std::vector<float>&a = t_bf16->a, &b = t_bf16->b, &p = t_bf16->p;
  round_into(a, A, ta ? K : M, ta ? M : K, lda);
  round_into(b, B, tb ? N : K, tb ? K : N, ldb);
  const bool in_place = beta == 0.0f;
  if (!in_place) p.resize(size_t(M * N));
  float* product = in_place ? C : p.data();
  const int64_t ldp = in_place ? ldc : N;
  gemm_impl(ta, tb, M, N, K, 1.0f, a.data(), ta ? M : K, b.data(), tb ? K : N, 0.0f, product, ldp);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float v = alpha * bf16_round(product[i * ldp + j]);
      float& c = C[i * ldc + j];
      c = in_place ? v : v + beta * c;
    }
}

}  // namespace

bool bf16_products() { return t_bf16 != nullptr; }
Bf16Products::Bf16Products(Bf16Scratch* scratch) : was_(t_bf16) { t_bf16 = scratch; }
Bf16Products::~Bf16Products() { t_bf16 = was_; }

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
          float beta, float* C, int64_t ldc) {
  if (t_bf16 != nullptr && M > 0 && N > 0) return gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda, const double* B, int64_t ldb,
          double beta, double* C, int64_t ldc) {
  gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace segtape::cpu
