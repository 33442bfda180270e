#include "packed.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "segtape/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SEGTAPE_PACKED_KERNEL 1
#include <immintrin.h>
#define SEGTAPE_AVX512 __attribute__((target("avx512f")))
#define SEGTAPE_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline
#define SEGTAPE_AVX2 __attribute__((target("avx2,fma")))
#define SEGTAPE_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
#endif

namespace segtape::cpu {

namespace {

// Panels of 32 columns (two 16-float vectors). C is computed in blocks of up
// to 12 rows × one panel: 24 accumulators, two loads of B and twelve
// broadcasts of A per k; M is split into blocks of nearly equal size (64
// rows: 11, 11, 11, 11, 10, 10), never a short tail. The inner dimension is
// cut into blocks of 512 when it is longer than 768, so a panel's block
// (64 KiB) stays near the core while every block of rows of A passes over it.
// Chosen by measurement on AVX-512 (docs/lab/benchmarks-changelog.md, item 10): 12 × 32
// ran at 140-170 GFLOP/s on one thread, 8 × 32 a few percent slower, 16 × 16
// slower still. The AVX2 kernel (16 vector registers of 8 floats) reads the
// same packing: blocks of up to 6 rows × half a panel (12 accumulators).
// Both compute every element of C as one chain of FMAs in k order per block
// of the inner dimension, the blocks added in order, so the two kernels'
// results are identical to the bit (packed_test checks both against such a
// chain written out in scalar code).
constexpr int64_t kNR = 32;
constexpr int kMR = 12;
int64_t block_of(int64_t K) { return K <= 768 ? K : 512; }

#ifdef SEGTAPE_PACKED_KERNEL
// dst[k * 32 + c] = w[c * K + k] for a 16 × 16 tile (c, k < 16): sixteen rows
// of W read as vectors, transposed in registers (4 × 4 within 128-bit lanes,
// then the lanes), written as sixteen 16-float rows of the panel. (GCC 12's
// avx512fintrin.h passes _mm512_undefined_ps() as the unused source of the
// masked forms behind the unpacks, which -W(maybe-)uninitialized reports from here.)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
SEGTAPE_AVX512 void transpose_tile(const float* w, int64_t K, float* dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(w + i * K);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + j], lane l: column 4l + j of rows 4i .. 4i + 3
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {  // row 4l + j of the result = lane l of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512 x0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), x1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44), y1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    _mm512_storeu_ps(dst + (0 + j) * kNR, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(dst + (4 + j) * kNR, _mm512_shuffle_f32x4(x0, y0, 0xDD));
    _mm512_storeu_ps(dst + (8 + j) * kNR, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(dst + (12 + j) * kNR, _mm512_shuffle_f32x4(x1, y1, 0xDD));
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The same for an 8 × 8 tile with AVX2: dst[k * 32 + c] = w[c * K + k] for c, k < 8.
SEGTAPE_AVX2 void transpose_tile8(const float* w, int64_t K, float* dst) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(w + i * K);
  for (int i = 0; i < 4; ++i) {  // t[2i], lane l: r[2i][4l], r[2i+1][4l], r[2i][4l+1], r[2i+1][4l+1]
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3: r[4h + j], lane l = element 4l + j of rows 4h .. 4h + 3
    const __m256 a = t[4 * h], b = t[4 * h + 1], c = t[4 * h + 2], d = t[4 * h + 3];
    r[4 * h] = _mm256_shuffle_ps(a, c, 0x44);
    r[4 * h + 1] = _mm256_shuffle_ps(a, c, 0xEE);
    r[4 * h + 2] = _mm256_shuffle_ps(b, d, 0x44);
    r[4 * h + 3] = _mm256_shuffle_ps(b, d, 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // row j of the result: the low lanes of r[j], r[4 + j]; row 4 + j: the high lanes
    _mm256_storeu_ps(dst + j * kNR, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
    _mm256_storeu_ps(dst + (4 + j) * kNR, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
  }
}
#endif

enum class Isa { none, avx2, avx512 };

// The kernel that runs, by kernels::Options::packed (segtape/kernels.h): Off
// none, Avx2 the AVX2 kernel even on a CPU with AVX-512F, Best the best the
// CPU has (AVX-512F, else AVX2 with FMA, else none). The CPU is asked once.
Isa isa() {
#ifdef SEGTAPE_PACKED_KERNEL
  struct Cpu {
    bool avx2, avx512;
  };
  static const Cpu cpu = [] {
    __builtin_cpu_init();
    return Cpu{__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), bool(__builtin_cpu_supports("avx512f"))};
  }();
  switch (kernels::options().packed) {
    case kernels::Packed::Off: return Isa::none;
    case kernels::Packed::Avx2: return cpu.avx2 ? Isa::avx2 : Isa::none;
    case kernels::Packed::Best: break;
  }
  return cpu.avx512 ? Isa::avx512 : cpu.avx2 ? Isa::avx2 : Isa::none;
#else
  return Isa::none;
#endif
}

// One panel block of B = W^T: dst[k * 32 + c] = w[c * K + k] for c < cols, k < kc.
void pack_transposed(const float* w, int64_t K, int64_t kc, int64_t cols, float* dst) {
  int64_t c0 = 0;
#ifdef SEGTAPE_PACKED_KERNEL
  const Isa kind = isa();
  if (kind != Isa::none) {
    const int64_t tile = kind == Isa::avx512 ? 16 : 8, kt = kc / tile * tile;
    for (; c0 + tile <= cols; c0 += tile)
      for (int64_t k = 0; k < kt; k += tile) {
        if (kind == Isa::avx512) transpose_tile(w + c0 * K + k, K, dst + k * kNR + c0);
        else transpose_tile8(w + c0 * K + k, K, dst + k * kNR + c0);
      }
    for (int64_t c = 0; c < c0; ++c)  // the k tail of the tiled columns
      for (int64_t k = kt; k < kc; ++k) dst[k * kNR + c] = w[c * K + k];
  }
#endif
  for (int64_t k = 0; k < kc; ++k)  // the columns no tile covered
    for (int64_t c = c0; c < cols; ++c) dst[k * kNR + c] = w[c * K + k];
}

}  // namespace

bool packed_available() { return isa() != Isa::none; }

const char* packed_kernel() {
  switch (isa()) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::none: break;
  }
  return "none";
}

namespace {
// Products of at most this many multiply-adds do not pay for OpenBLAS's threads.
constexpr int64_t kThreadsPayAbove = int64_t(1) << 22;
}  // namespace

bool packed_worthwhile(int64_t M, int64_t N, int64_t K) {
  if (M < 1 || N < 1 || K < 1 || !packed_available()) return false;
  return openblas_get_num_threads() == 1 || M * N * K <= kThreadsPayAbove;
}

bool threads_do_not_pay(int64_t M, int64_t N, int64_t K) {
  return openblas_get_num_threads() > 1 && packed_worthwhile(M, N, K);
}

int64_t packed_k_block(int64_t K) { return block_of(K); }

size_t packed_floats(int64_t K, int64_t N) { return size_t((N + kNR - 1) / kNR * kNR * K); }

void pack_b(const float* W, int64_t K, int64_t N, bool trans, float* dst) {
  const int64_t panels = (N + kNR - 1) / kNR, KC = block_of(K);
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    for (int64_t j = 0; j < panels; ++j, dst += kc * kNR) {
      const int64_t cols = std::min(kNR, N - j * kNR);
      if (cols < kNR) std::fill(dst, dst + kc * kNR, 0.0f);
      if (trans) {  // column c of the panel is row j * 32 + c of W
        pack_transposed(W + j * kNR * K + k0, K, kc, cols, dst);
      } else if (cols == kNR) {
        for (int64_t k = 0; k < kc; ++k) std::memcpy(dst + k * kNR, W + (k0 + k) * N + j * kNR, kNR * sizeof(float));
      } else {
        for (int64_t k = 0; k < kc; ++k) std::memcpy(dst + k * kNR, W + (k0 + k) * N + j * kNR, size_t(cols) * sizeof(float));
      }
    }
  }
}

#ifdef SEGTAPE_PACKED_KERNEL
namespace {

// The masks of a panel's first `cols` columns (1 to 32).
SEGTAPE_AVX512_INLINE void masks(int64_t cols, __mmask16& m0, __mmask16& m1) {
  m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  m1 = cols >= 32 ? __mmask16(0xFFFF) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1);
}

// One row of one panel of the result into C: added to what C holds when acc;
// only the columns the masks select.
SEGTAPE_AVX512_INLINE void store_row(float* c, __m512 lo, __m512 hi, bool acc, __mmask16 m0, __mmask16 m1) {
  if (acc) {
    lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, c));
    hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, c + 16));
  }
  _mm512_mask_storeu_ps(c, m0, lo);
  _mm512_mask_storeu_ps(c + 16, m1, hi);
}

// C [MR, cols] (+)= A [MR, kc] * one packed panel block [kc, 32]. The rows are
// a parameter pack so every accumulator is a named register, not an array.
// A [i, k] is A[i * lda + k], or A[k * lda + i] when TA (A given transposed).
template <bool TA, int... I>
SEGTAPE_AVX512 void kernel(std::integer_sequence<int, I...>, int64_t kc, const float* A, int64_t lda, const float* B, float* C,
                           int64_t ldc, bool acc, int64_t cols) {
  constexpr int MR = sizeof...(I);
  __m512 lo[MR], hi[MR];
  ((lo[I] = _mm512_setzero_ps(), hi[I] = _mm512_setzero_ps()), ...);
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(B + k * kNR), b1 = _mm512_load_ps(B + k * kNR + 16);
    ((lo[I] = _mm512_fmadd_ps(_mm512_set1_ps(TA ? A[k * lda + I] : A[I * lda + k]), b0, lo[I]),
      hi[I] = _mm512_fmadd_ps(_mm512_set1_ps(TA ? A[k * lda + I] : A[I * lda + k]), b1, hi[I])),
     ...);
  }
  __mmask16 m0, m1;
  masks(cols, m0, m1);
  (store_row(C + I * ldc, lo[I], hi[I], acc, m0, m1), ...);
}

template <int MR, bool TA>
SEGTAPE_AVX512 void rows(int64_t kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool acc, int64_t cols) {
  kernel<TA>(std::make_integer_sequence<int, MR>{}, kc, A, lda, B, C, ldc, acc, cols);
}

using RowsFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, bool, int64_t);
template <bool TA>
constexpr RowsFn kRows[kMR + 1] = {nullptr,         rows<1, TA>, rows<2, TA>, rows<3, TA>,  rows<4, TA>,  rows<5, TA>, rows<6, TA>,
                                   rows<7, TA>,     rows<8, TA>, rows<9, TA>, rows<10, TA>, rows<11, TA>, rows<12, TA>};

// Under kFewRows rows (B = 1, the agent's case) one panel gives each row only
// two accumulators, too few to hide the FMA's latency: C [MR, P panels] (+)=
// A [MR, kc] * P consecutive panel blocks instead (2 * MR * P accumulators,
// one broadcast of A per row and k). The last panel may be partial (cols).
constexpr int64_t kPanels = 4;
template <int MR, int P>
SEGTAPE_AVX512 void few_rows(int64_t kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool acc,
                             int64_t cols) {
  __m512 lo[MR][P], hi[MR][P];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) lo[i][p] = _mm512_setzero_ps(), hi[i][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    // MR broadcasts, then each panel's two vectors in turn: at most 2 * 3 * 4
    // accumulators + 3 + 2 = 29 of the 32 vector registers, so nothing spills.
    __m512 a[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) a[i] = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 b0 = _mm512_load_ps(B + (p * kc + k) * kNR), b1 = _mm512_load_ps(B + (p * kc + k) * kNR + 16);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) lo[i][p] = _mm512_fmadd_ps(a[i], b0, lo[i][p]), hi[i][p] = _mm512_fmadd_ps(a[i], b1, hi[i][p]);
    }
  }
  __mmask16 m0, m1;
  masks(cols, m0, m1);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const bool last = p == P - 1;  // only the last panel may be partial
      store_row(C + i * ldc + p * kNR, lo[i][p], hi[i][p], acc, last ? m0 : __mmask16(0xFFFF), last ? m1 : __mmask16(0xFFFF));
    }
}

template <int MR>
constexpr RowsFn kFew[kPanels + 1] = {nullptr, few_rows<MR, 1>, few_rows<MR, 2>, few_rows<MR, 3>, few_rows<MR, 4>};

// One ISA's kernels as packed_gemm's driver uses them: blocks of up to
// `rows` rows × `width` columns (a panel or half of one) through main[trans_a][r]
// for r rows; under kFewRows rows (A not transposed) few[M][p] over p ≤
// few_panels[M] panels at a time.
struct KernelSet {
  int64_t rows, width;
  const RowsFn* main[2];
  int64_t few_panels[kFewRows];
  const RowsFn* few[kFewRows];
};

constexpr KernelSet kAvx512 = {kMR, kNR, {kRows<false>, kRows<true>}, {0, kPanels, kPanels, kPanels}, {nullptr, kFew<1>, kFew<2>, kFew<3>}};

// ---- AVX2 + FMA: 8-float vectors, 16 registers ----

// Lanes [0, n) of a vector selected, n in [0, 8]: a window on 8 ones then 8 zeros.
alignas(32) constexpr int32_t kLaneWindow[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

// The first n floats (any n; at most 8 used) of one vector of a row of C:
// added to what C holds when acc.
SEGTAPE_AVX2_INLINE void store8(float* c, __m256 x, bool acc, int64_t n) {
  if (n >= 8) {
    if (acc) x = _mm256_add_ps(x, _mm256_loadu_ps(c));
    _mm256_storeu_ps(c, x);
  } else if (n > 0) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneWindow + 8 - n));
    if (acc) x = _mm256_add_ps(x, _mm256_maskload_ps(c, m));
    _mm256_maskstore_ps(c, m, x);
  }
}

// C [MR, cols] (+)= A [MR, kc] * half a panel block [kc, 16] (B: its first
// column; rows kNR apart): 2 MR accumulators, two loads of B and MR broadcasts per k.
constexpr int kMR2 = 6;
template <bool TA, int... I>
SEGTAPE_AVX2 void kernel2(std::integer_sequence<int, I...>, int64_t kc, const float* A, int64_t lda, const float* B, float* C,
                          int64_t ldc, bool acc, int64_t cols) {
  constexpr int MR = sizeof...(I);
  __m256 lo[MR], hi[MR];
  ((lo[I] = _mm256_setzero_ps(), hi[I] = _mm256_setzero_ps()), ...);
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(B + k * kNR), b1 = _mm256_load_ps(B + k * kNR + 8);
    ((lo[I] = _mm256_fmadd_ps(_mm256_set1_ps(TA ? A[k * lda + I] : A[I * lda + k]), b0, lo[I]),
      hi[I] = _mm256_fmadd_ps(_mm256_set1_ps(TA ? A[k * lda + I] : A[I * lda + k]), b1, hi[I])),
     ...);
  }
  ((store8(C + I * ldc, lo[I], acc, cols), store8(C + I * ldc + 8, hi[I], acc, cols - 8)), ...);
}

template <int MR, bool TA>
SEGTAPE_AVX2 void rows2(int64_t kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool acc, int64_t cols) {
  kernel2<TA>(std::make_integer_sequence<int, MR>{}, kc, A, lda, B, C, ldc, acc, cols);
}

template <bool TA>
constexpr RowsFn kRows2[kMR2 + 1] = {nullptr, rows2<1, TA>, rows2<2, TA>, rows2<3, TA>, rows2<4, TA>, rows2<5, TA>, rows2<6, TA>};

// Under kFewRows rows: C [MR, P panels] (+)= A [MR, kc] * P consecutive
// panel blocks, 4 MR P ≤ 12 accumulators (B = 1: three panels at a time).
// The last panel may be partial (cols).
template <int MR, int P>
SEGTAPE_AVX2 void few_rows2(int64_t kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool acc,
                            int64_t cols) {
  static_assert(4 * MR * P <= 12);
  __m256 s[MR][P][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) s[i][p][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m256 a[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) a[i] = _mm256_set1_ps(A[i * lda + k]);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256 b = _mm256_load_ps(B + (p * kc + k) * kNR + 8 * v);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) s[i][p][v] = _mm256_fmadd_ps(a[i], b, s[i][p][v]);
      }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) store8(C + i * ldc + p * kNR + 8 * v, s[i][p][v], acc, p == P - 1 ? cols - 8 * v : 8);
}

constexpr RowsFn kFew2M1[4] = {nullptr, few_rows2<1, 1>, few_rows2<1, 2>, few_rows2<1, 3>};
constexpr RowsFn kFew2M2[2] = {nullptr, few_rows2<2, 1>};
constexpr RowsFn kFew2M3[2] = {nullptr, few_rows2<3, 1>};
constexpr KernelSet kAvx2 = {kMR2, 16, {kRows2<false>, kRows2<true>}, {0, 3, 1, 1}, {nullptr, kFew2M1, kFew2M2, kFew2M3}};

void gemm_with(const KernelSet& ks, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed, float beta,
               float* C, int64_t ldc, bool trans_a) {
  const int64_t panels = (N + kNR - 1) / kNR, KC = block_of(K), blocks = (M + ks.rows - 1) / ks.rows;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    const bool acc = beta != 0.0f || k0 > 0;
    const float* B = packed + k0 * panels * kNR;  // this block of the inner dimension: its panels, one after another
    if (M < kFewRows && !trans_a) {
      const int64_t step = ks.few_panels[M];
      for (int64_t j = 0; j < panels; j += step) {
        const int64_t p = std::min(step, panels - j), cols = std::min((j + p) * kNR, N) - (j + p - 1) * kNR;
        ks.few[M][p](kc, A + k0, lda, B + j * kc * kNR, C + j * kNR, ldc, acc, cols);
      }
      continue;
    }
    for (int64_t j = 0; j < panels; ++j) {
      const int64_t cols = std::min(kNR, N - j * kNR);
      for (int64_t c0 = 0; c0 < cols; c0 += ks.width) {  // AVX2: a panel's second half only where it has columns
        const float* Bc = B + j * kc * kNR + c0;
        float* Cc = C + j * kNR + c0;
        for (int64_t b = 0, m = 0; b < blocks; ++b) {
          const int64_t r = M / blocks + (b < M % blocks ? 1 : 0);
          ks.main[trans_a][r](kc, trans_a ? A + k0 * lda + m : A + m * lda + k0, lda, Bc, Cc + m * ldc, ldc, acc, cols - c0);
          m += r;
        }
      }
    }
  }
}

}  // namespace
#endif

void packed_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed, float beta, float* C,
                 int64_t ldc, bool trans_a) {
  if (M < 1 || N < 1) return;
#ifdef SEGTAPE_PACKED_KERNEL
  switch (isa()) {
    case Isa::avx512: return gemm_with(kAvx512, M, N, K, A, lda, packed, beta, C, ldc, trans_a);
    case Isa::avx2: return gemm_with(kAvx2, M, N, K, A, lda, packed, beta, C, ldc, trans_a);
    case Isa::none: break;
  }
#else
  (void)K, (void)A, (void)lda, (void)packed, (void)beta, (void)C, (void)ldc, (void)trans_a;
#endif
  std::abort();  // unreachable: packed_available() is false
}

}  // namespace segtape::cpu
