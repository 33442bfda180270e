// Products with a weight operand packed once and reused: a segment multiplies
// by the same W_hh at every step, forward and backward, and OpenBLAS repacks
// it on every call (0.3.21 has no packed-GEMM API). segtape's own kernel
// reads a copy packed in the order it consumes it (docs/lab/benchmarks-changelog.md,
// items 10 and 14), with AVX-512F or with AVX2 + FMA; elsewhere, and in
// double, GEMM stays OpenBLAS's.
#pragma once
#include <cstddef>
#include <cstdint>

namespace segtape::cpu {

// Whether the packed kernel may run now: an x86-64 CPU with AVX-512F or
// AVX2 + FMA, and kernels::Options::packed (segtape/kernels.h) not Off.
bool packed_available();

// The kernel that runs: "avx512", "avx2" or "none". The best the CPU has;
// kernels::Packed::Avx2 takes the AVX2 kernel on a CPU with AVX-512F too
// (both give the same bits), kernels::Packed::Off none.
const char* packed_kernel();

// Whether a product of these sizes may take the packed path: packed_available(),
// and OpenBLAS on one thread, or a product small enough that OpenBLAS's
// threads do not pay (M * N * K <= 2^22).
bool packed_worthwhile(int64_t M, int64_t N, int64_t K);

// Whether a product OpenBLAS would run on more than one thread is too small
// for its threads to pay (M * N * K <= 2^22, the bound above), so that
// segtape's one-thread kernel should take it even where packing its operands
// is an extra copy: packed_available() and OpenBLAS on more than one thread.
bool threads_do_not_pay(int64_t M, int64_t N, int64_t K);

// Under kFewRows rows a row of A uses each element of B once, so packing B
// pays only when a pass reuses it: the GRU packs such a weight at its
// kPackAfter-th product in a pass (detail::packed_weight) and leaves the
// products before to BLAS. Packing W_hh at H = 128 costs about four of its
// products through OpenBLAS (docs/lab/benchmarks-changelog.md, item 11).
constexpr int64_t kFewRows = 4;
constexpr int kPackAfter = 8;

// The blocks the inner dimension is cut into: K up to 768 whole, longer in
// blocks of 512 (each block's sum added to C in order).
int64_t packed_k_block(int64_t K);

// Floats of a packed K x N operand (columns padded to a multiple of 32).
size_t packed_floats(int64_t K, int64_t N);

// Packs B [K, N]: B = W^T for W [N, K] row-major (trans), else B = W for W [K, N].
// dst: packed_floats(K, N) floats, 64-byte aligned.
void pack_b(const float* W, int64_t K, int64_t N, bool trans, float* dst);

// C [M, N] = A [M, K] (row stride lda) * B + beta * C (beta 0 or 1), B packed
// by pack_b. trans_a: A is given as A^T [K, M] (row stride lda), read in
// place (a backward's dg^T h, where dg is [rows, 3H]). M or N 0: nothing.
void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed, float beta, float* C,
                 int64_t ldc, bool trans_a = false);

}  // namespace segtape::cpu
